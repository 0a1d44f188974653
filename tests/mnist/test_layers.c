/* Layer kernels of the example convnet (examples/mnist/layers/layers.c): each against a naive reference
 * written from the definition, and each backward against a central-difference numerical
 * gradient; then the whole model's backward (examples/mnist/model.c) against numerical gradients
 * of its loss. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hora_layers.h"
#include "hora_test.h"
#include "model.h"

static uint64_t rng_state = 12345;
static float frand(void) { /* uniform in [-1, 1) */
  return 2.0f * hora__rng_uniform(0xfeedull, rng_state++) - 1.0f;
}
static float *randv(size_t n) {
  float *v = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) v[i] = frand();
  return v;
}
static int close_to(double a, double b, double atol, double rtol) {
  return fabs(a - b) <= atol + rtol * fmax(fabs(a), fabs(b));
}
static double dot(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

/* naive conv, NHWC, weights [k][kh][kw][c] */
static void conv_ref(const hora_conv_shape_t *s, const float *x, const float *w, const float *b,
                     int relu, double *y) {
  int oh = s->h - s->kh + 1, ow = s->w - s->kw + 1;
  for (size_t n = 0; n < s->n; n++)
    for (int oy = 0; oy < oh; oy++)
      for (int ox = 0; ox < ow; ox++)
        for (int k = 0; k < s->k; k++) {
          double acc = b[k];
          for (int ky = 0; ky < s->kh; ky++)
            for (int kx = 0; kx < s->kw; kx++)
              for (int c = 0; c < s->c; c++)
                acc += (double)x[((n * s->h + oy + ky) * s->w + ox + kx) * s->c + c] *
                       w[((k * s->kh + ky) * s->kw + kx) * s->c + c];
          if (relu && acc < 0) acc = 0;
          y[((n * oh + oy) * ow + ox) * s->k + k] = acc;
        }
}

/* L(x, w, b) = sum r .* conv(x, w, b) (no ReLU: linear, so the central difference is exact up to
 * rounding) */
static double conv_loss(const hora_conv_shape_t *s, const float *x, const float *w,
                        const float *b, const float *r, float *col, float *y) {
  hora__conv2d_fwd_host(s, x, w, b, 0, col, y);
  return dot(y, r, hora__conv2d_out_count(s));
}

static void check_grad(const char *what, float *v, size_t n, const float *analytic,
                       double (*loss)(void *), void *arg, float eps, size_t stride) {
  size_t bad = 0, checked = 0;
  for (size_t i = 0; i < n; i += stride) {
    float save = v[i];
    v[i] = save + eps;
    double lp = loss(arg);
    v[i] = save - eps;
    double lm = loss(arg);
    v[i] = save;
    double num = (lp - lm) / (2.0 * eps);
    checked++;
    if (!close_to(analytic[i], num, 2e-3, 2e-2)) {
      if (bad < 5)
        fprintf(stderr, "%s[%zu]: analytic %.6g numerical %.6g\n", what, i, analytic[i], num);
      bad++;
    }
  }
  EXPECT(bad == 0, "%s: %zu of %zu gradient entries differ from the numerical gradient", what, bad,
         checked);
}

typedef struct {
  hora_conv_shape_t s;
  float *x, *w, *b, *r, *col, *y;
} conv_case_t;
static double conv_case_loss(void *p) {
  conv_case_t *c = p;
  return conv_loss(&c->s, c->x, c->w, c->b, c->r, c->col, c->y);
}

static void test_conv(hora_conv_shape_t s) {
  size_t xn = s.n * s.h * s.w * s.c, wn = (size_t)s.k * s.kh * s.kw * s.c;
  size_t yn = hora__conv2d_out_count(&s), cn = hora__conv2d_col_count(&s);
  EXPECT(yn == s.n * (s.h - s.kh + 1) * (s.w - s.kw + 1) * (size_t)s.k, "out count");
  conv_case_t c = {s, randv(xn), randv(wn), randv(s.k), randv(yn), calloc(cn, 4), calloc(yn, 4)};
  double *ref = malloc(yn * sizeof(double));
  for (int relu = 0; relu < 2; relu++) {
    EXPECT_OK(hora__conv2d_fwd_host(&s, c.x, c.w, c.b, relu, c.col, c.y));
    conv_ref(&s, c.x, c.w, c.b, relu, ref);
    size_t bad = 0;
    for (size_t i = 0; i < yn; i++) bad += !close_to(c.y[i], ref[i], 1e-4, 1e-4);
    EXPECT(bad == 0, "conv fwd (c=%d k=%d %dx%d relu=%d): %zu of %zu outputs differ", s.c, s.k,
           s.kh, s.kw, relu, bad, yn);
  }
  /* backward with dy = r: analytic gradients of L = sum r .* y */
  float *dw = calloc(wn, 4), *db = calloc(s.k, 4), *dcol = calloc(cn, 4), *dx = calloc(xn, 4);
  hora__conv2d_fwd_host(&s, c.x, c.w, c.b, 0, c.col, c.y);
  EXPECT_OK(hora__conv2d_bwd_host(&s, c.col, c.r, c.w, dw, db, dcol, dx));
  check_grad("conv dW", c.w, wn, dw, conv_case_loss, &c, 1e-2f, 1);
  check_grad("conv dbias", c.b, s.k, db, conv_case_loss, &c, 1e-2f, 1);
  check_grad("conv dx", c.x, xn, dx, conv_case_loss, &c, 1e-2f, 1);
  /* dx NULL skips the input gradient but gives the same weight gradient */
  float *dw2 = calloc(wn, 4), *db2 = calloc(s.k, 4);
  hora__conv2d_fwd_host(&s, c.x, c.w, c.b, 0, c.col, c.y);
  EXPECT_OK(hora__conv2d_bwd_host(&s, c.col, c.r, c.w, dw2, db2, NULL, NULL));
  EXPECT(memcmp(dw, dw2, wn * 4) == 0 && memcmp(db, db2, (size_t)s.k * 4) == 0,
         "conv bwd without dx changes dW");
  free(dw2), free(db2), free(ref), free(dw), free(db), free(dcol), free(dx);
  free(c.x), free(c.w), free(c.b), free(c.r), free(c.col), free(c.y);
}

static void test_conv_errors(void) {
  hora_conv_shape_t s = {2, 4, 4, 1, 2, 5, 3}; /* kernel taller than the input */
  float buf[64] = {0};
  EXPECT_RC(hora__conv2d_fwd_host(&s, buf, buf, buf, 0, buf, buf), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(hora__conv2d_out_count(&s) == 0, "bad shape has a count");
  hora_conv_shape_t ok = {1, 4, 4, 1, 1, 3, 3};
  EXPECT_RC(hora__conv2d_fwd_host(&ok, NULL, buf, buf, 0, buf, buf), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora__conv2d_bwd_host(&ok, buf, buf, buf, buf, buf, NULL, buf),
            HORA_ERR_INVALID_ARGUMENT);
}

static void test_relu(void) {
  float y[6] = {-1, 0, 2, 3, -0.5f, 1e-30f}, dy[6] = {1, 2, 3, 4, 5, 6};
  EXPECT_OK(hora__relu_bwd_host(y, dy, 6));
  float want[6] = {0, 0, 3, 4, 0, 6};
  EXPECT(memcmp(dy, want, sizeof want) == 0, "relu bwd");
}

typedef struct {
  float *x, *y, *r;
  uint8_t *arg;
  size_t n;
  int h, w, c;
} pool_case_t;
static double pool_loss(void *p) {
  pool_case_t *q = p;
  hora__maxpool2_fwd_host(q->x, q->n, q->h, q->w, q->c, q->y, q->arg);
  return dot(q->y, q->r, q->n * (q->h / 2) * (q->w / 2) * q->c);
}

static void test_pool(size_t n, int h, int w, int c) {
  size_t xn = n * h * w * c, yn = n * (h / 2) * (w / 2) * c;
  pool_case_t q = {randv(xn), calloc(yn, 4), randv(yn), calloc(yn, 1), n, h, w, c};
  EXPECT_OK(hora__maxpool2_fwd_host(q.x, n, h, w, c, q.y, q.arg));
  size_t bad = 0;
  for (size_t b = 0; b < n; b++)
    for (int py = 0; py < h / 2; py++)
      for (int px = 0; px < w / 2; px++)
        for (int ch = 0; ch < c; ch++) {
          float m = -INFINITY;
          for (int dy = 0; dy < 2; dy++)
            for (int dx = 0; dx < 2; dx++)
              m = fmaxf(m, q.x[((b * h + 2 * py + dy) * w + 2 * px + dx) * c + ch]);
          bad += q.y[((b * (h / 2) + py) * (w / 2) + px) * c + ch] != m;
        }
  EXPECT(bad == 0, "maxpool fwd %dx%d: %zu wrong maxima", h, w, bad);
  float *dx = malloc(xn * 4), *fused = malloc(xn * 4);
  for (size_t i = 0; i < xn; i++) dx[i] = fused[i] = NAN; /* every element must be written */
  EXPECT_OK(hora__maxpool2_bwd_host(q.r, q.arg, n, h, w, c, dx));
  /* eps well below the gap between distinct random inputs keeps the argmax fixed */
  check_grad("maxpool dx", q.x, xn, dx, pool_loss, &q, 1e-4f, 1);
  /* fused ReLU backward == maxpool backward then ReLU backward, bit for bit */
  EXPECT_OK(hora__maxpool2_relu_bwd_host(q.r, q.arg, q.x, n, h, w, c, fused));
  EXPECT_OK(hora__relu_bwd_host(q.x, dx, xn));
  EXPECT(memcmp(dx, fused, xn * 4) == 0, "maxpool+relu bwd differs from maxpool bwd then relu bwd");
  size_t zeroed = 0;
  for (size_t i = 0; i < xn; i++) zeroed += fused[i] == 0.0f;
  EXPECT(zeroed > xn * 3 / 4, "fused bwd: only %zu of %zu zeros", zeroed, xn);
  free(dx), free(fused), free(q.x), free(q.y), free(q.r), free(q.arg);
}

static void test_dropout(void) {
  size_t n = 100000;
  float *x = randv(n), *y = calloc(n, 4), *y2 = calloc(n, 4), *dx = calloc(n, 4);
  uint8_t *keep = calloc(n, 1), *keep2 = calloc(n, 1);
  EXPECT_OK(hora__dropout_fwd_host(x, y, keep, n, 0.5f, 7));
  size_t kept = 0, bad = 0;
  for (size_t i = 0; i < n; i++) {
    kept += keep[i];
    bad += y[i] != (keep[i] ? x[i] * 2.0f : 0.0f);
  }
  /* binomial(1e5, 0.5): sd 158; 5 sd */
  EXPECT(kept > 49200 && kept < 50800, "dropout kept %zu of %zu with p=0.5", kept, n);
  EXPECT(bad == 0, "dropout fwd: %zu wrong outputs", bad);
  EXPECT_OK(hora__dropout_fwd_host(x, y2, keep2, n, 0.5f, 7));
  EXPECT(memcmp(keep, keep2, n) == 0, "dropout mask differs for the same seed");
  EXPECT_OK(hora__dropout_fwd_host(x, y2, keep2, n, 0.5f, 8));
  EXPECT(memcmp(keep, keep2, n) != 0, "dropout mask equal for different seeds");
  /* dropout is linear in x for a fixed mask: its backward is the same mask and scale */
  EXPECT_OK(hora__dropout_bwd_host(x, keep, n, 0.5f, dx));
  EXPECT(memcmp(dx, y, n * 4) == 0, "dropout bwd differs from the forward's mask and scale");
  EXPECT_RC(hora__dropout_fwd_host(x, y, keep, n, 1.0f, 7), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_OK(hora__dropout_fwd_host(x, y, keep, n, 0.0f, 7));
  EXPECT(memcmp(x, y, n * 4) == 0, "dropout p=0 is not a copy");
  free(x), free(y), free(y2), free(dx), free(keep), free(keep2);
}

typedef struct {
  float *x, *w, *b, *r, *y;
  size_t n;
  int in, out;
} dense_case_t;
static double dense_loss(void *p) {
  dense_case_t *d = p;
  hora__dense_fwd_host(d->x, d->n, d->in, d->w, d->b, d->out, d->y);
  return dot(d->y, d->r, d->n * d->out);
}

static void test_dense(size_t n, int in, int out) {
  dense_case_t d = {randv(n * in), randv((size_t)in * out), randv(out), randv(n * out),
                    calloc(n * out, 4), n, in, out};
  EXPECT_OK(hora__dense_fwd_host(d.x, n, in, d.w, d.b, out, d.y));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    for (int o = 0; o < out; o++) {
      double acc = d.b[o];
      for (int k = 0; k < in; k++) acc += (double)d.x[i * in + k] * d.w[(size_t)o * in + k];
      bad += !close_to(d.y[i * out + o], acc, 1e-4, 1e-4);
    }
  EXPECT(bad == 0, "dense fwd: %zu wrong outputs", bad);
  float *dw = calloc((size_t)in * out, 4), *db = calloc(out, 4), *dx = calloc(n * in, 4);
  EXPECT_OK(hora__dense_bwd_host(d.x, d.r, n, in, d.w, out, dw, db, dx));
  check_grad("dense dW", d.w, (size_t)in * out, dw, dense_loss, &d, 1e-2f, 1);
  check_grad("dense dbias", d.b, out, db, dense_loss, &d, 1e-2f, 1);
  check_grad("dense dx", d.x, n * in, dx, dense_loss, &d, 1e-2f, 1);
  free(dw), free(db), free(dx), free(d.x), free(d.w), free(d.b), free(d.r), free(d.y);
}

typedef struct {
  float *z;
  uint8_t *lab;
  size_t n;
} xent_case_t;
static double xent_loss(void *p) {
  xent_case_t *c = p;
  double l;
  size_t ok;
  hora__softmax_xent_host(c->z, c->lab, c->n, 10, 1.0f, &l, &ok, NULL);
  return l / c->n;
}

static void test_xent(void) {
  size_t n = 7;
  xent_case_t c = {randv(n * 10), calloc(n, 1), n};
  for (size_t i = 0; i < n * 10; i++) c.z[i] *= 4.0f;
  size_t want_ok = 0;
  double want = 0;
  for (size_t i = 0; i < n; i++) {
    c.lab[i] = (uint8_t)(i * 3 % 10);
    double s = 0;
    int am = 0;
    for (int j = 0; j < 10; j++) {
      s += exp(c.z[i * 10 + j]);
      if (c.z[i * 10 + j] > c.z[i * 10 + am]) am = j;
    }
    want += -log(exp(c.z[i * 10 + c.lab[i]]) / s);
    want_ok += am == c.lab[i];
  }
  double loss;
  size_t ok;
  float *dz = calloc(n * 10, 4);
  EXPECT_OK(hora__softmax_xent_host(c.z, c.lab, n, 10, 1.0f / n, &loss, &ok, dz));
  EXPECT(close_to(loss, want, 1e-9, 1e-9), "xent loss %.10g want %.10g", loss, want);
  EXPECT(ok == want_ok, "xent correct %zu want %zu", ok, want_ok);
  check_grad("xent dlogits", c.z, n * 10, dz, xent_loss, &c, 1e-3f, 1);
  c.lab[2] = 10;
  EXPECT_RC(hora__softmax_xent_host(c.z, c.lab, n, 10, 1.0f, &loss, &ok, dz),
            HORA_ERR_INVALID_ARGUMENT);
  /* huge logits: no overflow */
  float big[10] = {1000, -1000, 0, 0, 0, 0, 0, 0, 0, 0};
  uint8_t l0 = 0;
  EXPECT_OK(hora__softmax_xent_host(big, &l0, 1, 10, 1.0f, &loss, &ok, dz));
  EXPECT(isfinite(loss) && loss < 1e-6 && ok == 1, "xent with logit 1000: loss %g", loss);
  free(c.z), free(c.lab), free(dz);
}

static void test_optimizers(void) {
  /* SGD with momentum, two steps by hand: v1 = g1, p1 = p0 - lr g1; v2 = m g1 + g2. */
  float p[2] = {1.0f, -2.0f}, v[2] = {0, 0}, g1[2] = {0.5f, -1.0f}, g2[2] = {0.25f, 2.0f};
  EXPECT_OK(hora__sgd_momentum_host(p, g1, v, 2, 0.1f, 0.9f));
  EXPECT_OK(hora__sgd_momentum_host(p, g2, v, 2, 0.1f, 0.9f));
  for (int i = 0; i < 2; i++) {
    double v2 = 0.9 * g1[i] + g2[i];
    double p2 = (i ? -2.0 : 1.0) - 0.1 * g1[i] - 0.1 * v2;
    EXPECT(close_to(v[i], v2, 1e-6, 1e-6) && close_to(p[i], p2, 1e-6, 1e-6),
           "sgd[%d]: p %g want %g", i, p[i], p2);
  }
  /* Adam: the first step moves each parameter by lr * g / (|g| + eps) (bias correction makes
   * m_hat = g and v_hat = g^2); the second by the formula in double. */
  float q[3] = {0.5f, 0.5f, 0.5f}, m[3] = {0}, s[3] = {0}, g[3] = {1e-3f, -4.0f, 0.0f};
  EXPECT_OK(hora__adam_host(q, g, m, s, 3, 0.01f, 0.9f, 0.999f, 1e-8f, 1));
  for (int i = 0; i < 3; i++) {
    double want = 0.5 - 0.01 * g[i] / (fabs(g[i]) + 1e-8);
    EXPECT(close_to(q[i], want, 1e-6, 1e-5), "adam step 1 [%d]: %g want %g", i, q[i], want);
  }
  float h[3] = {2e-3f, 1.0f, -1.0f};
  double m2[3], s2[3], want2[3];
  for (int i = 0; i < 3; i++) {
    m2[i] = 0.9 * (0.1 * g[i]) + 0.1 * h[i];
    s2[i] = 0.999 * (0.001 * g[i] * g[i]) + 0.001 * h[i] * h[i];
    double mh = m2[i] / (1 - 0.81), vh = s2[i] / (1 - 0.999 * 0.999);
    want2[i] = q[i] - 0.01 * mh / (sqrt(vh) + 1e-8);
  }
  EXPECT_OK(hora__adam_host(q, h, m, s, 3, 0.01f, 0.9f, 0.999f, 1e-8f, 2));
  for (int i = 0; i < 3; i++)
    EXPECT(close_to(q[i], want2[i], 1e-6, 1e-4), "adam step 2 [%d]: %g want %g", i, q[i],
           want2[i]);
  EXPECT_RC(hora__adam_host(q, h, m, s, 3, 0.01f, 0.9f, 0.999f, 1e-8f, 0),
            HORA_ERR_INVALID_ARGUMENT);
}

static void test_init(void) {
  size_t n = 200000;
  float *w = calloc(n, 4), *w2 = calloc(n, 4);
  EXPECT_OK(hora__init_uniform_host(w, n, 0.5f, 99));
  double sum = 0, sq = 0, lo = 1, hi = -1;
  for (size_t i = 0; i < n; i++) {
    sum += w[i], sq += (double)w[i] * w[i];
    lo = fmin(lo, w[i]), hi = fmax(hi, w[i]);
  }
  /* uniform(-a, a): mean 0, variance a^2 / 3 */
  EXPECT(lo >= -0.5 && hi < 0.5 && lo < -0.499 && hi > 0.499, "init range [%g, %g]", lo, hi);
  EXPECT(fabs(sum / n) < 0.005, "init mean %g", sum / n);
  EXPECT(close_to(sq / n, 0.25 / 3, 0, 0.02), "init variance %g want %g", sq / n, 0.25 / 3);
  EXPECT_OK(hora__init_uniform_host(w2, n, 0.5f, 99));
  EXPECT(memcmp(w, w2, n * 4) == 0, "init differs for the same seed");
  free(w), free(w2);
}

/* The whole network: the model's backward against numerical gradients of the mean loss over a
 * batch of 3 images, with the dropout mask fixed by its seed. */
typedef struct {
  mnist_model_t *m;
} model_case_t;
static double model_loss(void *p) {
  mnist_model_t *m = ((model_case_t *)p)->m;
  double l;
  size_t ok;
  mnist_model_forward(m, 3, 1, 4242, &l, &ok);
  return l / 3;
}

/* Through ReLUs and max-pools a perturbation can cross a kink, and the float forward pass adds
 * rounding noise to every difference, so single entries of the whole network's numerical
 * gradient are not exact; a wrong backward, though, is far off as a whole. Checks the relative
 * L2 error ||analytic - numerical|| / ||numerical|| over the sampled entries instead. */
static void check_grad_l2(const char *what, float *v, size_t n, const float *analytic,
                          double (*loss)(void *), void *arg, float eps, size_t stride,
                          double max_rel) {
  double diff = 0, norm = 0;
  size_t checked = 0;
  for (size_t i = 0; i < n; i += stride) {
    float save = v[i];
    v[i] = save + eps;
    double lp = loss(arg);
    v[i] = save - eps;
    double lm = loss(arg);
    v[i] = save;
    double num = (lp - lm) / (2.0 * eps);
    diff += (analytic[i] - num) * (analytic[i] - num);
    norm += num * num;
    checked++;
  }
  double rel = sqrt(diff / norm);
  printf("%s: relative L2 error %.4f over %zu entries\n", what, rel, checked);
  EXPECT(norm > 0 && rel < max_rel, "%s: relative L2 error %.4f of the gradient over %zu entries "
         "(want < %.2f)", what, rel, checked, max_rel);
}

static hora_result_t count_done(void *arg, int layer) {
  int *order = arg;
  order[order[3]++] = layer;
  return HORA_SUCCESS;
}

static void test_model(void) {
  mnist_model_t m;
  EXPECT_OK(mnist_model_create(&m, 3));
  EXPECT(m.nparams == 288 + 32 + 18432 + 64 + 16000 + 10, "model has %zu parameters", m.nparams);
  mnist_model_init_params(&m, 1);
  for (size_t i = 0; i < 3 * MNIST_PIXELS; i++) m.x[i] = 0.5f + 0.5f * frand();
  m.labels[0] = 3, m.labels[1] = 7, m.labels[2] = 0;
  /* larger weights than the init so the loss is far from flat */
  for (size_t i = 0; i < m.nparams; i++) m.params[i] *= 2.0f;
  double l;
  size_t ok;
  EXPECT_OK(mnist_model_forward(&m, 3, 1, 4242, &l, &ok));
  int order[4] = {0};
  EXPECT_OK(mnist_model_backward(&m, count_done, order));
  EXPECT(order[3] == 3 && order[0] == MNIST_DENSE && order[1] == MNIST_CONV2 &&
             order[2] == MNIST_CONV1,
         "layer_done order %d %d %d (%d calls)", order[0], order[1], order[2], order[3]);
  float *g = malloc(m.nparams * 4);
  memcpy(g, m.grads, m.nparams * 4);
  model_case_t c = {&m};
  /* every 7th parameter: covers all of conv1 and the biases at least partly, in seconds */
  for (int L = 0; L < MNIST_LAYERS; L++) {
    char what[64];
    snprintf(what, sizeof what, "model %s", m.layer[L].name);
    size_t stride = m.layer[L].count > 1000 ? 97 : 1;
    check_grad_l2(what, m.params + m.layer[L].offset, m.layer[L].count, g + m.layer[L].offset,
                  model_loss, &c, 1e-3f, stride, 0.05);
  }
  free(g);
  mnist_model_destroy(&m);
}

int main(void) {
  hora_conv_shape_t a = {2, 6, 5, 1, 3, 3, 3}, b = {3, 7, 6, 4, 5, 3, 2}, c = {1, 13, 13, 32, 4, 3, 3};
  test_conv(a);
  test_conv(b);
  test_conv(c);
  test_conv_errors();
  test_relu();
  test_pool(2, 6, 6, 3);
  test_pool(1, 5, 7, 2); /* odd sizes: the last row/column is dropped */
  test_dropout();
  test_dense(4, 37, 10);
  test_xent();
  test_optimizers();
  test_init();
  test_model();
  return hora_test_finish("test_layers");
}
