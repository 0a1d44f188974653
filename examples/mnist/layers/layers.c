/* Host layer kernels of the example convnet (see hora_layers.h): im2col + OpenBLAS sgemm for the
 * convolutions and the dense layer, plain loops for the rest. Matrix products go to OpenBLAS
 * (a well-kept, tuned GEMM) rather than our own; the loops around them are simple enough to
 * keep here. Built into hora_layers (not libhora): only the example and its tests link it. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "hora_layers.h"
/* The optimizers' and the initializer's per-element formulas are the ones the CUDA kernels use
 * (one definition for both paths; the index-heavy kernels stay separate so that
 * tests/unit/test_layers_body.c checks the device's index math against an independent host). */
#include "layers_body.h"

#define BAD HORA_ERR_INVALID_ARGUMENT

static int conv_ok(const hora_conv_shape_t *s) {
  if (!s || s->n == 0 || s->h <= 0 || s->w <= 0 || s->c <= 0 || s->k <= 0 || s->kh <= 0 ||
      s->kw <= 0 || s->kh > s->h || s->kw > s->w)
    return 0;
  size_t oh = (size_t)(s->h - s->kh + 1), ow = (size_t)(s->w - s->kw + 1);
  size_t kk = (size_t)s->kh * s->kw * s->c;
  if (kk > INT_MAX || s->n > INT_MAX / (oh * ow)) return 0;
  size_t m = s->n * oh * ow;
  /* col and y element counts must fit size_t and the BLAS int per dimension (checked above). */
  return m <= SIZE_MAX / (kk > (size_t)s->k ? kk : (size_t)s->k);
}

size_t hora__conv2d_out_count(const hora_conv_shape_t *s) {
  if (!conv_ok(s)) return 0;
  return s->n * (size_t)(s->h - s->kh + 1) * (size_t)(s->w - s->kw + 1) * (size_t)s->k;
}

size_t hora__conv2d_col_count(const hora_conv_shape_t *s) {
  if (!conv_ok(s)) return 0;
  return s->n * (size_t)(s->h - s->kh + 1) * (size_t)(s->w - s->kw + 1) *
         ((size_t)s->kh * s->kw * s->c);
}

/* Copies n floats; short runs (conv1 has runs of 3) are copied inline, since a memcpy call per
 * 12 bytes costs more than the copy. */
static inline void copy_run(float *restrict d, const float *restrict s, size_t n) {
  if (n <= 8) {
    for (size_t i = 0; i < n; i++) d[i] = s[i];
  } else {
    memcpy(d, s, n * sizeof(float));
  }
}

/* im2col, NHWC: row (b, oy, ox) holds, for ky = 0..kh-1, the kw*c contiguous input values
 * x[b][oy+ky][ox .. ox+kw-1][0 .. c-1]: one run copy per (row, ky). */
static void im2col(const hora_conv_shape_t *s, const float *x, float *col) {
  const int oh = s->h - s->kh + 1, ow = s->w - s->kw + 1;
  const size_t run = (size_t)s->kw * s->c, rowlen = run * s->kh;
  const size_t img = (size_t)s->h * s->w * s->c, line = (size_t)s->w * s->c;
  for (size_t b = 0; b < s->n; b++) {
    const float *xb = x + b * img;
    for (int oy = 0; oy < oh; oy++)
      for (int ox = 0; ox < ow; ox++) {
        float *r = col + ((b * oh + oy) * ow + ox) * rowlen;
        const float *src = xb + (size_t)oy * line + (size_t)ox * s->c;
        for (int ky = 0; ky < s->kh; ky++) copy_run(r + ky * run, src + ky * line, run);
      }
  }
}

/* col2im: the adjoint of im2col; every row's runs are added back onto the input positions they
 * were copied from. */
static void col2im(const hora_conv_shape_t *s, const float *dcol, float *dx) {
  const int oh = s->h - s->kh + 1, ow = s->w - s->kw + 1;
  const size_t run = (size_t)s->kw * s->c, rowlen = run * s->kh;
  const size_t img = (size_t)s->h * s->w * s->c, line = (size_t)s->w * s->c;
  memset(dx, 0, s->n * img * sizeof(float));
  for (size_t b = 0; b < s->n; b++) {
    float *xb = dx + b * img;
    for (int oy = 0; oy < oh; oy++)
      for (int ox = 0; ox < ow; ox++) {
        const float *r = dcol + ((b * oh + oy) * ow + ox) * rowlen;
        float *dst = xb + (size_t)oy * line + (size_t)ox * s->c;
        for (int ky = 0; ky < s->kh; ky++) {
          float *d = dst + ky * line;
          const float *q = r + ky * run;
          for (size_t i = 0; i < run; i++) d[i] += q[i];
        }
      }
  }
}

/* y[m][j] = act(y[m][j] + bias[j]) over an M x k matrix. */
static void bias_act(float *y, size_t m, int k, const float *bias, int relu) {
  for (size_t r = 0; r < m; r++) {
    float *yr = y + r * (size_t)k;
    if (relu)
      for (int j = 0; j < k; j++) {
        float v = yr[j] + bias[j];
        yr[j] = v > 0.0f ? v : 0.0f;
      }
    else
      for (int j = 0; j < k; j++) yr[j] += bias[j];
  }
}

/* dbias[j] = sum over rows of dy[r][j]; accumulated in double so the sum over a large batch
 * does not depend on float rounding more than needed. */
static void col_sums(const float *dy, size_t m, int k, float *dbias) {
  double acc[k];
  for (int j = 0; j < k; j++) acc[j] = 0.0;
  for (size_t r = 0; r < m; r++) {
    const float *d = dy + r * (size_t)k;
    for (int j = 0; j < k; j++) acc[j] += d[j];
  }
  for (int j = 0; j < k; j++) dbias[j] = (float)acc[j];
}

hora_result_t hora__conv2d_fwd_host(const hora_conv_shape_t *s, const float *x, const float *wt,
                                    const float *bias, int relu, float *col, float *y) {
  if (!conv_ok(s) || !x || !wt || !bias || !col || !y) return BAD;
  const int oh = s->h - s->kh + 1, ow = s->w - s->kw + 1, kk = s->kh * s->kw * s->c;
  const int m = (int)(s->n * (size_t)oh * ow);
  im2col(s, x, col);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, s->k, kk, 1.0f, col, kk, wt, kk, 0.0f,
              y, s->k);
  bias_act(y, (size_t)m, s->k, bias, relu);
  return HORA_SUCCESS;
}

hora_result_t hora__conv2d_bwd_host(const hora_conv_shape_t *s, const float *col, const float *dy,
                                    const float *wt, float *dwt, float *dbias, float *dcol,
                                    float *dx) {
  if (!conv_ok(s) || !col || !dy || !wt || !dwt || !dbias || (dx && !dcol)) return BAD;
  const int oh = s->h - s->kh + 1, ow = s->w - s->kw + 1, kk = s->kh * s->kw * s->c;
  const int m = (int)(s->n * (size_t)oh * ow);
  /* dwt [k x K] = dy^T [k x M] * col [M x K] */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s->k, kk, m, 1.0f, dy, s->k, col, kk, 0.0f,
              dwt, kk);
  col_sums(dy, (size_t)m, s->k, dbias);
  if (dx) {
    /* dcol [M x K] = dy [M x k] * wt [k x K] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, kk, s->k, 1.0f, dy, s->k, wt, kk,
                0.0f, dcol, kk);
    col2im(s, dcol, dx);
  }
  return HORA_SUCCESS;
}

hora_result_t hora__relu_bwd_host(const float *y, float *dy, size_t count) {
  if (count && (!y || !dy)) return BAD;
  for (size_t i = 0; i < count; i++) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  return HORA_SUCCESS;
}

static int pool_ok(size_t n, int h, int w, int c) {
  return n > 0 && h >= 2 && w >= 2 && c > 0 && n <= SIZE_MAX / ((size_t)h * w * c);
}

hora_result_t hora__maxpool2_fwd_host(const float *x, size_t n, int h, int w, int c, float *y,
                                      uint8_t *arg) {
  if (!pool_ok(n, h, w, c) || !x || !y || !arg) return BAD;
  const int ph = h / 2, pw = w / 2;
  const size_t line = (size_t)w * c;
  for (size_t b = 0; b < n; b++)
    for (int py = 0; py < ph; py++)
      for (int px = 0; px < pw; px++) {
        const float *x0 = x + b * h * line + (size_t)(2 * py) * line + (size_t)(2 * px) * c;
        const float *q[4] = {x0, x0 + c, x0 + line, x0 + line + c};
        size_t o = ((b * ph + py) * pw + px) * (size_t)c;
        for (int ch = 0; ch < c; ch++) {
          float best = q[0][ch];
          uint8_t bi = 0;
          for (uint8_t t = 1; t < 4; t++)
            if (q[t][ch] > best) {
              best = q[t][ch];
              bi = t;
            }
          y[o + ch] = best;
          arg[o + ch] = bi;
        }
      }
  return HORA_SUCCESS;
}

/* Writes every window in full (winner dy, the others 0) instead of clearing dx first and
 * scattering: one sequential pass over dx. x non-NULL: the pooled input was a ReLU output, and
 * the ReLU's backward is fused in (a winner whose value is not > 0 passes 0). */
static void pool_bwd(const float *dy, const uint8_t *arg, const float *x, size_t n, int h, int w,
                     int c, float *dx) {
  const int ph = h / 2, pw = w / 2;
  const size_t line = (size_t)w * c;
  for (size_t b = 0; b < n; b++) {
    for (int py = 0; py < ph; py++) {
      size_t row0 = b * h * line + (size_t)(2 * py) * line;
      for (int px = 0; px < pw; px++) {
        size_t o = ((b * ph + py) * pw + px) * (size_t)c;
        float *q[4];
        q[0] = dx + row0 + (size_t)(2 * px) * c;
        q[1] = q[0] + c;
        q[2] = q[0] + line;
        q[3] = q[2] + c;
        for (int ch = 0; ch < c; ch++) {
          uint8_t t = arg[o + ch];
          float g = dy[o + ch];
          if (x && !(x[(size_t)(q[t] - dx) + ch] > 0.0f)) g = 0.0f;
          q[0][ch] = t == 0 ? g : 0.0f;
          q[1][ch] = t == 1 ? g : 0.0f;
          q[2][ch] = t == 2 ? g : 0.0f;
          q[3][ch] = t == 3 ? g : 0.0f;
        }
      }
      if (w & 1) { /* the last column of both rows is in no window */
        memset(dx + row0 + (size_t)(w - 1) * c, 0, c * sizeof(float));
        memset(dx + row0 + line + (size_t)(w - 1) * c, 0, c * sizeof(float));
      }
    }
    if (h & 1) memset(dx + b * h * line + (size_t)(h - 1) * line, 0, line * sizeof(float));
  }
}

hora_result_t hora__maxpool2_bwd_host(const float *dy, const uint8_t *arg, size_t n, int h, int w,
                                      int c, float *dx) {
  if (!pool_ok(n, h, w, c) || !dy || !arg || !dx) return BAD;
  pool_bwd(dy, arg, NULL, n, h, w, c, dx);
  return HORA_SUCCESS;
}

hora_result_t hora__maxpool2_relu_bwd_host(const float *dy, const uint8_t *arg, const float *x,
                                           size_t n, int h, int w, int c, float *dx) {
  if (!pool_ok(n, h, w, c) || !dy || !arg || !x || !dx) return BAD;
  pool_bwd(dy, arg, x, n, h, w, c, dx);
  return HORA_SUCCESS;
}

uint64_t hora__rng_u64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float hora__rng_uniform(uint64_t seed, uint64_t i) {
  return (float)(hora__rng_u64(seed, i) >> 40) * (1.0f / 16777216.0f);
}

hora_result_t hora__dropout_fwd_host(const float *x, float *y, uint8_t *keep, size_t count,
                                     float p, uint64_t seed) {
  if (!(p >= 0.0f && p < 1.0f) || (count && (!x || !y || !keep))) return BAD;
  const float scale = 1.0f / (1.0f - p);
  for (size_t i = 0; i < count; i++) {
    uint8_t k = hora__rng_uniform(seed, i) >= p;
    keep[i] = k;
    y[i] = k ? x[i] * scale : 0.0f;
  }
  return HORA_SUCCESS;
}

hora_result_t hora__dropout_bwd_host(const float *dy, const uint8_t *keep, size_t count, float p,
                                     float *dx) {
  if (!(p >= 0.0f && p < 1.0f) || (count && (!dy || !keep || !dx))) return BAD;
  const float scale = 1.0f / (1.0f - p);
  for (size_t i = 0; i < count; i++) dx[i] = keep[i] ? dy[i] * scale : 0.0f;
  return HORA_SUCCESS;
}

static int dense_ok(size_t n, int in, int out) {
  return n > 0 && n <= INT_MAX && in > 0 && out > 0;
}

hora_result_t hora__dense_fwd_host(const float *x, size_t n, int in, const float *wt,
                                   const float *bias, int out, float *y) {
  if (!dense_ok(n, in, out) || !x || !wt || !bias || !y) return BAD;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, out, in, 1.0f, x, in, wt, in, 0.0f,
              y, out);
  bias_act(y, n, out, bias, 0);
  return HORA_SUCCESS;
}

hora_result_t hora__dense_bwd_host(const float *x, const float *dy, size_t n, int in,
                                   const float *wt, int out, float *dwt, float *dbias, float *dx) {
  if (!dense_ok(n, in, out) || !x || !dy || !wt || !dwt || !dbias) return BAD;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, (int)n, 1.0f, dy, out, x, in, 0.0f,
              dwt, in);
  col_sums(dy, n, out, dbias);
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, in, out, 1.0f, dy, out, wt, in,
                0.0f, dx, in);
  return HORA_SUCCESS;
}

hora_result_t hora__softmax_xent_host(const float *logits, const uint8_t *labels, size_t n,
                                      int classes, float grad_scale, double *loss_sum,
                                      size_t *correct, float *dlogits) {
  if (n == 0 || classes <= 0 || !logits || !labels || !loss_sum || !correct) return BAD;
  for (size_t r = 0; r < n; r++)
    if (labels[r] >= classes) return BAD;
  double loss = 0.0;
  size_t ok = 0;
  for (size_t r = 0; r < n; r++) {
    const float *z = logits + r * (size_t)classes;
    int am = 0;
    for (int j = 1; j < classes; j++)
      if (z[j] > z[am]) am = j;
    ok += am == labels[r];
    double sum = 0.0;
    for (int j = 0; j < classes; j++) sum += exp((double)z[j] - z[am]);
    double lse = log(sum) + z[am];
    loss += lse - z[labels[r]];
    if (dlogits) {
      float *d = dlogits + r * (size_t)classes;
      for (int j = 0; j < classes; j++)
        d[j] = (float)((exp((double)z[j] - lse) - (j == labels[r])) * grad_scale);
    }
  }
  *loss_sum = loss;
  *correct = ok;
  return HORA_SUCCESS;
}

hora_result_t hora__sgd_momentum_host(float *param, const float *grad, float *velocity,
                                      size_t count, float lr, float momentum) {
  if (count && (!param || !grad || !velocity)) return BAD;
  for (size_t i = 0; i < count; i++) hora_body_sgd(param, grad, velocity, lr, momentum, i);
  return HORA_SUCCESS;
}

hora_result_t hora__adam_host(float *param, const float *grad, float *m, float *v, size_t count,
                              float lr, float beta1, float beta2, float eps, int64_t t) {
  if (t < 1 || (count && (!param || !grad || !m || !v))) return BAD;
  float c1, c2;
  hora_body_adam_scales(beta1, beta2, t, &c1, &c2);
  for (size_t i = 0; i < count; i++) hora_body_adam(param, grad, m, v, lr, beta1, beta2, eps, c1, c2, i);
  return HORA_SUCCESS;
}

hora_result_t hora__init_uniform_host(float *w, size_t count, float limit, uint64_t seed) {
  if (count && !w) return BAD;
  if (!(limit >= 0.0f)) return BAD;
  for (size_t i = 0; i < count; i++) w[i] = hora_body_init_uniform(limit, seed, i);
  return HORA_SUCCESS;
}
