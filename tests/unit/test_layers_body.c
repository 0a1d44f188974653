/* The per-element bodies of the CUDA layer kernels (examples/mnist/layers/layers_body.h), run here on the
 * CPU by a plain loop over every index, against the host layer kernels (examples/mnist/layers/layers.c) on
 * random shapes (odd sizes, odd pooled sizes, several batch sizes). This is the CPU check of the
 * device path's index math: every comparison is bit-exact (the bodies keep the host's arithmetic
 * order), except where stated. The matrix products of the device path (hora_body_gemm_*, turned
 * into cublasSgemm's column-major arguments by hora_body_gemm_cm) run through OpenBLAS's
 * column-major sgemm. OpenBLAS runs single-threaded (the test's ENV), so two GEMM calls
 * on the same inputs give the same bits. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hora_layers.h"
#include "hora_test.h"
#include "layers_body.h"

static uint64_t rng_state = 777;
static float frand(void) { return 2.0f * hora__rng_uniform(0xb0d1ull, rng_state++) - 1.0f; }
static int irand(int lo, int hi) { /* in [lo, hi] */
  return lo + (int)(hora__rng_u64(0x5eedull, rng_state++) % (uint64_t)(hi - lo + 1));
}
static float *randv(size_t n) {
  float *v = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) v[i] = frand();
  return v;
}
/* Values on a coarse grid (many exact ties), for the pooling's first-max rule. */
static float *tiedv(size_t n) {
  float *v = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) v[i] = (float)irand(-3, 3) * 0.5f;
  return v;
}
static size_t first_diff(const void *a, const void *b, size_t n, size_t es) {
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)a + i * es, (const char *)b + i * es, es)) return i;
  return (size_t)-1;
}
#define SAME(a, b, n, what, ...)                                                             \
  do {                                                                                       \
    size_t d_ = first_diff((a), (b), (n), sizeof *(a));                                      \
    EXPECT(d_ == (size_t)-1, what ": element %zu of %zu differs" , ##__VA_ARGS__, d_, (size_t)(n)); \
  } while (0)

/* The device's bias gradient: 256 residue classes of rows, added in the kernel's tree; within one
 * float ulp (relative 2^-23) of the host's row-order sum, plus a tiny absolute slack for sums
 * that cancel. */
static void check_tree_col_sums(const float *dy, size_t m, int k, const float *host, const char *what) {
  double part[256];
  for (int j = 0; j < k; j++) {
    for (unsigned t = 0; t < 256; t++) part[t] = hora_body_col_sum_part(dy, m, k, j, t, 256);
    float got = (float)hora_body_tree_sum(part, 256);
    EXPECT(fabsf(got - host[j]) <= 1.2e-7f * fabsf(host[j]) + 1e-12f, "%s: tree column sum %d: %.9g vs %.9g",
           what, j, got, host[j]);
  }
}

/* A layer product as layers.cu issues it: the column-major arguments of hora_body_gemm_cm(g), run
 * through OpenBLAS's column-major sgemm (what cublasSgemm computes), into a poisoned buffer;
 * compared with the host kernel's output `want` (count elements; the same OpenBLAS kernels, so
 * any difference beyond rounding is a wrong operand order, transpose, size or leading dimension). */
static void check_gemm(hora_body_gemm_t g, const float *want, size_t count, const char *what) {
  float *out = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) out[i] = NAN;
  g.c = out;
  hora_body_gemm_t c = hora_body_gemm_cm(g);
  EXPECT(c.m == g.n && c.n == g.m && c.k == g.k && c.ldc == g.ldc, "%s: column-major sizes", what);
  cblas_sgemm(CblasColMajor, c.ta ? CblasTrans : CblasNoTrans, c.tb ? CblasTrans : CblasNoTrans, c.m,
              c.n, c.k, 1.0f, c.a, c.lda, c.b, c.ldb, 0.0f, c.c, c.ldc);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < count; i++)
    if (!(fabsf(out[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i])))) first = bad++ ? first : i;
  EXPECT(bad == 0, "%s: column-major GEMM: %zu of %zu elements differ from the host's (first %zu: %g vs %g)",
         what, bad, count, first, bad ? out[first] : 0.0f, bad ? want[first] : 0.0f);
  free(out);
}

static void test_conv(hora_conv_shape_t s) {
  const size_t xn = s.n * (size_t)s.h * s.w * s.c, wn = (size_t)s.k * s.kh * s.kw * s.c;
  const size_t yn = hora__conv2d_out_count(&s), cn = hora__conv2d_col_count(&s);
  EXPECT(yn > 0 && cn > 0, "shape n %zu h %d w %d c %d k %d kh %d kw %d valid", s.n, s.h, s.w, s.c,
         s.k, s.kh, s.kw);
  float *x = randv(xn), *wt = randv(wn), *bias = randv((size_t)s.k), *zero = calloc(s.k, 4);
  float *col = randv(cn), *y = randv(yn), *z = randv(yn), *got = randv(cn > yn ? cn : yn);
  float *dy = randv(yn), *dwt = randv(wn), *db = randv((size_t)s.k), *dcol = randv(cn);
  float *dx = randv(xn), *gx = randv(xn);
  const size_t m = yn / (size_t)s.k;
  for (int relu = 0; relu < 2; relu++) {
    EXPECT_OK(hora__conv2d_fwd_host(&s, x, wt, bias, relu, col, y));
    for (size_t i = 0; i < cn; i++) got[i] = hora_body_im2col(s, x, i);
    SAME(got, col, cn, "im2col c %d kh %d kw %d", s.c, s.kh, s.kw);
    /* the GEMM alone (zero bias, no ReLU), then the bias+ReLU body on it */
    EXPECT_OK(hora__conv2d_fwd_host(&s, x, wt, zero, 0, col, z));
    for (size_t i = 0; i < yn; i++) got[i] = hora_body_bias_act(z, bias, s.k, relu, i);
    SAME(got, y, yn, "bias_act relu %d k %d", relu, s.k);
  }
  EXPECT_OK(hora__conv2d_bwd_host(&s, col, dy, wt, dwt, db, dcol, dx));
  for (int j = 0; j < s.k; j++) got[j] = hora_body_col_sum(dy, m, s.k, j);
  SAME(got, db, (size_t)s.k, "conv bias gradient (column sums) k %d", s.k);
  check_tree_col_sums(dy, m, s.k, db, "conv");
  for (size_t i = 0; i < xn; i++) gx[i] = hora_body_col2im(s, dcol, i);
  SAME(gx, dx, xn, "col2im h %d w %d c %d kh %d kw %d", s.h, s.w, s.c, s.kh, s.kw);
  /* the three products of the device path (z: the forward GEMM alone, from the loop above) */
  check_gemm(hora_body_gemm_conv_fwd(&s, col, wt, NULL), z, yn, "conv fwd");
  check_gemm(hora_body_gemm_conv_dwt(&s, dy, col, NULL), dwt, wn, "conv dwt");
  check_gemm(hora_body_gemm_conv_dcol(&s, dy, wt, NULL), dcol, cn, "conv dcol");
  /* relu backward on the conv output */
  memcpy(z, dy, yn * 4);
  EXPECT_OK(hora__relu_bwd_host(y, z, yn));
  for (size_t i = 0; i < yn; i++) got[i] = hora_body_relu_bwd(y, dy, i);
  SAME(got, z, yn, "relu_bwd");
  free(x), free(wt), free(bias), free(zero), free(col), free(y), free(z), free(got);
  free(dy), free(dwt), free(db), free(dcol), free(dx), free(gx);
}

static void test_pool(size_t n, int h, int w, int c) {
  const size_t xn = n * (size_t)h * w * c, yn = n * (size_t)(h / 2) * (w / 2) * c;
  float *x = tiedv(xn), *y = randv(yn), *gy = randv(yn), *dy = randv(yn);
  float *dx = randv(xn), *gx = randv(xn), *relu_in = randv(xn);
  uint8_t *arg = malloc(yn), *garg = malloc(yn);
  EXPECT_OK(hora__maxpool2_fwd_host(x, n, h, w, c, y, arg));
  memset(garg, 0xff, yn);
  for (size_t o = 0; o < yn; o++) hora_body_maxpool2_fwd(x, h, w, c, o, gy, garg);
  SAME(gy, y, yn, "maxpool fwd h %d w %d c %d", h, w, c);
  SAME(garg, arg, yn, "maxpool arg h %d w %d c %d", h, w, c);
  EXPECT_OK(hora__maxpool2_bwd_host(dy, arg, n, h, w, c, dx));
  for (size_t i = 0; i < xn; i++) gx[i] = hora_body_maxpool2_bwd(dy, arg, NULL, h, w, c, i);
  SAME(gx, dx, xn, "maxpool bwd h %d w %d c %d", h, w, c);
  EXPECT_OK(hora__maxpool2_relu_bwd_host(dy, arg, x, n, h, w, c, dx));
  for (size_t i = 0; i < xn; i++) gx[i] = hora_body_maxpool2_bwd(dy, arg, x, h, w, c, i);
  SAME(gx, dx, xn, "maxpool+relu bwd h %d w %d c %d", h, w, c);
  /* the fused ReLU really zeroed something (x has values <= 0 at winners) */
  size_t zeroed = 0;
  for (size_t i = 0; i < xn; i++) zeroed += gx[i] == 0.0f && hora_body_maxpool2_bwd(dy, arg, NULL, h, w, c, i) != 0.0f;
  EXPECT(zeroed > 0 || xn < 64, "maxpool+relu bwd h %d w %d: no winner was zeroed by the ReLU", h, w);
  free(x), free(y), free(gy), free(dy), free(dx), free(gx), free(relu_in), free(arg), free(garg);
}

static void test_dropout(size_t count, float p, uint64_t seed) {
  float *x = randv(count), *y = randv(count), *gy = randv(count), *dx = randv(count);
  uint8_t *keep = malloc(count), *gkeep = malloc(count);
  EXPECT_OK(hora__dropout_fwd_host(x, y, keep, count, p, seed));
  const float scale = 1.0f / (1.0f - p);
  for (size_t i = 0; i < count; i++) hora_body_dropout_fwd(x, gy, gkeep, p, scale, seed, i);
  SAME(gkeep, keep, count, "dropout mask p %g count %zu", p, count);
  SAME(gy, y, count, "dropout fwd p %g", p);
  size_t kept = 0;
  for (size_t i = 0; i < count; i++) kept += keep[i];
  EXPECT(fabs((double)kept / count - (1.0 - p)) < 0.05, "dropout p %g keeps %zu of %zu", p, kept, count);
  EXPECT_OK(hora__dropout_bwd_host(x, keep, count, p, dx));
  for (size_t i = 0; i < count; i++) gy[i] = hora_body_dropout_bwd(x, keep, scale, i);
  SAME(gy, dx, count, "dropout bwd p %g", p);
  for (uint64_t i = 0; i < 1000; i++) {
    EXPECT(hora_body_rng_u64(seed, i * 7919) == hora__rng_u64(seed, i * 7919), "rng_u64 %llu", (unsigned long long)i);
    float a = hora_body_rng_uniform(seed, i), b = hora__rng_uniform(seed, i);
    EXPECT(!memcmp(&a, &b, 4), "rng_uniform %llu", (unsigned long long)i);
  }
  free(x), free(y), free(gy), free(dx), free(keep), free(gkeep);
}

static void test_dense(size_t n, int in, int out) {
  float *x = randv(n * in), *wt = randv((size_t)in * out), *b = randv(out), *zero = calloc(out, 4);
  float *y = randv(n * out), *z = randv(n * out), *got = randv(n * out), *dwt = randv((size_t)in * out);
  float *db = randv(out), *dx = randv(n * in);
  EXPECT_OK(hora__dense_fwd_host(x, n, in, wt, b, out, y));
  EXPECT_OK(hora__dense_fwd_host(x, n, in, wt, zero, out, z));
  for (size_t i = 0; i < n * out; i++) got[i] = hora_body_bias_act(z, b, out, 0, i);
  SAME(got, y, n * out, "dense bias n %zu out %d", n, out);
  EXPECT_OK(hora__dense_bwd_host(x, y, n, in, wt, out, dwt, db, dx));
  check_gemm(hora_body_gemm_dense_fwd(x, n, in, wt, out, NULL), z, n * out, "dense fwd");
  check_gemm(hora_body_gemm_dense_dwt(x, y, n, in, out, NULL), dwt, (size_t)in * out, "dense dwt");
  check_gemm(hora_body_gemm_dense_dx(y, n, in, wt, out, NULL), dx, n * in, "dense dx");
  for (int j = 0; j < out; j++) got[j] = hora_body_col_sum(y, n, out, j);
  SAME(got, db, (size_t)out, "dense bias gradient out %d", out);
  check_tree_col_sums(y, n, out, db, "dense");
  free(x), free(wt), free(b), free(zero), free(y), free(z), free(got), free(dwt), free(db), free(dx);
}

static void test_xent(size_t n, int classes) {
  float *z = randv(n * classes), *d = randv(n * classes), *gd = randv(n * classes);
  uint8_t *lab = malloc(n);
  for (size_t r = 0; r < n; r++) lab[r] = (uint8_t)irand(0, classes - 1);
  /* some rows with tied maxima */
  for (size_t r = 0; r < n; r += 3) z[r * classes + classes - 1] = z[r * classes];
  double loss, gloss = 0;
  size_t ok, gok = 0;
  const float scale = 1.0f / (float)n;
  EXPECT_OK(hora__softmax_xent_host(z, lab, n, classes, scale, &loss, &ok, d));
  for (size_t r = 0; r < n; r++) {
    int o;
    gloss += hora_body_xent_row(z + r * classes, lab[r], classes, scale, &o, gd + r * classes);
    gok += (size_t)o;
  }
  /* Bit-exact here (same libm, rows summed in order); the device sums in another order. */
  EXPECT(!memcmp(&gloss, &loss, sizeof loss), "xent loss n %zu classes %d: %.17g vs %.17g", n, classes, gloss, loss);
  EXPECT(gok == ok, "xent correct %zu vs %zu", gok, ok);
  SAME(gd, d, n * classes, "xent dlogits n %zu classes %d", n, classes);
  free(z), free(d), free(gd), free(lab);
}

static void test_optim(size_t count) {
  float *p = randv(count), *g = randv(count), *m = randv(count), *v = randv(count);
  for (size_t i = 0; i < count; i++) v[i] = fabsf(v[i]);
  float *p2 = malloc(count * 4), *m2 = malloc(count * 4), *v2 = malloc(count * 4);
  memcpy(p2, p, count * 4), memcpy(m2, m, count * 4);
  EXPECT_OK(hora__sgd_momentum_host(p, g, m, count, 0.05f, 0.9f));
  for (size_t i = 0; i < count; i++) hora_body_sgd(p2, g, m2, 0.05f, 0.9f, i);
  SAME(p2, p, count, "sgd param");
  SAME(m2, m, count, "sgd velocity");
  memcpy(p2, p, count * 4), memcpy(m2, m, count * 4), memcpy(v2, v, count * 4);
  for (int64_t t = 1; t <= 3; t++) {
    EXPECT_OK(hora__adam_host(p, g, m, v, count, 1e-3f, 0.9f, 0.999f, 1e-7f, t));
    const float c1 = 1.0f / (float)(1.0 - pow(0.9f, (double)t));
    const float c2 = 1.0f / (float)(1.0 - pow(0.999f, (double)t));
    for (size_t i = 0; i < count; i++) hora_body_adam(p2, g, m2, v2, 1e-3f, 0.9f, 0.999f, 1e-7f, c1, c2, i);
    SAME(p2, p, count, "adam param t %lld", (long long)t);
    SAME(m2, m, count, "adam m t %lld", (long long)t);
    SAME(v2, v, count, "adam v t %lld", (long long)t);
  }
  EXPECT_OK(hora__init_uniform_host(p, count, 0.3f, 99));
  for (size_t i = 0; i < count; i++) p2[i] = hora_body_init_uniform(0.3f, 99, i);
  SAME(p2, p, count, "init_uniform");
  free(p), free(g), free(m), free(v), free(p2), free(m2), free(v2);
}

/* The bodies' shape checks accept exactly what the host kernels accept. */
static void test_checks(void) {
  const hora_conv_shape_t bad[] = {{0, 5, 5, 1, 2, 3, 3}, {1, 5, 5, 0, 2, 3, 3}, {1, 2, 5, 1, 2, 3, 3},
                                   {1, 5, 2, 1, 2, 3, 3}, {1, 5, 5, 1, 0, 3, 3}, {1, 5, 5, 1, 2, 0, 3},
                                   {(size_t)1 << 40, 28, 28, 1, 32, 3, 3}, {1, 1 << 16, 1 << 16, 1, 1, 1, 1}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    EXPECT(!hora_body_conv_ok(&bad[i]), "conv shape %zu accepted", i);
    EXPECT(hora__conv2d_out_count(&bad[i]) == 0, "host conv shape %zu accepted", i);
  }
  EXPECT(!hora_body_conv_ok(NULL), "NULL conv shape accepted");
  hora_conv_shape_t ok = {3, 7, 6, 2, 4, 3, 2};
  EXPECT(hora_body_conv_ok(&ok) && hora__conv2d_out_count(&ok) == 3 * 5 * 5 * 4, "conv shape rejected");
  EXPECT(!hora_body_pool_ok(1, 1, 4, 1) && !hora_body_pool_ok(0, 4, 4, 1) && hora_body_pool_ok(1, 3, 3, 1),
         "pool checks");
  EXPECT(!hora_body_dense_ok(0, 1, 1) && !hora_body_dense_ok(1, 0, 1) && hora_body_dense_ok(1, 1, 1),
         "dense checks");
}

int main(void) {
  test_checks();
  /* the example's two convolutions at a small batch, then random odd shapes */
  test_conv((hora_conv_shape_t){2, 28, 28, 1, 32, 3, 3});
  test_conv((hora_conv_shape_t){3, 13, 13, 32, 64, 3, 3});
  for (int t = 0; t < 12; t++) {
    hora_conv_shape_t s = {(size_t)irand(1, 3), irand(1, 11), irand(1, 11), irand(1, 5), irand(1, 7), 0, 0};
    s.kh = irand(1, s.h < 4 ? s.h : 4), s.kw = irand(1, s.w < 4 ? s.w : 4);
    test_conv(s);
  }
  test_pool(2, 26, 26, 32);
  test_pool(3, 11, 11, 64);
  for (int t = 0; t < 10; t++) test_pool((size_t)irand(1, 3), irand(2, 13), irand(2, 13), irand(1, 9));
  test_dropout(1600 * 3, 0.5f, 0x1234);
  test_dropout(4099, 0.2f, 7);
  test_dropout(17, 0.0f, 1);
  test_dense(5, 1600, 10);
  for (int t = 0; t < 6; t++) test_dense((size_t)irand(1, 9), irand(1, 70), irand(1, 13));
  test_xent(64, 10);
  test_xent(7, 3);
  test_xent(1, 1);
  test_optim(1000);
  test_optim(3);
  return hora_test_finish("test_layers_body");
}
