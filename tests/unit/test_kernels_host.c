/* Host reference kernels (kernels/host) against plain scalar loops: reduce and reduce_n for every
 * dtype and op, scale, the four casts and the batched copy, for odd sizes and unaligned offsets
 * (the kernels' vectorized bodies, block loops and tails all run). 16-bit floats are checked
 * through float32 with the scalar conversions, and the scalar conversions themselves against
 * known bit patterns and exhaustive round trips. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hora_kernels.h"
#include "hora_test.h"

static const size_t sizes[] = {0, 1, 2, 7, 31, 511, 512, 513, 1025, 4099, 16384 + 5};
static const size_t offs[] = {0, 1, 3};
#define NSIZES (sizeof sizes / sizeof *sizes)
#define MAXN (16384 + 5 + 8)

#include "hora_test_fill.h"

/* The scalar oracle: dst[i] = OP over srcs, in the plainest form. */
#define SCALAR_INT(T, UT)                                                        \
  {                                                                             \
    T acc = ((const T *)srcs[0])[i];                                            \
    for (int s = 1; s < nsrc; s++) {                                            \
      T v = ((const T *)srcs[s])[i];                                            \
      if (op == HORA_SUM || op == HORA_AVERAGE) acc = (T)((UT)acc + (UT)v);     \
      else if (op == HORA_PRODUCT) acc = (T)((UT)acc * (UT)v);                  \
      else if (op == HORA_MIN) acc = v < acc ? v : acc;                         \
      else acc = v > acc ? v : acc;                                             \
    }                                                                           \
    ((T *)dst)[i] = acc;                                                        \
  }                                                                             \
  break;
#define SCALAR_FLT(T)                                                           \
  {                                                                             \
    T acc = ((const T *)srcs[0])[i];                                            \
    for (int s = 1; s < nsrc; s++) {                                            \
      T v = ((const T *)srcs[s])[i];                                            \
      if (op == HORA_SUM || op == HORA_AVERAGE) acc = acc + v;                  \
      else if (op == HORA_PRODUCT) acc = acc * v;                               \
      else if (op == HORA_MIN) acc = v < acc ? v : acc;                         \
      else acc = v > acc ? v : acc;                                             \
    }                                                                           \
    ((T *)dst)[i] = acc;                                                        \
  }                                                                             \
  break;

static float h2f(hora_dtype_t d, uint16_t h) { return d == HORA_FLOAT16 ? hora__f16_to_f32(h) : hora__bf16_to_f32(h); }
static uint16_t f2h(hora_dtype_t d, float f) { return d == HORA_FLOAT16 ? hora__f32_to_f16(f) : hora__f32_to_bf16(f); }

static void scalar_reduce(void *dst, const void *const *srcs, int nsrc, size_t n, hora_dtype_t d, hora_op_t op) {
  for (size_t i = 0; i < n; i++) {
    switch (d) {
      case HORA_UINT8: SCALAR_INT(uint8_t, uint8_t)
      case HORA_INT8: SCALAR_INT(int8_t, uint8_t)
      case HORA_INT16: SCALAR_INT(int16_t, uint16_t)
      case HORA_BOOL: { /* SUM/AVERAGE/MAX: logical OR; MIN/PRODUCT: logical AND */
        int and_ = op == HORA_MIN || op == HORA_PRODUCT, acc = ((const uint8_t *)srcs[0])[i];
        for (int s = 1; s < nsrc; s++) {
          int v = ((const uint8_t *)srcs[s])[i];
          acc = and_ ? (acc && v) : (acc || v);
        }
        ((uint8_t *)dst)[i] = (uint8_t)acc;
        break;
      }
      case HORA_INT32: SCALAR_INT(int32_t, uint32_t)
      case HORA_INT64: SCALAR_INT(int64_t, uint64_t)
      case HORA_FLOAT32: SCALAR_FLT(float)
      case HORA_FLOAT64: SCALAR_FLT(double)
      case HORA_FLOAT16:
      case HORA_BFLOAT16: {
        float acc = h2f(d, ((const uint16_t *)srcs[0])[i]);
        for (int s = 1; s < nsrc; s++) {
          float v = h2f(d, ((const uint16_t *)srcs[s])[i]);
          if (op == HORA_SUM || op == HORA_AVERAGE) acc = acc + v;
          else if (op == HORA_PRODUCT) acc = acc * v;
          else if (op == HORA_MIN) acc = v < acc ? v : acc;
          else acc = v > acc ? v : acc;
        }
        ((uint16_t *)dst)[i] = f2h(d, acc);
        break;
      }
    }
  }
}

static size_t first_diff(const void *a, const void *b, size_t n, size_t es) {
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)a + i * es, (const char *)b + i * es, es)) return i;
  return (size_t)-1;
}

static char *xmalloc(size_t n) {
  char *p = malloc(n);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  return p;
}

static void test_reduce(void) {
  const size_t cap = MAXN * 8;
  char *src[5], *out = xmalloc(cap), *want = xmalloc(cap);
  for (int s = 0; s < 5; s++) src[s] = xmalloc(cap);
  for (int d = 0; d < HORA_DTYPE_COUNT; d++) {
    size_t es = esize((hora_dtype_t)d);
    for (int op = 0; op < HORA_OP_COUNT; op++)
      for (size_t si = 0; si < NSIZES; si++)
        for (size_t oi = 0; oi < 3; oi++) {
          size_t n = sizes[si], off = offs[oi];
          for (int s = 0; s < 5; s++) fill(src[s], (hora_dtype_t)d, MAXN);
          /* Two sources at different misalignments: a at off, b at off+1, dst at 2*off. */
          const void *ab[2] = {src[0] + off * es, src[1] + (off + 1) * es};
          char *dst = out + 2 * off * es;
          memset(out, 0xa5, cap);
          scalar_reduce(want, ab, 2, n, (hora_dtype_t)d, (hora_op_t)op);
          EXPECT_OK(hora__reduce_host(dst, ab[0], ab[1], n, (hora_dtype_t)d, (hora_op_t)op, NULL));
          size_t bad = first_diff(dst, want, n, es);
          EXPECT(bad == (size_t)-1, "reduce dtype %d op %d n %zu off %zu: element %zu differs", d, op, n, off, bad);
          EXPECT((unsigned char)dst[n * es] == 0xa5, "reduce dtype %d op %d n %zu: wrote past the end", d, op, n);
          /* In place: dst == a. */
          memcpy(out, ab[0], n * es);
          EXPECT_OK(hora__reduce_host(out, out, ab[1], n, (hora_dtype_t)d, (hora_op_t)op, NULL));
          bad = first_diff(out, want, n, es);
          EXPECT(bad == (size_t)-1, "in-place reduce dtype %d op %d n %zu: element %zu differs", d, op, n, bad);
          /* reduce_n with 1..5 sources, unaligned differently each. */
          for (int ns = 1; ns <= 5; ns++) {
            const void *ss[5];
            for (int s = 0; s < ns; s++) ss[s] = src[s] + ((off + (size_t)s) % 4) * es;
            scalar_reduce(want, ss, ns, n, (hora_dtype_t)d, (hora_op_t)op);
            memset(out, 0x5a, cap);
            EXPECT_OK(hora__reduce_n_host(dst, ss, ns, n, (hora_dtype_t)d, (hora_op_t)op, NULL));
            bad = first_diff(dst, want, n, es);
            EXPECT(bad == (size_t)-1, "reduce_n dtype %d op %d n %zu nsrc %d off %zu: element %zu differs", d, op,
                   n, ns, off, bad);
          }
        }
  }
  for (int s = 0; s < 5; s++) free(src[s]);
  free(out);
  free(want);
}

static void test_scale(void) {
  const double factors[] = {0.5, 1.0, -3.25, 1.0 / 3.0};
  const size_t cap = MAXN * 8;
  char *src = xmalloc(cap), *out = xmalloc(cap), *want = xmalloc(cap);
  for (int d = 0; d < HORA_DTYPE_COUNT; d++) {
    size_t es = esize((hora_dtype_t)d);
    for (size_t fi = 0; fi < 4; fi++)
      for (size_t si = 0; si < NSIZES; si++)
        for (size_t oi = 0; oi < 3; oi++) {
          size_t n = sizes[si], off = offs[oi];
          double f = factors[fi];
          fill(src, (hora_dtype_t)d, MAXN);
          const char *s = src + off * es;
          /* Integer factors that would overflow the type (undefined conversion) become 0.5. */
          int is_int = d == HORA_UINT8 || d == HORA_INT8 || d == HORA_INT32 || d == HORA_INT64 ||
                       d == HORA_INT16;
          double used = is_int && (f < -1 || f > 1) ? 0.5 : f;
          if (d == HORA_BOOL) { /* only the exact copy of factor 1.0 is defined */
            if (f != 1.0) {
              EXPECT_RC(hora__scale_host(out, src, 1, HORA_BOOL, f, NULL), HORA_ERR_INVALID_ARGUMENT);
              continue;
            }
          }
          if (d == HORA_UINT8 && used < 0) continue; /* negative scale of unsigned: out of range */
          for (size_t i = 0; i < n; i++) {
            if (used == 1.0) { /* factor 1.0 is defined as an exact copy */
              memcpy(want + i * es, s + i * es, es);
              continue;
            }
            switch (d) {
              case HORA_UINT8: ((uint8_t *)want)[i] = (uint8_t)(((const uint8_t *)s)[i] * used); break;
              case HORA_INT8: ((int8_t *)want)[i] = (int8_t)(((const int8_t *)s)[i] * used); break;
              case HORA_INT16: ((int16_t *)want)[i] = (int16_t)(((const int16_t *)s)[i] * used); break;
              case HORA_INT32: ((int32_t *)want)[i] = (int32_t)(((const int32_t *)s)[i] * used); break;
              case HORA_INT64: ((int64_t *)want)[i] = (int64_t)((double)((const int64_t *)s)[i] * used); break;
              case HORA_FLOAT32: ((float *)want)[i] = ((const float *)s)[i] * (float)used; break;
              case HORA_FLOAT64: ((double *)want)[i] = ((const double *)s)[i] * used; break;
              default: ((uint16_t *)want)[i] = f2h((hora_dtype_t)d, h2f((hora_dtype_t)d, ((const uint16_t *)s)[i]) * (float)used);
            }
          }
          memset(out, 0xa5, cap);
          EXPECT_OK(hora__scale_host(out + 2 * off * es, s, n, (hora_dtype_t)d, used, NULL));
          size_t bad = first_diff(out + 2 * off * es, want, n, es);
          EXPECT(bad == (size_t)-1, "scale dtype %d factor %g n %zu off %zu: element %zu differs", d, used, n, off, bad);
          /* In place. */
          memcpy(out, s, n * es);
          EXPECT_OK(hora__scale_host(out, out, n, (hora_dtype_t)d, used, NULL));
          bad = first_diff(out, want, n, es);
          EXPECT(bad == (size_t)-1, "in-place scale dtype %d factor %g n %zu: element %zu differs", d, used, n, bad);
        }
  }
  free(src);
  free(out);
  free(want);
}

static void test_casts(void) {
  const size_t cap = MAXN * 4 + 64;
  float *f = (float *)xmalloc(cap), *fo = (float *)xmalloc(cap);
  uint16_t *h = (uint16_t *)xmalloc(cap), *ho = (uint16_t *)xmalloc(cap);
  fill(f, HORA_FLOAT32, MAXN);
  f[3] = 65504.0f;    /* largest binary16 */
  f[4] = 65520.0f;    /* rounds to infinity in binary16 */
  f[5] = 5.9604645e-8f; /* smallest binary16 subnormal */
  f[6] = -0.0f;
  f[7] = INFINITY;
  for (size_t si = 0; si < NSIZES; si++)
    for (size_t oi = 0; oi < 3; oi++) {
      size_t n = sizes[si], off = offs[oi];
      for (int bf = 0; bf < 2; bf++) {
        hora_dtype_t d = bf ? HORA_BFLOAT16 : HORA_FLOAT16;
        memset(ho, 0xa5, cap);
        if (bf) EXPECT_OK(hora__cast_f32_to_bf16_host(ho + off, f + off, n, NULL));
        else EXPECT_OK(hora__cast_f32_to_f16_host(ho + off, f + off, n, NULL));
        size_t bad = (size_t)-1;
        for (size_t i = 0; i < n && bad == (size_t)-1; i++)
          if (ho[off + i] != f2h(d, f[off + i])) bad = i;
        EXPECT(bad == (size_t)-1, "cast f32->%s n %zu off %zu: element %zu differs", bf ? "bf16" : "f16", n, off, bad);
        EXPECT(ho[off + n] == 0xa5a5, "cast f32->16 n %zu: wrote past the end", n);
        for (size_t i = 0; i < n; i++) h[off + i] = ho[off + i];
        memset(fo, 0xa5, cap);
        if (bf) EXPECT_OK(hora__cast_bf16_to_f32_host(fo + off, h + off, n, NULL));
        else EXPECT_OK(hora__cast_f16_to_f32_host(fo + off, h + off, n, NULL));
        bad = (size_t)-1;
        for (size_t i = 0; i < n && bad == (size_t)-1; i++) {
          float w = h2f(d, h[off + i]);
          if (memcmp(&fo[off + i], &w, 4)) bad = i;
        }
        EXPECT(bad == (size_t)-1, "cast %s->f32 n %zu off %zu: element %zu differs", bf ? "bf16" : "f16", n, off, bad);
      }
    }
  /* The scalar conversions: known patterns, ties to even, and exhaustive round trips. */
  EXPECT(hora__f32_to_f16(1.0f) == 0x3c00, "1.0 -> f16 %#x", hora__f32_to_f16(1.0f));
  EXPECT(hora__f32_to_f16(65504.0f) == 0x7bff, "65504 -> f16");
  EXPECT(hora__f32_to_f16(65520.0f) == 0x7c00, "65520 -> f16 must be +inf");
  EXPECT(hora__f32_to_f16(-2.0f) == 0xc000, "-2 -> f16");
  EXPECT(hora__f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "1 + half ulp ties to even (down)");
  EXPECT(hora__f32_to_f16(1.0f + 0x3p-11f) == 0x3c02, "1 + 1.5 ulp ties to even (up)");
  EXPECT(hora__f32_to_f16(0x1p-24f) == 0x0001, "smallest subnormal");
  EXPECT(hora__f32_to_f16(0x1p-25f) == 0x0000, "half the smallest subnormal ties to zero");
  EXPECT(hora__f32_to_bf16(1.0f) == 0x3f80, "1.0 -> bf16");
  EXPECT(hora__f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80, "bf16 tie to even (down)");
  EXPECT(hora__f32_to_bf16(1.0f + 0x3p-8f) == 0x3f82, "bf16 tie to even (up)");
  EXPECT(isnan(hora__bf16_to_f32(hora__f32_to_bf16(NAN))), "bf16 NaN stays NaN");
  EXPECT(isnan(hora__f16_to_f32(hora__f32_to_f16(NAN))), "f16 NaN stays NaN");
  long rt16 = 0, rtbf = 0;
  for (uint32_t v = 0; v < 65536; v++) {
    float a = hora__f16_to_f32((uint16_t)v), b = hora__bf16_to_f32((uint16_t)v);
    if (!isnan(a) && hora__f32_to_f16(a) != v) rt16++;
    if (!isnan(b) && hora__f32_to_bf16(b) != v) rtbf++;
  }
  EXPECT(rt16 == 0, "%ld binary16 values do not round-trip through float32", rt16);
  EXPECT(rtbf == 0, "%ld bfloat16 values do not round-trip through float32", rtbf);
  free(f);
  free(fo);
  free(h);
  free(ho);
}

static void test_batched_copy(void) {
  enum { NR = 37 };
  const size_t cap = 1 << 20;
  char *src = xmalloc(cap), *dst = xmalloc(cap), *want = xmalloc(cap);
  fill(src, HORA_UINT8, cap);
  hora_copy_desc_t descs[NR];
  memset(dst, 0x11, cap);
  memcpy(want, dst, cap);
  size_t so = 3, dof = 5;
  for (int i = 0; i < NR; i++) {
    size_t bytes = i == 4 ? 0 : (next_rand() % 9000) + (size_t)i;
    descs[i].dst = dst + dof;
    descs[i].src = src + so;
    descs[i].bytes = bytes;
    memcpy(want + dof, src + so, bytes);
    so += bytes + (next_rand() % 7);
    dof += bytes + 1 + (next_rand() % 5); /* gaps stay untouched */
  }
  EXPECT_OK(hora__batched_copy_host(descs, NR, NULL));
  EXPECT(memcmp(dst, want, cap) == 0, "batched copy: destination differs at byte %zu", first_diff(dst, want, cap, 1));
  EXPECT_OK(hora__batched_copy_host(NULL, 0, NULL));
  free(src);
  free(dst);
  free(want);
}

/* Streaming copy: every byte of the destination range, none outside it, for lengths below and
 * above the streaming threshold and misaligned ends (head, whole 16 KiB blocks, tail). */
static void test_copy_stream(void) {
  const size_t cap = (3u << 20) + 4096;
  unsigned char *src = (unsigned char *)xmalloc(cap), *dst = (unsigned char *)xmalloc(cap);
  fill(src, HORA_UINT8, cap);
  const size_t lens[] = {0, 1, 63, 4097, (1u << 20) - 1, 1u << 20, (1u << 20) + 77, (3u << 20) + 1};
  for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
    for (size_t off = 0; off < 3; off++) {
      size_t d0 = 5 + off * 61, s0 = 3 + off * 7, n = lens[k];
      memset(dst, 0xA5, cap);
      hora__copy_stream_host(dst + d0, src + s0, n);
      size_t bad = 0;
      for (size_t i = 0; i < cap; i++) bad += dst[i] != (i >= d0 && i < d0 + n ? src[s0 + i - d0] : 0xA5);
      EXPECT(bad == 0, "copy_stream of %zu bytes at offset %zu: %zu bytes wrong", n, d0, bad);
    }
  free(src);
  free(dst);
}

/* The shm allreduce's fused float32 pass: the same bits as reduce_n then scale, in both outputs,
 * for 1..4 sources, every dst alignment a float array can have within 32 bytes (the streaming
 * stores need 32), streamed or not, with and without a factor; nothing outside written. */
static void test_sum_scale2(void) {
  const size_t maxn = 5000, cap = (maxn + 64) * sizeof(float);
  char *src[4], *dst = xmalloc(cap), *copy = xmalloc(cap), *want = xmalloc(cap);
  for (int k = 0; k < 4; k++) {
    src[k] = xmalloc(cap);
    fill(src[k], HORA_FLOAT32, cap / sizeof(float));
  }
  const size_t lens[] = {0, 1, 15, 63, 64, 65, 1000, maxn};
  const double factors[] = {1.0, 0.5, 1.0 / 3.0, 0.1};
  for (int ns = 1; ns <= 4; ns++)
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
      for (size_t doff = 0; doff <= 32; doff += 4) /* bytes */
        for (size_t fi = 0; fi < sizeof factors / sizeof factors[0]; fi++)
          for (int stream = 0; stream < 2; stream++) {
            size_t n = lens[li];
            const float *ss[4];
            for (int k = 0; k < ns; k++) ss[k] = (const float *)(src[k] + 4 * (size_t)(k + 1));
            EXPECT_OK(hora__reduce_n_host(want, (const void *const *)ss, ns, n, HORA_FLOAT32, HORA_SUM, NULL));
            EXPECT_OK(hora__scale_host(want, want, n, HORA_FLOAT32, factors[fi], NULL));
            memset(dst, 0xa5, cap);
            memset(copy, 0x5a, cap);
            float *d = (float *)(dst + doff), *c = (float *)(copy + 12);
            hora__sum_scale2_f32_host(d, c, ss, ns, n, factors[fi], stream);
            size_t bd = first_diff(d, want, n, 4), bc = first_diff(c, want, n, 4);
            EXPECT(bd == (size_t)-1 && bc == (size_t)-1,
                   "sum_scale2 %d sources n %zu dst+%zu factor %g stream %d: element %zu (dst) / %zu (copy) differs",
                   ns, n, doff, factors[fi], stream, bd, bc);
            size_t past = 0;
            for (size_t i = 0; i < cap; i++) {
              past += (i < doff || i >= doff + 4 * n) && (unsigned char)dst[i] != 0xa5;
              past += (i < 12 || i >= 12 + 4 * n) && (unsigned char)copy[i] != 0x5a;
            }
            EXPECT(past == 0, "sum_scale2 %d sources n %zu dst+%zu: %zu bytes written outside", ns, n, doff, past);
          }
  for (int k = 0; k < 4; k++) free(src[k]);
  free(dst);
  free(copy);
  free(want);
}

static void test_errors(void) {
  float x = 1;
  const void *one[1] = {&x};
  EXPECT_RC(hora__reduce_host(&x, &x, &x, 1, (hora_dtype_t)99, HORA_SUM, NULL), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora__reduce_host(&x, &x, &x, 1, HORA_FLOAT32, (hora_op_t)99, NULL), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora__reduce_host(NULL, &x, &x, 1, HORA_FLOAT32, HORA_SUM, NULL), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_OK(hora__reduce_host(NULL, NULL, NULL, 0, HORA_FLOAT32, HORA_SUM, NULL));
  EXPECT_RC(hora__reduce_n_host(&x, one, 0, 1, HORA_FLOAT32, HORA_SUM, NULL), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora__scale_host(&x, NULL, 1, HORA_FLOAT32, 2.0, NULL), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora__cast_f32_to_f16_host(NULL, &x, 1, NULL), HORA_ERR_INVALID_ARGUMENT);
  hora_copy_desc_t bad = {NULL, &x, 4};
  EXPECT_RC(hora__batched_copy_host(&bad, 1, NULL), HORA_ERR_INVALID_ARGUMENT);
}

int main(void) {
  test_reduce();
  test_scale();
  test_casts();
  test_batched_copy();
  test_copy_stream();
  test_sum_scale2();
  test_errors();
  return hora_test_finish("test_kernels_host");
}
