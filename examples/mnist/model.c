/* The example convnet's forward and backward passes: shapes and buffers around the layer kernels
 * of examples/mnist/layers/layers.c, or examples/mnist/layers/layers.cu on the GPU path (see model.h for the
 * network). The two paths run the same sequence of calls through a table of kernels: the _cuda
 * entry points take the _host ones' arguments. */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef MNIST_HAVE_CUDA
#include <cuda_runtime.h>
#endif

typedef struct {
  hora_result_t (*conv_fwd)(const hora_conv_shape_t *, const float *, const float *, const float *,
                            int, float *, float *);
  hora_result_t (*conv_bwd)(const hora_conv_shape_t *, const float *, const float *, const float *,
                            float *, float *, float *, float *);
  hora_result_t (*pool_fwd)(const float *, size_t, int, int, int, float *, uint8_t *);
  hora_result_t (*pool_relu_bwd)(const float *, const uint8_t *, const float *, size_t, int, int,
                                 int, float *);
  hora_result_t (*dropout_fwd)(const float *, float *, uint8_t *, size_t, float, uint64_t);
  hora_result_t (*dropout_bwd)(const float *, const uint8_t *, size_t, float, float *);
  hora_result_t (*dense_fwd)(const float *, size_t, int, const float *, const float *, int, float *);
  hora_result_t (*dense_bwd)(const float *, const float *, size_t, int, const float *, int, float *,
                             float *, float *);
  hora_result_t (*xent)(const float *, const uint8_t *, size_t, int, float, double *, size_t *,
                        float *);
  hora_result_t (*init_uniform)(float *, size_t, float, uint64_t);
} kernels_t;

static const kernels_t host_kernels = {
    hora__conv2d_fwd_host,    hora__conv2d_bwd_host,         hora__maxpool2_fwd_host,
    hora__maxpool2_relu_bwd_host, hora__dropout_fwd_host,    hora__dropout_bwd_host,
    hora__dense_fwd_host,     hora__dense_bwd_host,          hora__softmax_xent_host,
    hora__init_uniform_host};
#ifdef MNIST_HAVE_CUDA
static const kernels_t cuda_kernels = {
    hora__conv2d_fwd_cuda,    hora__conv2d_bwd_cuda,         hora__maxpool2_fwd_cuda,
    hora__maxpool2_relu_bwd_cuda, hora__dropout_fwd_cuda,    hora__dropout_bwd_cuda,
    hora__dense_fwd_cuda,     hora__dense_bwd_cuda,          hora__softmax_xent_cuda,
    hora__init_uniform_cuda};
#define KERNELS(m) ((m)->cuda ? &cuda_kernels : &host_kernels)
#else
#define KERNELS(m) (&host_kernels)
#endif

void *mnist_zalloc(int cuda, size_t bytes) {
#ifdef MNIST_HAVE_CUDA
  if (cuda) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) return NULL;
    if (cudaMemset(p, 0, bytes) != cudaSuccess) {
      cudaFree(p);
      return NULL;
    }
    return p;
  }
#else
  (void)cuda;
#endif
  return calloc(bytes ? bytes : 1, 1);
}
void mnist_zfree(int cuda, void *p) {
#ifdef MNIST_HAVE_CUDA
  if (cuda) {
    if (p) cudaFree(p);
    return;
  }
#else
  (void)cuda;
#endif
  free(p);
}

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
  return mnist_model_create_on(m, capacity, 0);
}

hora_result_t mnist_model_create_on(mnist_model_t *m, size_t capacity, int cuda) {
  memset(m, 0, sizeof *m);
  if (capacity == 0 || capacity > (1u << 20)) return HORA_ERR_INVALID_ARGUMENT;
#ifndef MNIST_HAVE_CUDA
  if (cuda) return HORA_ERR_NOT_SUPPORTED;
#endif
  m->cuda = cuda;
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
#define F(ptr, cnt) ((ptr) = mnist_zalloc(cuda, (cnt) * sizeof(float)), ok = ok && (ptr))
#define B(ptr, cnt) ((ptr) = mnist_zalloc(cuda, (cnt)), ok = ok && (ptr))
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
  if (cuda) {
#ifdef MNIST_HAVE_CUDA
    /* pinned, so that the per-step upload is one DMA without a bounce buffer */
    if (cudaMallocHost((void **)&m->x_in, n * MNIST_PIXELS * sizeof(float)) != cudaSuccess)
      m->x_in = NULL;
    if (cudaMallocHost((void **)&m->labels_in, n) != cudaSuccess) m->labels_in = NULL;
#endif
    ok = ok && m->x_in && m->labels_in;
  } else {
    m->x_in = m->x;
    m->labels_in = m->labels;
  }
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
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) mnist_zfree(m->cuda, p[i]);
#ifdef MNIST_HAVE_CUDA
  if (m->cuda) {
    if (m->x_in) cudaFreeHost(m->x_in);
    if (m->labels_in) cudaFreeHost(m->labels_in);
  }
#endif
  memset(m, 0, sizeof *m);
}

void mnist_model_init_params(mnist_model_t *m, uint64_t seed) {
  const kernels_t *K = KERNELS(m);
  for (int l = 0; l < MNIST_LAYERS; l++) {
    const mnist_layer_t *L = &m->layer[l];
    float *w = m->params + L->offset;
    /* He uniform before a ReLU, Glorot uniform for the output layer. */
    float limit = l == MNIST_DENSE ? sqrtf(6.0f / (float)(L->fan_in + L->fan_out))
                                   : sqrtf(6.0f / (float)L->fan_in);
    K->init_uniform(w, L->wcount, limit, hora__rng_u64(seed, (uint64_t)l));
#ifdef MNIST_HAVE_CUDA
    if (m->cuda) {
      cudaMemset(w + L->wcount, 0, (L->count - L->wcount) * sizeof(float));
      continue;
    }
#endif
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
  const kernels_t *K = KERNELS(m);
#ifdef MNIST_HAVE_CUDA
  if (m->cuda) {
    if (cudaMemcpy(m->x, m->x_in, n * MNIST_PIXELS * sizeof(float), cudaMemcpyHostToDevice) !=
            cudaSuccess ||
        cudaMemcpy(m->labels, m->labels_in, n, cudaMemcpyHostToDevice) != cudaSuccess)
      return HORA_ERR_CUDA;
  }
#endif
  const float *P = m->params;
  const mnist_layer_t *L1 = &m->layer[MNIST_CONV1], *L2 = &m->layer[MNIST_CONV2],
                      *L3 = &m->layer[MNIST_DENSE];
  hora_conv_shape_t c1 = conv1_shape(n), c2 = conv2_shape(n);
  TRY(K->conv_fwd(&c1, m->x, P + L1->offset, P + L1->offset + L1->wcount, 1, m->col1,
                            m->y1));
  TRY(K->pool_fwd(m->y1, n, 26, 26, 32, m->p1, m->arg1));
  TRY(K->conv_fwd(&c2, m->p1, P + L2->offset, P + L2->offset + L2->wcount, 1, m->col2,
                            m->y2));
  TRY(K->pool_fwd(m->y2, n, 11, 11, 64, m->p2, m->arg2));
  const float *feat = m->p2;
  if (train) {
    TRY(K->dropout_fwd(m->p2, m->d, m->keep, n * FLAT, m->dropout, dropout_seed));
    feat = m->d;
  }
  TRY(K->dense_fwd(feat, n, FLAT, P + L3->offset, P + L3->offset + L3->wcount,
                           MNIST_CLASSES, m->logits));
  return K->xent(m->logits, m->labels, n, MNIST_CLASSES, 1.0f / (float)n, loss_sum,
                                 correct, train ? m->dlogits : NULL);
}

hora_result_t mnist_model_backward(mnist_model_t *m, mnist_layer_done_fn layer_done, void *arg) {
  const size_t n = m->n;
  const kernels_t *K = KERNELS(m);
  const float *P = m->params;
  float *G = m->grads;
  const mnist_layer_t *L1 = &m->layer[MNIST_CONV1], *L2 = &m->layer[MNIST_CONV2],
                      *L3 = &m->layer[MNIST_DENSE];
  hora_conv_shape_t c1 = conv1_shape(n), c2 = conv2_shape(n);
  /* dense: its input was the dropout output */
  TRY(K->dense_bwd(m->d, m->dlogits, n, FLAT, P + L3->offset, MNIST_CLASSES, G + L3->offset,
                           G + L3->offset + L3->wcount, m->dd));
  if (layer_done) TRY(layer_done(arg, MNIST_DENSE));
  TRY(K->dropout_bwd(m->dd, m->keep, n * FLAT, m->dropout, m->dd));
  /* the second pool's input gradient, through conv2's ReLU, is conv2's output gradient */
  TRY(K->pool_relu_bwd(m->dd, m->arg2, m->y2, n, 11, 11, 64, m->dy2));
  TRY(K->conv_bwd(&c2, m->col2, m->dy2, P + L2->offset, G + L2->offset,
                            G + L2->offset + L2->wcount, m->dcol2, m->dp1));
  if (layer_done) TRY(layer_done(arg, MNIST_CONV2));
  TRY(K->pool_relu_bwd(m->dp1, m->arg1, m->y1, n, 26, 26, 32, m->dy1));
  TRY(K->conv_bwd(&c1, m->col1, m->dy1, P + L1->offset, G + L1->offset,
                            G + L1->offset + L1->wcount, NULL, NULL));
  if (layer_done) TRY(layer_done(arg, MNIST_CONV1));
  return HORA_SUCCESS;
}
