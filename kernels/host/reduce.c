/* Host reductions, scaling and batched copy: the CPU path and the oracle for the CUDA kernels.
 * Loops are written so that GCC -O3 vectorizes them (one dtype and op per loop, restrict where
 * the contract allows it, no calls inside); f16/bf16 go through float32 in blocks. */
#include <stdatomic.h>
#include <string.h>

#include "hora_kernels.h"
#include "half_inline.h"

#define OP_SUM(x, y) ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
#define OP_MIN(x, y) ((y) < (x) ? (y) : (x))
#define OP_MAX(x, y) ((y) > (x) ? (y) : (x))

/* Integer sums wrap (two's complement, as MPI and NCCL do); signed overflow in C is undefined,
 * so signed integer sums and products are computed in the unsigned type of the same width. */
#define DEF_REDUCE2(name, T, UT, OP)                                                        \
  static void name(T *dst, const T *a, const T *b, size_t n) {                             \
    for (size_t i = 0; i < n; i++) dst[i] = (T)OP((UT)a[i], (UT)b[i]);                     \
  }
#define DEF_REDUCE2_ALL(sfx, T, UT)        \
  DEF_REDUCE2(sum_##sfx, T, UT, OP_SUM)    \
  DEF_REDUCE2(prod_##sfx, T, UT, OP_PROD)  \
  DEF_REDUCE2(min_##sfx, T, T, OP_MIN)     \
  DEF_REDUCE2(max_##sfx, T, T, OP_MAX)

DEF_REDUCE2_ALL(u8, uint8_t, uint8_t)
DEF_REDUCE2_ALL(i8, int8_t, uint8_t)
DEF_REDUCE2_ALL(i16, int16_t, uint16_t)
DEF_REDUCE2_ALL(i32, int32_t, uint32_t)
DEF_REDUCE2_ALL(i64, int64_t, uint64_t)
DEF_REDUCE2_ALL(f32, float, float)
DEF_REDUCE2_ALL(f64, double, double)

/* 16-bit floats: convert a block to float32, reduce, convert back. The block conversions are the
 * hot part: bfloat16 is plain shifts that GCC vectorizes; binary16 uses the F16C instructions
 * when the CPU has them (checked once at run time; bit-identical to the scalar conversion in
 * half_inline.h, which is the fallback and the tail loop). */
#define HBLK 512
typedef union {
  float f[HBLK];
  uint32_t u[HBLK];
} blk32_t;

static void bf16_to_f32_n(blk32_t *d, const uint16_t *s, size_t n) {
  for (size_t i = 0; i < n; i++) d->u[i] = (uint32_t)s[i] << 16;
}
static void f32_to_bf16_n(uint16_t *d, const blk32_t *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u = s->u[i];
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (u >> 16) | 0x40u;
    d[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx,f16c"))) static void h16_to_f32_f16c(blk32_t *d, const uint16_t *s, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d->f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  for (; i < n; i++) d->f[i] = h16_to_f32(s[i]);
}
__attribute__((target("avx,f16c"))) static void f32_to_h16_f16c(uint16_t *d, const blk32_t *s, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s->f + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; i++) d[i] = f32_to_h16(s->f[i]);
}
static int have_f16c(void) {
  /* Threads may race to fill it (the shm allreduce's helper threads do): every one computes the
   * same value, and the atomic makes that race defined. */
  static _Atomic int cached = -1;
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v < 0) {
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    atomic_store_explicit(&cached, v, memory_order_relaxed);
  }
  return v;
}
#else
static int have_f16c(void) { return 0; }
#endif

static void h16_to_f32_n(blk32_t *d, const uint16_t *s, size_t n) {
#if defined(__x86_64__)
  if (have_f16c()) {
    h16_to_f32_f16c(d, s, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) d->f[i] = h16_to_f32(s[i]);
}
static void f32_to_h16_n(uint16_t *d, const blk32_t *s, size_t n) {
#if defined(__x86_64__)
  if (have_f16c()) {
    f32_to_h16_f16c(d, s, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) d[i] = f32_to_h16(s->f[i]);
}

static void to_f32_n(hora_dtype_t dt, blk32_t *d, const uint16_t *s, size_t n) {
  if (dt == HORA_FLOAT16) h16_to_f32_n(d, s, n);
  else bf16_to_f32_n(d, s, n);
}
static void from_f32_n(hora_dtype_t dt, uint16_t *d, const blk32_t *s, size_t n) {
  if (dt == HORA_FLOAT16) f32_to_h16_n(d, s, n);
  else f32_to_bf16_n(d, s, n);
}

static void reduce_f32_op(float *dst, const float *a, const float *b, size_t m, hora_op_t op) {
  switch (op) {
    case HORA_SUM: case HORA_AVERAGE: sum_f32(dst, a, b, m); break;
    case HORA_PRODUCT: prod_f32(dst, a, b, m); break;
    case HORA_MIN: min_f32(dst, a, b, m); break;
    case HORA_MAX: max_f32(dst, a, b, m); break;
    case HORA_ADASUM: break; /* not element-wise: valid() refuses it */
  }
}

/* dst = OP over nsrc 16-bit sources, accumulated in float32 and rounded once per element. */
static void reduce_half_n(hora_dtype_t dt, uint16_t *dst, const uint16_t *const *srcs, int nsrc,
                          size_t off, size_t n, hora_op_t op) {
  blk32_t acc, tmp;
  for (size_t base = 0; base < n; base += HBLK) {
    size_t m = n - base < HBLK ? n - base : HBLK;
    to_f32_n(dt, &acc, srcs[0] + off + base, m);
    for (int s = 1; s < nsrc; s++) {
      to_f32_n(dt, &tmp, srcs[s] + off + base, m);
      reduce_f32_op(acc.f, acc.f, tmp.f, m, op);
    }
    from_f32_n(dt, dst + off + base, &acc, m);
  }
}

static int valid(hora_dtype_t dt, hora_op_t op) {
  return (unsigned)dt < HORA_DTYPE_COUNT && (unsigned)op < HORA_OP_COUNT;
}

#define DISPATCH_OP(sfx, T)                                                     \
  switch (op) {                                                                 \
    case HORA_SUM: case HORA_AVERAGE: sum_##sfx((T *)dst, a, b, count); break;  \
    case HORA_PRODUCT: prod_##sfx((T *)dst, a, b, count); break;                \
    case HORA_MIN: min_##sfx((T *)dst, a, b, count); break;                     \
    case HORA_MAX: max_##sfx((T *)dst, a, b, count); break;                     \
    case HORA_ADASUM: break; /* not element-wise: valid() refuses it */         \
  }                                                                             \
  break;

hora_result_t hora__reduce_host(void *dst, const void *a, const void *b, size_t count,
                                hora_dtype_t dtype, hora_op_t op, void *stream) {
  (void)stream;
  if (!valid(dtype, op)) return HORA_ERR_INVALID_ARGUMENT;
  if (count == 0) return HORA_SUCCESS;
  if (!dst || !a || !b) return HORA_ERR_INVALID_ARGUMENT;
  switch (dtype) {
    case HORA_UINT8: DISPATCH_OP(u8, uint8_t)
    case HORA_INT8: DISPATCH_OP(i8, int8_t)
    case HORA_INT16: DISPATCH_OP(i16, int16_t)
    case HORA_BOOL: /* 0/1 bytes: OR is max, AND is min */
      if (op == HORA_MIN || op == HORA_PRODUCT) min_u8(dst, a, b, count);
      else max_u8(dst, a, b, count);
      break;
    case HORA_INT32: DISPATCH_OP(i32, int32_t)
    case HORA_INT64: DISPATCH_OP(i64, int64_t)
    case HORA_FLOAT32: DISPATCH_OP(f32, float)
    case HORA_FLOAT64: DISPATCH_OP(f64, double)
    case HORA_FLOAT16:
    case HORA_BFLOAT16: {
      const uint16_t *srcs[2] = {a, b};
      reduce_half_n(dtype, dst, srcs, 2, 0, count, op);
      break;
    }
  }
  return HORA_SUCCESS;
}

/* Multi-source reduction, in cache-sized blocks so that dst stays in L1/L2 while each source
 * streams through once. */
hora_result_t hora__reduce_n_host(void *dst, const void *const *srcs, int nsrc, size_t count,
                                  hora_dtype_t dtype, hora_op_t op, void *stream) {
  if (!valid(dtype, op) || nsrc < 1) return HORA_ERR_INVALID_ARGUMENT;
  if (count == 0) return HORA_SUCCESS;
  if (!dst || !srcs) return HORA_ERR_INVALID_ARGUMENT;
  for (int s = 0; s < nsrc; s++)
    if (!srcs[s]) return HORA_ERR_INVALID_ARGUMENT;
  if ((dtype == HORA_FLOAT16 || dtype == HORA_BFLOAT16) && nsrc > 1) {
    /* One float32 accumulator per block: each source is converted once, dst written once. */
    reduce_half_n(dtype, dst, (const uint16_t *const *)srcs, nsrc, 0, count, op);
    return HORA_SUCCESS;
  }
  size_t es = hora__kdtype_size(dtype);
  const size_t blk = 16384 / es; /* 16 KiB of dst per block */
  for (size_t base = 0; base < count; base += blk) {
    size_t m = count - base < blk ? count - base : blk;
    char *d = (char *)dst + base * es;
    const char *s0 = (const char *)srcs[0] + base * es;
    if (nsrc == 1) {
      if (d != s0) memcpy(d, s0, m * es);
      continue;
    }
    hora_result_t rc = hora__reduce_host(d, s0, (const char *)srcs[1] + base * es, m, dtype, op, stream);
    if (rc) return rc;
    for (int s = 2; s < nsrc; s++) {
      rc = hora__reduce_host(d, d, (const char *)srcs[s] + base * es, m, dtype, op, stream);
      if (rc) return rc;
    }
  }
  return HORA_SUCCESS;
}

#define DEF_SCALE_INT(sfx, T)                                                   \
  static void scale_##sfx(T *dst, const T *src, size_t n, double f) {          \
    for (size_t i = 0; i < n; i++) dst[i] = (T)((double)src[i] * f);           \
  }
DEF_SCALE_INT(u8, uint8_t)
DEF_SCALE_INT(i8, int8_t)
DEF_SCALE_INT(i16, int16_t)
DEF_SCALE_INT(i32, int32_t)
DEF_SCALE_INT(i64, int64_t)
static void scale_f32(float *dst, const float *src, size_t n, double f) {
  float ff = (float)f;
  for (size_t i = 0; i < n; i++) dst[i] = src[i] * ff;
}
static void scale_f64(double *dst, const double *src, size_t n, double f) {
  for (size_t i = 0; i < n; i++) dst[i] = src[i] * f;
}

hora_result_t hora__scale_host(void *dst, const void *src, size_t count, hora_dtype_t dtype,
                               double factor, void *stream) {
  (void)stream;
  if ((unsigned)dtype >= HORA_DTYPE_COUNT) return HORA_ERR_INVALID_ARGUMENT;
  if (count == 0) return HORA_SUCCESS;
  if (!dst || !src) return HORA_ERR_INVALID_ARGUMENT;
  if (factor == 1.0) {
    if (dst != src) {
      size_t es = hora__kdtype_size(dtype);
      memmove(dst, src, count * es);
    }
    return HORA_SUCCESS;
  }
  switch (dtype) {
    case HORA_UINT8: scale_u8(dst, src, count, factor); break;
    case HORA_INT8: scale_i8(dst, src, count, factor); break;
    case HORA_INT16: scale_i16(dst, src, count, factor); break;
    case HORA_BOOL: return HORA_ERR_INVALID_ARGUMENT; /* a bool cannot be scaled */
    case HORA_INT32: scale_i32(dst, src, count, factor); break;
    case HORA_INT64: scale_i64(dst, src, count, factor); break;
    case HORA_FLOAT32: scale_f32(dst, src, count, factor); break;
    case HORA_FLOAT64: scale_f64(dst, src, count, factor); break;
    case HORA_FLOAT16:
    case HORA_BFLOAT16: {
      const uint16_t *s = src;
      uint16_t *d = dst;
      float ff = (float)factor;
      blk32_t b;
      for (size_t base = 0; base < count; base += HBLK) {
        size_t m = count - base < HBLK ? count - base : HBLK;
        to_f32_n(dtype, &b, s + base, m);
        for (size_t i = 0; i < m; i++) b.f[i] *= ff;
        from_f32_n(dtype, d + base, &b, m);
      }
      break;
    }
  }
  return HORA_SUCCESS;
}

hora_result_t hora__batched_copy_host(const hora_copy_desc_t *descs, size_t n, void *stream) {
  (void)stream;
  if (n && !descs) return HORA_ERR_INVALID_ARGUMENT;
  for (size_t i = 0; i < n; i++) {
    if (descs[i].bytes == 0) continue;
    if (!descs[i].dst || !descs[i].src) return HORA_ERR_INVALID_ARGUMENT;
    memcpy(descs[i].dst, descs[i].src, descs[i].bytes);
  }
  return HORA_SUCCESS;
}

/* Streaming copy (hora_kernels.h). Ours because no library offers a streaming memcpy: glibc's
 * memcpy switches to non-temporal stores only above a threshold derived from the last-level
 * cache size, which large-L3 nodes put above a typical tensor (1 GiB in 8 tensors on a 2-core
 * VM: 150 ms with memcpy, 86 ms streamed). 16 KiB at a time as four 4 KiB pages walked side by
 * side (64 bytes of each in turn, source prefetched ahead): several DRAM pages stay open at once,
 * as in glibc's large-copy loop (1 GiB, one thread: 86 ms against 115 ms for a plain streaming
 * loop). */
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static void stream_avx2_pages(unsigned char *d, const unsigned char *s, size_t n) {
  for (size_t blk = 0; blk < n; blk += 16384)
    for (size_t i = 0; i < 4096; i += 64)
      for (size_t p = 0; p < 16384; p += 4096) {
        const unsigned char *ss = s + blk + p + i;
        unsigned char *dd = d + blk + p + i;
        _mm_prefetch((const char *)(ss + 512), _MM_HINT_T0);
        __m256i a = _mm256_loadu_si256((const __m256i *)ss);
        __m256i b = _mm256_loadu_si256((const __m256i *)(ss + 32));
        _mm256_stream_si256((__m256i *)dd, a);
        _mm256_stream_si256((__m256i *)(dd + 32), b);
      }
}
#endif

void hora__copy_stream_host(void *dst, const void *src, size_t n) {
  unsigned char *d = dst;
  const unsigned char *s = src;
#if defined(__x86_64__)
  if (n >= 16384 + 128 && __builtin_cpu_supports("avx2")) {
    size_t head = (size_t)(-(uintptr_t)d & 127); /* align the destination to 128 bytes */
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    size_t body = n & ~(size_t)16383; /* whole 16 KiB blocks; memcpy takes the rest */
    stream_avx2_pages(d, s, body);
    _mm_sfence(); /* streaming stores are weakly ordered */
    d += body, s += body, n -= body;
  }
#endif
  memcpy(d, s, n);
}

/* The float32 sum of the shared-memory allreduce's own slice, scaled and stored twice (hora_kernels.h).
 * Ours, as the reduce kernels are: one pass where reduce, scale and copy were three (the sum into the
 * cache, the scale over it, the copy out of it), since the pass that reads the sources is the one
 * whose stores must reach the recv buffer. Bit-identical to hora__reduce_n_host followed by
 * hora__scale_host: the same additions in the same order, then one float32 multiply. */
static float sum_scale_one(const float *const *srcs, int nsrc, size_t i, float f, int scale) {
  float a = srcs[0][i];
  for (int k = 1; k < nsrc; k++) a = a + srcs[k][i];
  return scale ? a * f : a;
}

#if defined(__x86_64__)
/* 16 floats per step; dst is 32-byte aligned when `stream` (the caller's head loop sees to it). */
__attribute__((target("avx2"))) static void sum_scale2_avx2(float *dst, float *copy, const float *const *srcs,
                                                            int nsrc, size_t i, size_t end, float f, int scale,
                                                            int stream) {
  __m256 vf = _mm256_set1_ps(f);
  for (; i + 16 <= end; i += 16) {
    _mm_prefetch((const char *)(srcs[0] + i + 128), _MM_HINT_T0);
    __m256 x = _mm256_loadu_ps(srcs[0] + i), y = _mm256_loadu_ps(srcs[0] + i + 8);
    for (int k = 1; k < nsrc; k++) {
      x = _mm256_add_ps(x, _mm256_loadu_ps(srcs[k] + i));
      y = _mm256_add_ps(y, _mm256_loadu_ps(srcs[k] + i + 8));
    }
    if (scale) {
      x = _mm256_mul_ps(x, vf);
      y = _mm256_mul_ps(y, vf);
    }
    _mm256_storeu_ps(copy + i, x);
    _mm256_storeu_ps(copy + i + 8, y);
    if (stream) {
      _mm256_stream_ps(dst + i, x);
      _mm256_stream_ps(dst + i + 8, y);
    } else {
      _mm256_storeu_ps(dst + i, x);
      _mm256_storeu_ps(dst + i + 8, y);
    }
  }
  if (stream) _mm_sfence(); /* streaming stores are weakly ordered */
}
#endif

void hora__sum_scale2_f32_host(float *dst, float *copy, const float *const *srcs, int nsrc, size_t count,
                               double factor, int stream) {
  float f = (float)factor; /* as hora__scale_host: the factor rounded to float32 once */
  int scale = factor != 1.0;
  size_t i = 0;
#if defined(__x86_64__)
  if (count >= 64 && __builtin_cpu_supports("avx2")) {
    if (stream)
      for (; ((uintptr_t)(dst + i) & 31) != 0; i++) dst[i] = copy[i] = sum_scale_one(srcs, nsrc, i, f, scale);
    sum_scale2_avx2(dst, copy, srcs, nsrc, i, count, f, scale, stream);
    i = count - (count - i) % 16;
  }
#else
  (void)stream;
#endif
  for (; i < count; i++) dst[i] = copy[i] = sum_scale_one(srcs, nsrc, i, f, scale);
}
