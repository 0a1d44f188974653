/* The Keras MNIST convnet on the hora layer kernels (examples/mnist/layers/hora_layers.h):
 *
 *   x [n][28][28][1]
 *   -> conv1 32 3x3 + ReLU -> [n][26][26][32] -> maxpool 2 -> [n][13][13][32]
 *   -> conv2 64 3x3 + ReLU -> [n][11][11][64] -> maxpool 2 -> [n][5][5][64]
 *   -> flatten (1600, HWC order) -> dropout 0.5 -> dense 10 -> softmax cross-entropy
 *
 * All parameters live in one float array, layer after layer, each layer's weights followed by
 * its bias, so that one layer's gradient is one contiguous tensor for the allreduce; the gradients
 * mirror that layout. The model owns every activation buffer for up to `capacity` images, so a
 * training step allocates nothing. */
#ifndef MNIST_MODEL_H
#define MNIST_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "hora_layers.h"

#define MNIST_ROWS 28
#define MNIST_COLS 28
#define MNIST_PIXELS (MNIST_ROWS * MNIST_COLS)
#define MNIST_CLASSES 10

enum { MNIST_CONV1 = 0, MNIST_CONV2 = 1, MNIST_DENSE = 2, MNIST_LAYERS = 3 };

typedef struct {
  const char *name;   /* "conv1", "conv2", "dense" */
  size_t offset;      /* first element in params / grads */
  size_t count;       /* weights + bias elements */
  size_t wcount;      /* weight elements (the bias follows) */
  size_t fan_in, fan_out;
} mnist_layer_t;

typedef struct {
  size_t capacity; /* images per forward/backward, at most */
  int cuda;        /* 1: every buffer below is device memory of the current GPU, _cuda kernels */
  float dropout;   /* 0.5 */
  mnist_layer_t layer[MNIST_LAYERS];
  size_t nparams;
  float *params, *grads;
  /* activations and workspaces, sized for `capacity` */
  float *x, *col1, *y1, *p1, *col2, *y2, *p2, *d, *logits;
  uint8_t *arg1, *arg2, *keep, *labels;
  float *dlogits, *dd, *dy2, *dcol2, *dp1, *dy1;
  size_t n; /* images of the last forward */
  /* Where the data reader puts a batch: m->x and m->labels on the CPU path; on the GPU path host
   * staging buffers (pinned, cudaMallocHost) that mnist_model_forward copies to the device. */
  float *x_in;
  uint8_t *labels_in;
} mnist_model_t;

/* Allocates every buffer for up to `capacity` images; params/grads zeroed. HORA_ERR_NO_MEMORY,
 * HORA_ERR_INVALID_ARGUMENT (capacity 0 or too large). */
hora_result_t mnist_model_create(mnist_model_t *m, size_t capacity);
/* The same with cuda = 1: the buffers in device memory of the current GPU (cudaSetDevice first)
 * and the _cuda layer kernels; HORA_ERR_NOT_SUPPORTED in a build without MNIST_HAVE_CUDA (the
 * CUDA layer kernels), HORA_ERR_NO_MEMORY when cudaMalloc fails. */
hora_result_t mnist_model_create_on(mnist_model_t *m, size_t capacity, int cuda);
void mnist_model_destroy(mnist_model_t *m);
/* A zeroed buffer of `bytes` (at least 1) in host memory, or device memory of the current GPU
 * when cuda is set (a CUDA build); NULL when out of memory. Freed by mnist_zfree (NULL is a
 * no-op). The model's buffers and the example's optimizer state come from here. */
void *mnist_zalloc(int cuda, size_t bytes);
void mnist_zfree(int cuda, void *p);

/* He uniform for the convolutions (ReLU follows), Glorot uniform for the dense layer, zero biases;
 * a function of `seed` only. */
void mnist_model_init_params(mnist_model_t *m, uint64_t seed);

/* Forward pass on m->x_in (n images, pixels in [0, 1]) and m->labels_in. train nonzero: dropout with a
 * mask drawn from dropout_seed (hora__dropout_fwd_host), and the gradient of the mean loss is
 * prepared for mnist_model_backward; else dropout is the identity. Outputs the summed loss and the
 * number of correct predictions. */
hora_result_t mnist_model_forward(mnist_model_t *m, size_t n, int train, uint64_t dropout_seed,
                                  double *loss_sum, size_t *correct);

/* Backward pass after a training forward: fills m->grads layer by layer, last layer first, and
 * calls layer_done(arg, layer) as soon as that layer's gradient is final (the place to start its
 * allreduce; NULL: no calls). A result other than HORA_SUCCESS from layer_done stops the pass
 * and is returned. */
typedef hora_result_t (*mnist_layer_done_fn)(void *arg, int layer);
hora_result_t mnist_model_backward(mnist_model_t *m, mnist_layer_done_fn layer_done, void *arg);

#endif
