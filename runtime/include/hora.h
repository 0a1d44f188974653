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
  HORA_ERR_SHUTDOWN = 16,        /* the operation was cancelled because hora is shutting down */
  HORA_ERR_CORRUPT = 17          /* checkpoints exist but none is valid (each is named and why) */
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
  HORA_FLOAT64 = 7,
  HORA_INT16 = 8,
  HORA_BOOL = 9 /* one byte, 0 or 1: SUM and MAX are logical OR, MIN and PRODUCT logical AND;
                 * AVERAGE is HORA_ERR_INVALID_ARGUMENT. NCCL reduces it as uint8 max/min. */
} hora_dtype_t; /* values are only ever appended */
#define HORA_DTYPE_COUNT 10

typedef enum {
  HORA_SUM = 0,
  HORA_AVERAGE = 1, /* sum, then divide by the world size (integers: truncating division) */
  HORA_MIN = 2,
  HORA_MAX = 3,
  HORA_PRODUCT = 4,
  HORA_ADASUM = 5 /* Adasum (Maleki et al. 2021; Horovod's op=Adasum): allreduce only (blocking
                   * and async), HORA_FLOAT32/HORA_FLOAT64 host buffers, power-of-two sizes */
} hora_op_t;
#define HORA_OP_COUNT 5 /* the element-wise ops 0..4, which every reducing collective takes */

typedef enum {
  HORA_DEVICE_HOST = 0, /* host memory (pageable or pinned) */
  HORA_DEVICE_CUDA = 1  /* CUDA device memory of the GPU this rank uses (hora_device_index) */
} hora_device_t;

/* Size of one element of `dtype` in bytes through *size_bytes. HORA_ERR_INVALID_ARGUMENT for an
 * unknown dtype or a NULL output. Local. */
hora_result_t hora_dtype_size(hora_dtype_t dtype, size_t *size_bytes);

/* hora_built: whether this build of libhora contains `feature`, through *built (1 or 0).
 * Features: "mpi" (always 1), "cuda" (device buffers), "nccl" (the NCCL GPU path), "hwloc" (CPU
 * binding), "gloo", "ddl", "ccl", "rocm" (never: hora has none of them; for Horovod's
 * *_built() queries). Local; callable before hora_init. Errors: HORA_ERR_INVALID_ARGUMENT
 * (feature or built NULL, or a feature name not in this list: the message names it). */
hora_result_t hora_built(const char *feature, int *built);

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
 * CUDA builds: picks this rank's GPU (HORA_DEVICE, else local rank modulo the number of visible
 * GPUs), makes it current on the calling thread (cudaSetDevice) and logs it at INFO; a rank that
 * sees no GPU starts normally (its device collectives return HORA_ERR_NOT_SUPPORTED).
 * Compares across ranks the settings that decide how ranks exchange data (docs/env.md: HORA_CHECK,
 * HORA_ALLREDUCE_ALGO, the ring/shm/staged chunk sizes, HORA_SHM_FLAT_BYTES, HORA_FUSION_THRESHOLD,
 * HORA_CACHE_CAPACITY, HORA_GPU_PATH, HORA_COMPRESSION; one MPI_Allreduce): a rank whose value
 * differs would run another algorithm or protocol, and its peers would get wrong data or hang.
 * Errors: HORA_ERR_INVALID_ARGUMENT (ctx NULL, a malformed HORA_* variable: the message names it;
 *   HORA_DEVICE at or beyond the number of visible GPUs; on every rank, one of the settings above
 *   differs between ranks: the message names it, the values and the ranks holding each; first of
 *   all, the ranks run different libhora builds, version and git commit (HORA_BUILD_GIT, set at
 *   configure time), named the same way), HORA_ERR_CUDA (cudaSetDevice failed),
 *   HORA_ERR_LAYOUT (world size differs from SLURM_NTASKS or HORA_SIZE; the message says how to
 *   start the job), HORA_ERR_MPI (MPI could not start or lacks MPI_THREAD_MULTIPLE),
 *   HORA_ERR_NO_MEMORY, HORA_ERR_INTERNAL (HORA_TEST_FAULT injected a failure), HORA_ERR_REMOTE
 *   (a rank's first heartbeat did not arrive within HORA_INIT_TIMEOUT_S: the message names the
 *   ranks never heard from; see below). On error *ctx is
 *   left unchanged and nothing stays allocated; MPI, when hora_init started it, is finalized only
 *   if the failure came before the GPU and engine start-up (later ones may be this rank's alone,
 *   and MPI_Finalize would wait for the ranks that went on).
 * Also installs, once per process and before MPI_Init, hora's handler for SIGSEGV, SIGBUS,
 * SIGFPE, SIGILL and SIGABRT (one async-signal-safe line naming rank, node, host, pid, thread and
 * signal, then the default action), unless the program installed its own first; Open MPI then
 * installs none (docs/design.md, "When a job fails").
 * Start-up of the heartbeat (HORA_PEER_TIMEOUT_S > 0, more than one rank): hora_init returns only
 * once the first heartbeat of every rank this one watches has arrived (rank 0 watches every rank,
 * the others rank 0; one UDP exchange, milliseconds), so that from then on a peer that stops is
 * found within HORA_PEER_TIMEOUT_S. A rank not heard from within HORA_INIT_TIMEOUT_S fails
 * hora_init with HORA_ERR_REMOTE naming it on rank 0, and on the other ranks through rank 0
 * (HORA_INIT_TIMEOUT_S=0: hora_init does not wait, and such a rank is never declared dead).
 * Before the heartbeat runs, hora_init's start-up collectives are blocking MPI calls: if a rank
 * never calls hora_init, hora_init cannot return an error, so a watchdog thread ends the process
 * (exit status 1, one line on stderr naming host, pid and the start-up step it waits in, such as
 * "MPI_Comm_dup of the world communicator", and for how long) once hora_init has not returned
 * after 2 x HORA_INIT_TIMEOUT_S; the launcher then ends the job (runtime/init/init.c). */
hora_result_t hora_init(hora_ctx_t **ctx);
/* hora_init_ex: hora_init with options (opts may be NULL for defaults). Same errors, and
 * HORA_ERR_INVALID_ARGUMENT if opts->size is smaller than the first field's end. */
hora_result_t hora_init_ex(const hora_init_opts_t *opts, hora_ctx_t **ctx);

/* hora_finalize: flush and stop everything hora started for this context (engine thread,
 * checkpoint writer and copier, communicators), free it, and finalize MPI if hora_init started it.
 * Collective. ctx NULL is a no-op. After it returns `ctx` must not be used. Returns the first error
 * met while flushing (for example HORA_ERR_IO from a checkpoint copy), but always frees.
 * After a failure (a peer was declared dead: HORA_ERR_REMOTE, or the engine failed) it still
 * returns within seconds, with that error: it skips what would wait for the dead rank (the
 * checkpoint result broadcast, shared-memory window frees, MPI_Finalize: the process then ends
 * with MPI initialized, which mpirun/srun report) and leaks the buffers MPI may still write.
 * Buffers of async requests that failed with HORA_ERR_REMOTE may likewise still be written by MPI
 * if the peer was only slow: a program should end after HORA_ERR_REMOTE, not reuse them.
 * A rank that finalizes while the others still wait for it never hangs them (as in Horovod):
 *  - Its first step tells every other rank (one UDP datagram each, through the heartbeat) how many
 *    blocking collectives it completed on ctx. A rank that is in, or later enters, a blocking
 *    collective numbered above that (one the finalizing rank skipped, or left with an error of
 *    its own) gets HORA_ERR_REMOTE naming it ("rank 1 called hora_finalize after completing 10
 *    blocking collectives on this context, so it will never join this rank's call number 11"),
 *    within a heartbeat poll (50 ms); its context has then failed, like after a dead peer.
 *  - Once this rank has no async request pending (at once if it has none; else when they have
 *    completed or the other ranks finalize too), it stops the async engine on every rank (the
 *    engine's next cycle): requests still pending on any rank complete with HORA_ERR_SHUTDOWN
 *    naming it, and later async submits there return HORA_ERR_SHUTDOWN.
 *  This rank's hora_finalize then returns within about HORA_PEER_TIMEOUT_S plus 2 s when a peer
 *  failed this way (it falls silent), with HORA_ERR_REMOTE; when every rank finalizes after its
 *  last call, none of this happens. The announcement also carries this rank's count for each
 *  process set made from ctx that it is in (a call on such a set gets "... on process set of N
 *  ranks (A..B), so it will never join ..."); a set made from a set, or beyond the 64 slots
 *  (hora_process_set_create), is not covered. */
hora_result_t hora_finalize(hora_ctx_t *ctx);

/* fork(). A child made by fork() from a rank (a PyTorch DataLoader worker, os.fork) inherits the
 * memory of what the rank made but none of its threads (the async engine, heartbeat, records
 * prefetch, checkpoint writer and copier, GPU monitor), and MPI's connections belong to the
 * parent. In the child:
 *  - the layout queries (hora_rank, hora_size, ..., hora_device_index) work;
 *  - every other call on a context made before the fork returns HORA_ERR_NOT_INITIALIZED (the
 *    context is not live in the child; hora_finalize included, so the child may simply exit);
 *  - calls on a handle, records reader or writer, checkpointer, elastic state, TensorBoard writer
 *    or GPU monitor made before the fork, and hora_init once hora_init had started MPI in the
 *    parent, return HORA_ERR_NOT_SUPPORTED and touch nothing (a records writer's abort in the
 *    child does not remove the parent's file);
 *  each message names the call, both pids and what to do instead. Nothing is sent to the parent's
 *  peers. A reader, writer or TensorBoard file that the child opens itself works as anywhere. A
 *  timeline being recorded on rank 0 is not written twice when the child ends with exit(). The
 *  parent is unaffected. Children started with exec (subprocess, multiprocessing's 'spawn' or
 *  'forkserver', posix_spawn) are not fork() children of the rank in this sense. */

/* Layout queries. Local; valid between hora_init and hora_finalize, also in a fork() child of the
 * rank (below). Errors: HORA_ERR_INVALID_ARGUMENT (NULL output), HORA_ERR_NOT_INITIALIZED (ctx
 * NULL or finalized). */
hora_result_t hora_rank(hora_ctx_t *ctx, int *rank);             /* 0 .. size-1 */
hora_result_t hora_size(hora_ctx_t *ctx, int *size);             /* world size */
hora_result_t hora_local_rank(hora_ctx_t *ctx, int *local_rank); /* rank among this node's */
hora_result_t hora_local_size(hora_ctx_t *ctx, int *local_size); /* ranks on this node */
hora_result_t hora_cross_rank(hora_ctx_t *ctx, int *cross_rank); /* index of this node */
hora_result_t hora_cross_size(hora_ctx_t *ctx, int *cross_size); /* number of nodes */
/* 1 when every node holds the same number of this context's ranks (Horovod's is_homogeneous),
 * else 0; the same on every rank. */
hora_result_t hora_is_homogeneous(hora_ctx_t *ctx, int *homogeneous);
/* CUDA device ordinal this rank uses (chosen by hora_init: HORA_DEVICE, else local rank modulo
 * the visible GPU count). Local. HORA_ERR_NOT_SUPPORTED when the build has no CUDA or the rank has
 * no GPU (then *device is unchanged). */
hora_result_t hora_device_index(hora_ctx_t *ctx, int *device);

/* ---------------------------------------------------------------------------------------------
 * Process sets (Horovod's add_process_set / remove_process_set).
 *
 * A process set is a hora context over a subset of a parent context's ranks: the handle it
 * returns is a hora_ctx_t, so every blocking collective, every async call (hora_*_async,
 * hora_join) and the layout getters work on it unchanged, with ranks, sizes and roots counted
 * within the set (hora_rank gives the rank in the set, 0 for the lowest parent rank listed).
 * Collectives on different sets, or on a set and its parent, may run at the same time from
 * different threads (each set has its own communicators and its own engine thread); on one
 * context the usual rules hold.
 * Shared with the root context made by hora_init: MPI, the heartbeat (a dead peer fails the
 * root's engine and every set's engine with HORA_ERR_REMOTE), the timeline (HORA_TIMELINE
 * records the root's operations only), the GPU monitor, the device (hora_device_index). Each set
 * has its own communicators, engine thread, fusion buffer, response cache, scratch and
 * shared-memory window. Checkpoints and signals (hora_ckpt_open, hora_ckpt_on_signal) belong to
 * the root context: on a set they return HORA_ERR_INVALID_ARGUMENT.
 * ------------------------------------------------------------------------------------------- */

/* hora_process_set_create: make a process set of the parent ranks `ranks[0..nranks)` (distinct,
 * each in 0 .. size-1 of ctx, any order: the set's ranks follow the parent's order).
 * Collective over ctx: every rank of ctx calls it, with the same list, also the ranks outside
 * the set; blocking. On success every rank gets a handle in *set. Ranks outside the set get a
 * handle too: every call on it except hora_process_set_destroy and hora_process_set_included
 * returns HORA_ERR_INVALID_ARGUMENT with a message naming the set's ranks. ctx may itself be a
 * process set (nested sets). Not concurrent with other collectives on ctx. A set made from the
 * context hora_init made takes one of 64 call-count slots (the lowest that no rank of ctx uses,
 * agreed in the same exchange that compares the lists: no extra round trip), through which the
 * finalize announcement and the stall inspection across nodes cover its blocking calls; a set
 * made from a set, or while all 64 are taken, works the same without that cover.
 * Errors (on every rank of ctx, never a hang): HORA_ERR_NOT_INITIALIZED (ctx not live: this one
 *   rank returns at once, the others block), HORA_ERR_INVALID_ARGUMENT (on the rank that passed
 *   it: set NULL, ranks NULL, nranks 0 or above the size of ctx, a rank out of range or listed
 *   twice, or ctx is a set this rank is not in; the other ranks return the same code with a
 *   message saying another rank rejected its list), HORA_ERR_MISMATCH (ranks passed different
 *   lists), HORA_ERR_SHUTDOWN (ctx is being finalized), HORA_ERR_REMOTE (a peer died or stopped:
 *   the agreements on the list and on the result are non-blocking MPI calls whose waits watch the
 *   heartbeat's verdict, so a rank that never comes ends them within HORA_PEER_TIMEOUT_S plus a
 *   fraction of a second; the communicator split and the set's engine start in between cannot be
 *   abandoned, but run only once every rank was present), HORA_ERR_MPI, HORA_ERR_NO_MEMORY. On
 *   error *set is unchanged and nothing stays allocated. */
hora_result_t hora_process_set_create(hora_ctx_t *ctx, const int *ranks, size_t nranks,
                                      hora_ctx_t **set);
/* hora_process_set_destroy: stop the set's engine (requests still pending fail with
 * HORA_ERR_SHUTDOWN) and free the set. Collective over the set's members (every member calls it,
 * in the same order relative to the set's collectives); local on a rank outside the set. The
 * parent's hora_finalize destroys the sets still live, newest first; a set must not be used after
 * either. set NULL is a no-op. Errors: HORA_ERR_NOT_INITIALIZED (not a live context),
 * HORA_ERR_INVALID_ARGUMENT (set was made by hora_init: use hora_finalize), HORA_ERR_REMOTE
 * (a peer died or stopped, before or during the destroy, which then returns within about
 * HORA_PEER_TIMEOUT_S plus 2 s: a set's waits also watch its parent's verdict; the set is freed
 * anyway). hora_finalize on a set returns
 * HORA_ERR_INVALID_ARGUMENT and leaves it alive. */
hora_result_t hora_process_set_destroy(hora_ctx_t *set);
/* hora_process_set_included: *included = 1 if this rank is in the set, else 0 (a context made
 * by hora_init: 1). Local. Errors: HORA_ERR_NOT_INITIALIZED, HORA_ERR_INVALID_ARGUMENT (NULL). */
hora_result_t hora_process_set_included(hora_ctx_t *set, int *included);

/* ---------------------------------------------------------------------------------------------
 * Blocking collectives.
 *
 * All are collective over the context's world: every rank calls them in the same order with the
 * same count, dtype, op, root and device (what can be detected is checked and reported as
 * HORA_ERR_INVALID_ARGUMENT or HORA_ERR_MISMATCH). sendbuf == recvbuf means in place. Counts are
 * in elements; buffers larger than 2^31 elements work. `device` says where both buffers live.
 * Common errors: HORA_ERR_NOT_INITIALIZED (ctx NULL or finalized), HORA_ERR_INVALID_ARGUMENT
 * (NULL buffer with count > 0, a buffer not aligned to its element size, unknown dtype/op/device,
 * root out of range, count * element size overflows size_t, partially overlapping buffers),
 * HORA_ERR_NOT_SUPPORTED (device buffers in a
 * build without CUDA), HORA_ERR_MPI / HORA_ERR_NCCL / HORA_ERR_CUDA (the transport failed),
 * HORA_ERR_REMOTE (a peer died or stopped; below). On HORA_ERR_INVALID_ARGUMENT nothing is
 * written to recvbuf.
 *
 * Cross-rank call check (on unless HORA_CHECK=0): before moving any data, every blocking
 * collective (host and device buffers, every algorithm and GPU path) agrees across ranks on
 *   collective  which call (a rank calling another collective, or hora_barrier, at this point),
 *   count       allreduce/broadcast/allgather/alltoall: count; reducescatter: recvcount;
 *               allgatherv: the sum of recvcounts (then each entry, see hora_allgatherv);
 *               alltoallv: checked pairwise (see hora_alltoallv),
 *   dtype, op   (op: allreduce, reducescatter), root (broadcast), device,
 *   prescale, postscale  (allreduce, reducescatter; compared bit for bit),
 *   shape       the fingerprint given by hora_set_call_shape (0 or not set: unchecked).
 * A disagreement returns HORA_ERR_MISMATCH on EVERY rank within the call, and nothing is written
 * to any rank's buffers. The message (hora_last_error) names this rank's collective, then either
 * "ranks disagree on the call sequence (collective): hora_allreduce on rank 0; hora_broadcast on
 * rank 1", or for each differing field "ranks disagree on count: 100 on ranks 0,2; 50 on rank 1"
 * (fields joined by " | "). A call is never paired with a later one: the check is the first
 * communication of every blocking call. For hora_allreduce the resolved algorithm
 * (HORA_ALLREDUCE_ALGO) is compared too ("allreduce algorithm", named only when count and dtype
 * agree). Cost per call (docs/benchmarks.md "Call check"): a host allreduce on one node carries the
 * 40-byte descriptor in the first barrier of the shared-memory algorithm it runs anyway (every
 * size, with the check on: messages up to HORA_SHM_FLAT_BYTES take its one-barrier flat form),
 * so the check adds no round trip, only the descriptor's writes and reads; the other collectives
 * on one node pay one barrier of that window (created on the first blocking call); across nodes,
 * one MPI_Allreduce of 80 bytes, plus, only on a mismatch, one MPI_Allgather of 40 bytes per
 * rank. HORA_CHECK must be the same on every rank. The local argument checks come first: a rank
 * whose own arguments are invalid returns its HORA_ERR_INVALID_ARGUMENT (or NOT_SUPPORTED), and
 * still takes part in the check as "invalid arguments", so the ranks whose arguments were fine
 * return HORA_ERR_MISMATCH naming it ("call sequence") instead of waiting for it.
 * A live rank that never calls (it skipped the call, or is stuck elsewhere) is named by the check's
 * stall inspection on one node: a warning after HORA_STALL_WARNING_S (60 s), and with
 * HORA_STALL_SHUTDOWN_S > 0 the call returns HORA_ERR_TIMEOUT naming it after that long, nothing
 * written, the context still usable. Across nodes (the context hora_init made) the same warning and
 * HORA_ERR_TIMEOUT name the rank that entered the fewest blocking calls as rank 0 last saw it
 * (each rank's count rides on its heartbeats, so the view is up to one heartbeat period old:
 * HORA_PEER_TIMEOUT_S / 6, at most 1 s); there the check's MPI allreduce is already posted and
 * cannot be taken back, so the context then fails: every later call on it returns the same
 * HORA_ERR_TIMEOUT, and its heartbeats stop, so the missing rank gets HORA_ERR_REMOTE within
 * HORA_PEER_TIMEOUT_S. A process set made from the context hora_init made is inspected the same
 * way (its members' counts ride on the heartbeats too; the rank named is a rank of the job), and
 * its HORA_ERR_TIMEOUT fails the job's context as well; a set made from a set is not inspected
 * across nodes (the call waits).
 * A rank that called hora_finalize instead of this call: HORA_ERR_REMOTE naming it at once (see
 * hora_finalize).
 *
 * A dead or stopped peer (crashed, killed, SIGSTOPped, or so starved that its heartbeat thread
 * is silent): every blocking collective here, every algorithm (ring, shm, hier, the MPI path)
 * and device path (staged, NCCL), returns HORA_ERR_REMOTE on every surviving rank, with a
 * message naming the rank ("rank 3 sent no heartbeat for 30 s (HORA_PEER_TIMEOUT_S)"), within
 * HORA_PEER_TIMEOUT_S plus a fraction of a second of the peer falling silent (measured: 0 to
 * 0.25 s; seconds more on an overloaded node; docs/design.md), also right after hora_init (which
 * waits for every peer's first heartbeat). Every
 * wait inside the call watches the heartbeat's verdict; a call made after the verdict returns it
 * at once. recvbuf (and buf) is then undefined and MPI may still write
 * it if the peer was only slow: do not reuse it; call hora_finalize, which returns promptly, and
 * end the program. HORA_PEER_TIMEOUT_S=0 turns the heartbeat off: then a call waits forever.
 * ------------------------------------------------------------------------------------------- */

/* hora_set_call_shape: tag this thread's NEXT collective on ctx with a fingerprint of the
 * caller's tensor shape (any 64-bit digest of the dimensions; 0: unchecked). The next collective
 * called by this thread on ctx, blocking or async, takes the tag and clears it, whatever its
 * result (hora_grouped_allreduce_async gives it to every member: one digest of the whole group's
 * shapes, and of whatever else the caller wants the ranks to agree on). Blocking calls: ranks whose non-zero
 * fingerprints differ get HORA_ERR_MISMATCH (field "shape") even when the element counts agree; a
 * rank that gave none (0) matches any. Async calls: the fingerprint is one more field every rank
 * must agree on for the name (0 included), reported like the others. The Python bindings
 * (hora, hora.torch) pass a hash of each tensor's shape (hora.torch's integer tensors: with the
 * op and scale factors it applies itself). Local; costs nothing but the call.
 * Errors: HORA_ERR_NOT_INITIALIZED (ctx NULL or finalized). */
hora_result_t hora_set_call_shape(hora_ctx_t *ctx, uint64_t fingerprint);

/* hora_set_call_group: tag this thread's NEXT collective on ctx as one member of a group of
 * `size` async requests that the caller submits one by one (a grouped allgather or
 * reducescatter; hora_grouped_allreduce_async tags its members itself). `key` is any 64-bit
 * digest of the set of the group's names (0: not a group); every member gets the same key and
 * size. The ranks must agree on it like on any other field of a name: ranks that group other
 * names (a member more or fewer) get HORA_ERR_MISMATCH for every member, field "the grouped call
 * it belongs to", on every rank, the members only some ranks submit included, instead of waiting
 * for members that never come. The next collective called by this thread on ctx takes the tag
 * and clears it, whatever its result; blocking collectives ignore it. The Python bindings tag
 * hora.torch's grouped_allgather and grouped_reducescatter. Local; costs nothing but the call.
 * Errors: HORA_ERR_NOT_INITIALIZED (ctx NULL or finalized), HORA_ERR_INVALID_ARGUMENT (size 0
 * with a non-zero key). */
hora_result_t hora_set_call_group(hora_ctx_t *ctx, uint64_t key, uint32_t size);

/* hora_set_call_ready: tag this thread's NEXT async collective on ctx (any hora_*_async call
 * below) with a CUDA event (a cudaEvent_t, passed as void *) after which its buffers are ready:
 * the engine thread waits for the event to complete before that request's collective reads
 * sendbuf or writes recvbuf, so the caller need not synchronize the stream that produces the data
 * (Horovod records such a "ready event" for every GPU tensor it enqueues). Record the event on
 * the stream that writes the buffers (and that allocated recvbuf) after that work, pass it here,
 * then submit. The event must not be destroyed or recorded again before the handle is done.
 * hora_grouped_allreduce_async applies one event to all its members. Host buffers wait too (a
 * pinned buffer written by cudaMemcpyAsync). The wait is polled on the engine thread: it fails
 * the request with HORA_ERR_CUDA when the event reports a CUDA error, and with HORA_ERR_TIMEOUT
 * when the event has not completed within HORA_PEER_TIMEOUT_S (the work before it is stuck);
 * the engine then fails as after any failed collective. The next collective called by this
 * thread on ctx takes the tag and clears it, whatever its result; blocking collectives clear it
 * without waiting (they run on the calling thread, which synchronizes the stream itself).
 * cuda_event NULL clears it. Local; costs nothing but the call. The Python bindings pass one
 * event per async submission of CUDA tensors (hora.torch's allreduce_async, the grouped form,
 * broadcast_async and DistributedOptimizer's gradients); their other calls synchronize torch's
 * current stream instead.
 * Errors: HORA_ERR_NOT_INITIALIZED (ctx NULL or finalized), HORA_ERR_NOT_SUPPORTED (a non-NULL
 * event in a build without CUDA). */
hora_result_t hora_set_call_ready(hora_ctx_t *ctx, void *cuda_event);

/* allreduce: recvbuf[i] = postscale * OP_r(prescale * sendbuf_r[i]) for i in [0, count).
 * HORA_AVERAGE divides the reduced value by the world size (after prescale, before postscale).
 * HORA_ADASUM combines the ranks' whole vectors pairwise in a binary tree of log2(size) levels
 * with adasum(a, b) = (1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b (a coefficient is 1 where
 * |x|^2 < sqrt(DBL_MIN) = 1.49e-154, Horovod 0.28's threshold), by recursive vector halving and distance doubling (runtime/algo/adasum.c; at
 * level d rank r pairs with r xor d, lower rank's vector first); dot products in double. It
 * needs HORA_FLOAT32 or HORA_FLOAT64 (else HORA_ERR_INVALID_ARGUMENT) and a power-of-two world
 * size (else HORA_ERR_INVALID_ARGUMENT, on every rank). On device buffers it is Horovod 0.28's
 * GPU Adasum (its NCCL builds): the ranks of each node are averaged (after prescale), the node
 * averages combined by Adasum across nodes as above, then postscale; on one node that is the
 * average. It goes through host memory on every GPU path, and needs the same number of ranks on
 * every node and a power-of-two number of nodes (else HORA_ERR_INVALID_ARGUMENT, on every rank)
 * instead of a power-of-two world. hora_allreduce_async and hora_grouped_allreduce_async take it too (checked at
 * submission; never fused: each tensor is its own Adasum); hora_reducescatter refuses it
 * (HORA_ERR_INVALID_ARGUMENT).
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
 * elements) recvbuf[i] = postscale * OP_p(prescale * sendbuf_p[r*recvcount + i]), the reduction
 * over ranks p of block r. HORA_AVERAGE divides by the world size (after prescale, before
 * postscale), as Horovod 0.28's reducescatter does; the prescaled input is a copy, sendbuf is
 * never written. Scale factors apply to floating-point dtypes; for integer dtypes they must be
 * 1.0 (HORA_ERR_INVALID_ARGUMENT), and so must they for HORA_BOOL, which also refuses
 * HORA_AVERAGE. Ranks must agree on both factors (HORA_ERR_MISMATCH, fields "prescale",
 * "postscale"). In place when recvbuf == sendbuf + rank*recvcount (elements); any other overlap is
 * HORA_ERR_INVALID_ARGUMENT. Algorithm: the reduce-scatter half of hora's ring (host buffers);
 * ncclReduceScatter or the staged ring (device buffers). */
hora_result_t hora_reducescatter(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                 size_t recvcount, hora_dtype_t dtype, hora_op_t op, double prescale,
                                 double postscale, hora_device_t device);

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

/* barrier: returns once every rank has entered it. With the call check on it is the check's
 * exchange itself: a rank that calls another collective meanwhile gets HORA_ERR_MISMATCH
 * ("call sequence"), and so does this one. Errors: HORA_ERR_NOT_INITIALIZED, HORA_ERR_MPI,
 * HORA_ERR_MISMATCH, HORA_ERR_REMOTE (a peer died or stopped: within HORA_PEER_TIMEOUT_S, as
 * above). */
hora_result_t hora_barrier(hora_ctx_t *ctx);

/* hora_refuse: this rank's call of a blocking collective (any of the above) failed checks made
 * before it reached libhora (a binding's own: a non-contiguous array, a dtype it cannot map):
 * take part in that call's check as "invalid arguments", as a call whose arguments fail
 * libhora's own checks does, so that the other ranks' call returns HORA_ERR_MISMATCH naming this
 * rank ("hora_allreduce on rank 0; invalid arguments on rank 1") instead of waiting for it, or
 * meeting this rank's next call with other data. Call it in place of the refused call, once.
 * Blocking, like the call it stands for. Does nothing (HORA_SUCCESS) where the call check is off
 * (HORA_CHECK=0), on a rank outside the process set ctx is, or after a failure verdict. The
 * Python bindings (hora's blocking calls) call it for every argument error they raise before
 * the C call. hora's own; MPI and Horovod have none.
 * Errors: HORA_ERR_NOT_INITIALIZED; HORA_ERR_TIMEOUT (HORA_STALL_SHUTDOWN_S passed with some
 * rank not calling); HORA_ERR_REMOTE, HORA_ERR_MPI as for the collectives. HORA_SUCCESS when the
 * refusal reached the other ranks (their call failed) or every rank refused. */
hora_result_t hora_refuse(hora_ctx_t *ctx);

/* ---- async engine (runtime/engine) ----
 * Named non-blocking collectives in the style of Horovod. A call only queues the request and
 * returns a handle; one background thread per context (started by hora_init, stopped by
 * hora_finalize, beside a heartbeat thread that detects dead peers) owns all their
 * communication. Each cycle (HORA_CYCLE_TIME_MS) it negotiates
 * which names every rank has submitted (rank 0 coordinates new names; names seen before take a
 * fast path through a response cache of HORA_CACHE_CAPACITY entries and one bitwise-AND
 * allreduce of a bit vector), groups ready allreduces with the same dtype, op, scale factors and
 * device up to HORA_FUSION_THRESHOLD bytes, runs one collective per group on its own duplicate of
 * the world communicator (so it never interleaves with blocking collectives called from other
 * threads) and completes the handles. On one node, when the shared-memory algorithm reduces the
 * group, it works directly on the tensors' buffers; otherwise the group is packed into a fusion
 * buffer, reduced and unpacked. docs/design.md ("Async engine") describes the protocol.
 *
 * Rules that hold for every *_async call below:
 *  - Collective by name: every rank must submit a request with the same `name`, in any order
 *    relative to its other async requests, with matching count, dtype, op, root, device, shape
 *    fingerprint (hora_set_call_shape) and group (hora_grouped_allreduce_async,
 *    hora_set_call_group). A
 *    disagreement completes the handle on every rank with HORA_ERR_MISMATCH and a message that
 *    names the tensor, the field and which ranks hold which value (hora_wait sets it as the
 *    calling thread's hora_last_error()).
 *  - `name` is NUL-terminated, 1 .. 1024 bytes including the NUL; a name may be reused once the
 *    previous request with that name has completed on this rank (a second pending request with
 *    the same name completes with HORA_ERR_INVALID_ARGUMENT).
 *  - Non-blocking and thread-safe: any thread may submit, poll or wait. The buffers are read and
 *    written by the engine thread until the handle is done: do not touch them before that. The
 *    buffers of different pending requests must not overlap (the engine may write one request's
 *    recvbuf while it still reads another's sendbuf).
 *  - If the call returns an error, no handle is created, *handle is unchanged and the request
 *    never completes. On success *handle must be released with hora_handle_free.
 *  - Common errors: HORA_ERR_NOT_INITIALIZED (ctx NULL or finalized), HORA_ERR_INVALID_ARGUMENT
 *    (NULL name/handle, name empty or longer than 1023 bytes, NULL buffer with
 *    count > 0, unknown dtype/op/device, root out of range, sizes overflowing
 *    size_t, partially overlapping buffers, scale factors other than 1.0 for integer dtypes),
 *    HORA_ERR_NOT_SUPPORTED (HORA_DEVICE_CUDA buffers in a build without CUDA),
 *    HORA_ERR_REMOTE (a peer was declared dead: see hora_wait), HORA_ERR_SHUTDOWN (hora_finalize
 *    has begun here, or on another rank, which stopped the engine everywhere), HORA_ERR_NO_MEMORY.
 *  - Completion results (returned by hora_wait): HORA_SUCCESS; HORA_ERR_MISMATCH (see above);
 *    HORA_ERR_TIMEOUT (some ranks never submitted this name within HORA_STALL_SHUTDOWN_S; the
 *    message lists the missing ranks); HORA_ERR_REMOTE (a rank sent no heartbeat for
 *    HORA_PEER_TIMEOUT_S seconds: it died or hangs; the message names it; every pending and later
 *    request of this process then fails the same way); HORA_ERR_SHUTDOWN (hora_finalize ran
 *    while the request was pending, on this rank or on another: one rank's hora_finalize stops
 *    the engine on every rank, and the message then names that rank); HORA_ERR_INVALID_ARGUMENT (this rank already had a pending
 *    request with the same name, or a collective other than a SUM/AVERAGE allreduce was submitted
 *    while some rank had joined: see hora_join); HORA_ERR_NOT_SUPPORTED (device buffers in a
 *    CUDA build whose GPU path does not provide this collective); HORA_ERR_MPI (the transport
 *    failed; the engine then fails every pending request the same way, since the ranks may be out
 *    of step). On any error result the contents of the receive buffer are unspecified. */
typedef struct hora_handle hora_handle_t;

/* hora_allreduce_async: the non-blocking hora_allreduce of the tensor `name`:
 * recvbuf[i] = postscale * OP_r(prescale * sendbuf_r[i]) for i in [0, count) (count elements
 * of dtype); HORA_AVERAGE divides by the world size. sendbuf == recvbuf means in place. The
 * tensor is fused with other ready allreduces of the same dtype, op, prescale, postscale and
 * device; the reduction is the host algorithm of hora_allreduce (HORA_ALLREDUCE_ALGO) run on the
 * group: on one node with the shared-memory algorithm directly on the tensors' buffers (tensors of
 * 1 MiB and more are fused too), otherwise on a fusion buffer (tensors of 1 MiB and more are then
 * reduced on their own). Device tensors (HORA_DEVICE_CUDA) of any size are fused the same way
 * into a device fusion buffer of hora's (16-byte aligned members), reduced by one device
 * collective and copied back (runtime/comm/gpu.c). Ranks that called hora_join contribute zeros
 * (SUM and AVERAGE only).
 * Errors: the common ones above. */
hora_result_t hora_allreduce_async(hora_ctx_t *ctx, const char *name, const void *sendbuf,
                                   void *recvbuf, size_t count, hora_dtype_t dtype, hora_op_t op,
                                   double prescale, double postscale, hora_device_t device,
                                   hora_handle_t **handle);

/* hora_grouped_allreduce_async: ntensors allreduces (names[i], sendbufs[i], recvbufs[i],
 * counts[i] elements) with one dtype, op, scale factors and device, submitted at once and
 * completed through ONE handle that is done when all of them are (Horovod's
 * grouped_allreduce). The group is negotiated and fused together, so its tensors normally travel
 * in one collective. Every rank must submit the same group: the same set of names (in any
 * order), each with matching arguments. Ranks that group other names (a member more or fewer,
 * another name, a member submitted on its own) get HORA_ERR_MISMATCH for every member on every
 * rank, field "the grouped call it belongs to", the members that only some ranks submit included:
 * no handle waits for a member that never comes.
 * The handle's result is the first error of any member, else HORA_SUCCESS.
 * Errors: the common ones above, and HORA_ERR_INVALID_ARGUMENT for ntensors == 0, a NULL array,
 * or the same name twice in the group (the message gives the index). */
hora_result_t hora_grouped_allreduce_async(hora_ctx_t *ctx, const char *const *names,
                                           const void *const *sendbufs, void *const *recvbufs,
                                           const size_t *counts, size_t ntensors,
                                           hora_dtype_t dtype, hora_op_t op, double prescale,
                                           double postscale, hora_device_t device,
                                           hora_handle_t **handle);

/* hora_allgather_async: the non-blocking hora_allgather of `name`: every rank contributes
 * `count` elements; recvbuf (size*count elements) receives rank r's block at offset r*count.
 * In place when sendbuf == recvbuf + rank*count (elements). Not fused.
 * Errors: the common ones above; a joined rank (hora_join) makes it HORA_ERR_INVALID_ARGUMENT
 * on every rank (only allreduce proceeds with joined ranks). */
hora_result_t hora_allgather_async(hora_ctx_t *ctx, const char *name, const void *sendbuf,
                                   void *recvbuf, size_t count, hora_dtype_t dtype,
                                   hora_device_t device, hora_handle_t **handle);

/* hora_allgatherv_async: the non-blocking hora_allgatherv of `name`: rank r contributes
 * recvcounts[r] elements (sendcount must equal recvcounts[rank]); recvbuf holds sum(recvcounts)
 * elements in rank order. recvcounts (`size` entries) is copied at the call and must be the
 * same on every rank (HORA_ERR_MISMATCH, field "recvcounts", when it is not). Not fused.
 * Errors: the common ones above, HORA_ERR_INVALID_ARGUMENT for recvcounts NULL or
 * sendcount != recvcounts[rank]. */
hora_result_t hora_allgatherv_async(hora_ctx_t *ctx, const char *name, const void *sendbuf,
                                    size_t sendcount, void *recvbuf, const size_t *recvcounts,
                                    hora_dtype_t dtype, hora_device_t device,
                                    hora_handle_t **handle);

/* hora_broadcast_async: the non-blocking hora_broadcast of `name`: buf (count elements) of rank
 * `root` is copied into every rank's buf. Every rank must name the same root (HORA_ERR_MISMATCH,
 * field "root"). Not fused. Errors: the common ones above (root outside [0, size) is
 * HORA_ERR_INVALID_ARGUMENT). */
hora_result_t hora_broadcast_async(hora_ctx_t *ctx, const char *name, void *buf, size_t count,
                                   hora_dtype_t dtype, int root, hora_device_t device,
                                   hora_handle_t **handle);

/* hora_reducescatter_async: the non-blocking hora_reducescatter of `name`: sendbuf holds
 * size*recvcount elements; rank r receives in recvbuf (recvcount elements)
 * postscale * OP_p(prescale * block r of rank p) (HORA_AVERAGE divides by the world size after
 * prescale, before postscale; scale factors 1.0 for integer dtypes). In place when
 * recvbuf == sendbuf + rank*recvcount (elements). Not fused. Errors: the common ones above
 * (ranks that disagree on prescale or postscale: HORA_ERR_MISMATCH naming the field). */
hora_result_t hora_reducescatter_async(hora_ctx_t *ctx, const char *name, const void *sendbuf,
                                       void *recvbuf, size_t recvcount, hora_dtype_t dtype,
                                       hora_op_t op, double prescale, double postscale,
                                       hora_device_t device, hora_handle_t **handle);

/* hora_alltoall_async: the non-blocking hora_alltoall of `name`: sendbuf holds size blocks of
 * `count` elements, block p goes to rank p; recvbuf (size*count elements) receives at block p
 * what rank p sent. Not in place (any overlap is HORA_ERR_INVALID_ARGUMENT). Not fused.
 * Errors: the common ones above. */
hora_result_t hora_alltoall_async(hora_ctx_t *ctx, const char *name, const void *sendbuf,
                                  void *recvbuf, size_t count, hora_dtype_t dtype,
                                  hora_device_t device, hora_handle_t **handle);

/* hora_refuse_async: tell the other ranks that this rank's call of the collective named
 * names[0..n) failed its own checks (a bad argument found before any request was submitted),
 * so that theirs fail instead of waiting for a request that never comes. Each of the n names
 * (n >= 1: the names the call would have submitted, e.g. every member of a grouped call) is
 * submitted as a refusal: when every rank has submitted that name, every rank's request of it
 * completes with HORA_ERR_MISMATCH and a message that names the refusing ranks ("the call failed
 * its own argument checks on rank(s) 1"); nothing moves, even where every rank refused. The
 * refusal carries the group tag of hora_set_call_group when one is set (as the refused call's
 * members would), else, for n > 1, the group of hora_grouped_allreduce_async over the n names,
 * so that the peers' grouped members fail with it (members only they submitted included).
 * Non-blocking; the handle completes with HORA_ERR_MISMATCH once the ranks have met, and holds
 * the names as pending until then (a request of the same name on this rank before that fails as a
 * duplicate); release it with hora_handle_free (which waits) or keep it and poll. Collective by
 * name like the calls above: a rank that never submits the name leaves the others' requests to
 * the stall rules (HORA_STALL_WARNING_S, HORA_STALL_SHUTDOWN_S). The Python bindings call it for
 * every argument error raised before a request reached the engine, so that one rank's error is
 * an error on every rank and unnamed requests stay numbered alike. hora's own; Horovod has none
 * (a rank's argument error there leaves its peers waiting).
 * Errors: the common ones above (names or handle NULL, a name empty or too long), and
 * HORA_ERR_INVALID_ARGUMENT for n == 0. */
hora_result_t hora_refuse_async(hora_ctx_t *ctx, const char *const *names, size_t n,
                                hora_handle_t **handle);

/* hora_poll: *done = 1 if the request has completed (successfully or not), else 0. Local;
 * never blocks; thread-safe. Errors: HORA_ERR_INVALID_ARGUMENT (handle or done NULL).
 * HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the object (see fork()
 * above). */
hora_result_t hora_poll(hora_handle_t *handle, int *done);

/* hora_wait: block until the request has completed and return its own result (see the
 * completion results above; the detailed message becomes the calling thread's
 * hora_last_error()). Local; thread-safe; may be called again after completion (it returns the
 * same result). Bounded in time: a dead peer completes it with HORA_ERR_REMOTE within about
 * HORA_PEER_TIMEOUT_S. Errors besides the request's own: HORA_ERR_INVALID_ARGUMENT (handle
 * NULL). The handle stays valid until hora_handle_free. HORA_ERR_NOT_SUPPORTED in a fork() child
 * of the process that made the object (see fork() above). */
hora_result_t hora_wait(hora_handle_t *handle);

/* hora_handle_free: release a handle. If the request is still pending it first waits for it
 * (the buffers must stay valid until then), so freeing never leaves the engine writing into
 * memory the caller has reclaimed. Local. handle NULL is a no-op. Returns HORA_SUCCESS (the
 * request's own result is only reported by hora_wait), or HORA_ERR_NOT_SUPPORTED in a fork()
 * child of the process that made the object (see fork() above). */
hora_result_t hora_handle_free(hora_handle_t *handle);

/* hora_join: Horovod's join, for ranks that ran out of data. Collective over the world, but
 * ranks call it at different times: after a rank has called it (and while it blocks), the other
 * ranks' SUM and AVERAGE allreduces (host or device buffers; for device buffers the joined rank
 * reduces a zeroed buffer on its own GPU) proceed with zeros from the joined rank (AVERAGE still
 * divides by the world size); any other collective submitted while a rank is joined fails with
 * HORA_ERR_INVALID_ARGUMENT. Returns on every rank once all ranks have joined, with *last_rank
 * the rank that joined last (ties: the highest rank). Blocking; call it from one thread per rank
 * after that rank's own async requests have been submitted.
 * Errors: HORA_ERR_NOT_INITIALIZED, HORA_ERR_INVALID_ARGUMENT (last_rank NULL, or this rank has
 * already joined), HORA_ERR_REMOTE (a peer died), HORA_ERR_SHUTDOWN. *last_rank is unchanged on
 * error. */
hora_result_t hora_join(hora_ctx_t *ctx, int *last_rank);

/* hora_timeline_start: record the async engine's requests into a Chrome-trace timeline at `path`
 * (Trace Event Format JSON, loadable in Perfetto or chrome://tracing; the layout of HORA_TIMELINE,
 * docs/api.md "Timeline"), from now until hora_timeline_stop, another hora_timeline_start or
 * hora_finalize: Horovod's hvd.start_timeline. One row per tensor name with its QUEUE,
 * NEGOTIATE, fusion-copy and collective phases (microseconds); mark_cycles != 0 adds an instant
 * event per engine cycle that ran a collective. A timeline that is already recording (from
 * HORA_TIMELINE or an earlier call) is closed and saved under its own name first, so each file
 * holds the requests of its own interval. Only rank 0 of the context made by hora_init writes
 * the file (its negotiation sees every rank's requests); other ranks may call it and return
 * HORA_SUCCESS without touching `path`. Not collective, not blocking on other ranks, thread-safe.
 * The file is made under a temporary name in path's directory with its first event and renamed
 * to `path` at once; from then on `path` holds a complete JSON array at every moment, and every
 * finished request within about a second (each flush rewrites the closing bracket), so it can be
 * read while the job runs and after it hung or was killed. It gets HORA_FILE_MODE, and
 * HORA_TIMELINE_MAX_BYTES caps its size (events past the cap are dropped and counted).
 * Errors: HORA_ERR_NOT_INITIALIZED (ctx NULL or finalized), HORA_ERR_INVALID_ARGUMENT (path NULL
 * or empty; ctx is a process set), HORA_ERR_SHUTDOWN (hora_finalize has begun), HORA_ERR_IO
 * (rank 0: path's directory does not exist or fails the shared-node check of docs/checkpoint.md,
 * or the file cannot be created: the recording that was running, if any, goes on unchanged; or
 * the previous recording could not be saved: the new one is recording and the message says so),
 * HORA_ERR_NO_MEMORY. */
hora_result_t hora_timeline_start(hora_ctx_t *ctx, const char *path, int mark_cycles);

/* hora_timeline_stop: end the recording of hora_timeline_start or HORA_TIMELINE and save the
 * file under its final name before returning (rank 0; other ranks return at once). HORA_SUCCESS
 * and nothing done when no timeline is recording, as Horovod's hvd.stop_timeline.
 * Errors: HORA_ERR_NOT_INITIALIZED, HORA_ERR_INVALID_ARGUMENT (ctx is a process set),
 * HORA_ERR_SHUTDOWN, HORA_ERR_IO (a write or the final fsync failed, e.g. a full disk: the file
 * keeps the events written before the failure, as a complete array, the message says how many
 * were dropped, and the recording has ended). */
hora_result_t hora_timeline_stop(hora_ctx_t *ctx);

/* ---- GPU (runtime/comm) ----
 * Device buffers (device = HORA_DEVICE_CUDA) are accepted by every blocking collective above in
 * CUDA builds. They must be memory of this rank's GPU (hora_device_index). Transport:
 * HORA_GPU_PATH (auto: NCCL unless the build lacks it or two ranks of a node share a GPU, then an
 * MPI ring staged through pinned host memory with the reduction on the GPU; see docs/gpu.md).
 * hora enqueues on its own blocking streams, so it orders after the caller's work on the legacy
 * default stream; work on other streams must be complete before the call. The call returns when
 * the result is in recvbuf. HORA_COMPRESSION=fp16|bf16 sends float32 allreduce payloads as 16-bit
 * floats. The first device collective of a context creates its GPU state (collective).
 * Extra errors for device buffers: HORA_ERR_INVALID_ARGUMENT (a buffer is host memory or memory of
 * another GPU; checked locally, so the other ranks wait until HORA_PEER_TIMEOUT_S),
 * HORA_ERR_NOT_SUPPORTED (no CUDA in the build, some rank has no
 * GPU, or HORA_GPU_PATH=nccl where NCCL cannot run; returned on every rank), HORA_ERR_CUDA (a CUDA
 * call or kernel failed), HORA_ERR_NCCL (NCCL failed), HORA_ERR_TIMEOUT (no completion within
 * HORA_PEER_TIMEOUT_S; the NCCL communicator is aborted), HORA_ERR_REMOTE (NCCL reported a remote
 * or system error, or the communicator was aborted earlier). */

/* ---- checkpoints (runtime/ckpt) ----
 * Two-phase checkpoints (docs/checkpoint.md): hora_ckpt_save copies the named tensors of rank 0
 * into a staging buffer and returns; a writer thread writes them to node-local disk
 * (local_dir/step-<N>/), a copier thread copies committed steps to persistent storage
 * (persist_dir/step-<N>/). Every file reaches its final name through a temporary name, fsync,
 * rename and a directory fsync; the manifest (manifest.json, with the file's size and CRC32C)
 * is written last, so a step directory without a valid manifest is never used. Files are
 * safetensors (loadable by Python's `safetensors` package) with CRC32C values per tensor and
 * for the data section in `__metadata__`. `keep` versions stay in each place; an older version
 * is removed only after a newer one verified in the same place.
 * Threads: one checkpointer is used by one thread at a time (the training loop). */
typedef struct hora_ckpt hora_ckpt_t;

/* Options of hora_ckpt_open. Call hora_ckpt_opts_init, then set the fields you need. Fields only
 * ever grow at the end. */
typedef struct {
  size_t size;             /* sizeof(hora_ckpt_opts_t) */
  const char *local_dir;   /* NULL: $SLURM_TMPDIR/hora-ckpt, else /tmp/hora-$SLURM_JOB_ID, else /tmp/hora-ckpt-<uid> */
  const char *persist_dir; /* NULL: no copier, local only */
  int keep;                /* versions kept in each place; 0: 2; 1 is an error */
  double copy_interval_s;  /* < 0: default 600; 0: copy after every save */
} hora_ckpt_opts_t;

/* hora_ckpt_opts_init: set opts->size and every default (local_dir and persist_dir NULL, keep 2,
 * copy_interval_s 600). Local. Errors: HORA_ERR_INVALID_ARGUMENT (opts NULL). */
hora_result_t hora_ckpt_opts_init(hora_ckpt_opts_t *opts);

/* One tensor to save or restore. */
typedef struct {
  const char *name;        /* unique within a checkpoint */
  void *data;              /* save: read from; restore: written to */
  size_t count;            /* elements */
  hora_dtype_t dtype;
  hora_device_t device;
  int ndim;                /* 0: 1-D [count]; else shape[0..ndim-1], product == count */
  const int64_t *shape;
} hora_tensor_t;

/* One user metadata entry (both strings NUL-terminated; copied by hora_ckpt_save). */
typedef struct { const char *key; const char *value; } hora_kv_t;

/* Exit status a program uses after a preemption checkpoint (hora_should_stop, then save and
 * flush): the sbatch script requeues the job when srun returns it (examples/slurm/requeue.sbatch,
 * or RequeueExit=3 in slurm.conf). */
#define HORA_EXIT_REQUEUE 3

/* hora_ckpt_open: create a checkpointer. Collective (every rank, same options; only rank 0's
 * directories are used). Blocking: rank 0 creates local_dir and persist_dir (with parents)
 * if missing, removes temporary files an interrupted earlier run left in them, and starts the
 * writer thread and, with a persist_dir, the copier thread. hora_finalize closes checkpointers
 * still open. opts NULL means the defaults (see hora_ckpt_opts_t).
 * Errors: HORA_ERR_NOT_INITIALIZED (ctx not live), HORA_ERR_INVALID_ARGUMENT (ck NULL, opts->size
 *   too small, keep 1 or negative, copy_interval_s NaN, an empty directory string, ctx is a
 *   process set: checkpoints belong to the root context),
 *   HORA_ERR_IO (a directory cannot be created or is not a directory, or fails the shared-node
 *   check: a directory on the way owned by another user than the caller or root, writable by
 *   group or others without the sticky bit, or a symlink owned by another user; the message
 *   names the path, owner and mode; every rank returns it; docs/checkpoint.md, "Shared nodes"),
 *   HORA_ERR_REMOTE (a rank was declared dead while this rank waited for rank 0's result),
 *   HORA_ERR_MPI, HORA_ERR_NO_MEMORY. On error *ck is unchanged.
 * Directories hora creates are 0700 and files 0600 (HORA_FILE_MODE widens them). */
hora_result_t hora_ckpt_open(hora_ctx_t *ctx, const hora_ckpt_opts_t *opts, hora_ckpt_t **ck);

/* hora_ckpt_save: checkpoint `step`. Collective; only rank 0's tensors and metadata are read
 * (data-parallel replicas hold the same state), other ranks may pass NULL/0.
 * Rank 0 copies the ntensors tensors (host memory with memcpy; device memory with
 * cudaMemcpyAsync into pinned staging, then one stream synchronize) and returns as soon as
 * the copy is complete: the caller may overwrite its buffers right after. As for the
 * collectives, hora's copy stream orders after the caller's work on the legacy default stream;
 * work on other streams that writes the tensors must be complete before the call. The file is written
 * in the background (tensors in the order given, back to back). One snapshot exists at a
 * time: a save that finds the previous checkpoint still being written waits for it (and logs a
 * warning saying how long). Saving a step that is already committed writes a new version of
 * it beside the old file and replaces the manifest by rename.
 * Metadata: nmeta key/value strings, stored in the file's `__metadata__` besides hora's own
 * hora.step, hora.world_size, hora.version, hora.crc32c.<tensor> and hora.data_crc32c.
 * Errors (every rank returns rank 0's result):
 *   HORA_ERR_INVALID_ARGUMENT: ck NULL; tensors or meta NULL with a nonzero count; a tensor name
 *     NULL, empty, longer than 1024 bytes, "__metadata__" or repeated; unknown dtype or device;
 *     data NULL with count > 0; ndim outside 0..64, shape NULL, or a shape whose product is not
 *     count; count * element size overflowing; a meta key NULL, empty, repeated or starting
 *     with "hora."; a meta value NULL.
 *   HORA_ERR_IO: local_dir has less free space than the new file needs even after pruning
 *     older versions early (the save first waits for the write in progress, then removes
 *     versions other than the newest complete one and the one being copied), or local_dir
 *     fails the shared-node check (see hora_ckpt_open), or the background write of an EARLIER
 *     save failed (disk full,
 *     quota, RLIMIT_FSIZE; the message names that step). Such a deferred error is returned
 *     once, by the next save, flush or close; a save that returns it takes no snapshot, so
 *     call it again to checkpoint this step. Training can go on after any of these errors.
 *   HORA_ERR_REMOTE: a rank was declared dead, or the job failed otherwise, while this rank
 *     waited for rank 0's result (the message names the rank and "waiting for the result from
 *     rank 0"); rank 0 may have taken its snapshot before, which the writer still commits.
 *   HORA_ERR_NOT_SUPPORTED (device tensors in a build without CUDA), HORA_ERR_CUDA,
 *   HORA_ERR_NO_MEMORY (the staging buffer, as large as all tensors, cannot be allocated),
 *   HORA_ERR_MPI. On the other errors no snapshot is taken and nothing on disk changes.
 * HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the object (see fork()
 * above). */
hora_result_t hora_ckpt_save(hora_ckpt_t *ck, int64_t step, const hora_tensor_t *tensors,
                             size_t ntensors, const hora_kv_t *meta, size_t nmeta);

/* hora_ckpt_restore: load the newest valid checkpoint into every rank's tensors. Collective;
 * every rank passes the same names, dtypes and counts. Rank 0 looks in local_dir, then in
 * persist_dir, and takes the highest step whose manifest parses and whose file has the
 * manifest's size and CRC32C and every tensor CRC32C of its header (for the same step, the local
 * copy); torn or corrupt candidates, and local ones written by a run with another persist_dir,
 * are skipped with a warning naming them and the reason. It
 * then broadcasts step, metadata and bytes to all ranks. The checkpoint may hold more tensors
 * than asked for. A save still being written is waited for first. Device tensors are filled
 * with cudaMemcpy from host staging.
 * On success *step is the checkpoint's step (resume at *step + 1), and hora_ckpt_meta_get and
 * hora_ckpt_restore_source describe it.
 * Errors (every rank returns the same code):
 *   HORA_ERR_NOT_FOUND: no checkpoint in either place (a fresh start: no step directory holds a
 *     manifest of this run); nothing is written.
 *   HORA_ERR_CORRUPT: checkpoints exist but none is valid; the message names each and why.
 *     A resume loop must stop here, not start over from step 0. Nothing is written.
 *   HORA_ERR_IO: local_dir or persist_dir fails the shared-node check (see hora_ckpt_open);
 *     nothing is read from it. Restore never reads `latest`, never follows a symlink inside
 *     either directory, and takes only plain file names from a manifest.
 *   HORA_ERR_MISMATCH: the checkpoint lacks a requested tensor, or has another dtype, count or
 *     shape (when ndim > 0) for it, or the ranks' tensors differ in total size; nothing is
 *     written.
 *   HORA_ERR_INVALID_ARGUMENT (ck or step NULL, tensors NULL with ntensors > 0, a NULL name,
 *   data NULL with count > 0, unknown dtype or device; nothing written), HORA_ERR_NO_MEMORY (the
 *   file is read whole into memory on rank 0, and every other rank receives the requested
 *   bytes in one buffer), HORA_ERR_NOT_SUPPORTED / HORA_ERR_CUDA (device tensors; tensors may
 *   be partly written), HORA_ERR_REMOTE (a peer was declared dead during the restore: the
 *   survivors return within HORA_PEER_TIMEOUT_S, not every rank the same code then),
 *   HORA_ERR_MPI. *step is unchanged on error. HORA_ERR_NOT_SUPPORTED in a fork() child of the
 * process that made the object (see fork() above). */
hora_result_t hora_ckpt_restore(hora_ckpt_t *ck, int64_t *step, hora_tensor_t *tensors,
                                size_t ntensors);

/* hora_ckpt_meta_get: value of user metadata `key` of the last successful restore, on every
 * rank. Local. *value stays valid until the next restore or close.
 * Errors: HORA_ERR_INVALID_ARGUMENT (NULL argument), HORA_ERR_NOT_FOUND (no such key, or no
 * restore yet). */
hora_result_t hora_ckpt_meta_get(hora_ckpt_t *ck, const char *key, const char **value);

/* hora_ckpt_restore_source: the step directory the last successful restore used (for example
 * "/scratch/run1/step-300"), on every rank. Local. *dir stays valid until the next restore or
 * close. Errors: HORA_ERR_INVALID_ARGUMENT (NULL argument), HORA_ERR_NOT_FOUND (no restore yet). */
hora_result_t hora_ckpt_restore_source(hora_ckpt_t *ck, const char **dir);

/* hora_ckpt_flush: wait until every saved checkpoint is committed in local_dir and, with a
 * persist_dir, until the newest one is durable there (the copier is woken at once, whatever
 * copy_interval_s says). Collective; blocking. While persist_dir is unreachable the copier
 * retries every HORA_CKPT_RETRY_S; flush gives up after HORA_CKPT_FLUSH_TIMEOUT_S.
 * Errors (every rank returns rank 0's result): HORA_ERR_INVALID_ARGUMENT (ck NULL), HORA_ERR_IO
 *   (a deferred write error, see hora_ckpt_save, or the copy kept failing until the timeout:
 *   the message says why), HORA_ERR_DATA (the local file no longer matched its manifest, so it
 *   was not copied), HORA_ERR_REMOTE (a rank was declared dead, or the job failed otherwise,
 *   while this rank waited for rank 0's result: the message names it), HORA_ERR_MPI.
 * HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the object (see fork()
 * above). */
hora_result_t hora_ckpt_flush(hora_ckpt_t *ck);

/* hora_ckpt_close: flush, stop the threads and free the checkpointer. Collective. ck NULL is a
 * no-op. The checkpointer is freed in every case; returns the flush's error.
 * HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the object (see fork()
 * above). */
hora_result_t hora_ckpt_close(hora_ckpt_t *ck);

/* hora_ckpt_on_signal: install handlers for SIGUSR1 (Slurm's `--signal=USR1@T`, `scancel -s
 * USR1`) and SIGTERM that only set a process-wide flag; hora_finalize restores the previous
 * handlers, unless hora_should_stop has answered 1 (the rank is stopping: a late copy of the
 * signal, which Slurm delivers node by node, must not kill it before it exits with
 * HORA_EXIT_REQUEUE). Local; call it on every rank after hora_init. Idempotent.
 * Errors: HORA_ERR_NOT_INITIALIZED (ctx not live), HORA_ERR_INVALID_ARGUMENT (ctx is a process
 * set: call it on the root context), HORA_ERR_INTERNAL (sigaction failed), HORA_ERR_NO_MEMORY. */
hora_result_t hora_ckpt_on_signal(hora_ctx_t *ctx);

/* hora_should_stop: *stop = 1 on every rank if any rank has received SIGUSR1 or SIGTERM since
 * hora_ckpt_on_signal, else 0 everywhere (an MPI_Allreduce of one int, so call it at a step
 * boundary: every rank stops at the same step). Once 1 it stays 1. Collective; blocking.
 * The intended sequence: save, flush, hora_finalize, exit(HORA_EXIT_REQUEUE).
 * Errors: HORA_ERR_NOT_INITIALIZED, HORA_ERR_INVALID_ARGUMENT (stop NULL), HORA_ERR_REMOTE (a
 * peer was declared dead, before or during the call: it returns within HORA_PEER_TIMEOUT_S
 * instead of waiting for the lost rank), HORA_ERR_NO_MEMORY (the first call's state),
 * HORA_ERR_MPI. */
hora_result_t hora_should_stop(hora_ctx_t *ctx, int *stop);

/* ---- elastic training (runtime/ckpt/elastic*.c, docs/elastic.md) ----
 * A committed state: named tensors plus a small user blob (epoch, batch, RNG state), copied into
 * this rank's memory by hora_elastic_commit. MPI cannot shrink a running world, so a job that
 * loses a rank re-forms as a new Slurm step (`launch --elastic`): each survivor gets
 * HORA_ERR_REMOTE, calls hora_elastic_save (no MPI) and exits with HORA_EXIT_ELASTIC; the ranks
 * of the new step call hora_elastic_sync, which takes the newest commit any of them holds
 * (memory, the survivors' files, else the checkpoint pipeline) from the lowest rank holding it.
 * Commit ids grow by one per commit across steps; 0 is the initial state of a fresh start.
 * Threads: one elastic state is used by one thread at a time. Host and device tensors (device
 * ones as for hora_ckpt_save). */
typedef struct hora_elastic hora_elastic_t;

/* Exit status of a survivor whose step must be re-formed (after hora_elastic_save): `launch
 * --elastic` starts a new step on the nodes still usable. */
#define HORA_EXIT_ELASTIC 4
/* The largest user blob in bytes. */
#define HORA_ELASTIC_BLOB_MAX 65536

/* hora_elastic_open: create an elastic state. Collective over ctx (every rank, the same
 * arguments). `dir`: where survivors write their commit (created with parents if missing;
 * node-local disk works: the new step's ranks read the files they can see, and the lowest rank
 * holding the newest one sends it). dir NULL: HORA_ELASTIC_DIR, else $SLURM_TMPDIR/hora-elastic,
 * else /tmp/hora-elastic-$SLURM_JOB_ID, else /tmp/hora-elastic-<uid>. dir belongs to one run: a
 * commit file of an earlier run with the same tensors left in it is taken as this run's newest
 * commit (the defaults are per Slurm job, and stay across a requeue of the same job). `ck` (may be NULL): a checkpointer of ctx; every ckpt_every-th
 * commit (ids divisible by it; 0: never) is also saved there as step <id> (only rank 0 writes),
 * with the blob as the uint8 tensor "hora_elastic_blob" of HORA_ELASTIC_BLOB_MAX elements. Close
 * the state before hora_ckpt_close. hora_finalize releases the MPI resources of a state left
 * open; hora_elastic_close still frees it.
 * ctx may be a process set (its members form the world of the state; ck must then be NULL).
 * Errors: HORA_ERR_NOT_INITIALIZED (ctx not live), HORA_ERR_INVALID_ARGUMENT (es NULL, dir
 *   empty, ckpt_every negative, ck of another context; on a rank outside a set), HORA_ERR_IO (dir cannot
 *   be created or fails the shared-node check of hora_ckpt_open, on any rank: all return it),
 *   HORA_ERR_REMOTE (a rank was declared dead while this rank waited for the others: the message
 *   names it), HORA_ERR_MPI, HORA_ERR_NO_MEMORY. *es is unchanged on error. */
hora_result_t hora_elastic_open(hora_ctx_t *ctx, const char *dir, hora_ckpt_t *ck, int ckpt_every,
                                hora_elastic_t **es);

/* hora_elastic_commit: copy the ntensors tensors and blob_bytes bytes of blob into this rank's
 * memory as the next commit (id = previous + 1), replacing the previous one. Local, blocking
 * (returns when the copy is done: the caller may change its tensors at once), except every
 * ckpt_every-th commit, which also calls hora_ckpt_save and is then collective: call it at the same
 * point on every rank (as Horovod's state.commit()).
 * Errors: HORA_ERR_INVALID_ARGUMENT (es NULL; tensors NULL with ntensors > 0; a tensor with a NULL
 *   or empty name, the name "hora_elastic_blob", NULL data and count > 0, an unknown dtype or
 *   device; blob NULL with blob_bytes > 0; blob_bytes > HORA_ELASTIC_BLOB_MAX), HORA_ERR_NO_MEMORY,
 *   HORA_ERR_CUDA / HORA_ERR_NOT_SUPPORTED (device tensors); on these the previous commit stays.
 *   A checkpoint commit also returns hora_ckpt_save's errors; the in-memory commit is then already
 *   made. HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the object (see
 * fork() above). */
hora_result_t hora_elastic_commit(hora_elastic_t *es, const hora_tensor_t *tensors, size_t ntensors,
                                  const void *blob, size_t blob_bytes);

/* hora_elastic_restore: copy the last commit (or sync) back into the tensors and blob: bit for
 * bit what was committed. Local. *blob_bytes (may be NULL) gets the blob's length.
 * Errors: HORA_ERR_INVALID_ARGUMENT (es NULL, a bad tensor as for commit, blob NULL or blob_cap
 *   smaller than the committed blob), HORA_ERR_NOT_FOUND (nothing committed or synced yet),
 *   HORA_ERR_MISMATCH (other names, dtypes or counts than the commit's), HORA_ERR_CUDA. Nothing
 *   is written on these errors except HORA_ERR_CUDA. */
hora_result_t hora_elastic_restore(hora_elastic_t *es, hora_tensor_t *tensors, size_t ntensors, void *blob,
                                   size_t blob_cap, size_t *blob_bytes);

/* hora_elastic_sync: make every rank hold the same commit and write it into the tensors and
 * blob. Collective (every rank, the same tensor names, dtypes and counts); blocking. Each rank's
 * candidate is its in-memory commit, else the newest valid commit file in dir (any rank's; a
 * corrupt or foreign one is skipped with a warning); the newest id over all ranks wins and the
 * lowest rank holding it broadcasts it. With no candidate anywhere, the checkpointer's newest
 * checkpoint is restored (if ck was given), else rank 0's current tensors are broadcast and
 * become commit 0 with an empty blob (a fresh start). Commit files older than the result are
 * removed. *commit gets the id held now; *blob_bytes (may be NULL) the blob's length.
 * Under `launch --elastic`, a step started while the previous one is still ending waits first: rank
 * 0 waits while "<HORA_ELASTIC_HOSTS_FILE>.prev" exists (the driver removes it when that step has
 * ended; at most HORA_PEER_TIMEOUT_S + 60 s, then a warning), so the survivors' files are written.
 * Waits watch the heartbeat: a peer that dies during the call gives HORA_ERR_REMOTE within
 * HORA_PEER_TIMEOUT_S, and this rank's commit stays (hora_elastic_save still works).
 * Errors (every rank returns the same code, except HORA_ERR_MPI): HORA_ERR_INVALID_ARGUMENT
 *   (es or commit NULL, a bad tensor on any rank, blob_cap smaller than the blob), HORA_ERR_REMOTE
 *   (a peer died or fell silent), HORA_ERR_MISMATCH
 *   (the ranks pass different tensors), hora_ckpt_restore's errors (HORA_ERR_CORRUPT, ...),
 *   HORA_ERR_NO_MEMORY, HORA_ERR_CUDA, HORA_ERR_MPI. On error this rank's commit is unchanged and
 *   the tensors are unchanged, except after a checkpoint restore that failed late.
 * HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the object (see fork()
 * above). */
hora_result_t hora_elastic_sync(hora_elastic_t *es, hora_tensor_t *tensors, size_t ntensors, void *blob,
                                size_t blob_cap, size_t *blob_bytes, int64_t *commit);

/* hora_elastic_save: write this rank's last commit to dir/commit-<id>.r<rank>.hora (temporary
 * name, fsync, rename; CRC32C), for the next step's hora_elastic_sync. Local, uses no MPI: call
 * it after HORA_ERR_REMOTE, then hora_finalize and exit(HORA_EXIT_ELASTIC).
 * Errors: HORA_ERR_INVALID_ARGUMENT (es NULL), HORA_ERR_NOT_FOUND (nothing committed or synced),
 *   HORA_ERR_IO (dir or the file; no file appears under the final name), HORA_ERR_NO_MEMORY.
 * HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the object (see fork()
 * above). */
hora_result_t hora_elastic_save(hora_elastic_t *es);

/* hora_elastic_hosts_changed: *changed = 1 on every rank when the driver (`launch --elastic`)
 * reports another number of usable nodes than this step runs on (rank 0 reads the first line of
 * HORA_ELASTIC_HOSTS_FILE; a missing or unreadable file means no change), else 0. Collective
 * (one broadcast): call it at the same point on every rank, for example at an epoch boundary
 * after a commit; on 1 the intended sequence is hora_elastic_save, hora_finalize,
 * exit(HORA_EXIT_ELASTIC), and the driver starts the next step on the nodes it has.
 * Errors: HORA_ERR_INVALID_ARGUMENT (a NULL argument), HORA_ERR_REMOTE (a peer died or fell silent:
 *   within HORA_PEER_TIMEOUT_S, as for sync), HORA_ERR_NO_MEMORY, HORA_ERR_MPI.
 * HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the object (see fork()
 * above). */
hora_result_t hora_elastic_hosts_changed(hora_elastic_t *es, int *changed);

/* hora_elastic_commit_id: *commit = the id of the commit held (-1: none yet). Local.
 * Errors: HORA_ERR_INVALID_ARGUMENT (a NULL argument). */
hora_result_t hora_elastic_commit_id(hora_elastic_t *es, int64_t *commit);

/* hora_elastic_close: free the state (local; es NULL is a no-op). HORA_SUCCESS, or
 * HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the object (see fork()
 * above). */
hora_result_t hora_elastic_close(hora_elastic_t *es);

/* ---- record files (runtime/data) ----
 * TFRecord-framed files (docs/data.md): each record is
 *   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
 * with masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8 over c = CRC32C(x) (the framing of
 * TensorFlow's TFRecordWriter, so files interoperate with TensorFlow and its tools). */
typedef struct hora_records_writer hora_records_writer_t;
typedef struct hora_records_reader hora_records_reader_t;

/* hora_records_writer_open: start writing a record file that appears under `path` only when
 * hora_records_writer_close succeeds. Local; blocking (creates the temporary file).
 * Records go to a temporary file ".tmp-<name>.<16 random hex digits>" in the same directory
 * (hidden, so glob patterns such as "train-*" never match it), created with O_EXCL|O_NOFOLLOW on
 * the directory's fd with mode HORA_FILE_MODE (0600 by default); close flushes, fsyncs, renames
 * it to `path` inside that directory (an existing file there is replaced) and fsyncs the directory.
 * The directory must exist and pass the shared-node check (owned by the caller or root, not
 * writable by group or others unless sticky, no symlink owned by another user on the way;
 * docs/checkpoint.md, "Shared nodes").
 * Not thread-safe: one writer is used by one thread at a time.
 * Errors: HORA_ERR_INVALID_ARGUMENT (path or writer NULL, path empty or ending in '/'),
 *   HORA_ERR_IO (the directory is missing or fails the check, or the temporary file cannot be
 *   created: the message names the path, and owner and mode or the errno text), HORA_ERR_NO_MEMORY.
 *   On error *writer is unchanged and no file is left behind. */
hora_result_t hora_records_writer_open(const char *path, hora_records_writer_t **writer);

/* hora_records_writer_write: append one record of len_bytes bytes (0 allowed; data may then be
 * NULL). Local; blocking only when its 1 MiB buffer is full (then it writes the buffer out).
 * Errors: HORA_ERR_INVALID_ARGUMENT (writer NULL, data NULL with len_bytes > 0),
 *   HORA_ERR_IO (a write failed, e.g. disk full). After HORA_ERR_IO the writer is failed: later
 *   writes return HORA_ERR_IO and close discards the temporary file and returns HORA_ERR_IO.
 * HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the object (see fork()
 * above). */
hora_result_t hora_records_writer_write(hora_records_writer_t *writer, const void *data,
                                        size_t len_bytes);

/* hora_records_writer_close: commit (flush, fsync, rename to the final path, fsync the directory)
 * and free the writer. Local; blocking. writer NULL is a no-op. The writer is freed in every case.
 * Errors: HORA_ERR_IO (an earlier write failed, or flush/fsync/rename failed: the temporary file
 *   is removed and nothing appears under the final path; a file already there stays as it was).
 * HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the object (see fork()
 * above). */
hora_result_t hora_records_writer_close(hora_records_writer_t *writer);

/* hora_records_writer_abort: discard everything written (the temporary file is removed; the final
 * path is not touched) and free the writer. Local. writer NULL is a no-op. HORA_SUCCESS, or
 * HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the object (see fork()
 * above). */
hora_result_t hora_records_writer_abort(hora_records_writer_t *writer);

/* hora_records_count: number of records in one file, through *count. Local; blocking (reads every
 * record header and seeks over the data; length CRCs are checked, data CRCs are not: use a reader
 * or `hora-records verify` for that).
 * Errors: HORA_ERR_INVALID_ARGUMENT (NULL argument), HORA_ERR_IO (cannot open/read),
 *   HORA_ERR_DATA (bad length CRC or truncated record: the message names file and byte offset).
 *   *count is unchanged on error. */
hora_result_t hora_records_count(const char *path, uint64_t *count);

/* Options of hora_records_reader_open. Zero-initialize, set `size = sizeof(...)`, then the fields
 * you need; zero means the documented default. Fields only ever grow at the end. */
typedef struct {
  size_t size;
  /* Files to read: `pattern_count` glob(3) patterns or plain file names. The matches of all
   * patterns are sorted by name and duplicates dropped, so every rank sees the same list. A
   * pattern without matches is an error. */
  const char *const *patterns;
  size_t pattern_count;
  /* Sharding. world_size 0: take rank and world size from ctx, or read everything (rank 0 of 1)
   * when ctx is NULL. world_size > 0: this reader is shard `rank` of `world_size` (ctx ignored).
   * With at least as many files as ranks, file i (in sorted order) goes to rank i % world_size;
   * otherwise every rank reads every file and keeps record j (counted over all files in order)
   * when j % world_size == rank. */
  hora_ctx_t *ctx;
  int rank;
  int world_size;
  /* Records read ahead by the background thread (0: 256). The queue holds at most
   * max(prefetch, records of one 1 MiB read block) records. */
  size_t prefetch;
  /* Shuffle buffer in records (0 or 1: no shuffling, records come in file order). With B > 1 the
   * rank's files are visited in a per-epoch random order and records pass through a B-record
   * buffer from which a random one is emitted (the tf.data scheme). The order depends only on
   * (seed, epoch, rank, file list, B): it is reproducible across runs. The buffer is drained at
   * the end of each epoch, so epochs never mix. */
  size_t shuffle_buffer;
  uint64_t seed;
  /* Epochs of the whole run (0: 1). The reader delivers epochs start_epoch .. epochs-1 and then
   * end of data. To resume where hora_records_reader_position said (epoch e, n records), open
   * with the same options and start_epoch = e, skip_records = n: the records that follow are
   * exactly those the first run would have delivered next. */
  uint64_t epochs;
  uint64_t start_epoch;
  uint64_t skip_records; /* records of start_epoch (this rank's stream) to drop first */
  /* Nonzero: skip corrupt records and count them (hora_records_reader_corrupt) instead of
   * failing. A record whose data CRC is wrong is skipped alone; a bad length CRC or a truncated
   * record ends that file (its framing cannot be trusted past that point). */
  int skip_corrupt;
} hora_records_reader_opts_t;

/* hora_records_reader_open: expand the patterns, pick this rank's share and start the prefetch
 * thread. Local (each rank opens its own reader; ranks that should see disjoint shards pass the
 * same patterns, seed and world size). Non-blocking beyond glob/stat of the files.
 * Errors: HORA_ERR_INVALID_ARGUMENT (opts/reader NULL, opts->size too small, no patterns,
 *   rank outside [0, world_size), world_size < 0, start_epoch >= epochs), HORA_ERR_NOT_FOUND
 *   (a pattern matched nothing: the message names it), HORA_ERR_NOT_INITIALIZED (ctx given but
 *   not live), HORA_ERR_IO (glob or thread creation failed), HORA_ERR_NO_MEMORY.
 *   On error *reader is unchanged. A rank whose shard is empty gets a reader that reports end of
 *   data at once.
 * Files mostly in the page cache are read through a read-only mapping (no copy: the records
 * returned point into the page cache, and the CRC check runs in the caller's thread of
 * hora_records_next, where the bytes are used next); others with read() in 1 MiB blocks by the
 * prefetch thread (HORA_RECORDS_MMAP=auto|on|off, docs/data.md). The first mapping installs a
 * process-wide SIGBUS handler that turns a fault inside the reader's mappings (a file truncated
 * by another process while mapped) into HORA_ERR_IO and hands every other SIGBUS to the handler
 * that was installed before it (or the default action). */
hora_result_t hora_records_reader_open(const hora_records_reader_opts_t *opts,
                                       hora_records_reader_t **reader);

/* hora_records_next: the next record of this rank's stream. Local; blocks until the prefetch
 * thread has a record ready. Not thread-safe: one thread consumes a reader.
 * On success with *eof == 0, *data points at *len_bytes bytes owned by the reader, valid until
 * the next hora_records_next or close on this reader (zero-copy: no copy is made for the caller).
 * At the end of the last epoch: HORA_SUCCESS with *eof = 1, *data = NULL, *len_bytes = 0 (and
 * again on every later call).
 * Errors: HORA_ERR_INVALID_ARGUMENT (NULL argument), HORA_ERR_DATA (corrupt or truncated record
 *   and skip_corrupt is 0: the message names the file and the byte offset of the record),
 *   HORA_ERR_IO (a file could not be opened or read, or a mapped file was truncated or rewritten
 *   in place while being read: the message names it, and the record returned by the call before
 *   may hold zeros in place of the bytes that were lost; replace record files by renaming a new
 *   file over them, as hora_records_writer_close does), HORA_ERR_NO_MEMORY. An error is sticky:
 *   later calls return it again. Outputs are unchanged on error. HORA_ERR_NOT_SUPPORTED in a
 * fork() child of the process that made the object (see fork() above). */
hora_result_t hora_records_next(hora_records_reader_t *reader, const void **data,
                                size_t *len_bytes, int *eof);

/* hora_records_reader_position: where the consumer is: *epoch is the epoch of the last record
 * returned and *records the number of records of that epoch returned so far (including those
 * skipped through skip_records). Before the first record: (start_epoch, skip_records). After
 * end of data: (last epoch, its record count). Save both to resume (see the options). Local.
 * Errors: HORA_ERR_INVALID_ARGUMENT (NULL argument). */
hora_result_t hora_records_reader_position(hora_records_reader_t *reader, uint64_t *epoch,
                                           uint64_t *records);

/* hora_records_reader_corrupt: number of corrupt records skipped so far by this reader (only
 * nonzero with skip_corrupt; counts those met so far: by the prefetch thread, which may be ahead
 * of the consumer, or, on mapped files the consumer parses itself, by hora_records_next). Local.
 * Errors: HORA_ERR_INVALID_ARGUMENT (NULL argument). */
hora_result_t hora_records_reader_corrupt(hora_records_reader_t *reader, uint64_t *count);

/* hora_records_reader_close: stop the prefetch thread (waits for a read in progress), close the
 * files and free the reader; pointers returned by hora_records_next become invalid. Local.
 * reader NULL is a no-op. HORA_SUCCESS, or HORA_ERR_NOT_SUPPORTED in a fork() child of the
 * process that made the object (see fork() above). */
hora_result_t hora_records_reader_close(hora_records_reader_t *reader);

/* ---- TensorBoard and GPU monitor (runtime/trace) ---- */
typedef struct hora_tb hora_tb_t;

/* hora_tb_open: create `dir` (and missing parents) and a new event file
 * dir/events.out.tfevents.<unix time>.<hostname>.<pid> in TFRecord framing, whose first record is
 * the Event{wall_time, file_version: "brain.Event:2"} TensorBoard expects. Local: usually only
 * rank 0 calls it. Blocking (creates the file). Every directory on the way must pass the
 * shared-node check (owned by the caller or root, not writable by group or others unless
 * sticky, no symlink owned by another user; docs/checkpoint.md, "Shared nodes"); directories it
 * creates get 0700 and the event file 0600 (HORA_FILE_MODE widens them), created with
 * O_EXCL|O_NOFOLLOW on the checked directory's fd.
 * Errors: HORA_ERR_INVALID_ARGUMENT (NULL argument, empty dir), HORA_ERR_IO (mkdir or create
 *   failed, or a directory fails the check: the message names the path, and owner and mode),
 *   HORA_ERR_NO_MEMORY. On error *tb is unchanged. */
hora_result_t hora_tb_open(const char *dir, hora_tb_t **tb);

/* hora_tb_scalar: append Event{wall_time: now, step, summary{value{tag, simple_value}}}; the value
 * is stored as a float32 (TensorBoard's simple_value). Local; thread-safe (the GPU monitor writes
 * from its own thread). Unbuffered: each event goes to the file in one write() (about 1 us), so
 * a live TensorBoard sees it at once and a crash loses nothing already returned.
 * Errors: HORA_ERR_INVALID_ARGUMENT (tb/tag NULL, tag empty or longer than 1024 bytes),
 * HORA_ERR_IO (a write failed; the writer then stays failed). HORA_ERR_NOT_SUPPORTED in a fork()
 * child of the process that made the object (see fork() above). */
hora_result_t hora_tb_scalar(hora_tb_t *tb, const char *tag, int64_t step, double value);

/* hora_tb_flush: make the events written so far durable (fsync). Local; thread-safe.
 * Errors: HORA_ERR_INVALID_ARGUMENT (tb NULL), HORA_ERR_IO. HORA_ERR_NOT_SUPPORTED in a fork()
 * child of the process that made the object (see fork() above). */
hora_result_t hora_tb_flush(hora_tb_t *tb);

/* hora_tb_close: flush, fsync, close and free. Local. Detach it from any GPU monitor first
 * (stop the monitor). tb NULL is a no-op. Errors: HORA_ERR_IO (flush/fsync/close failed; the
 * writer is freed anyway). HORA_ERR_NOT_SUPPORTED in a fork() child of the process that made the
 * object (see fork() above). */
hora_result_t hora_tb_close(hora_tb_t *tb);

typedef struct hora_gpumon hora_gpumon_t;

/* Options of hora_gpumon_start. Zero-initialize and set `size`; zero means the default. */
typedef struct {
  size_t size;
  double period_s;      /* sampling period in s (0: HORA_GPU_MONITOR_S, and 1 s if that is 0) */
  const char *csv_path; /* NULL/"": HORA_GPU_MONITOR_CSV, else hora-gpu-<rank>.csv */
  hora_tb_t *tb;        /* if not NULL, samples also go there as gpu<N>/<metric> scalars */
  hora_ctx_t *ctx;      /* if not NULL: rank for the CSV name and this rank's GPU */
  /* CUDA device ordinal to watch when ctx is NULL (default 0); with a ctx, the ctx's GPU is
   * watched, or every GPU when the rank has none. Ordinals are mapped to NVML devices through
   * CUDA_VISIBLE_DEVICES (indices or GPU-UUIDs) when it is set. */
  int device;
  int all_gpus; /* nonzero: watch every GPU NVML shows (restricted to CUDA_VISIBLE_DEVICES) */
} hora_gpumon_opts_t;

/* hora_gpumon_start: load NVML with dlopen(HORA_NVML_LIBRARY) and start a thread that every
 * period samples GPU utilization (%), memory-controller utilization (%), memory used (MiB), power
 * (W), temperature (C) and SM clock (MHz) of the watched GPUs. Each sample is one CSV row per GPU
 * (columns date,time,rank,gpu,pwr_w,gtemp_c,sm_pct,mem_pct,fb_used_mib,sclk_mhz: the fields of
 * `nvidia-smi dmon -o DT`), flushed at once, and, with opts->tb, scalars at step = sample number.
 * The first sample is taken before this returns. Local; returns at once after that.
 * Without NVML (library missing, nvmlInit fails, or the GPU is not found) it logs one INFO line
 * and returns HORA_ERR_NOT_SUPPORTED with *mon unchanged: callers treat that as "monitor off".
 * Errors: HORA_ERR_INVALID_ARGUMENT (NULL output, opts->size too small, period < 0, device < 0),
 *   HORA_ERR_IO (the CSV file cannot be created: its directory is missing or fails the
 *   shared-node check of hora_tb_open, or the name is a symlink or another user's file; the CSV
 *   is created with mode HORA_FILE_MODE, 0600 by default, or truncated when it is the caller's),
 *   HORA_ERR_NOT_SUPPORTED, HORA_ERR_NO_MEMORY.
 * When hora_init sees HORA_GPU_MONITOR_S > 0 it starts one itself (ctx's GPU, or local rank 0
 * watching every GPU when the rank has none) and hora_finalize stops it. */
hora_result_t hora_gpumon_start(const hora_gpumon_opts_t *opts, hora_gpumon_t **mon);

/* hora_gpumon_stop: stop the thread (waits at most one NVML call), close the CSV, unload NVML
 * and free. Local. mon NULL is a no-op. HORA_SUCCESS, or HORA_ERR_NOT_SUPPORTED in a fork() child
 * of the process that made the object (see fork() above). */
hora_result_t hora_gpumon_stop(hora_gpumon_t *mon);

/* hora_gpumon_samples: number of sampling rounds done so far. Local; thread-safe.
 * Errors: HORA_ERR_INVALID_ARGUMENT (NULL argument). HORA_ERR_NOT_SUPPORTED in a fork() child of
 * the process that made the object (see fork() above). */
hora_result_t hora_gpumon_samples(hora_gpumon_t *mon, uint64_t *count);

/* HORA_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* HORA_H */
