/* IEEE binary16 and bfloat16 <-> binary32 conversions, round to nearest even.
 * The algorithms are the standard bit manipulations (see IEEE 754-2008 section 3.6 for the
 * binary16 format); written here because the conversions sit inside the reduction loops and must
 * inline, and no Debian C library offers them as inline functions. */
#include <string.h>

#include "hora_kernels.h"
#include "half_inline.h"

float hora__f16_to_f32(uint16_t h) { return h16_to_f32(h); }
uint16_t hora__f32_to_f16(float f) { return f32_to_h16(f); }
float hora__bf16_to_f32(uint16_t h) { return bf16_to_f32(h); }
uint16_t hora__f32_to_bf16(float f) { return f32_to_bf16(f); }

hora_result_t hora__cast_f32_to_f16_host(void *dst, const float *src, size_t count, void *stream) {
  (void)stream;
  if (count && (!dst || !src)) return HORA_ERR_INVALID_ARGUMENT;
  uint16_t *d = dst;
  for (size_t i = 0; i < count; i++) d[i] = f32_to_h16(src[i]);
  return HORA_SUCCESS;
}
hora_result_t hora__cast_f16_to_f32_host(float *dst, const void *src, size_t count, void *stream) {
  (void)stream;
  if (count && (!dst || !src)) return HORA_ERR_INVALID_ARGUMENT;
  const uint16_t *s = src;
  for (size_t i = 0; i < count; i++) dst[i] = h16_to_f32(s[i]);
  return HORA_SUCCESS;
}
hora_result_t hora__cast_f32_to_bf16_host(void *dst, const float *src, size_t count, void *stream) {
  (void)stream;
  if (count && (!dst || !src)) return HORA_ERR_INVALID_ARGUMENT;
  uint16_t *d = dst;
  for (size_t i = 0; i < count; i++) d[i] = f32_to_bf16(src[i]);
  return HORA_SUCCESS;
}
hora_result_t hora__cast_bf16_to_f32_host(float *dst, const void *src, size_t count, void *stream) {
  (void)stream;
  if (count && (!dst || !src)) return HORA_ERR_INVALID_ARGUMENT;
  const uint16_t *s = src;
  for (size_t i = 0; i < count; i++) dst[i] = bf16_to_f32(s[i]);
  return HORA_SUCCESS;
}
