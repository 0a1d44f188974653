/* CUDA layer kernels of the example convnet (see hora_layers.h, the _cuda entry points): grid-
 * stride loops around the per-element bodies of layers_body.h (shared with the CPU unit test that
 * checks their index math against the host kernels), and cuBLAS (cublasSgemm) for the matrix
 * products. Everything runs on the legacy default stream of the calling thread's current device;
 * nothing synchronizes except hora__softmax_xent_cuda, which returns host scalars.
 *
 * Built into hora_layers_cuda (not libhora) and compiled with --fmad=false, so that the bodies'
 * float arithmetic gives the same bits as the host kernels (the GEMMs differ from OpenBLAS's in
 * summation order; the tests use a tolerance there). */
#include <cublas_v2.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "common.cuh"
#include "hora_layers.h"
#include "layers_body.h"

#define BAD HORA_ERR_INVALID_ARGUMENT

namespace {

using hora_cuda::blocks_for;
using hora_cuda::kThreads;

/* The message of this thread's last failure (hora__layers_cuda_last_error). Also handed to
 * hora__error when libhora's internals are linked in (hora_last_error() then has it too); a
 * program on the shared libhora, which does not export them, reads it here. */
thread_local char g_err[512];

__attribute__((format(printf, 3, 4))) hora_result_t fail(hora_result_t rc, int line,
                                                        const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof g_err, fmt, ap);
  va_end(ap);
  if (hora__error) return hora__error(rc, __FILE__, line, "%s", g_err);
  return rc;
}
hora_result_t cuda_fail(cudaError_t e, const char *what, int line) {
  return fail(HORA_ERR_CUDA, line, "%s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}
hora_result_t launched(const char *kernel, int line) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return HORA_SUCCESS;
  return fail(HORA_ERR_CUDA, line, "%s: kernel launch failed: %s (%s)", kernel, cudaGetErrorString(e),
              cudaGetErrorName(e));
}
#define LAUNCHED(kernel) launched((kernel), __LINE__)
#define CALL(call) ([&]() -> hora_result_t { cudaError_t e_ = (call); \
                     return e_ == cudaSuccess ? HORA_SUCCESS : cuda_fail(e_, #call, __LINE__); }())

#define GRID_STRIDE(i, count) \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (count); i += (size_t)gridDim.x * blockDim.x)

__global__ void k_im2col(hora_conv_shape_t s, const float *x, float *col, size_t count) {
  GRID_STRIDE(i, count) col[i] = hora_body_im2col(s, x, i);
}
__global__ void k_col2im(hora_conv_shape_t s, const float *dcol, float *dx, size_t count) {
  GRID_STRIDE(i, count) dx[i] = hora_body_col2im(s, dcol, i);
}
__global__ void k_bias_act(float *y, const float *bias, int k, int relu, size_t count) {
  GRID_STRIDE(i, count) y[i] = hora_body_bias_act(y, bias, k, relu, i);
}
/* Bias gradient: one block per channel (grid-stride over channels); each thread sums one residue
 * class of rows, then the block adds the partial sums in the tree of hora_body_tree_sum. The
 * m rows of a conv layer (n*oh*ow, 43264 for conv1 at batch 64) are spread over the block instead
 * of one thread walking them all. */
static_assert(kThreads > 0 && (kThreads & (kThreads - 1)) == 0,
              "k_col_sum and k_xent halve the block in their trees: kThreads must be a power of two");
__global__ void k_col_sum(const float *dy, size_t m, int k, float *dbias) {
  __shared__ double part[kThreads];
  for (size_t j = blockIdx.x; j < (size_t)k; j += gridDim.x) {
    part[threadIdx.x] = hora_body_col_sum_part(dy, m, k, (int)j, threadIdx.x, blockDim.x);
    __syncthreads();
    for (unsigned h = blockDim.x / 2; h > 0; h /= 2) {
      if (threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
      __syncthreads();
    }
    if (threadIdx.x == 0) dbias[j] = (float)part[0];
    __syncthreads();
  }
}
hora_result_t col_sum(const float *dy, size_t m, int k, float *dbias) {
  k_col_sum<<<(unsigned)(k < 65535 ? k : 65535), kThreads>>>(dy, m, k, dbias);
  return LAUNCHED("k_col_sum");
}
__global__ void k_relu_bwd(const float *y, float *dy, size_t count) {
  GRID_STRIDE(i, count) dy[i] = hora_body_relu_bwd(y, dy, i);
}
__global__ void k_pool_fwd(const float *x, int h, int w, int c, float *y, uint8_t *arg, size_t count) {
  GRID_STRIDE(o, count) hora_body_maxpool2_fwd(x, h, w, c, o, y, arg);
}
__global__ void k_pool_bwd(const float *dy, const uint8_t *arg, const float *x, int h, int w, int c,
                           float *dx, size_t count) {
  GRID_STRIDE(i, count) dx[i] = hora_body_maxpool2_bwd(dy, arg, x, h, w, c, i);
}
__global__ void k_dropout_fwd(const float *x, float *y, uint8_t *keep, float p, float scale,
                              uint64_t seed, size_t count) {
  GRID_STRIDE(i, count) hora_body_dropout_fwd(x, y, keep, p, scale, seed, i);
}
__global__ void k_dropout_bwd(const float *dy, const uint8_t *keep, float scale, float *dx, size_t count) {
  GRID_STRIDE(i, count) dx[i] = hora_body_dropout_bwd(dy, keep, scale, i);
}
__global__ void k_sgd(float *p, const float *g, float *vel, float lr, float mom, size_t count) {
  GRID_STRIDE(i, count) hora_body_sgd(p, g, vel, lr, mom, i);
}
__global__ void k_adam(float *p, const float *g, float *m, float *v, float lr, float b1, float b2,
                       float eps, float c1, float c2, size_t count) {
  GRID_STRIDE(i, count) hora_body_adam(p, g, m, v, lr, b1, b2, eps, c1, c2, i);
}
__global__ void k_init(float *w, float limit, uint64_t seed, size_t count) {
  GRID_STRIDE(i, count) w[i] = hora_body_init_uniform(limit, seed, i);
}

/* Softmax cross-entropy in one block: the labels are checked first (nothing is written when one
 * is out of range), then one row per thread; the block sums the rows' losses and counts in shared
 * memory and writes them to out (out->bad = 1 for a bad label). One block is plenty for the
 * example's batch sizes (rows of 10 classes). */
struct xent_out {
  double loss;
  unsigned long long correct;
  int bad;
};
__global__ void k_xent(const float *z, const uint8_t *labels, size_t n, int classes, float scale,
                       float *d, xent_out *out) {
  __shared__ double s_loss[kThreads];
  __shared__ unsigned long long s_ok[kThreads];
  __shared__ int s_bad;
  if (threadIdx.x == 0) s_bad = 0;
  __syncthreads();
  for (size_t r = threadIdx.x; r < n; r += blockDim.x)
    if (labels[r] >= classes) s_bad = 1;
  __syncthreads();
  if (s_bad) {
    if (threadIdx.x == 0) out->bad = 1, out->loss = 0, out->correct = 0;
    return;
  }
  double loss = 0;
  unsigned long long ok = 0;
  for (size_t r = threadIdx.x; r < n; r += blockDim.x) {
    int o;
    loss += hora_body_xent_row(z + r * classes, labels[r], classes, scale, &o,
                               d ? d + r * classes : NULL);
    ok += (unsigned long long)o;
  }
  s_loss[threadIdx.x] = loss;
  s_ok[threadIdx.x] = ok;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      s_loss[threadIdx.x] += s_loss[threadIdx.x + half];
      s_ok[threadIdx.x] += s_ok[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out->bad = 0, out->loss = s_loss[0], out->correct = s_ok[0];
}
__device__ xent_out g_xent_out;

/* One cuBLAS handle per device ordinal, created on first use, bound to the legacy default stream.
 * Creating a handle costs milliseconds, so it is kept for the process's life. */
pthread_mutex_t g_blas_mu = PTHREAD_MUTEX_INITIALIZER;
cublasHandle_t g_blas[64];

const char *blas_name(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
  }
}

hora_result_t blas_fail(cublasStatus_t st, const char *what, int line) {
  return fail(HORA_ERR_CUDA, line, "%s: %s (%d)", what, blas_name(st), (int)st);
}

hora_result_t blas_handle(cublasHandle_t *h) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cuda_fail(e, "cudaGetDevice", __LINE__);
  if (dev < 0 || dev >= 64) return fail(HORA_ERR_CUDA, __LINE__, "device ordinal %d >= 64", dev);
  pthread_mutex_lock(&g_blas_mu);
  hora_result_t rc = HORA_SUCCESS;
  if (!g_blas[dev]) {
    cublasStatus_t st = cublasCreate(&g_blas[dev]);
    if (st != CUBLAS_STATUS_SUCCESS) {
      g_blas[dev] = NULL;
      rc = blas_fail(st, "cublasCreate", __LINE__);
    } else if ((st = cublasSetStream(g_blas[dev], 0)) != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(g_blas[dev]);
      g_blas[dev] = NULL;
      rc = blas_fail(st, "cublasSetStream", __LINE__);
    }
  }
  *h = g_blas[dev];
  pthread_mutex_unlock(&g_blas_mu);
  return rc;
}

/* The row-major product g (the host kernels' cblas_sgemm(CblasRowMajor, ...) call, built by the
 * hora_body_gemm_* functions) as the column-major cublasSgemm of hora_body_gemm_cm. */
hora_result_t gemm(hora_body_gemm_t g) {
  cublasHandle_t h;
  hora_result_t rc = blas_handle(&h);
  if (rc != HORA_SUCCESS) return rc;
  const hora_body_gemm_t c = hora_body_gemm_cm(g);
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t st = cublasSgemm(h, c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, c.tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  c.m, c.n, c.k, &one, c.a, c.lda, c.b, c.ldb, &zero, c.c, c.ldc);
  if (st != CUBLAS_STATUS_SUCCESS) return blas_fail(st, "cublasSgemm", __LINE__);
  return HORA_SUCCESS;
}

#define LAUNCH(kernel, work, ...)                                  \
  do {                                                             \
    kernel<<<blocks_for(work), kThreads>>>(__VA_ARGS__);           \
    hora_result_t rc_ = LAUNCHED(#kernel);                         \
    if (rc_ != HORA_SUCCESS) return rc_;                           \
  } while (0)
#define TRY(call)                                \
  do {                                           \
    hora_result_t rc_ = (call);                  \
    if (rc_ != HORA_SUCCESS) return rc_;         \
  } while (0)

}  // namespace

extern "C" {

const char *hora__layers_cuda_last_error(void) { return g_err; }

hora_result_t hora__conv2d_fwd_cuda(const hora_conv_shape_t *s, const float *x, const float *wt,
                                    const float *bias, int relu, float *col, float *y) {
  if (!hora_body_conv_ok(s) || !x || !wt || !bias || !col || !y) return BAD;
  const int oh = s->h - s->kh + 1, ow = s->w - s->kw + 1, kk = s->kh * s->kw * s->c;
  const int m = (int)(s->n * (size_t)oh * ow);
  const size_t cn = (size_t)m * kk, yn = (size_t)m * s->k;
  LAUNCH(k_im2col, cn, *s, x, col, cn);
  TRY(gemm(hora_body_gemm_conv_fwd(s, col, wt, y)));
  LAUNCH(k_bias_act, yn, y, bias, s->k, relu, yn);
  return HORA_SUCCESS;
}

hora_result_t hora__conv2d_bwd_cuda(const hora_conv_shape_t *s, const float *col, const float *dy,
                                    const float *wt, float *dwt, float *dbias, float *dcol,
                                    float *dx) {
  if (!hora_body_conv_ok(s) || !col || !dy || !wt || !dwt || !dbias || (dx && !dcol)) return BAD;
  const int m = (int)(s->n * (size_t)(s->h - s->kh + 1) * (size_t)(s->w - s->kw + 1));
  TRY(gemm(hora_body_gemm_conv_dwt(s, dy, col, dwt)));
  TRY(col_sum(dy, (size_t)m, s->k, dbias));
  if (dx) {
    TRY(gemm(hora_body_gemm_conv_dcol(s, dy, wt, dcol)));
    const size_t xn = s->n * (size_t)s->h * s->w * s->c;
    LAUNCH(k_col2im, xn, *s, dcol, dx, xn);
  }
  return HORA_SUCCESS;
}

hora_result_t hora__relu_bwd_cuda(const float *y, float *dy, size_t count) {
  if (count && (!y || !dy)) return BAD;
  if (count) LAUNCH(k_relu_bwd, count, y, dy, count);
  return HORA_SUCCESS;
}

hora_result_t hora__maxpool2_fwd_cuda(const float *x, size_t n, int h, int w, int c, float *y,
                                      uint8_t *arg) {
  if (!hora_body_pool_ok(n, h, w, c) || !x || !y || !arg) return BAD;
  const size_t yn = n * (size_t)(h / 2) * (w / 2) * c;
  LAUNCH(k_pool_fwd, yn, x, h, w, c, y, arg, yn);
  return HORA_SUCCESS;
}

hora_result_t hora__maxpool2_bwd_cuda(const float *dy, const uint8_t *arg, size_t n, int h, int w,
                                      int c, float *dx) {
  if (!hora_body_pool_ok(n, h, w, c) || !dy || !arg || !dx) return BAD;
  const size_t xn = n * (size_t)h * w * c;
  LAUNCH(k_pool_bwd, xn, dy, arg, (const float *)NULL, h, w, c, dx, xn);
  return HORA_SUCCESS;
}

hora_result_t hora__maxpool2_relu_bwd_cuda(const float *dy, const uint8_t *arg, const float *x,
                                           size_t n, int h, int w, int c, float *dx) {
  if (!hora_body_pool_ok(n, h, w, c) || !dy || !arg || !x || !dx) return BAD;
  const size_t xn = n * (size_t)h * w * c;
  LAUNCH(k_pool_bwd, xn, dy, arg, x, h, w, c, dx, xn);
  return HORA_SUCCESS;
}

hora_result_t hora__dropout_fwd_cuda(const float *x, float *y, uint8_t *keep, size_t count, float p,
                                     uint64_t seed) {
  if (!(p >= 0.0f && p < 1.0f) || (count && (!x || !y || !keep))) return BAD;
  if (count) LAUNCH(k_dropout_fwd, count, x, y, keep, p, 1.0f / (1.0f - p), seed, count);
  return HORA_SUCCESS;
}

hora_result_t hora__dropout_bwd_cuda(const float *dy, const uint8_t *keep, size_t count, float p,
                                     float *dx) {
  if (!(p >= 0.0f && p < 1.0f) || (count && (!dy || !keep || !dx))) return BAD;
  if (count) LAUNCH(k_dropout_bwd, count, dy, keep, 1.0f / (1.0f - p), dx, count);
  return HORA_SUCCESS;
}

hora_result_t hora__dense_fwd_cuda(const float *x, size_t n, int in, const float *wt,
                                   const float *bias, int out, float *y) {
  if (!hora_body_dense_ok(n, in, out) || !x || !wt || !bias || !y) return BAD;
  TRY(gemm(hora_body_gemm_dense_fwd(x, n, in, wt, out, y)));
  const size_t yn = n * (size_t)out;
  LAUNCH(k_bias_act, yn, y, bias, out, 0, yn);
  return HORA_SUCCESS;
}

hora_result_t hora__dense_bwd_cuda(const float *x, const float *dy, size_t n, int in,
                                   const float *wt, int out, float *dwt, float *dbias, float *dx) {
  if (!hora_body_dense_ok(n, in, out) || !x || !dy || !wt || !dwt || !dbias) return BAD;
  TRY(gemm(hora_body_gemm_dense_dwt(x, dy, n, in, out, dwt)));
  TRY(col_sum(dy, n, out, dbias));
  if (dx) TRY(gemm(hora_body_gemm_dense_dx(dy, n, in, wt, out, dx)));
  return HORA_SUCCESS;
}

hora_result_t hora__softmax_xent_cuda(const float *logits, const uint8_t *labels, size_t n,
                                      int classes, float grad_scale, double *loss_sum,
                                      size_t *correct, float *dlogits) {
  if (n == 0 || classes <= 0 || !logits || !labels || !loss_sum || !correct) return BAD;
  xent_out *out = NULL;
  TRY(CALL(cudaGetSymbolAddress((void **)&out, g_xent_out)));
  k_xent<<<1, kThreads>>>(logits, labels, n, classes, grad_scale, dlogits, out);
  TRY(LAUNCHED("k_xent"));
  xent_out h;
  /* a synchronous copy on the legacy default stream: waits for the kernel */
  TRY(CALL(cudaMemcpy(&h, out, sizeof h, cudaMemcpyDeviceToHost)));
  if (h.bad) return fail(BAD, __LINE__, "softmax_xent_cuda: a label is >= classes (%d)", classes);
  *loss_sum = h.loss;
  *correct = (size_t)h.correct;
  return HORA_SUCCESS;
}

hora_result_t hora__sgd_momentum_cuda(float *param, const float *grad, float *velocity,
                                      size_t count, float lr, float momentum) {
  if (count && (!param || !grad || !velocity)) return BAD;
  if (count) LAUNCH(k_sgd, count, param, grad, velocity, lr, momentum, count);
  return HORA_SUCCESS;
}

hora_result_t hora__adam_cuda(float *param, const float *grad, float *m, float *v, size_t count,
                              float lr, float beta1, float beta2, float eps, int64_t t) {
  if (t < 1 || (count && (!param || !grad || !m || !v))) return BAD;
  float c1, c2;
  hora_body_adam_scales(beta1, beta2, t, &c1, &c2);
  if (count) LAUNCH(k_adam, count, param, grad, m, v, lr, beta1, beta2, eps, c1, c2, count);
  return HORA_SUCCESS;
}

hora_result_t hora__init_uniform_cuda(float *w, size_t count, float limit, uint64_t seed) {
  if (count && !w) return BAD;
  if (!(limit >= 0.0f)) return BAD;
  if (count) LAUNCH(k_init, count, w, limit, seed, count);
  return HORA_SUCCESS;
}

}  // extern "C"
