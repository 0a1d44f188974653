/*
 * hora.h: the public C API of libhora, a distributed training runtime for Slurm clusters.
 *
 * This is the only header a C/CUDA training program needs. It includes <stddef.h>, <stdint.h>
 * and the generated <hora/config.h> and <hora/version.h>; no MPI, CUDA or hwloc header leaks in.
 *
 * Conventions that hold for every function below unless its comment says otherwise:
 *  - It returns a hora_result_t. HORA_SUCCESS is 0. On error, hora_last_error() returns a
 *    message for the calling thread that names the argument or the condition that was wrong.
 *  - Outputs are the last pointer arguments. On error, outputs are left unchanged.
 *  - Counts are in elements (size_t), sizes in bytes carry `_bytes`, times carry their unit.
 *  - "Collective" means every rank of the context must call it, in the same order relative to
 *    other blocking collectives, with matching arguments; "local" means any rank alone.
 *  - Functions are thread-safe for one context unless the comment says otherwise; blocking
 *    collectives on the same context must not run concurrently from two threads.
 *  - `*_destroy(NULL)`-style calls on NULL are no-ops returning HORA_SUCCESS.
 *
 * The declarations between HORA_CDEF_BEGIN and HORA_CDEF_END are parsed by cffi (python/):
 * keep them plain C (no #ifdef, no attributes, integer #defines only).
 */
#ifndef HORA_H
#define HORA_H

#include <stddef.h>
#include <stdint.h>

#include <hora/config.h>
#include <hora/version.h>

#ifdef __cplusplus
extern "C" {
#endif

/* HORA_CDEF_BEGIN */

/* ---------------------------------------------------------------------------------------------
 * Results. Values are explicit and only ever appended; runtime/core/result.def is the list that
 * generates the names and messages, and a static check keeps the two in step.
 * ------------------------------------------------------------------------------------------- */
typedef enum {
  HORA_SUCCESS = 0,
  HORA_ERR_INVALID_ARGUMENT = 1, /* a NULL pointer, unknown enum value, overflow, bad option */
  HORA_ERR_NOT_INITIALIZED = 2,  /* the context was never initialized or is finalized */
  HORA_ERR_NOT_SUPPORTED = 3,    /* the feature was built OFF or the hardware is missing */
  HORA_ERR_NO_MEMORY = 4,        /* an allocation failed */
  HORA_ERR_MPI = 5,              /* an MPI call failed */
  HORA_ERR_CUDA = 6,             /* a CUDA runtime call or kernel launch failed */
  HORA_ERR_NCCL = 7,             /* an NCCL call failed */
  HORA_ERR_MISMATCH = 8,         /* ranks disagree on a tensor's count, dtype, op, root, device */
  HORA_ERR_TIMEOUT = 9,          /* a stall or peer timeout expired */
  HORA_ERR_REMOTE = 10,          /* another rank died or failed; the message names it */
  HORA_ERR_IO = 11,              /* a file system call failed (disk full, permission, ...) */
  HORA_ERR_DATA = 12,            /* corrupt or truncated input (checksum, framing) */
  HORA_ERR_LAYOUT = 13,          /* launcher/Slurm layout and MPI world disagree */
  HORA_ERR_NOT_FOUND = 14,       /* nothing to restore, no such file, no such name */
  HORA_ERR_INTERNAL = 15,        /* a bug in hora: please report it */
  HORA_ERR_SHUTDOWN = 16         /* the operation was cancelled because hora is shutting down */
} hora_result_t;

/* Name of a result code ("HORA_ERR_MPI"); "HORA_UNKNOWN_RESULT" for values not in the list. */
const char *hora_result_name(hora_result_t result);
/* One-sentence description of a result code; never NULL. */
const char *hora_strerror(hora_result_t result);
/* The detailed message of the last failed hora call on the calling thread ("" if none). The
 * string stays valid until the next hora call on this thread. */
const char *hora_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Types of elements, reductions and memory.
 * ------------------------------------------------------------------------------------------- */
typedef enum {
  HORA_UINT8 = 0,
  HORA_INT8 = 1,
  HORA_INT32 = 2,
  HORA_INT64 = 3,
  HORA_FLOAT16 = 4,  /* IEEE 754 binary16; reduced through float32 arithmetic */
  HORA_BFLOAT16 = 5, /* bfloat16 (upper half of a float32); reduced through float32 arithmetic */
  HORA_FLOAT32 = 6,
  HORA_FLOAT64 = 7
} hora_dtype_t;
#define HORA_DTYPE_COUNT 8

typedef enum {
  HORA_SUM = 0,
  HORA_AVERAGE = 1, /* sum, then divide by the world size (integers: truncating division) */
  HORA_MIN = 2,
  HORA_MAX = 3,
  HORA_PRODUCT = 4
} hora_op_t;
#define HORA_OP_COUNT 5

typedef enum {
  HORA_DEVICE_HOST = 0, /* host memory (pageable or pinned) */
  HORA_DEVICE_CUDA = 1  /* CUDA device memory of the GPU this rank uses (hora_device_index) */
} hora_device_t;

/* Size of one element of `dtype` in bytes through *size_bytes. HORA_ERR_INVALID_ARGUMENT for an
 * unknown dtype or a NULL output. Local. */
hora_result_t hora_dtype_size(hora_dtype_t dtype, size_t *size_bytes);

/* ---------------------------------------------------------------------------------------------
 * Context: init, layout, finalize.
 * ------------------------------------------------------------------------------------------- */
typedef struct hora_ctx hora_ctx_t;

/* Versioned options for hora_init_ex. Set `size = sizeof(hora_init_opts_t)`; fields only ever
 * grow at the end, so a program built against an older header keeps working. */
typedef struct {
  size_t size;
  /* An MPI communicator (an MPI_Comm cast to void* with Open MPI, whose handles are pointers)
   * that hora dups and uses as its world, or NULL for MPI_COMM_WORLD. */
  void *mpi_comm;
} hora_init_opts_t;

/* hora_init: start hora on this process.
 * Collective over MPI_COMM_WORLD (every process of the job must call it).
 * Calls MPI_Init_thread(MPI_THREAD_MULTIPLE) only if MPI is not initialized yet, and then
 * finalizes MPI itself in hora_finalize; otherwise dups the caller's world.
 * Reads and validates every HORA_* environment variable (docs/env.md); determines rank, size,
 * local rank/size (ranks sharing this node's memory) and cross rank/size (node index and count).
 * Checks the world size against SLURM_NTASKS (inside an srun step) and HORA_SIZE (set by
 * launch); a difference means the processes were started without a working PMI and each one is
 * its own single-rank world.
 * Errors: HORA_ERR_INVALID_ARGUMENT (ctx NULL, a malformed HORA_* variable: the message names it),
 *   HORA_ERR_LAYOUT (world size differs from SLURM_NTASKS or HORA_SIZE; the message says how to
 *   start the job), HORA_ERR_MPI (MPI could not start or lacks MPI_THREAD_MULTIPLE),
 *   HORA_ERR_NO_MEMORY. On error *ctx is left unchanged and nothing stays allocated. */
hora_result_t hora_init(hora_ctx_t **ctx);
/* hora_init_ex: hora_init with options (opts may be NULL for defaults). Same errors, and
 * HORA_ERR_INVALID_ARGUMENT if opts->size is smaller than the first field's end. */
hora_result_t hora_init_ex(const hora_init_opts_t *opts, hora_ctx_t **ctx);

/* hora_finalize: flush and stop everything hora started for this context (engine thread,
 * checkpoint writer and copier, communicators), free it, and finalize MPI if hora_init started it.
 * Collective. ctx NULL is a no-op. After it returns `ctx` must not be used. Returns the first error
 * met while flushing (for example HORA_ERR_IO from a checkpoint copy), but always frees. */
hora_result_t hora_finalize(hora_ctx_t *ctx);

/* Layout queries. Local; valid between hora_init and hora_finalize. Errors:
 * HORA_ERR_INVALID_ARGUMENT (NULL output), HORA_ERR_NOT_INITIALIZED (ctx NULL or finalized). */
hora_result_t hora_rank(hora_ctx_t *ctx, int *rank);             /* 0 .. size-1 */
hora_result_t hora_size(hora_ctx_t *ctx, int *size);             /* world size */
hora_result_t hora_local_rank(hora_ctx_t *ctx, int *local_rank); /* rank among this node's */
hora_result_t hora_local_size(hora_ctx_t *ctx, int *local_size); /* ranks on this node */
hora_result_t hora_cross_rank(hora_ctx_t *ctx, int *cross_rank); /* index of this node */
hora_result_t hora_cross_size(hora_ctx_t *ctx, int *cross_size); /* number of nodes */
/* CUDA device ordinal this rank uses. HORA_ERR_NOT_SUPPORTED when the build has no CUDA or the
 * rank has no GPU (then *device is unchanged). */
hora_result_t hora_device_index(hora_ctx_t *ctx, int *device);

/* ---------------------------------------------------------------------------------------------
 * Blocking collectives.
 *
 * All are collective over the context's world: every rank calls them in the same order with the
 * same count, dtype, op, root and device (what can be detected is checked and reported as
 * HORA_ERR_INVALID_ARGUMENT or HORA_ERR_MISMATCH). sendbuf == recvbuf means in place. Counts are
 * in elements; buffers larger than 2^31 elements work. `device` says where both buffers live.
 * Common errors: HORA_ERR_NOT_INITIALIZED (ctx NULL or finalized), HORA_ERR_INVALID_ARGUMENT
 * (NULL buffer with count > 0, unknown dtype/op/device, root out of range, count * element size
 * overflows size_t, partially overlapping buffers), HORA_ERR_NOT_SUPPORTED (device buffers in a
 * build without CUDA), HORA_ERR_MPI / HORA_ERR_NCCL / HORA_ERR_CUDA (the transport failed),
 * HORA_ERR_REMOTE (a peer died). On HORA_ERR_INVALID_ARGUMENT nothing is written to recvbuf.
 * ------------------------------------------------------------------------------------------- */

/* allreduce: recvbuf[i] = postscale * OP_r(prescale * sendbuf_r[i]) for i in [0, count).
 * HORA_AVERAGE divides the reduced value by the world size (after prescale, before postscale).
 * Scale factors apply to floating-point dtypes; for integer dtypes they must be 1.0.
 * Algorithm: HORA_ALLREDUCE_ALGO (auto, ring, shm, hier, mpi); see docs/design.md. */
hora_result_t hora_allreduce(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                             hora_dtype_t dtype, hora_op_t op, double prescale, double postscale,
                             hora_device_t device);

/* broadcast: buf (count elements) of `root` is copied to every rank's buf. */
hora_result_t hora_broadcast(hora_ctx_t *ctx, void *buf, size_t count, hora_dtype_t dtype,
                             int root, hora_device_t device);

/* allgather: every rank contributes `count` elements; recvbuf holds size*count elements, rank r's
 * block at offset r*count. In place when sendbuf == recvbuf + rank*count (elements). */
hora_result_t hora_allgather(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                             hora_dtype_t dtype, hora_device_t device);

/* allgatherv: rank r contributes recvcounts[r] elements (its sendcount must equal
 * recvcounts[rank], else HORA_ERR_INVALID_ARGUMENT); recvbuf holds sum(recvcounts) elements in
 * rank order. recvcounts has `size` entries and must be the same on every rank (HORA_ERR_MISMATCH
 * when it is not). */
hora_result_t hora_allgatherv(hora_ctx_t *ctx, const void *sendbuf, size_t sendcount,
                              void *recvbuf, const size_t *recvcounts, hora_dtype_t dtype,
                              hora_device_t device);

/* reducescatter: sendbuf holds size*recvcount elements; rank r receives in recvbuf (recvcount
 * elements) the reduction over ranks of block r. HORA_AVERAGE divides by the world size. In place
 * when recvbuf == sendbuf + rank*recvcount (elements); any other overlap is
 * HORA_ERR_INVALID_ARGUMENT. Algorithm: the reduce-scatter half of hora's ring. */
hora_result_t hora_reducescatter(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                 size_t recvcount, hora_dtype_t dtype, hora_op_t op,
                                 hora_device_t device);

/* alltoall: sendbuf holds size blocks of `count` elements; block p goes to rank p, and recvbuf
 * (size*count elements) holds at block p what rank p sent to this rank. Not in place. */
hora_result_t hora_alltoall(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                            hora_dtype_t dtype, hora_device_t device);

/* alltoallv: sendcounts[p] elements go to rank p (blocks packed in rank order in sendbuf);
 * recvcounts[p] elements arrive from rank p (packed in rank order in recvbuf). Both arrays have
 * `size` entries; recvcounts[p] on this rank must equal sendcounts[this rank] on rank p. */
hora_result_t hora_alltoallv(hora_ctx_t *ctx, const void *sendbuf, const size_t *sendcounts,
                             void *recvbuf, const size_t *recvcounts, hora_dtype_t dtype,
                             hora_device_t device);

/* barrier: returns once every rank has entered it. */
hora_result_t hora_barrier(hora_ctx_t *ctx);

/* ---- async engine (runtime/engine) ---- */

/* ---- GPU (runtime/comm) ---- */

/* ---- checkpoints (runtime/ckpt) ---- */

/* ---- record files (runtime/data) ---- */

/* ---- TensorBoard and GPU monitor (runtime/trace) ---- */

/* HORA_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* HORA_H */
