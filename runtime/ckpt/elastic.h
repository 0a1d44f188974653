/* Internal declarations of elastic training's committed state (elastic.c: open, commit,
 * restore, close; elastic_sync.c: the survivor's file and hora_elastic_sync). */
#ifndef HORA_CKPT_ELASTIC_H
#define HORA_CKPT_ELASTIC_H

#include "ckpt/ckpt.h"

#define EL_MAGIC "HORAEL01"
#define EL_BLOB_TENSOR "hora_elastic_blob"
#define EL_FILE_MAX ((size_t)1 << 40)

typedef struct {
  int64_t id;        /* -1: none */
  uint64_t layout;   /* hash of names, dtypes and counts */
  size_t data_bytes; /* tensors' bytes, back to back */
  size_t blob_bytes;
  unsigned char *data; /* data_bytes + blob_bytes */
} el_commit_t;

/* Refuse an elastic state's call in a fork() child of the rank that opened it (core/fork.c). */
#define HORA_ELASTIC_FORK_CHECK(es, fn) \
  HORA_CHECK(hora__fork_check((es)->ctx->fork_gen, fn, "the elastic state", "use it in the parent"))

struct hora_elastic {
  hora_ctx_t *ctx;
  MPI_Comm comm;
  int rank, size;
  char *dir;
  hora_ckpt_t *ck;
  int ckpt_every;
  el_commit_t cur;
  unsigned char *ckblob; /* HORA_ELASTIC_BLOB_MAX bytes: the blob as a checkpoint tensor */
};

void hora__el_commit_free(el_commit_t *c); /* frees data; id becomes -1 */
/* FNV-1a hash of the tensors' names, dtypes and counts, their total bytes and (off non-NULL)
 * each one's offset; HORA_ERR_INVALID_ARGUMENT naming fn and the bad tensor. */
hora_result_t hora__el_layout(const char *fn, const hora_tensor_t *t, size_t n, uint64_t *hash, size_t *bytes,
                              size_t *off);
/* Copy commit c into the tensors and blob after checking they fit (HORA_ERR_MISMATCH: another
 * layout; HORA_ERR_INVALID_ARGUMENT: blob_cap too small). blob_bytes may be NULL. */
hora_result_t hora__el_apply(const char *fn, const el_commit_t *c, hora_tensor_t *t, size_t n, void *blob,
                             size_t blob_cap, size_t *blob_bytes, int device);

#endif
