/* Internal helpers of the record-file framing shared by the writer, the reader, hora_records_count
 * and the tools. See docs/data.md for the layout. */
#ifndef HORA_DATA_RECORDS_H
#define HORA_DATA_RECORDS_H
#include <stdint.h>
#include <string.h>

#include "core/crc32c.h"
#include "core/internal.h"

#define HORA_RECORD_HEADER_BYTES 12 /* uint64 length + uint32 masked CRC of the length */
#define HORA_RECORD_FOOTER_BYTES 4  /* uint32 masked CRC of the data */
#define HORA_RECORD_OVERHEAD_BYTES 16

static inline uint64_t hora__load_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static inline uint32_t hora__load_le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void hora__store_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void hora__store_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t hora__masked_crc(const void *p, size_t n) {
  return hora__crc32c_mask(hora__crc32c(0, p, n));
}
/* Fill the 12-byte header of a record of len bytes. */
static inline void hora__record_header(unsigned char hdr[12], uint64_t len) {
  hora__store_le64(hdr, len);
  hora__store_le32(hdr + 8, hora__masked_crc(hdr, 8));
}
/* Check a 12-byte header; returns 1 and the length when its CRC matches. */
static inline int hora__record_header_ok(const unsigned char *hdr, uint64_t *len) {
  if (hora__load_le32(hdr + 8) != hora__masked_crc(hdr, 8)) return 0;
  *len = hora__load_le64(hdr);
  return 1;
}

#endif
