/* libFuzzer target over the record reader: the input becomes a record file (in memory, through
 * memfd) and is read to the end with options taken from its first byte (shuffle buffer, skip
 * corrupt records, prefetch depth). Any crash, sanitizer report, hang or an error other than
 * HORA_ERR_DATA/HORA_ERR_IO on a file that hora_records_count accepted is a bug. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hora.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  unsigned flags = size ? data[0] : 0;
  if (size) {
    data++;
    size--;
  }
  int fd = memfd_create("hora-fuzz", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t off = 0;
  while (off < size) {
    ssize_t w = write(fd, data + off, size - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const char *pat = path;
  hora_records_reader_opts_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.patterns = &pat;
  o.pattern_count = 1;
  o.shuffle_buffer = (flags & 1) ? 4 : 0;
  o.skip_corrupt = (flags & 2) != 0;
  o.prefetch = (flags & 4) ? 1 : 0;
  o.epochs = (flags & 8) ? 2 : 1;
  o.skip_records = (flags >> 4) & 3;
  hora_records_reader_t *r = NULL;
  if (hora_records_reader_open(&o, &r) == HORA_SUCCESS) {
    size_t total = 0;
    for (;;) {
      const void *d;
      size_t len;
      int eof;
      hora_result_t rc = hora_records_next(r, &d, &len, &eof);
      if (rc != HORA_SUCCESS) {
        if (rc != HORA_ERR_DATA) abort();
        break;
      }
      if (eof) break;
      /* touch every byte handed out: ASan catches reads past the buffer */
      const volatile unsigned char *p = d;
      for (size_t i = 0; i < len; i++) total += p[i];
    }
    hora_records_reader_close(r);
    (void)total;
  }
  uint64_t count;
  (void)hora_records_count(path, &count);
  close(fd);
  return 0;
}
