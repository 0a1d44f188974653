/* Internal declarations of runtime/ckpt: the snapshot description shared by the writer, the
 * copier and restore, the safetensors encoder/decoder (format.c), the manifest and the
 * validation of a checkpoint directory (manifest.c), file-system helpers (fsutil.c), staging
 * buffers (stage.c) and the checkpointer object (ckpt.c, writer.c, copier.c, restore.c).
 *
 * On-disk layout of one place (local_dir or persist_dir; docs/checkpoint.md):
 *   <dir>/step-<N>/state.safetensors     the tensors (safetensors; CRC32Cs in __metadata__)
 *   <dir>/step-<N>/manifest.json         written last: a step directory without it is not a
 *                                        checkpoint
 *   <dir>/latest                         "step-<N>\n", replaced by rename after each commit
 * Temporary files start with ".tmp-" and never carry a final name. */
#ifndef HORA_CKPT_CKPT_H
#define HORA_CKPT_CKPT_H

#include <pthread.h>
#include <stdint.h>

#include "core/ctx.h"
#include "core/internal.h"
#include "core/safefs.h"

#define CK_MANIFEST "manifest.json"
#define CK_LATEST "latest"
#define CK_DATA "state.safetensors"
#define CK_TMP_PREFIX HORA_TMP_PREFIX
#define CK_FORMAT "hora-ckpt"
#define CK_FORMAT_VERSION 1
#define CK_NAME_MAX 1024
#define CK_MSG_MAX 768

/* One tensor of a snapshot (or of a decoded file). */
typedef struct {
  char *name;
  hora_dtype_t dtype;
  int ndim;       /* >= 1 (a hora_tensor_t with ndim 0 is stored 1-D [count]) */
  int64_t *shape; /* ndim entries */
  size_t count, bytes;
  size_t offset;  /* byte offset within the data section */
  uint32_t crc;   /* CRC32C of the tensor's bytes */
} ck_tensor_t;

/* A checkpoint's content: what the writer writes and what a reader decodes. */
typedef struct {
  int64_t step;
  int world_size;
  size_t ntensors;
  ck_tensor_t *t;
  size_t nmeta; /* user metadata (keys without the reserved "hora." prefix) */
  char **keys, **vals;
  const unsigned char *data; /* data section (ntensors tensors back to back) */
  size_t data_bytes;
} ck_snap_t;

void hora__ck_snap_free(ck_snap_t *s); /* frees names, shapes, meta; not data */
/* Frees the restored checkpoint's metadata and source directory kept in ck (keys, vals,
 * restored_from) and leaves none. */
void hora__ck_meta_free(hora_ckpt_t *ck);

/* ---- format.c: safetensors with CRC32C ---- */
/* The safetensors dtype name ("F32", "BF16", ...) of a hora dtype, and back (-1: unknown). */
const char *hora__ck_dtype_st(hora_dtype_t dtype);
int hora__ck_dtype_from_st(const char *name);
/* CRC32C of A||B from crc(A), crc(B) and len(B) (zlib's crc32_combine method). */
uint32_t hora__ck_crc_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b);
/* Fill every tensor's crc from s->data (one pass over the data). */
void hora__ck_snap_crcs(ck_snap_t *s);
/* The file prefix: 8-byte little-endian header length + JSON header padded with spaces to a
 * multiple of 8 bytes. *prefix is malloc'd. *file_crc is CRC32C of the whole file (prefix and
 * data, combined from the tensor CRCs) and *data_crc that of the data section. */
hora_result_t hora__ck_encode(const ck_snap_t *s, unsigned char **prefix, size_t *prefix_bytes,
                              uint32_t *file_crc, uint32_t *data_crc);
/* Decode a whole file held in memory (buf, len): header, tensors, metadata. Tensor data stays in
 * buf (s->data points into it). Checks framing, offsets (contiguous, in bounds), dtypes and
 * shapes and, with check_crc, every tensor CRC against the header metadata. HORA_ERR_DATA with
 * a message naming `what` and the problem. */
hora_result_t hora__ck_decode(const unsigned char *buf, size_t len, const char *what,
                              int check_crc, ck_snap_t *s);

/* ---- fsutil.c ----
 * Directories are reached through fds checked by core/safefs.c (hora__dir_open: owner and mode
 * of every component, no foreign symlinks); files inside them are opened with openat and
 * O_NOFOLLOW, created with O_EXCL under unpredictable temporary names and renamed with renameat.
 * `dir` arguments only name the directory in messages. */
hora_result_t hora__ck_write_all(int fd, const void *p, size_t n, const char *name);
hora_result_t hora__ck_fsync_fd(int dfd, const char *dir);
hora_result_t hora__ck_mkdirs(const char *dir); /* hora__dir_open(dir, create) and close */
/* Remove the step directory `name` of dfd and everything in it (one level: step dirs hold only
 * files). The manifest goes first, so a crash half-way leaves a directory that is not a
 * checkpoint. A symlink under that name is removed, never followed. */
hora_result_t hora__ck_remove_step_at(int dfd, const char *dir, const char *name);
/* Read the whole regular file `name` of dfd (never a symlink) into a malloc'd buffer (at most
 * max_bytes). */
hora_result_t hora__ck_read_file_at(int dfd, const char *dir, const char *name, size_t max_bytes,
                                    unsigned char **buf, size_t *len);
/* CRC32C of a whole file and its size, read in chunk_bytes pieces. */
hora_result_t hora__ck_file_crc_at(int dfd, const char *dir, const char *name, size_t chunk_bytes,
                                   uint32_t *crc, uint64_t *bytes);
/* Test-only pacing (HORA_CKPT_TEST_DELAY_US) after each chunk written or copied. */
void hora__ck_test_delay(void);

/* ---- manifest.c ---- */
typedef struct {
  int64_t step;
  int world_size;
  char file[256];
  uint64_t file_bytes;
  uint32_t file_crc, data_crc;
  char persist_dir[4096]; /* the run's persist_dir ("" when it had none) */
} ck_manifest_t;
/* Serialize the manifest of snapshot s (file name, size and CRCs given) as JSON (malloc'd). */
hora_result_t hora__ck_manifest_json(const ck_snap_t *s, const char *file, uint64_t file_bytes,
                                     uint32_t file_crc, uint32_t data_crc, const char *persist_dir,
                                     char **json);
/* The manifest of the step directory sdfd (path sd). HORA_ERR_NOT_FOUND when it has none (an
 * interrupted write), HORA_ERR_DATA when it does not parse, HORA_ERR_IO when unreadable. */
hora_result_t hora__ck_manifest_read_at(int sdfd, const char *sd, ck_manifest_t *m);
int hora__ck_has_manifest(const char *stepdir); /* the file exists (quiet check) */
/* Steps present in the directory dfd (or `dir`) as step-<N> entries, sorted newest first.
 * *steps is malloc'd (NULL when none); a missing dir gives 0 steps. */
hora_result_t hora__ck_list_steps_at(int dfd, const char *dir, int64_t **steps, size_t *n);
hora_result_t hora__ck_list_steps(const char *dir, int64_t **steps, size_t *n);
void hora__ck_step_dir(const char *dir, int64_t step, char *out, size_t n);
void hora__ck_step_name(int64_t step, char *out, size_t n); /* "step-<N>" */
/* Validate the step directory sdfd (path sd, whose last component must be step-<manifest's
 * step>): manifest parses, the file has the manifest's size and CRC32C. With `load`, the file
 * is also decoded and every tensor CRC checked; the caller then owns *buf (the file) and *snap
 * (pointing into it). HORA_ERR_DATA / HORA_ERR_NOT_FOUND / HORA_ERR_IO with the reason as
 * message. hora__ck_validate opens (and checks) the path first. */
hora_result_t hora__ck_validate_at(int sdfd, const char *sd, int load, ck_manifest_t *m, unsigned char **buf,
                                   ck_snap_t *snap);
hora_result_t hora__ck_validate(const char *stepdir, int load, ck_manifest_t *m,
                                unsigned char **buf, ck_snap_t *snap);
/* Newest valid checkpoint over local then persistent (either may be NULL): the highest step
 * that validates; for equal steps the local copy. A local checkpoint counts only if its manifest
 * names the same persist_dir (canonical path; none for none): node-local directories such as
 * /tmp/hora-ckpt-<uid> may hold another run's checkpoints. Each directory must pass the safefs
 * check (HORA_ERR_IO naming it otherwise: nothing is read); a step entry that is a symlink or
 * fails the check is rejected like a corrupt one. `latest` is never read. Logs every rejected
 * candidate and why. HORA_ERR_NOT_FOUND when no step directory holds a manifest of this run (a
 * fresh start); HORA_ERR_CORRUPT when some do but none is valid, naming each and why. On success
 * the caller owns *buf and *snap; *path is the step directory used (malloc'd). */
hora_result_t hora__ck_find_newest(const char *local_dir, const char *persist_dir, char **path,
                                   unsigned char **buf, ck_snap_t *snap);

/* ---- stage.c: snapshot memory ---- */
typedef struct {
  unsigned char *p;
  size_t cap;
  int pinned; /* cudaHostAlloc'd */
} ck_stage_t;
/* Make st hold at least `bytes` (pinned when `pinned` and CUDA is available). */
hora_result_t hora__ck_stage_reserve(ck_stage_t *st, size_t bytes, int pinned);
void hora__ck_stage_free(ck_stage_t *st);
/* Copy n tensors (user descriptions) into dst at the given offsets: host tensors with memcpy,
 * device tensors with cudaMemcpyAsync on one stream, then one synchronize. Returns when every
 * byte is in dst. `device` is the CUDA ordinal to use (-1: current). */
hora_result_t hora__ck_gather(const hora_tensor_t *t, size_t n, const size_t *offsets,
                              unsigned char *dst, int device);
/* The reverse: copy from src at offsets into every tensor's data. */
hora_result_t hora__ck_scatter(hora_tensor_t *t, size_t n, const size_t *offsets,
                               const unsigned char *src, int device);

/* ---- the checkpointer ---- */
/* Refuse a checkpointer's call in a fork() child of the rank that opened it (core/fork.c). */
#define HORA_CKPT_FORK_CHECK(ck, fn) \
  HORA_CHECK(hora__fork_check((ck)->fork_gen, fn, "the checkpointer", "save and close it in the parent"))

struct hora_ckpt {
  hora_ctx_t *ctx;
  MPI_Comm comm; /* dup of the world: ckpt's collectives never interleave with the engine's */
  int rank, size;
  unsigned fork_gen; /* ctx->fork_gen: the writer and copier threads and MPI are the parent's */
  char *local_dir, *persist_dir;
  int keep;
  double copy_interval_s;
  struct hora_ckpt *next_open; /* list in ctx->ckpt, for hora_finalize */

  /* Rank 0 only: threads and the state they share, guarded by mu. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t writer, copier;
  int writer_started, copier_started;
  int stop;
  ck_stage_t stage;
  ck_snap_t job;          /* the snapshot the writer owns while job_pending or writing */
  int job_pending, writing;
  hora_result_t write_rc; /* deferred error of a background write (reported once) */
  char write_msg[2 * CK_MSG_MAX]; /* a CK_MSG_MAX message with its context */
  uint64_t commit_seq;    /* local commits so far */
  int64_t committed_step; /* newest committed locally (valid when commit_seq > 0) */
  uint64_t copied_seq;    /* commit_seq of the newest copy that is durable in persist_dir */
  int64_t copying_step;   /* step the copier reads now (pruning skips it); INT64_MIN: none */
  int flush_waiters;
  hora_result_t copy_rc;  /* result of the copier's last attempt */
  char copy_msg[2 * CK_MSG_MAX];
  double copy_retry_at, last_copy_s;
  int copy_failed_logged;
  /* Figures for hora-bench (rank 0). */
  double last_snapshot_s, last_write_s, last_copy_dur_s;
  uint64_t last_file_bytes;

  /* Last restore, every rank: user metadata and the directory used. */
  size_t nmeta;
  char **keys, **vals;
  char *restored_from;
};

/* Figures of the last save/write/copy for hora-bench (rank 0). */
void hora__ck_wait_written(hora_ckpt_t *ck);
void hora__ck_stats(hora_ckpt_t *ck, double *snapshot_s, double *write_s, double *copy_s, uint64_t *file_bytes);
void *hora__ck_writer_main(void *arg);
void *hora__ck_copier_main(void *arg);
/* Prune the directory dfd (path dir) to the newest `keep` steps, never removing `newest` (just
 * verified) nor `pinned`; only steps older than `newest` are removed. Step directories without
 * a manifest older than newest are removed too. Errors are logged, never returned (pruning is
 * best effort). Returns the number of step directories removed. */
int hora__ck_prune(int dfd, const char *dir, int keep, int64_t newest, int64_t pinned);
/* Broadcast `bytes` bytes at p from rank 0 of ck->comm as one MPI element, waited on with
 * hora__ctx_wait (`what` names it in the error). *lost = 1 after a verdict (the request is
 * abandoned: p must not be freed). p NULL (out of memory) still takes part. */
hora_result_t hora__ck_bcast_watched(hora_ckpt_t *ck, void *p, size_t bytes, const char *what, int *lost);
/* Broadcast rank 0's result and message to every rank of ck (collective); other ranks return
 * rank 0's code with a message that says it came from rank 0. The wait watches the context's
 * verdict (hora__ctx_wait): a lost peer ends it with HORA_ERR_REMOTE naming the rank, unless
 * this rank had an error of its own (rc), which is returned with its message then. */
hora_result_t hora__ck_bcast_result(hora_ckpt_t *ck, hora_result_t rc, const char *fn);
/* Copy a message from this thread's hora_last_error into dst. */
void hora__ck_keep_msg(char *dst);

#endif
