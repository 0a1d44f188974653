/* hora kernels: elementwise reductions, scaling, casts and the fusion buffer's batched copy.
 *
 * Every kernel has a host reference (kernels/host, suffix _host) and, in CUDA builds, a CUDA
 * version (kernels/cuda, suffix _cuda) with the same C signature. The host versions are the CPU
 * path and the test oracle for the CUDA ones. `stream` is a cudaStream_t for _cuda (NULL: the
 * default stream) and ignored by _host. CUDA versions enqueue on the stream and never
 * synchronize; they check cudaGetLastError() after each launch and return HORA_ERR_CUDA.
 *
 * Counts are in elements (size_t). f16 and bf16 are reduced through float32 arithmetic and
 * rounded to nearest even. HORA_AVERAGE reduces as HORA_SUM: the caller divides (scale).
 * Errors (all kernels): HORA_ERR_INVALID_ARGUMENT for an unknown dtype/op or a NULL pointer
 * with count > 0. Internal API: not installed, not exported. */
#ifndef HORA_KERNELS_H
#define HORA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "hora.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  void *dst;
  const void *src;
  size_t bytes;
} hora_copy_desc_t;

/* dst[i] = a[i] OP b[i], i < count. dst may equal a or b (in place); no other overlap. */
hora_result_t hora__reduce_host(void *dst, const void *a, const void *b, size_t count,
                                hora_dtype_t dtype, hora_op_t op, void *stream);
/* dst[i] = OP over s of srcs[s][i], nsrc >= 1 sources read in one pass (the shared-memory
 * allreduce reads every local rank's buffer this way). dst may equal srcs[0]. */
hora_result_t hora__reduce_n_host(void *dst, const void *const *srcs, int nsrc, size_t count,
                                  hora_dtype_t dtype, hora_op_t op, void *stream);
/* dst[i] = src[i] * factor (floating dtypes; integer dtypes: truncated toward zero of the double
 * product; factor 1.0 is a copy or no-op). dst may equal src. */
hora_result_t hora__scale_host(void *dst, const void *src, size_t count, hora_dtype_t dtype,
                               double factor, void *stream);
/* Casts for compression: float32 <-> float16 / bfloat16 (round to nearest even). */
hora_result_t hora__cast_f32_to_f16_host(void *dst, const float *src, size_t count, void *stream);
hora_result_t hora__cast_f16_to_f32_host(float *dst, const void *src, size_t count, void *stream);
hora_result_t hora__cast_f32_to_bf16_host(void *dst, const float *src, size_t count, void *stream);
hora_result_t hora__cast_bf16_to_f32_host(float *dst, const void *src, size_t count, void *stream);
/* Copies n (dst, src, bytes) regions; regions must not overlap each other. */
hora_result_t hora__batched_copy_host(const hora_copy_desc_t *descs, size_t n, void *stream);
/* memcpy for a destination nobody reads soon (x86-64 with AVX2; memcpy elsewhere): whole 16 KiB
 * blocks are written with stores that bypass the caches (non-temporal), so the destination lines
 * are not read first (a third of the memory traffic of a large copy) and do not evict what is in
 * the cache; head and tail go through memcpy. Worth it for copies larger than the caches; the
 * caller decides. Ends with a store fence. Regions must not overlap. */
void hora__copy_stream_host(void *dst, const void *src, size_t bytes);
/* Host only (the shared-memory allreduce's; no CUDA counterpart), float32 only:
 * v[i] = (srcs[0][i] + srcs[1][i] + ... + srcs[nsrc-1][i]) * factor, i < count, stored
 * to both dst[i] and copy[i] in one pass (the shared-memory allreduce's own slice goes to the recv
 * buffer and to the slot its peers read). The multiply is a float32 one by (float)factor and is
 * skipped for factor 1.0: the bits of hora__reduce_n_host then hora__scale_host. stream: dst is
 * written with non-temporal stores (x86-64 with AVX2; plain stores elsewhere), as
 * hora__copy_stream_host; copy always with plain ones. Every pointer must be float-aligned (4
 * bytes); no region may overlap another. */
void hora__sum_scale2_f32_host(float *dst, float *copy, const float *const *srcs, int nsrc, size_t count,
                               double factor, int stream);

/* Scalar conversions used by the host kernels and tests. */
float hora__f16_to_f32(uint16_t h);
uint16_t hora__f32_to_f16(float f);
float hora__bf16_to_f32(uint16_t h);
uint16_t hora__f32_to_bf16(float f);

/* Bytes of one element of `d` (0 for an unknown dtype). */
static inline size_t hora__kdtype_size(hora_dtype_t d) {
  switch (d) {
    case HORA_UINT8: case HORA_INT8: case HORA_BOOL: return 1;
    case HORA_INT16: case HORA_FLOAT16: case HORA_BFLOAT16: return 2;
    case HORA_INT32: case HORA_FLOAT32: return 4;
    case HORA_INT64: case HORA_FLOAT64: return 8;
  }
  return 0;
}

/* Element i of a host buffer of `dtype` as a double, and back (f16/bf16 through float32, rounded
 * to nearest even; integers truncated). For tests and benchmarks that build inputs and check
 * results for every dtype with one code path; not for hot loops. */
static inline void hora__elem_store(void *buf, hora_dtype_t d, size_t i, double v) {
  switch (d) {
    case HORA_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case HORA_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case HORA_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case HORA_BOOL: ((uint8_t *)buf)[i] = v != 0.0; break;
    case HORA_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case HORA_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case HORA_FLOAT16: ((uint16_t *)buf)[i] = hora__f32_to_f16((float)v); break;
    case HORA_BFLOAT16: ((uint16_t *)buf)[i] = hora__f32_to_bf16((float)v); break;
    case HORA_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case HORA_FLOAT64: ((double *)buf)[i] = v; break;
  }
}
static inline double hora__elem_load(const void *buf, hora_dtype_t d, size_t i) {
  switch (d) {
    case HORA_UINT8: return ((const uint8_t *)buf)[i];
    case HORA_INT8: return ((const int8_t *)buf)[i];
    case HORA_INT16: return ((const int16_t *)buf)[i];
    case HORA_BOOL: return ((const uint8_t *)buf)[i];
    case HORA_INT32: return ((const int32_t *)buf)[i];
    case HORA_INT64: return (double)((const int64_t *)buf)[i];
    case HORA_FLOAT16: return hora__f16_to_f32(((const uint16_t *)buf)[i]);
    case HORA_BFLOAT16: return hora__bf16_to_f32(((const uint16_t *)buf)[i]);
    case HORA_FLOAT32: return ((const float *)buf)[i];
    case HORA_FLOAT64: return ((const double *)buf)[i];
  }
  return 0.0 / 0.0;
}

/* CUDA versions (declared always; defined only when HORA_HAVE_CUDA). */
hora_result_t hora__reduce_cuda(void *dst, const void *a, const void *b, size_t count,
                                hora_dtype_t dtype, hora_op_t op, void *stream);
hora_result_t hora__reduce_n_cuda(void *dst, const void *const *srcs, int nsrc, size_t count,
                                  hora_dtype_t dtype, hora_op_t op, void *stream);
hora_result_t hora__scale_cuda(void *dst, const void *src, size_t count, hora_dtype_t dtype,
                               double factor, void *stream);
hora_result_t hora__cast_f32_to_f16_cuda(void *dst, const float *src, size_t count, void *stream);
hora_result_t hora__cast_f16_to_f32_cuda(float *dst, const void *src, size_t count, void *stream);
hora_result_t hora__cast_f32_to_bf16_cuda(void *dst, const float *src, size_t count, void *stream);
hora_result_t hora__cast_bf16_to_f32_cuda(float *dst, const void *src, size_t count, void *stream);
hora_result_t hora__batched_copy_cuda(const hora_copy_desc_t *descs, size_t n, void *stream);

#ifdef __cplusplus
}
#endif

#endif
