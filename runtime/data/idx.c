/* IDX reader (see idx.h). zlib's gzread reads gzip and plain files alike. */
#include "data/idx.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static int read_exact(gzFile f, void *p, size_t n) {
  unsigned char *c = p;
  while (n) {
    unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
    int r = gzread(f, c, chunk);
    if (r <= 0) return 0;
    c += r;
    n -= (size_t)r;
  }
  return 1;
}

hora_result_t hora__idx_load(const char *path, hora_idx_t *out) {
  gzFile f = gzopen(path, "rb");
  if (!f) return HORA_ERR(HORA_ERR_IO, "open %s: %s", path, errno ? strerror(errno) : "zlib error");
  unsigned char hdr[4];
  hora_result_t rc = HORA_SUCCESS;
  hora_idx_t idx = {0};
  if (!read_exact(f, hdr, 4)) {
    rc = HORA_ERR(HORA_ERR_DATA, "%s: truncated IDX header", path);
    goto done;
  }
  if (hdr[0] != 0 || hdr[1] != 0 || hdr[3] < 1 || hdr[3] > 4) {
    rc = HORA_ERR(HORA_ERR_DATA, "%s: not an IDX file (magic %02x %02x %02x %02x)", path, hdr[0], hdr[1],
                  hdr[2], hdr[3]);
    goto done;
  }
  if (hdr[2] != 0x08) {
    rc = HORA_ERR(HORA_ERR_DATA, "%s: IDX element type 0x%02x is not unsigned byte (0x08)", path, hdr[2]);
    goto done;
  }
  idx.ndims = hdr[3];
  size_t total = 1;
  for (int i = 0; i < idx.ndims; i++) {
    unsigned char d[4];
    if (!read_exact(f, d, 4)) {
      rc = HORA_ERR(HORA_ERR_DATA, "%s: truncated IDX header", path);
      goto done;
    }
    idx.dims[i] = (uint32_t)d[0] << 24 | (uint32_t)d[1] << 16 | (uint32_t)d[2] << 8 | d[3];
    if (idx.dims[i] && total > ((size_t)1 << 40) / idx.dims[i]) {
      rc = HORA_ERR(HORA_ERR_DATA, "%s: IDX dimensions too large", path);
      goto done;
    }
    total *= idx.dims[i];
  }
  idx.bytes = total;
  idx.data = malloc(total ? total : 1);
  if (!idx.data) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory for %zu bytes", path, total);
    goto done;
  }
  if (!read_exact(f, idx.data, total)) {
    rc = HORA_ERR(HORA_ERR_DATA, "%s: truncated IDX data (expected %zu bytes)", path, total);
    free(idx.data);
    goto done;
  }
  *out = idx;
done:
  gzclose(f);
  return rc;
}
