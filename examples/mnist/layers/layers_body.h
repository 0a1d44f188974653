/* The per-element (or per-output) work of every layer kernel of hora_layers.h, shared by the CUDA
 * kernels (examples/mnist/layers/layers.cu, one thread per element in a grid-stride loop) and the CPU unit
 * test tests/unit/test_layers_body.c, which drives each function with a plain host loop over all
 * indices and compares with the _host kernels (examples/mnist/layers/layers.c). That test is what checks the
 * index math of the device path on a machine without a GPU.
 *
 * Plain C99 (and valid C++ for nvcc): HORA_HD is __host__ __device__ under nvcc and empty in C.
 * Each function computes one output element from its index, in the same arithmetic order as the
 * host kernel wherever that is possible, so the results are bit-identical to the host's (under
 * nvcc only with --fmad=false, which examples/CMakeLists.txt sets for layers.cu). Exceptions, also
 * stated at the function: the softmax loss uses exp/log in double (CUDA's double exp/log are
 * within 1-2 ulp of glibc's) and the device sums the rows' losses in a different order.
 *
 * Layouts and shapes are those of hora_layers.h (NHWC activations, [k][kh][kw][c] conv weights,
 * [out][in] dense weights, valid stride-1 convolutions, 2x2 stride-2 pooling). Internal to the
 * layer kernels and their tests. */
#ifndef HORA_LAYERS_BODY_H
#define HORA_LAYERS_BODY_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "hora_layers.h"

#ifdef __CUDACC__
#define HORA_HD __host__ __device__
#else
#define HORA_HD
#endif

/* ---- shape checks (the same conditions as examples/mnist/layers/layers.c) ---- */

static inline int hora_body_conv_ok(const hora_conv_shape_t *s) {
  if (!s || s->n == 0 || s->h <= 0 || s->w <= 0 || s->c <= 0 || s->k <= 0 || s->kh <= 0 ||
      s->kw <= 0 || s->kh > s->h || s->kw > s->w)
    return 0;
  size_t oh = (size_t)(s->h - s->kh + 1), ow = (size_t)(s->w - s->kw + 1);
  size_t kk = (size_t)s->kh * s->kw * s->c;
  if (kk > 0x7fffffff || s->n > 0x7fffffff / (oh * ow)) return 0;
  size_t m = s->n * oh * ow;
  return m <= SIZE_MAX / (kk > (size_t)s->k ? kk : (size_t)s->k);
}

static inline int hora_body_pool_ok(size_t n, int h, int w, int c) {
  return n > 0 && h >= 2 && w >= 2 && c > 0 && n <= SIZE_MAX / ((size_t)h * w * c);
}

static inline int hora_body_dense_ok(size_t n, int in, int out) {
  return n > 0 && n <= 0x7fffffff && in > 0 && out > 0;
}

/* ---- matrix products ----
 * Each layer's product is stated once here, in the row-major form of the host kernels'
 * cblas_sgemm(CblasRowMajor, ...) call; hora_body_gemm_cm turns it into the arguments of the
 * column-major cublasSgemm of layers.cu. The unit test runs both forms through OpenBLAS
 * (CblasRowMajor and CblasColMajor) and compares them with the host kernels, so the operand swap,
 * the transposes, m/n/k and the leading dimensions of the device path are checked without a GPU. */

/* C [m x n] = op(A) [m x k] * op(B) [k x n], row-major, leading dimensions in elements. */
typedef struct {
  int ta, tb; /* 1: op(X) = X^T */
  int m, n, k;
  const float *a;
  int lda;
  const float *b;
  int ldb;
  float *c;
  int ldc;
} hora_body_gemm_t;

/* The column-major form of g: C^T [n x m] = op(B)^T * op(A)^T. A row-major matrix read as
 * column-major is its transpose, so the operands swap places (each keeps its own transpose flag
 * and leading dimension) and m and n swap; C's leading dimension is unchanged. */
static inline hora_body_gemm_t hora_body_gemm_cm(hora_body_gemm_t g) {
  hora_body_gemm_t c = {g.tb, g.ta, g.n, g.m, g.k, g.b, g.ldb, g.a, g.lda, g.c, g.ldc};
  return c;
}

/* conv forward: y [m x k] = col [m x kk] * wt^T (wt [k x kk]); m = n*oh*ow, kk = kh*kw*c. */
static inline hora_body_gemm_t hora_body_gemm_conv_fwd(const hora_conv_shape_t *s, const float *col,
                                                       const float *wt, float *y) {
  const int m = (int)(s->n * (size_t)(s->h - s->kh + 1) * (size_t)(s->w - s->kw + 1));
  const int kk = s->kh * s->kw * s->c;
  hora_body_gemm_t g = {0, 1, m, s->k, kk, col, kk, wt, kk, y, s->k};
  return g;
}
/* conv weight gradient: dwt [k x kk] = dy^T (dy [m x k]) * col [m x kk]. */
static inline hora_body_gemm_t hora_body_gemm_conv_dwt(const hora_conv_shape_t *s, const float *dy,
                                                       const float *col, float *dwt) {
  const int m = (int)(s->n * (size_t)(s->h - s->kh + 1) * (size_t)(s->w - s->kw + 1));
  const int kk = s->kh * s->kw * s->c;
  hora_body_gemm_t g = {1, 0, s->k, kk, m, dy, s->k, col, kk, dwt, kk};
  return g;
}
/* conv input gradient (before col2im): dcol [m x kk] = dy [m x k] * wt [k x kk]. */
static inline hora_body_gemm_t hora_body_gemm_conv_dcol(const hora_conv_shape_t *s, const float *dy,
                                                        const float *wt, float *dcol) {
  const int m = (int)(s->n * (size_t)(s->h - s->kh + 1) * (size_t)(s->w - s->kw + 1));
  const int kk = s->kh * s->kw * s->c;
  hora_body_gemm_t g = {0, 0, m, kk, s->k, dy, s->k, wt, kk, dcol, kk};
  return g;
}
/* dense forward: y [n x out] = x [n x in] * wt^T (wt [out x in]). */
static inline hora_body_gemm_t hora_body_gemm_dense_fwd(const float *x, size_t n, int in,
                                                        const float *wt, int out, float *y) {
  hora_body_gemm_t g = {0, 1, (int)n, out, in, x, in, wt, in, y, out};
  return g;
}
/* dense weight gradient: dwt [out x in] = dy^T (dy [n x out]) * x [n x in]. */
static inline hora_body_gemm_t hora_body_gemm_dense_dwt(const float *x, const float *dy, size_t n,
                                                        int in, int out, float *dwt) {
  hora_body_gemm_t g = {1, 0, out, in, (int)n, dy, out, x, in, dwt, in};
  return g;
}
/* dense input gradient: dx [n x in] = dy [n x out] * wt [out x in]. */
static inline hora_body_gemm_t hora_body_gemm_dense_dx(const float *dy, size_t n, int in,
                                                       const float *wt, int out, float *dx) {
  hora_body_gemm_t g = {0, 0, (int)n, in, out, dy, out, wt, in, dx, in};
  return g;
}

/* ---- the counter-based generator (the same bits as hora__rng_u64 / hora__rng_uniform) ---- */

static inline HORA_HD uint64_t hora_body_rng_u64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline HORA_HD float hora_body_rng_uniform(uint64_t seed, uint64_t i) {
  return (float)(hora_body_rng_u64(seed, i) >> 40) * (1.0f / 16777216.0f);
}

/* ---- convolution ---- */

/* Element i of the im2col matrix col [n*oh*ow][kh*kw*c]: row r = (b, oy, ox), column
 * j = (ky, kx, ch) -> x[b][oy+ky][ox+kx][ch]. */
static inline HORA_HD float hora_body_im2col(hora_conv_shape_t s, const float *x, size_t i) {
  const size_t oh = (size_t)(s.h - s.kh + 1), ow = (size_t)(s.w - s.kw + 1);
  const size_t kk = (size_t)s.kh * s.kw * s.c;
  size_t r = i / kk, j = i % kk;
  size_t ox = r % ow, t = r / ow;
  size_t oy = t % oh, b = t / oh;
  size_t ch = j % (size_t)s.c, u = j / (size_t)s.c;
  size_t kx = u % (size_t)s.kw, ky = u / (size_t)s.kw;
  return x[((b * s.h + oy + ky) * s.w + ox + kx) * s.c + ch];
}

/* Element i of dx [n][h][w][c] = col2im(dcol), gather form: the sum of the dcol entries that were
 * copied from input position i (no atomics). The entries are added in the order the host's
 * scatter adds them (output rows ascending: ky, then kx descending), starting from 0, so the sum
 * is bit-identical to the host's. */
static inline HORA_HD float hora_body_col2im(hora_conv_shape_t s, const float *dcol, size_t i) {
  const int oh = s.h - s.kh + 1, ow = s.w - s.kw + 1;
  const size_t kk = (size_t)s.kh * s.kw * s.c;
  const int ch = (int)(i % (size_t)s.c);
  size_t t = i / (size_t)s.c;
  const int x = (int)(t % (size_t)s.w);
  t /= (size_t)s.w;
  const int y = (int)(t % (size_t)s.h);
  const size_t b = t / (size_t)s.h;
  /* oy = y - ky in [0, oh): ky in [max(0, y-oh+1), min(kh-1, y)]; likewise kx. */
  const int ky_lo = y - oh + 1 > 0 ? y - oh + 1 : 0, ky_hi = y < s.kh - 1 ? y : s.kh - 1;
  const int kx_lo = x - ow + 1 > 0 ? x - ow + 1 : 0, kx_hi = x < s.kw - 1 ? x : s.kw - 1;
  float acc = 0.0f;
  for (int ky = ky_hi; ky >= ky_lo; ky--)
    for (int kx = kx_hi; kx >= kx_lo; kx--) {
      size_t row = (b * (size_t)oh + (size_t)(y - ky)) * (size_t)ow + (size_t)(x - kx);
      acc += dcol[row * kk + ((size_t)ky * s.kw + kx) * s.c + ch];
    }
  return acc;
}

/* Element i of an M x k matrix after the bias (and ReLU) pass: act(y[i] + bias[i % k]). */
static inline HORA_HD float hora_body_bias_act(const float *y, const float *bias, int k, int relu,
                                               size_t i) {
  float v = y[i] + bias[i % (size_t)k];
  if (relu) v = v > 0.0f ? v : 0.0f;
  return v;
}

/* Part of channel j's bias gradient: the sum in double of rows first, first + stride, ... (< m) of
 * column j of dy [m][k], in row order. first 0, stride 1 is the host's col_sums exactly; the CUDA
 * kernel gives each of a block's threads one residue class (stride = threads per block) and adds
 * the partial sums in a fixed tree, so its result is deterministic but can differ from the host's
 * in the last bit of the float. */
static inline HORA_HD double hora_body_col_sum_part(const float *dy, size_t m, int k, int j,
                                                    size_t first, size_t stride) {
  double acc = 0.0;
  for (size_t r = first; r < m; r += stride) acc += dy[r * (size_t)k + (size_t)j];
  return acc;
}

/* Channel j's bias gradient in row order (the host's order). */
static inline HORA_HD float hora_body_col_sum(const float *dy, size_t m, int k, int j) {
  return (float)hora_body_col_sum_part(dy, m, k, j, 0, 1);
}

/* The tree the CUDA kernel adds a block's n (a power of two) partial sums in: v[t] += v[t + h]
 * for h = n/2, n/4, ..., 1; the total ends in v[0]. Host form, for the unit test. */
static inline double hora_body_tree_sum(double *v, unsigned n) {
  for (unsigned h = n / 2; h > 0; h /= 2)
    for (unsigned t = 0; t < h; t++) v[t] += v[t + h];
  return v[0];
}

/* ---- ReLU, pooling, dropout ---- */

static inline HORA_HD float hora_body_relu_bwd(const float *y, const float *dy, size_t i) {
  return y[i] > 0.0f ? dy[i] : 0.0f;
}

/* Output element o of 2x2 max pooling, y [n][h/2][w/2][c]: writes y[o] and arg[o] (0..3 =
 * dy*2+dx, the first max on ties, the host's comparison order). */
static inline HORA_HD void hora_body_maxpool2_fwd(const float *x, int h, int w, int c, size_t o,
                                                  float *y, uint8_t *arg) {
  const int ph = h / 2, pw = w / 2;
  const size_t ch = o % (size_t)c;
  size_t t = o / (size_t)c;
  const size_t px = t % (size_t)pw;
  t /= (size_t)pw;
  const size_t py = t % (size_t)ph, b = t / (size_t)ph;
  const size_t line = (size_t)w * c;
  const float *x0 = x + b * (size_t)h * line + 2 * py * line + 2 * px * (size_t)c + ch;
  const float q[4] = {x0[0], x0[c], x0[line], x0[line + (size_t)c]};
  float best = q[0];
  uint8_t bi = 0;
  for (uint8_t k = 1; k < 4; k++)
    if (q[k] > best) {
      best = q[k];
      bi = k;
    }
  y[o] = best;
  arg[o] = bi;
}

/* Element i of the pool's input gradient dx [n][h][w][c], gather form: dy of its window when it
 * was the window's winner, else 0 (also for the odd last row/column that no window covers).
 * x non-NULL: the ReLU backward fused in (0 where x[i] is not > 0). */
static inline HORA_HD float hora_body_maxpool2_bwd(const float *dy, const uint8_t *arg,
                                                   const float *x, int h, int w, int c,
                                                   size_t i) {
  const int ph = h / 2, pw = w / 2;
  const size_t ch = i % (size_t)c;
  size_t t = i / (size_t)c;
  const int xx = (int)(t % (size_t)w);
  t /= (size_t)w;
  const int yy = (int)(t % (size_t)h);
  const size_t b = t / (size_t)h;
  if (yy >= 2 * ph || xx >= 2 * pw) return 0.0f;
  const size_t o = ((b * (size_t)ph + (size_t)(yy / 2)) * (size_t)pw + (size_t)(xx / 2)) * c + ch;
  if (arg[o] != (uint8_t)((yy & 1) * 2 + (xx & 1))) return 0.0f;
  if (x && !(x[i] > 0.0f)) return 0.0f;
  return dy[o];
}

/* Element i of inverted dropout: writes keep[i] and y[i] (scale = 1 / (1 - p)). */
static inline HORA_HD void hora_body_dropout_fwd(const float *x, float *y, uint8_t *keep, float p,
                                                 float scale, uint64_t seed, size_t i) {
  uint8_t k = hora_body_rng_uniform(seed, i) >= p;
  float xi = x[i];
  keep[i] = k;
  y[i] = k ? xi * scale : 0.0f;
}

static inline HORA_HD float hora_body_dropout_bwd(const float *dy, const uint8_t *keep,
                                                  float scale, size_t i) {
  return keep[i] ? dy[i] * scale : 0.0f;
}

/* ---- loss ---- */

/* One row of softmax cross-entropy: returns -log softmax(z)[label] (max subtracted, in double),
 * sets *ok to 1 when the arg max (first on ties) is the label, and writes the row of dlogits
 * unless d is NULL. The label must be in [0, classes) (the caller checks). */
static inline HORA_HD double hora_body_xent_row(const float *z, int label, int classes,
                                                float grad_scale, int *ok, float *d) {
  int am = 0;
  for (int j = 1; j < classes; j++)
    if (z[j] > z[am]) am = j;
  *ok = am == label;
  double sum = 0.0;
  for (int j = 0; j < classes; j++) sum += exp((double)z[j] - z[am]);
  double lse = log(sum) + z[am];
  if (d)
    for (int j = 0; j < classes; j++)
      d[j] = (float)((exp((double)z[j] - lse) - (j == label)) * grad_scale);
  return lse - z[label];
}

/* ---- optimizers, init ---- */

/* SGD with momentum, element i (PyTorch's form: v = momentum v + g; p -= lr v). */
static inline HORA_HD void hora_body_sgd(float *param, const float *grad, float *velocity,
                                         float lr, float momentum, size_t i) {
  float v = momentum * velocity[i] + grad[i];
  velocity[i] = v;
  param[i] -= lr * v;
}

/* Adam's bias corrections of update t >= 1: c1 = 1 / (1 - beta1^t), c2 = 1 / (1 - beta2^t),
 * computed once per step on the host in double. */
static inline void hora_body_adam_scales(float beta1, float beta2, int64_t t, float *c1, float *c2) {
  *c1 = 1.0f / (float)(1.0 - pow(beta1, (double)t));
  *c2 = 1.0f / (float)(1.0 - pow(beta2, (double)t));
}

/* Adam, element i, with c1 and c2 from hora_body_adam_scales. */
static inline HORA_HD void hora_body_adam(float *param, const float *grad, float *m, float *v,
                                          float lr, float beta1, float beta2, float eps, float c1,
                                          float c2, size_t i) {
  float g = grad[i];
  float mi = beta1 * m[i] + (1.0f - beta1) * g;
  float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  param[i] -= lr * (mi * c1) / (sqrtf(vi * c2) + eps);
}

/* Element i of a uniform init in [-limit, limit). */
static inline HORA_HD float hora_body_init_uniform(float limit, uint64_t seed, size_t i) {
  return (2.0f * hora_body_rng_uniform(seed, i) - 1.0f) * limit;
}

#endif
