/* hora layer kernels: the forward and backward passes of the layers of the example convnet
 * (examples/mnist: the Keras MNIST convnet) and its optimizers, float32.
 *
 * Layout: activations are NHWC (batch, height, width, channels; channels fastest), the layout
 * Keras uses, so that a convolution's im2col matrix has one row per output pixel whose columns
 * are kh*kw runs of c contiguous input values, and the output of the convolution GEMM is the
 * NHWC output itself. Convolution weights are [k][kh][kw][c] (k output channels), dense weights
 * [out][in]. Convolutions are "valid" (no padding), stride 1; pooling is 2x2, stride 2, and drops
 * an odd last row/column (Keras MaxPooling2D's default).
 *
 * Host versions (suffix _host) are the CPU path and the oracle for device versions. The matrix
 * products go to OpenBLAS (cblas_sgemm), threaded as openblas_set_num_threads() says; everything
 * else is plain loops written to vectorize. Counts and the batch size are size_t; the products
 * n*oh*ow and the feature sizes must fit in an int (the BLAS interface): larger is
 * HORA_ERR_INVALID_ARGUMENT.
 *
 * Errors (all kernels): HORA_ERR_INVALID_ARGUMENT for a NULL pointer that is required, a
 * non-positive dimension, a kernel larger than the input, or a size that overflows the BLAS int.
 * Nothing is written on error. Workspaces are caller-owned (no allocation inside, so a training
 * step allocates nothing). Internal API of the example: not installed, not exported. */
#ifndef HORA_LAYERS_H
#define HORA_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "hora.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Shape of a valid, stride-1 convolution: input [n][h][w][c], weights [k][kh][kw][c], output
 * [n][oh][ow][k] with oh = h - kh + 1, ow = w - kw + 1. The im2col matrix has
 * n*oh*ow rows and kh*kw*c columns. */
typedef struct {
  size_t n;
  int h, w, c;
  int k, kh, kw;
} hora_conv_shape_t;

/* Elements of the conv output ([n][oh][ow][k]) and of its im2col workspace ([n*oh*ow][kh*kw*c]);
 * 0 for an invalid shape. */
size_t hora__conv2d_out_count(const hora_conv_shape_t *s);
size_t hora__conv2d_col_count(const hora_conv_shape_t *s);

/* y = act(conv(x, wt) + bias). Builds the im2col matrix in col (kept for the backward pass),
 * then one GEMM: y[M x k] = col[M x K] * wt^T[K x k] with M = n*oh*ow, K = kh*kw*c.
 * relu nonzero: y = max(0, .) (the ReLU fused into the bias pass). */
hora_result_t hora__conv2d_fwd_host(const hora_conv_shape_t *s, const float *x, const float *wt,
                                    const float *bias, int relu, float *col, float *y);

/* Backward of hora__conv2d_fwd_host without the activation (apply hora__relu_bwd_host first).
 * col: the forward's im2col matrix. dy: [n][oh][ow][k]. Writes (overwrites) dwt [k][kh][kw][c] =
 * dy^T * col and dbias[k] = sum of dy over n, oh, ow. dx NULL: the input gradient is skipped (the
 * first layer); else dcol ([M x K] workspace) = dy * wt and dx [n][h][w][c] = col2im(dcol)
 * (overwritten; pixels no window covers get 0). */
hora_result_t hora__conv2d_bwd_host(const hora_conv_shape_t *s, const float *col, const float *dy,
                                    const float *wt, float *dwt, float *dbias, float *dcol,
                                    float *dx);

/* dy[i] = y[i] > 0 ? dy[i] : 0 for i < count (y: the ReLU output). In place. */
hora_result_t hora__relu_bwd_host(const float *y, float *dy, size_t count);

/* 2x2 max pooling, stride 2: x [n][h][w][c] -> y [n][h/2][w/2][c] (integer division).
 * arg[i] (same shape as y) records which of the 4 window elements won (dy*2+dx, first max on
 * ties). */
hora_result_t hora__maxpool2_fwd_host(const float *x, size_t n, int h, int w, int c, float *y,
                                      uint8_t *arg);
/* dx [n][h][w][c] = 0 except dx[winner] = dy for each window (overwritten). */
hora_result_t hora__maxpool2_bwd_host(const float *dy, const uint8_t *arg, size_t n, int h, int w,
                                      int c, float *dx);
/* The same with the backward of the ReLU that produced the pool's input x fused in: equal to
 * hora__maxpool2_bwd_host followed by hora__relu_bwd_host(x, dx), in one pass. */
hora_result_t hora__maxpool2_relu_bwd_host(const float *dy, const uint8_t *arg, const float *x,
                                           size_t n, int h, int w, int c, float *dx);

/* Inverted dropout: keep[i] = 1 with probability 1 - p, y[i] = x[i] * keep[i] / (1 - p).
 * The keep mask comes from a counter-based generator: element i's draw is a function of
 * (seed, i) only (splitmix64 of seed + i), so a step's mask is reproducible from its seed, on any
 * device and after a restart. 0 <= p < 1 (p = 0: copy, mask all ones); x and y may be equal. */
hora_result_t hora__dropout_fwd_host(const float *x, float *y, uint8_t *keep, size_t count,
                                     float p, uint64_t seed);
/* dx[i] = dy[i] * keep[i] / (1 - p); dx may equal dy. */
hora_result_t hora__dropout_bwd_host(const float *dy, const uint8_t *keep, size_t count, float p,
                                     float *dx);

/* Dense (fully connected): y [n][out] = x [n][in] * wt^T + bias, wt [out][in]. */
hora_result_t hora__dense_fwd_host(const float *x, size_t n, int in, const float *wt,
                                   const float *bias, int out, float *y);
/* dwt [out][in] = dy^T * x and dbias[out] = column sums of dy (both overwritten); dx [n][in] =
 * dy * wt unless dx is NULL. */
hora_result_t hora__dense_bwd_host(const float *x, const float *dy, size_t n, int in,
                                   const float *wt, int out, float *dwt, float *dbias, float *dx);

/* Softmax cross-entropy over `classes` logits per row, labels in [0, classes) (else
 * HORA_ERR_INVALID_ARGUMENT, nothing written). *loss_sum = sum over rows of -log softmax[label]
 * (computed with the max subtracted, in double); *correct = rows whose arg max (first on ties)
 * equals the label. dlogits NULL: no gradient; else dlogits = (softmax - onehot) * grad_scale
 * (1/n for the mean loss). */
hora_result_t hora__softmax_xent_host(const float *logits, const uint8_t *labels, size_t n,
                                      int classes, float grad_scale, double *loss_sum,
                                      size_t *correct, float *dlogits);

/* SGD with momentum as PyTorch's torch.optim.SGD does it: v = momentum * v + g; p -= lr * v.
 * momentum 0: plain SGD (v still holds g). */
hora_result_t hora__sgd_momentum_host(float *param, const float *grad, float *velocity,
                                      size_t count, float lr, float momentum);
/* Adam (Kingma & Ba 2015, with PyTorch's bias correction): m = b1 m + (1-b1) g;
 * v = b2 v + (1-b2) g^2; p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps). t >= 1 is the
 * number of this update (1 for the first). */
hora_result_t hora__adam_host(float *param, const float *grad, float *m, float *v, size_t count,
                              float lr, float beta1, float beta2, float eps, int64_t t);

/* w[i] uniform in [-limit, limit) from the counter-based generator (seed, i). He uniform:
 * limit = sqrt(6 / fan_in); Glorot uniform: limit = sqrt(6 / (fan_in + fan_out)). */
hora_result_t hora__init_uniform_host(float *w, size_t count, float limit, uint64_t seed);

/* The counter-based generator: splitmix64 (Steele, Lea & Flood 2014) of seed + (i+1)*golden,
 * and its top 24 bits as a float in [0, 1). */
uint64_t hora__rng_u64(uint64_t seed, uint64_t i);
float hora__rng_uniform(uint64_t seed, uint64_t i);

/* ---- device versions (suffix _cuda; examples/mnist/layers/layers.cu, library hora_layers_cuda) ----
 * Built only when CUDA is found; not part of libhora. Each takes the arguments of the _host
 * version of the same name, in the same order, with every array in device memory of the calling
 * thread's current GPU (cudaSetDevice; the example uses hora_device_index), and computes the same
 * result: the per-element work is examples/mnist/layers/layers_body.h, whose functions give the host's bits
 * (checked on the CPU by tests/unit/test_layers_body); the matrix products go to cuBLAS
 * (cublasSgemm, one handle per GPU created on first use), whose summation order differs from
 * OpenBLAS's (float rounding differences only), and the bias gradients add 256 partial sums per
 * channel in a fixed tree (within a float ulp of the host's). col2im is a gather (each dx element
 * sums the dcol entries that map to it): no atomics; every kernel is deterministic.
 * Stream: the legacy default stream (stream 0) of the current device; the calls are asynchronous
 * (they return once the work is enqueued) except hora__softmax_xent_cuda, which waits for its
 * kernel to return the loss and count on the host. Work the caller runs on other streams must be
 * complete before a call; hora's collectives order after the default stream (docs/gpu.md).
 * Errors: HORA_ERR_INVALID_ARGUMENT as the _host version (checked on the host before anything is
 * enqueued; the label check of the softmax is done on the device, before anything is written);
 * HORA_ERR_CUDA when a launch or cuBLAS call fails (hora_last_error() names the kernel or call
 * and gives the CUDA error string or cuBLAS status). Pointers are not checked to be device memory:
 * a host pointer is a CUDA error at the launch or later (an illegal address). */
hora_result_t hora__conv2d_fwd_cuda(const hora_conv_shape_t *s, const float *x, const float *wt,
                                    const float *bias, int relu, float *col, float *y);
hora_result_t hora__conv2d_bwd_cuda(const hora_conv_shape_t *s, const float *col, const float *dy,
                                    const float *wt, float *dwt, float *dbias, float *dcol,
                                    float *dx);
hora_result_t hora__relu_bwd_cuda(const float *y, float *dy, size_t count);
hora_result_t hora__maxpool2_fwd_cuda(const float *x, size_t n, int h, int w, int c, float *y,
                                      uint8_t *arg);
hora_result_t hora__maxpool2_bwd_cuda(const float *dy, const uint8_t *arg, size_t n, int h, int w,
                                      int c, float *dx);
hora_result_t hora__maxpool2_relu_bwd_cuda(const float *dy, const uint8_t *arg, const float *x,
                                           size_t n, int h, int w, int c, float *dx);
hora_result_t hora__dropout_fwd_cuda(const float *x, float *y, uint8_t *keep, size_t count,
                                     float p, uint64_t seed);
hora_result_t hora__dropout_bwd_cuda(const float *dy, const uint8_t *keep, size_t count, float p,
                                     float *dx);
hora_result_t hora__dense_fwd_cuda(const float *x, size_t n, int in, const float *wt,
                                   const float *bias, int out, float *y);
hora_result_t hora__dense_bwd_cuda(const float *x, const float *dy, size_t n, int in,
                                   const float *wt, int out, float *dwt, float *dbias, float *dx);
/* labels in device memory; *loss_sum and *correct are host memory (written after the kernel has
 * finished). One block of 256 threads (a row per thread) sums the rows' losses in a tree, not in
 * row order: *loss_sum can differ from the host's in the last bits. The sums pass through one
 * __device__ variable per GPU: calls from several host threads on the same GPU at once are not
 * supported (the example calls it from its training thread only). */
hora_result_t hora__softmax_xent_cuda(const float *logits, const uint8_t *labels, size_t n,
                                      int classes, float grad_scale, double *loss_sum,
                                      size_t *correct, float *dlogits);
hora_result_t hora__sgd_momentum_cuda(float *param, const float *grad, float *velocity,
                                      size_t count, float lr, float momentum);
hora_result_t hora__adam_cuda(float *param, const float *grad, float *m, float *v, size_t count,
                              float lr, float beta1, float beta2, float eps, int64_t t);
hora_result_t hora__init_uniform_cuda(float *w, size_t count, float limit, uint64_t seed);
/* The message of the calling thread's last HORA_ERR_CUDA (or device-detected bad label) from a
 * _cuda layer kernel, "" if none yet; valid until that thread's next failing call. The same text
 * goes to hora_last_error() only where libhora's internal symbols are linked (libhora_static):
 * a program on the shared libhora reads it here. */
const char *hora__layers_cuda_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
