/* Inline binary16/bfloat16 conversions shared by the host kernels (round to nearest even;
 * NaN stays NaN, overflow goes to infinity, subnormals are exact). */
#ifndef HORA_HALF_INLINE_H
#define HORA_HALF_INLINE_H
#include <stdint.h>
#include <string.h>

static inline float bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float h16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (man << 13)); /* inf / nan */
  if (exp == 0) {
    /* zero or subnormal: value = man * 2^-24, exact in float32 */
    float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t f32_to_h16(float f) {
  uint32_t u = f32_to_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* nan */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (a < 0x38800000u) {
    /* subnormal or zero in half: round a * 2^24 to nearest even integer */
    float v = bits_to_f32(a) * 16777216.0f;  /* exact scaling */
    uint32_t m = (uint32_t)v;
    float r = v - (float)m;
    if (r > 0.5f || (r == 0.5f && (m & 1u))) m++;
    return (uint16_t)(sign | m);
  }
  /* normal: rebias and round the 13 dropped bits to nearest even */
  uint32_t base = a - 0x38000000u; /* exponent rebias 127 -> 15, still in float bit layout */
  uint32_t lsb = (base >> 13) & 1u;
  base += 0xfffu + lsb;
  return (uint16_t)(sign | (base >> 13));
}

static inline float bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

static inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet nan */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
#endif
