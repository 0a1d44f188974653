/* CRC32C: hardware (x86-64 SSE4.2 or AArch64 CRC32 instructions, three interleaved streams)
 * with a slicing-by-8 fallback. See crc32c.h for why it is ours. */
#include "core/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#define HORA_CRC_HW 1
#define HW_TARGET __attribute__((target("sse4.2")))
#define HW_U64(c, w) _mm_crc32_u64((c), (w))
#define HW_U8(c, b) ((uint64_t)_mm_crc32_u8((uint32_t)(c), (b)))
#elif defined(__aarch64__) && defined(__GNUC__)
/* ARMv8.0 made the CRC32 instructions optional (ARMv8.1 requires them): checked at run time. */
#include <arm_acle.h>
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#define HORA_CRC_HW 1
#define HW_TARGET __attribute__((target("+crc")))
#define HW_U64(c, w) ((uint64_t)__crc32cd((uint32_t)(c), (w)))
#define HW_U8(c, b) ((uint64_t)__crc32cb((uint32_t)(c), (b)))
#endif
#ifndef HORA_CRC_HW
#define HORA_CRC_HW 0
#endif

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;
static int have_hw = 0;
#if HORA_CRC_HW
static void init_hw_shifts(void);
#endif

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
#elif HORA_CRC_HW
  have_hw = (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#endif
#if HORA_CRC_HW
  if (have_hw) init_hw_shifts();
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

#if HORA_CRC_HW
/* The crc32 instruction has a latency of 3 cycles and a throughput of 1 per cycle, so one
 * dependent chain runs at a third of what the unit can do. Long inputs are therefore split into
 * three streams of equal length L that run interleaved; the partial CRCs are joined with
 * crc(A|B) = shift_L(crc(A)) ^ crc(B) on the raw (uninverted) register, where shift_L (appending
 * L zero bytes) is linear over GF(2) and is applied with four 256-entry tables (Intel's
 * "Fast CRC Computation for iSCSI Polynomial Using CRC32 Instruction", 2011, describes the
 * interleaving; the tables are the byte-wise form of zlib's crc32_combine operator).
 * Two stream lengths: LONG_L for bulk data, SHORT_L for record-sized inputs. AArch64's CRC32CX
 * has the same shape (latency 2-3 cycles, one per cycle on Neoverse cores), so both share it. */
#define LONG_L 8192u
#define SHORT_L 256u
static uint32_t shift_long[4][256], shift_short[4][256];

/* The raw register after `len` zero bytes, with the byte table (init only). */
static uint32_t zeros(uint32_t c, size_t len) {
  for (size_t i = 0; i < len; i++) c = (c >> 8) ^ table[0][c & 0xff];
  return c;
}

static void make_shift(uint32_t t[4][256], size_t len) {
  uint32_t basis[32];
  for (int b = 0; b < 32; b++) basis[b] = zeros(1u << b, len);
  for (int k = 0; k < 4; k++)
    for (uint32_t v = 0; v < 256; v++) {
      uint32_t x = 0;
      for (int j = 0; j < 8; j++)
        if (v & (1u << j)) x ^= basis[8 * k + j];
      t[k][v] = x;
    }
}

static void init_hw_shifts(void) {
  make_shift(shift_long, LONG_L);
  make_shift(shift_short, SHORT_L);
}

static inline uint32_t shift(const uint32_t t[4][256], uint32_t c) {
  return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
}

/* Consume whole blocks of 3 x l bytes from p (8-byte aligned), extending the raw register *c;
 * returns the first byte not consumed and leaves the rest in *len. */
HW_TARGET __attribute__((always_inline)) static inline const unsigned char *crc3_blocks(
    uint64_t *c, const unsigned char *p, size_t *len, size_t l, const uint32_t t[4][256]) {
  while (*len >= 3 * l) {
    uint64_t c0 = *c, c1 = 0, c2 = 0;
    for (size_t i = 0; i < l; i += 8) {
      uint64_t w0, w1, w2;
      memcpy(&w0, p + i, 8);
      memcpy(&w1, p + l + i, 8);
      memcpy(&w2, p + 2 * l + i, 8);
      c0 = HW_U64(c0, w0);
      c1 = HW_U64(c1, w1);
      c2 = HW_U64(c2, w2);
    }
    c0 = shift(t, (uint32_t)c0) ^ (uint32_t)c1;
    *c = shift(t, (uint32_t)c0) ^ (uint32_t)c2;
    p += 3 * l;
    *len -= 3 * l;
  }
  return p;
}

HW_TARGET static uint32_t crc_hw(uint32_t crc, const void *buf, size_t len) {
  const unsigned char *p = buf;
  uint64_t c = ~crc;
  while (len && ((uintptr_t)p & 7)) {
    c = HW_U8(c, *p++);
    len--;
  }
  p = crc3_blocks(&c, p, &len, LONG_L, shift_long);
  p = crc3_blocks(&c, p, &len, SHORT_L, shift_short);
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c = HW_U64(c, w);
    p += 8;
    len -= 8;
  }
  while (len--) c = HW_U8(c, *p++);
  return ~(uint32_t)c;
}

HW_TARGET static void crc_hw_x3(const void *const p[3], const size_t n[3], uint32_t out[3]) {
  size_t m = n[0] < n[1] ? n[0] : n[1];
  if (n[2] < m) m = n[2];
  m &= ~(size_t)7;
  const unsigned char *a = p[0], *b = p[1], *c = p[2];
  uint64_t ca = 0xFFFFFFFFu, cb = 0xFFFFFFFFu, cc = 0xFFFFFFFFu;
  for (size_t i = 0; i < m; i += 8) {
    uint64_t wa, wb, wc;
    memcpy(&wa, a + i, 8);
    memcpy(&wb, b + i, 8);
    memcpy(&wc, c + i, 8);
    ca = HW_U64(ca, wa);
    cb = HW_U64(cb, wb);
    cc = HW_U64(cc, wc);
  }
  /* the rest of each buffer continues its own chain (crc_hw takes and returns inverted values) */
  out[0] = crc_hw(~(uint32_t)ca, a + m, n[0] - m);
  out[1] = crc_hw(~(uint32_t)cb, b + m, n[1] - m);
  out[2] = crc_hw(~(uint32_t)cc, c + m, n[2] - m);
}
#endif

void hora__crc32c_x3(const void *const p[3], const size_t n[3], uint32_t out[3]) {
  pthread_once(&table_once, init_tables);
#if HORA_CRC_HW
  if (have_hw) {
    crc_hw_x3(p, n, out);
    return;
  }
#endif
  for (int i = 0; i < 3; i++) out[i] = hora__crc32c_sw(0, p[i], n[i]);
}

int hora__crc32c_hw(void) {
  pthread_once(&table_once, init_tables);
  return have_hw;
}

uint32_t hora__crc32c(uint32_t crc, const void *buf, size_t len) {
  pthread_once(&table_once, init_tables);
#if HORA_CRC_HW
  if (have_hw) return crc_hw(crc, buf, len);
#endif
  return hora__crc32c_sw(crc, buf, len);
}
