/* The example convnet's forward and backward passes: shapes and buffers around the layer kernels
 * of kernels/host/layers.c (see model.h for the network). */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define P1H 13 /* (28 - 2) / 2 */
#define P2H 5  /* (13 - 2) / 2 */
#define FLAT (P2H * P2H * 64)

static hora_conv_shape_t conv1_shape(size_t n) {
  hora_conv_shape_t s = {n, MNIST_ROWS, MNIST_COLS, 1, 32, 3, 3};
  return s;
}
static hora_conv_shape_t conv2_shape(size_t n) {
  hora_conv_shape_t s = {n, P1H, P1H, 32, 64, 3, 3};
  return s;
}

hora_result_t mnist_model_create(mnist_model_t *m, size_t capacity) {
  memset(m, 0, sizeof *m);
  if (capacity == 0 || capacity > (1u << 20)) return HORA_ERR_INVALID_ARGUMENT;
  m->capacity = capacity;
  m->dropout = 0.5f;
  const size_t sizes[MNIST_LAYERS][4] = {/* weights, bias, fan_in, fan_out */
                                         {32 * 9, 32, 9, 32 * 9},
                                         {64 * 9 * 32, 64, 9 * 32, 64 * 9},
                                         {MNIST_CLASSES * FLAT, MNIST_CLASSES, FLAT, MNIST_CLASSES}};
  const char *names[MNIST_LAYERS] = {"conv1", "conv2", "dense"};
  size_t off = 0;
  for (int l = 0; l < MNIST_LAYERS; l++) {
    m->layer[l] = (mnist_layer_t){names[l], off, sizes[l][0] + sizes[l][1], sizes[l][0],
                                  sizes[l][2], sizes[l][3]};
    off += m->layer[l].count;
  }
  m->nparams = off;
  hora_conv_shape_t c1 = conv1_shape(capacity), c2 = conv2_shape(capacity);
  size_t n = capacity;
#define F(ptr, cnt) ((ptr) = calloc((cnt), sizeof(float)), ok = ok && (ptr))
#define B(ptr, cnt) ((ptr) = calloc((cnt), 1), ok = ok && (ptr))
  int ok = 1;
  F(m->params, m->nparams);
  F(m->grads, m->nparams);
  F(m->x, n * MNIST_PIXELS);
  F(m->col1, hora__conv2d_col_count(&c1));
  F(m->y1, hora__conv2d_out_count(&c1));
  F(m->p1, n * P1H * P1H * 32);
  F(m->col2, hora__conv2d_col_count(&c2));
  F(m->y2, hora__conv2d_out_count(&c2));
  F(m->p2, n * FLAT);
  F(m->d, n * FLAT);
  F(m->logits, n * MNIST_CLASSES);
  B(m->arg1, n * P1H * P1H * 32);
  B(m->arg2, n * FLAT);
  B(m->keep, n * FLAT);
  B(m->labels, n);
  F(m->dlogits, n * MNIST_CLASSES);
  F(m->dd, n * FLAT);
  F(m->dy2, hora__conv2d_out_count(&c2));
  F(m->dcol2, hora__conv2d_col_count(&c2));
  F(m->dp1, n * P1H * P1H * 32);
  F(m->dy1, hora__conv2d_out_count(&c1));
#undef F
#undef B
  if (!ok) {
    mnist_model_destroy(m);
    return HORA_ERR_NO_MEMORY;
  }
  return HORA_SUCCESS;
}

void mnist_model_destroy(mnist_model_t *m) {
  void *p[] = {m->params, m->grads, m->x,      m->col1, m->y1,      m->p1,  m->col2,
               m->y2,     m->p2,    m->d,      m->logits, m->arg1,  m->arg2, m->keep,
               m->labels, m->dlogits, m->dd,   m->dy2,  m->dcol2,   m->dp1, m->dy1};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
  memset(m, 0, sizeof *m);
}

void mnist_model_init_params(mnist_model_t *m, uint64_t seed) {
  for (int l = 0; l < MNIST_LAYERS; l++) {
    const mnist_layer_t *L = &m->layer[l];
    float *w = m->params + L->offset;
    /* He uniform before a ReLU, Glorot uniform for the output layer. */
    float limit = l == MNIST_DENSE ? sqrtf(6.0f / (float)(L->fan_in + L->fan_out))
                                   : sqrtf(6.0f / (float)L->fan_in);
    hora__init_uniform_host(w, L->wcount, limit, hora__rng_u64(seed, (uint64_t)l));
    memset(w + L->wcount, 0, (L->count - L->wcount) * sizeof(float));
  }
}

#define TRY(call)                              \
  do {                                         \
    hora_result_t rc_ = (call);                \
    if (rc_ != HORA_SUCCESS) return rc_;       \
  } while (0)

hora_result_t mnist_model_forward(mnist_model_t *m, size_t n, int train, uint64_t dropout_seed,
                                  double *loss_sum, size_t *correct) {
  if (n == 0 || n > m->capacity) return HORA_ERR_INVALID_ARGUMENT;
  m->n = n;
  const float *P = m->params;
  const mnist_layer_t *L1 = &m->layer[MNIST_CONV1], *L2 = &m->layer[MNIST_CONV2],
                      *L3 = &m->layer[MNIST_DENSE];
  hora_conv_shape_t c1 = conv1_shape(n), c2 = conv2_shape(n);
  TRY(hora__conv2d_fwd_host(&c1, m->x, P + L1->offset, P + L1->offset + L1->wcount, 1, m->col1,
                            m->y1));
  TRY(hora__maxpool2_fwd_host(m->y1, n, 26, 26, 32, m->p1, m->arg1));
  TRY(hora__conv2d_fwd_host(&c2, m->p1, P + L2->offset, P + L2->offset + L2->wcount, 1, m->col2,
                            m->y2));
  TRY(hora__maxpool2_fwd_host(m->y2, n, 11, 11, 64, m->p2, m->arg2));
  const float *feat = m->p2;
  if (train) {
    TRY(hora__dropout_fwd_host(m->p2, m->d, m->keep, n * FLAT, m->dropout, dropout_seed));
    feat = m->d;
  }
  TRY(hora__dense_fwd_host(feat, n, FLAT, P + L3->offset, P + L3->offset + L3->wcount,
                           MNIST_CLASSES, m->logits));
  return hora__softmax_xent_host(m->logits, m->labels, n, MNIST_CLASSES, 1.0f / (float)n, loss_sum,
                                 correct, train ? m->dlogits : NULL);
}

hora_result_t mnist_model_backward(mnist_model_t *m, mnist_layer_done_fn layer_done, void *arg) {
  const size_t n = m->n;
  const float *P = m->params;
  float *G = m->grads;
  const mnist_layer_t *L1 = &m->layer[MNIST_CONV1], *L2 = &m->layer[MNIST_CONV2],
                      *L3 = &m->layer[MNIST_DENSE];
  hora_conv_shape_t c1 = conv1_shape(n), c2 = conv2_shape(n);
  /* dense: its input was the dropout output */
  TRY(hora__dense_bwd_host(m->d, m->dlogits, n, FLAT, P + L3->offset, MNIST_CLASSES, G + L3->offset,
                           G + L3->offset + L3->wcount, m->dd));
  if (layer_done) TRY(layer_done(arg, MNIST_DENSE));
  TRY(hora__dropout_bwd_host(m->dd, m->keep, n * FLAT, m->dropout, m->dd));
  /* the second pool's input gradient, through conv2's ReLU, is conv2's output gradient */
  TRY(hora__maxpool2_relu_bwd_host(m->dd, m->arg2, m->y2, n, 11, 11, 64, m->dy2));
  TRY(hora__conv2d_bwd_host(&c2, m->col2, m->dy2, P + L2->offset, G + L2->offset,
                            G + L2->offset + L2->wcount, m->dcol2, m->dp1));
  if (layer_done) TRY(layer_done(arg, MNIST_CONV2));
  TRY(hora__maxpool2_relu_bwd_host(m->dp1, m->arg1, m->y1, n, 26, 26, 32, m->dy1));
  TRY(hora__conv2d_bwd_host(&c1, m->col1, m->dy1, P + L1->offset, G + L1->offset,
                            G + L1->offset + L1->wcount, NULL, NULL));
  if (layer_done) TRY(layer_done(arg, MNIST_CONV1));
  return HORA_SUCCESS;
}
