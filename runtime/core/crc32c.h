/* CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78), as used by TFRecord framing,
 * hora checkpoints and iSCSI (RFC 3720 B.4 gives the check vectors).
 * Debian 12 ships no C CRC32C library, so this is ours: the x86-64 SSE4.2 or AArch64 CRC32
 * instructions when the CPU has them (checked at run time), else a slicing-by-8 table fallback. */
#ifndef HORA_CORE_CRC32C_H
#define HORA_CORE_CRC32C_H
#include <stddef.h>
#include <stdint.h>

/* Extend `crc` (0 to start) over len bytes of buf; returns the new CRC (pre/post inverted as
 * the standard defines, so crc32c(0, "123456789", 9) == 0xE3069283). */
uint32_t hora__crc32c(uint32_t crc, const void *buf, size_t len);
/* CRC32C (from 0) of three separate buffers at once: out[i] = hora__crc32c(0, p[i], n[i]).
 * With the crc32 instruction the three chains run interleaved, so three short records (a few
 * hundred bytes, too short for the split-and-combine of one buffer) cost about one. */
void hora__crc32c_x3(const void *const p[3], const size_t n[3], uint32_t out[3]);
/* 1 when hora__crc32c uses the CPU's CRC32C instructions (SSE4.2, AArch64 CRC32), else 0. */
int hora__crc32c_hw(void);
/* The same with the portable table implementation only (for tests). */
uint32_t hora__crc32c_sw(uint32_t crc, const void *buf, size_t len);
/* TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
static inline uint32_t hora__crc32c_mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
#endif
