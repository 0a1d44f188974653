/* CRC32C: hardware (SSE4.2) with a slicing-by-8 fallback. See crc32c.h for why it is ours. */
#include "core/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#endif

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;
static int have_hw = 0;

static void init_tables(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (__get_cpuid(1, &a, &b, &c, &d)) have_hw = (c & bit_SSE4_2) != 0;
#endif
}

uint32_t hora__crc32c_sw(uint32_t crc, const void *buf, size_t len) {
  pthread_once(&table_once, init_tables);
  const unsigned char *p = buf;
  crc = ~crc;
  while (len && ((uintptr_t)p & 7)) {
    crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    len--;
  }
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    w ^= crc; /* little-endian machines only (x86-64, aarch64 LE) */
    crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
          table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
          table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
    p += 8;
    len -= 8;
  }
  while (len--) crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const void *buf, size_t len) {
  const unsigned char *p = buf;
  uint64_t c = ~crc;
  while (len && ((uintptr_t)p & 7)) {
    c = _mm_crc32_u8((uint32_t)c, *p++);
    len--;
  }
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
    p += 8;
    len -= 8;
  }
  while (len--) c = _mm_crc32_u8((uint32_t)c, *p++);
  return ~(uint32_t)c;
}
#endif

uint32_t hora__crc32c(uint32_t crc, const void *buf, size_t len) {
  pthread_once(&table_once, init_tables);
#if defined(__x86_64__)
  if (have_hw) return crc_hw(crc, buf, len);
#endif
  return hora__crc32c_sw(crc, buf, len);
}
