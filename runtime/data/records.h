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

/* ---- read-only file mappings guarded against SIGBUS (mapped.c) ---- */
typedef struct hora_map hora_map_t;
/* Map `len` bytes of `fd` read-only (one reference). NULL when the file cannot be mapped, when
 * `only_if_cached` is set and less than half of its first 256 MiB is in the page cache, when
 * the SIGBUS guard could not be installed, or when too many mappings are live: the caller then
 * reads the file with read(). */
hora_map_t *hora__map_open(int fd, size_t len, const char *path, int only_if_cached);
void hora__map_ref(hora_map_t *m);
void hora__map_unref(hora_map_t *m); /* the last reference unmaps */
const unsigned char *hora__map_base(const hora_map_t *m);
size_t hora__map_len(const hora_map_t *m);
const char *hora__map_path(const hora_map_t *m);
/* 1 once an access hit a page the file no longer has (truncated while mapped): the bytes read
 * from there on are zeros, not the file's. */
int hora__map_faulted(const hora_map_t *m);
/* Fault in [off, off+len) ahead of use (MADV_POPULATE_READ); 0 when the kernel lacks it. */
int hora__map_populate(const hora_map_t *m, size_t off, size_t len);
/* Drop this process's page-table entries of the whole pages in [off, off+len) (the page cache
 * keeps the data), so that a long sequential pass does not hold a whole file in its RSS. */
void hora__map_drop(const hora_map_t *m, size_t off, size_t len);

#endif
