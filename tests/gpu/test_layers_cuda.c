/* The CUDA layer kernels (examples/mnist/layers/layers.cu) against the host layer kernels on the same
 * random inputs (odd shapes included), and a central-difference gradient check of conv, dense,
 * max-pool and softmax cross-entropy computed on the device. Outside the matrix products and the
 * bias gradients the device results must be bit-identical to the host's (the bodies are shared
 * and layers.cu is built with --fmad=false); GEMM outputs (cuBLAS vs OpenBLAS summation order)
 * and bias gradients (a tree of partial sums) within a relative 1e-4 (plus, for the GEMMs, a bound
 * that grows with the number of summed products: near()). Then the example's whole model
 * (examples/mnist/model.c) on the GPU against the same model on the CPU. Exits 77 without a GPU. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hora_layers.h"
#include "hora_test.h"
#include "hora_test_cuda.h"
#include "model.h"


static uint64_t rng_state = 4242;
static float frand(void) { return 2.0f * hora__rng_uniform(0xc0dull, rng_state++) - 1.0f; }
static int irand(int lo, int hi) { return lo + (int)(hora__rng_u64(0xabcull, rng_state++) % (uint64_t)(hi - lo + 1)); }
static float *randv(size_t n) {
  float *v = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) v[i] = frand();
  return v;
}
static void *up(const void *h, size_t bytes) {
  void *d = NULL;
  CK(cudaMalloc(&d, bytes ? bytes : 1));
  CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}
static void *dev(size_t bytes) { /* poisoned device buffer */
  void *d = NULL;
  CK(cudaMalloc(&d, bytes ? bytes : 1));
  CK(cudaMemset(d, 0xa5, bytes));
  return d;
}
static void *down(const void *d, size_t bytes) {
  void *h = malloc(bytes ? bytes : 1);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
  return h;
}
static size_t first_diff(const void *a, const void *b, size_t n, size_t es) {
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)a + i * es, (const char *)b + i * es, es)) return i;
  return (size_t)-1;
}
/* Bit-exact comparison of a device array with a host one; frees the download. */
static void same(const void *d, const void *want, size_t n, size_t es, const char *what) {
  void *got = down(d, n * es);
  size_t i = first_diff(got, want, n, es);
  EXPECT(i == (size_t)-1, "%s: element %zu of %zu differs from the host's", what, i, n);
  free(got);
}
/* GEMM outputs, sums of `terms` products of values in [-1, 1]:
 * |a - b| <= 1e-4 * (1 + |b|) + 1e-7 * terms. Two summation orders of K such products differ by
 * about 1.2e-8 * K (float rounding of partial sums that grow like sqrt(K)), which for an output
 * near 0 of conv1's weight gradient (K = 2704 rows at batch 4) is close to 1e-4; the second term
 * keeps such outputs about 9 standard deviations inside the bound. A wrong operand, transpose or
 * size is off by the size of the outputs themselves. */
static void near(const float *d, const float *want, size_t n, double terms, const char *what) {
  float *got = down(d, n * 4);
  size_t bad = 0, first = 0;
  const float floor = (float)(1e-7 * terms);
  for (size_t i = 0; i < n; i++)
    if (!(fabsf(got[i] - want[i]) <= 1e-4f * (1.0f + fabsf(want[i])) + floor)) first = bad++ ? first : i;
  EXPECT(bad == 0, "%s: %zu of %zu elements off (first %zu: %g vs %g)", what, bad, n, first,
         bad ? got[first] : 0.0f, bad ? want[first] : 0.0f);
  free(got);
}
static double dot_dev(const float *d, const float *h, size_t n) {
  float *g = down(d, n * 4);
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)g[i] * h[i];
  free(g);
  return s;
}
static int grad_ok(double num, double ana) { return fabs(num - ana) <= 2e-2 * (fabs(num) + fabs(ana)) + 2e-3; }

/* Central difference (loss(p[i] + eps) - loss(p[i] - eps)) / 2 eps of a loss computed on the
 * device, for the device element p[i], which is restored afterwards. */
typedef double (*loss_fn)(const void *ctx);
static double num_grad(float *d_p, size_t i, float eps, loss_fn loss, const void *ctx) {
  float save, v;
  CK(cudaMemcpy(&save, d_p + i, 4, cudaMemcpyDeviceToHost));
  double l[2];
  for (int sg = 0; sg < 2; sg++) {
    v = save + (sg ? -eps : eps);
    CK(cudaMemcpy(d_p + i, &v, 4, cudaMemcpyHostToDevice));
    l[sg] = loss(ctx);
  }
  CK(cudaMemcpy(d_p + i, &save, 4, cudaMemcpyHostToDevice));
  return (l[0] - l[1]) / (2 * (double)eps);
}

/* L = sum(y * dy) of one forward pass, for the gradient checks of conv, pool and dense. */
typedef struct {
  const hora_conv_shape_t *s;
  const float *x, *wt, *b, *dy;
  float *col, *y;
  uint8_t *arg;
  size_t n, yn;
  int h, w, c, in, out;
} fwd_ctx_t;
static double conv_loss(const void *p) {
  const fwd_ctx_t *f = p;
  EXPECT_OK(hora__conv2d_fwd_cuda(f->s, f->x, f->wt, f->b, 0, f->col, f->y));
  return dot_dev(f->y, f->dy, f->yn);
}
static double pool_loss(const void *p) {
  const fwd_ctx_t *f = p;
  EXPECT_OK(hora__maxpool2_fwd_cuda(f->x, f->n, f->h, f->w, f->c, f->y, f->arg));
  return dot_dev(f->y, f->dy, f->yn);
}
static double dense_loss(const void *p) {
  const fwd_ctx_t *f = p;
  EXPECT_OK(hora__dense_fwd_cuda(f->x, f->n, f->in, f->wt, f->b, f->out, f->y));
  return dot_dev(f->y, f->dy, f->yn);
}

static void test_conv(hora_conv_shape_t s, int gradcheck) {
  const size_t xn = s.n * (size_t)s.h * s.w * s.c, wn = (size_t)s.k * s.kh * s.kw * s.c;
  const size_t yn = hora__conv2d_out_count(&s), cn = hora__conv2d_col_count(&s);
  float *x = randv(xn), *wt = randv(wn), *b = randv(s.k), *dy = randv(yn);
  float *col = malloc(cn * 4), *y = malloc(yn * 4), *dwt = malloc(wn * 4), *db = malloc(s.k * 4);
  float *dcol = malloc(cn * 4), *dx = malloc(xn * 4);
  float *d_x = up(x, xn * 4), *d_wt = up(wt, wn * 4), *d_b = up(b, s.k * 4), *d_dy = up(dy, yn * 4);
  float *d_col = dev(cn * 4), *d_y = dev(yn * 4), *d_dwt = dev(wn * 4), *d_db = dev(s.k * 4);
  float *d_dcol = dev(cn * 4), *d_dx = dev(xn * 4);
  for (int relu = 0; relu < 2; relu++) {
    EXPECT_OK(hora__conv2d_fwd_host(&s, x, wt, b, relu, col, y));
    EXPECT_OK(hora__conv2d_fwd_cuda(&s, d_x, d_wt, d_b, relu, d_col, d_y));
    same(d_col, col, cn, 4, "conv im2col");
    near(d_y, y, yn, (double)s.kh * s.kw * s.c, "conv fwd");
  }
  EXPECT_OK(hora__conv2d_bwd_host(&s, col, dy, wt, dwt, db, dcol, dx));
  EXPECT_OK(hora__conv2d_bwd_cuda(&s, d_col, d_dy, d_wt, d_dwt, d_db, d_dcol, d_dx));
  near(d_dwt, dwt, wn, (double)(yn / s.k), "conv dwt");
  near(d_db, db, s.k, 0, "conv dbias"); /* tree of partial sums: the last bit may differ */
  near(d_dcol, dcol, cn, s.k, "conv dcol");
  near(d_dx, dx, xn, (double)s.k * s.kh * s.kw, "conv dx");
  hora_conv_shape_t badk = s;
  badk.kh = s.h + 1;
  EXPECT_RC(hora__conv2d_fwd_cuda(&badk, d_x, d_wt, d_b, 0, d_col, d_y), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora__conv2d_bwd_cuda(&s, d_col, d_dy, NULL, d_dwt, d_db, d_dcol, d_dx), HORA_ERR_INVALID_ARGUMENT);
  if (gradcheck) {
    /* L = sum(y * dy) with no ReLU: dL/dwt, dL/dx from the device backward vs differences */
    EXPECT_OK(hora__conv2d_fwd_cuda(&s, d_x, d_wt, d_b, 0, d_col, d_y));
    EXPECT_OK(hora__conv2d_bwd_cuda(&s, d_col, d_dy, d_wt, d_dwt, d_db, d_dcol, d_dx));
    float *gw = down(d_dwt, wn * 4), *gx = down(d_dx, xn * 4);
    const float eps = 1e-2f;
    fwd_ctx_t f = {.s = &s, .x = d_x, .wt = d_wt, .b = d_b, .dy = dy, .col = d_col, .y = d_y, .yn = yn};
    for (int t = 0; t < 8; t++) {
      size_t i = (size_t)irand(0, (int)wn - 1);
      double num = num_grad(d_wt, i, eps, conv_loss, &f);
      EXPECT(grad_ok(num, gw[i]), "conv dwt[%zu]: numerical %g analytic %g", i, num, gw[i]);
      size_t j = (size_t)irand(0, (int)xn - 1);
      num = num_grad(d_x, j, eps, conv_loss, &f);
      EXPECT(grad_ok(num, gx[j]), "conv dx[%zu]: numerical %g analytic %g", j, num, gx[j]);
    }
    free(gw), free(gx);
  }
  void *all[] = {x, wt, b, dy, col, y, dwt, db, dcol, dx};
  for (size_t i = 0; i < 10; i++) free(all[i]);
  void *dall[] = {d_x, d_wt, d_b, d_dy, d_col, d_y, d_dwt, d_db, d_dcol, d_dx};
  for (size_t i = 0; i < 10; i++) CK(cudaFree(dall[i]));
}

static void test_pool(size_t n, int h, int w, int c, int gradcheck) {
  const size_t xn = n * (size_t)h * w * c, yn = n * (size_t)(h / 2) * (w / 2) * c;
  float *x = randv(xn), *dy = randv(yn), *y = malloc(yn * 4), *dx = malloc(xn * 4);
  for (size_t i = 0; i < xn; i += 5) x[i] = x[i + 1 < xn ? i + 1 : i]; /* ties */
  uint8_t *arg = malloc(yn);
  float *d_x = up(x, xn * 4), *d_dy = up(dy, yn * 4), *d_y = dev(yn * 4), *d_dx = dev(xn * 4);
  uint8_t *d_arg = dev(yn);
  EXPECT_OK(hora__maxpool2_fwd_host(x, n, h, w, c, y, arg));
  EXPECT_OK(hora__maxpool2_fwd_cuda(d_x, n, h, w, c, d_y, d_arg));
  same(d_y, y, yn, 4, "maxpool fwd");
  same(d_arg, arg, yn, 1, "maxpool arg");
  EXPECT_OK(hora__maxpool2_bwd_host(dy, arg, n, h, w, c, dx));
  EXPECT_OK(hora__maxpool2_bwd_cuda(d_dy, d_arg, n, h, w, c, d_dx));
  same(d_dx, dx, xn, 4, "maxpool bwd");
  EXPECT_OK(hora__maxpool2_relu_bwd_host(dy, arg, x, n, h, w, c, dx));
  EXPECT_OK(hora__maxpool2_relu_bwd_cuda(d_dy, d_arg, d_x, n, h, w, c, d_dx));
  same(d_dx, dx, xn, 4, "maxpool relu bwd");
  /* relu backward, in place on a copy of dy shaped like x */
  float *d_g = up(x, xn * 4), *g = malloc(xn * 4);
  memcpy(g, x, xn * 4);
  EXPECT_OK(hora__relu_bwd_host(dx, g, xn));
  EXPECT_OK(hora__relu_bwd_cuda(d_dx, d_g, xn));
  same(d_g, g, xn, 4, "relu bwd");
  EXPECT_RC(hora__maxpool2_fwd_cuda(d_x, n, 1, w, c, d_y, d_arg), HORA_ERR_INVALID_ARGUMENT);
  if (gradcheck) {
    /* distinct values so a small step changes no winner */
    for (size_t i = 0; i < xn; i++) x[i] = (float)((i * 7919) % xn) / (float)xn;
    CK(cudaMemcpy(d_x, x, xn * 4, cudaMemcpyHostToDevice));
    EXPECT_OK(hora__maxpool2_fwd_cuda(d_x, n, h, w, c, d_y, d_arg));
    EXPECT_OK(hora__maxpool2_bwd_cuda(d_dy, d_arg, n, h, w, c, d_dx));
    float *gx = down(d_dx, xn * 4);
    const float eps = 0.1f / (float)xn;
    fwd_ctx_t f = {.x = d_x, .dy = dy, .y = d_y, .arg = d_arg, .n = n, .yn = yn, .h = h, .w = w, .c = c};
    for (int t = 0; t < 16; t++) {
      size_t j = (size_t)irand(0, (int)xn - 1);
      double num = num_grad(d_x, j, eps, pool_loss, &f);
      EXPECT(grad_ok(num, gx[j]), "maxpool dx[%zu]: numerical %g analytic %g", j, num, gx[j]);
    }
    free(gx);
  }
  free(x), free(dy), free(y), free(dx), free(arg), free(g);
  void *dl[] = {d_x, d_dy, d_y, d_dx, d_arg, d_g};
  for (size_t i = 0; i < sizeof dl / sizeof *dl; i++) CK(cudaFree(dl[i]));
}

static void test_dense(size_t n, int in, int out, int gradcheck) {
  float *x = randv(n * in), *wt = randv((size_t)in * out), *b = randv(out), *dy = randv(n * out);
  float *y = malloc(n * out * 4), *dwt = malloc((size_t)in * out * 4), *db = malloc(out * 4), *dx = malloc(n * in * 4);
  float *d_x = up(x, n * in * 4), *d_wt = up(wt, (size_t)in * out * 4), *d_b = up(b, out * 4);
  float *d_dy = up(dy, n * out * 4), *d_y = dev(n * out * 4), *d_dwt = dev((size_t)in * out * 4);
  float *d_db = dev(out * 4), *d_dx = dev(n * in * 4);
  EXPECT_OK(hora__dense_fwd_host(x, n, in, wt, b, out, y));
  EXPECT_OK(hora__dense_fwd_cuda(d_x, n, in, d_wt, d_b, out, d_y));
  near(d_y, y, n * out, in, "dense fwd");
  EXPECT_OK(hora__dense_bwd_host(x, dy, n, in, wt, out, dwt, db, dx));
  EXPECT_OK(hora__dense_bwd_cuda(d_x, d_dy, n, in, d_wt, out, d_dwt, d_db, d_dx));
  near(d_dwt, dwt, (size_t)in * out, (double)n, "dense dwt");
  near(d_db, db, out, 0, "dense dbias");
  near(d_dx, dx, n * in, out, "dense dx");
  EXPECT_RC(hora__dense_fwd_cuda(d_x, 0, in, d_wt, d_b, out, d_y), HORA_ERR_INVALID_ARGUMENT);
  if (gradcheck) {
    float *gw = down(d_dwt, (size_t)in * out * 4), *gb = down(d_db, out * 4);
    const float eps = 1e-2f;
    fwd_ctx_t f = {.x = d_x, .wt = d_wt, .b = d_b, .dy = dy, .y = d_y, .n = n, .yn = n * out, .in = in, .out = out};
    for (int t = 0; t < 8; t++) {
      size_t i = (size_t)irand(0, in * out - 1);
      double num = num_grad(d_wt, i, eps, dense_loss, &f);
      EXPECT(grad_ok(num, gw[i]), "dense dwt[%zu]: numerical %g analytic %g", i, num, gw[i]);
    }
    int j = irand(0, out - 1);
    double num = num_grad(d_b, (size_t)j, eps, dense_loss, &f);
    EXPECT(grad_ok(num, gb[j]), "dense dbias[%d]: numerical %g analytic %g", j, num, gb[j]);
    free(gw), free(gb);
  }
  void *all[] = {x, wt, b, dy, y, dwt, db, dx};
  for (size_t i = 0; i < 8; i++) free(all[i]);
  void *dall[] = {d_x, d_wt, d_b, d_dy, d_y, d_dwt, d_db, d_dx};
  for (size_t i = 0; i < 8; i++) CK(cudaFree(dall[i]));
}

/* L = loss_sum of the device softmax cross-entropy (the caller divides by n). */
typedef struct {
  const float *z;
  const uint8_t *lab;
  size_t n;
  int classes;
} xent_ctx_t;
static double xent_loss(const void *p) {
  const xent_ctx_t *x = p;
  double l = 0;
  size_t ok;
  EXPECT_OK(hora__softmax_xent_cuda(x->z, x->lab, x->n, x->classes, 1.0f / x->n, &l, &ok, NULL));
  return l;
}

static void test_xent(size_t n, int classes) {
  float *z = randv(n * classes), *d = malloc(n * classes * 4);
  uint8_t *lab = malloc(n);
  for (size_t r = 0; r < n; r++) lab[r] = (uint8_t)irand(0, classes - 1);
  float *d_z = up(z, n * classes * 4), *d_d = dev(n * classes * 4);
  uint8_t *d_lab = up(lab, n);
  double loss, gloss;
  size_t ok, gok;
  EXPECT_OK(hora__softmax_xent_host(z, lab, n, classes, 1.0f / n, &loss, &ok, d));
  EXPECT_OK(hora__softmax_xent_cuda(d_z, d_lab, n, classes, 1.0f / n, &gloss, &gok, d_d));
  EXPECT(fabs(gloss - loss) <= 1e-12 * fabs(loss) + 1e-12, "xent loss %.17g vs host %.17g", gloss, loss);
  EXPECT(gok == ok, "xent correct %zu vs host %zu", gok, ok);
  float *gd = down(d_d, n * classes * 4);
  for (size_t i = 0; i < n * classes; i++)
    EXPECT(fabsf(gd[i] - d[i]) <= 1e-7f, "xent dlogits[%zu] %g vs host %g", i, gd[i], d[i]);
  /* gradient check: L = loss_sum / n */
  const float eps = 1e-3f;
  xent_ctx_t xc = {d_z, d_lab, n, classes};
  for (int t = 0; t < 8; t++) {
    size_t i = (size_t)irand(0, (int)(n * classes) - 1);
    double num = num_grad(d_z, i, eps, xent_loss, &xc) / n;
    EXPECT(grad_ok(num, gd[i]), "xent dlogits[%zu]: numerical %g analytic %g", i, num, gd[i]);
  }
  /* a bad label: HORA_ERR_INVALID_ARGUMENT, dlogits untouched */
  lab[n - 1] = (uint8_t)classes;
  CK(cudaMemcpy(d_lab, lab, n, cudaMemcpyHostToDevice));
  CK(cudaMemset(d_d, 0xa5, n * classes * 4));
  EXPECT_RC(hora__softmax_xent_cuda(d_z, d_lab, n, classes, 1.0f, &gloss, &gok, d_d), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora__layers_cuda_last_error(), "label") != NULL, "bad label message: '%s'",
         hora__layers_cuda_last_error());
  unsigned char *raw = down(d_d, n * classes * 4);
  size_t touched = 0;
  for (size_t i = 0; i < n * classes * 4; i++) touched += raw[i] != 0xa5;
  EXPECT(touched == 0, "xent with a bad label wrote %zu bytes of dlogits", touched);
  free(raw), free(z), free(d), free(lab), free(gd);
  void *dl[] = {d_z, d_d, d_lab};
  for (size_t i = 0; i < sizeof dl / sizeof *dl; i++) CK(cudaFree(dl[i]));
}

static void test_elementwise(size_t count) {
  float *x = randv(count), *g = randv(count), *m = randv(count), *v = randv(count);
  for (size_t i = 0; i < count; i++) v[i] = fabsf(v[i]);
  float *y = malloc(count * 4);
  uint8_t *keep = malloc(count);
  float *d_x = up(x, count * 4), *d_g = up(g, count * 4), *d_m = up(m, count * 4), *d_v = up(v, count * 4);
  float *d_y = dev(count * 4);
  uint8_t *d_keep = dev(count);
  EXPECT_OK(hora__dropout_fwd_host(x, y, keep, count, 0.5f, 0x77));
  EXPECT_OK(hora__dropout_fwd_cuda(d_x, d_y, d_keep, count, 0.5f, 0x77));
  same(d_keep, keep, count, 1, "dropout mask");
  same(d_y, y, count, 4, "dropout fwd");
  EXPECT_OK(hora__dropout_bwd_host(g, keep, count, 0.5f, y));
  EXPECT_OK(hora__dropout_bwd_cuda(d_g, d_keep, count, 0.5f, d_y));
  same(d_y, y, count, 4, "dropout bwd");
  EXPECT_RC(hora__dropout_fwd_cuda(d_x, d_y, d_keep, count, 1.0f, 1), HORA_ERR_INVALID_ARGUMENT);
  for (int64_t t = 1; t <= 3; t++) {
    EXPECT_OK(hora__adam_host(x, g, m, v, count, 1e-3f, 0.9f, 0.999f, 1e-7f, t));
    EXPECT_OK(hora__adam_cuda(d_x, d_g, d_m, d_v, count, 1e-3f, 0.9f, 0.999f, 1e-7f, t));
  }
  same(d_x, x, count, 4, "adam param");
  same(d_m, m, count, 4, "adam m");
  same(d_v, v, count, 4, "adam v");
  EXPECT_RC(hora__adam_cuda(d_x, d_g, d_m, d_v, count, 1e-3f, 0.9f, 0.999f, 1e-7f, 0), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_OK(hora__sgd_momentum_host(x, g, m, count, 0.01f, 0.9f));
  EXPECT_OK(hora__sgd_momentum_cuda(d_x, d_g, d_m, count, 0.01f, 0.9f));
  same(d_x, x, count, 4, "sgd param");
  same(d_m, m, count, 4, "sgd velocity");
  EXPECT_OK(hora__init_uniform_host(x, count, 0.25f, 5));
  EXPECT_OK(hora__init_uniform_cuda(d_x, count, 0.25f, 5));
  same(d_x, x, count, 4, "init uniform");
  free(x), free(g), free(m), free(v), free(y), free(keep);
  void *dl[] = {d_x, d_g, d_m, d_v, d_y, d_keep};
  for (size_t i = 0; i < sizeof dl / sizeof *dl; i++) CK(cudaFree(dl[i]));
}

/* Relative L2 distance of a device array from a host one (0 when both are 0). */
static double rel_l2(const float *d, const float *want, size_t n) {
  float *got = down(d, n * 4);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double e = (double)got[i] - want[i];
    num += e * e, den += (double)want[i] * want[i];
  }
  free(got);
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static hora_result_t record_layer(void *arg, int layer) {
  int *order = arg;
  order[order[3]++] = layer;
  return HORA_SUCCESS;
}

/* The example's model (examples/mnist/model.c) on the GPU against the same model on the CPU: same
 * initial parameters (bit-identical: the init kernel shares its body), then a training forward and
 * backward on the same batch with the same dropout seed, a partial batch, and an evaluation
 * forward. This checks the device path's buffer sizes, copies and call sequence as a whole. The
 * losses must agree to a relative 1e-4 and every layer's gradient to a relative 1e-2 (L2 over the
 * layer): cuBLAS and OpenBLAS round differently, which can move a near-tie of a max-pool window or
 * a ReLU at 0 and so route one gradient entry elsewhere, so bit equality is not expected; a wrong
 * buffer, size or row is off by far more. */
static void test_model(size_t cap) {
  mnist_model_t h, d;
  EXPECT_OK(mnist_model_create(&h, cap));
  EXPECT_OK(mnist_model_create_on(&d, cap, 1));
  EXPECT(d.cuda == 1 && d.nparams == h.nparams, "device model: cuda %d, %zu params vs %zu", d.cuda,
         d.nparams, h.nparams);
  mnist_model_init_params(&h, 11);
  mnist_model_init_params(&d, 11);
  same(d.params, h.params, h.nparams, 4, "model init");
  for (size_t i = 0; i < cap * MNIST_PIXELS; i++) d.x_in[i] = h.x_in[i] = hora__rng_uniform(0x1ab, i);
  for (size_t r = 0; r < cap; r++) d.labels_in[r] = h.labels_in[r] = (uint8_t)(r * 7 % MNIST_CLASSES);
  const size_t sizes[2] = {cap, cap - 1}; /* full batch, then a partial one */
  for (int t = 0; t < 2; t++) {
    size_t n = sizes[t], hok = 0, dok = 0;
    double hl = 0, dl = 0;
    EXPECT_OK(mnist_model_forward(&h, n, 1, 0x5eed + t, &hl, &hok));
    EXPECT_OK(mnist_model_forward(&d, n, 1, 0x5eed + t, &dl, &dok));
    EXPECT(fabs(dl - hl) <= 1e-4 * fabs(hl), "model n %zu: training loss %.9g on the GPU, %.9g on the CPU", n, dl, hl);
    EXPECT(dok + 1 >= hok && hok + 1 >= dok, "model n %zu: %zu correct on the GPU, %zu on the CPU", n, dok, hok);
    same(d.keep, h.keep, n * 5 * 5 * 64, 1, "model dropout mask");
    int horder[4] = {0}, dorder[4] = {0};
    EXPECT_OK(mnist_model_backward(&h, record_layer, horder));
    EXPECT_OK(mnist_model_backward(&d, record_layer, dorder));
    EXPECT(dorder[3] == 3 && !memcmp(dorder, horder, sizeof horder), "model: layer_done order on the GPU");
    for (int l = 0; l < MNIST_LAYERS; l++) {
      const mnist_layer_t *L = &h.layer[l];
      double e = rel_l2(d.grads + L->offset, h.grads + L->offset, L->count);
      EXPECT(e <= 1e-2, "model n %zu: %s gradient off by %.3g (relative L2)", n, L->name, e);
    }
  }
  double hl = 0, dl = 0;
  size_t hok = 0, dok = 0;
  EXPECT_OK(mnist_model_forward(&h, cap, 0, 0, &hl, &hok));
  EXPECT_OK(mnist_model_forward(&d, cap, 0, 0, &dl, &dok));
  EXPECT(fabs(dl - hl) <= 1e-4 * fabs(hl), "model: evaluation loss %.9g on the GPU, %.9g on the CPU", dl, hl);
  /* an optimizer step on the device model leaves it equal to the same step on the host */
  float *m0 = calloc(h.nparams, 4), *v0 = calloc(h.nparams, 4);
  float *dm = dev(h.nparams * 4), *dv = dev(h.nparams * 4);
  CK(cudaMemset(dm, 0, h.nparams * 4));
  CK(cudaMemset(dv, 0, h.nparams * 4));
  EXPECT_OK(hora__adam_host(h.params, h.grads, m0, v0, h.nparams, 1e-3f, 0.9f, 0.999f, 1e-7f, 1));
  EXPECT_OK(hora__adam_cuda(d.params, d.grads, dm, dv, d.nparams, 1e-3f, 0.9f, 0.999f, 1e-7f, 1));
  EXPECT(rel_l2(d.params, h.params, h.nparams) <= 1e-3, "model: parameters after an Adam step");
  free(m0), free(v0);
  CK(cudaFree(dm));
  CK(cudaFree(dv));
  mnist_model_destroy(&h);
  mnist_model_destroy(&d);
}

int main(void) {
  if (!hora_test_have_gpu("test_layers_cuda")) return HORA_TEST_SKIP;
  test_conv((hora_conv_shape_t){4, 28, 28, 1, 32, 3, 3}, 1);
  test_conv((hora_conv_shape_t){3, 13, 13, 32, 64, 3, 3}, 0);
  test_conv((hora_conv_shape_t){2, 7, 5, 3, 5, 3, 2}, 1);
  for (int t = 0; t < 6; t++) {
    hora_conv_shape_t s = {(size_t)irand(1, 3), irand(1, 11), irand(1, 11), irand(1, 5), irand(1, 7), 0, 0};
    s.kh = irand(1, s.h < 4 ? s.h : 4), s.kw = irand(1, s.w < 4 ? s.w : 4);
    test_conv(s, 0);
  }
  test_pool(4, 26, 26, 32, 0);
  test_pool(3, 11, 11, 64, 0);
  test_pool(2, 7, 9, 3, 1);
  test_dense(64, 1600, 10, 1);
  test_dense(7, 33, 5, 1);
  test_xent(64, 10);
  test_xent(300, 10); /* more rows than threads in the block */
  test_xent(5, 3);
  test_elementwise(1600 * 64 + 3);
  test_elementwise(17);
  /* more elements than the capped grid has threads (blocks_for: 8 blocks of 256 per SM): every
   * grid-stride loop goes round more than once, as conv1's im2col does at batch 64 */
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  test_elementwise((size_t)sms * 8 * 256 * 3 + 5);
  test_model(8);
  return hora_test_finish("test_layers_cuda");
}
