/* IDX files (the MNIST / Fashion-MNIST container: big-endian header "0 0 type ndims", ndims
 * uint32 dimensions, then the elements), gzip-compressed or raw; read through zlib, which
 * passes raw files through unchanged. Only unsigned-byte elements (type 0x08) are supported. */
#ifndef HORA_DATA_IDX_H
#define HORA_DATA_IDX_H
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

typedef struct {
  int ndims;
  uint32_t dims[4];
  unsigned char *data; /* dims[0] * ... * dims[ndims-1] bytes, malloc'd: free() it */
  size_t bytes;
} hora_idx_t;

/* Load `path`. HORA_ERR_IO (open/read), HORA_ERR_DATA (bad magic, unsupported type, more than
 * 4 dimensions, truncated: the message names the file), HORA_ERR_NO_MEMORY. */
hora_result_t hora__idx_load(const char *path, hora_idx_t *out);

#endif
