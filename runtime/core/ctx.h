/* The context: what hora_init builds and every module hangs its state from.
 * Modules register a finalizer (run in reverse order of registration by hora_finalize) instead
 * of core calling into them, so that dependencies point one way: core is the ground floor. */
#ifndef HORA_CORE_CTX_H
#define HORA_CORE_CTX_H

#include <mpi.h>
#include <pthread.h>

#include "core/internal.h"

typedef hora_result_t (*hora_finalizer_fn)(hora_ctx_t *ctx, void *arg);

struct hora_finalizer {
  hora_finalizer_fn fn;
  void *arg;
  struct hora_finalizer *next;
};

struct hora_ctx {
  MPI_Comm world; /* dup of the caller's world; all hora traffic uses this or comms made from it */
  MPI_Comm local; /* ranks on this node (shared memory and same Slurm node id) */
  MPI_Comm cross; /* ranks with the same local rank, one per node, ordered by node index */
  int rank, size;
  int local_rank, local_size;
  int cross_rank, cross_size; /* node index and node count */
  int uniform_local_size;     /* 1 if every node has the same local_size */
  int local_cpus;             /* CPUs in the union of this node's ranks' affinity masks */
  int overlaps_compute;       /* collectives run beside the caller's compute (the engine's shadow) */
  int device;                 /* CUDA ordinal, or -1 */
  int mpi_owned;              /* hora called MPI_Init and must call MPI_Finalize */
  unsigned fork_gen;          /* hora__fork_watch() when made: a fork() child may not use it */
  int failed;                 /* a peer was declared dead or the engine failed (__atomic_*): what
                               * would wait for every rank (MPI_Finalize, window frees) is skipped */
  struct hora_verdict *verdict; /* why it failed (hora__ctx_fail); shared with the engine's shadow
                                 * context, so that every wait of either sees one verdict */
  struct hora_calls *calls;     /* the blocking-call counts the heartbeat reads (below): on the
                                 * context hora_init made, an array of 1 + HORA_SET_SLOTS (the
                                 * world's, then one per process-set slot); on a set made from
                                 * it, its slot; NULL on the shadow and on sets without a slot */
  pthread_mutex_t lock;       /* guards the finalizer list and module slots */
  struct hora_finalizer *finalizers;

  /* Module slots: each module owns its pointer and frees it in its finalizer. */
  void *algo;   /* runtime/algo: shared-memory windows, scratch buffers */
  void *engine; /* runtime/engine: background thread and queues */
  void *gpu;    /* runtime/comm: CUDA streams, NCCL communicator, pinned buffers */
  void *ckpt;   /* runtime/ckpt: open checkpointers (for flush at finalize) */
  void *trace;  /* runtime/trace: GPU monitor */
  void *signal; /* runtime/ckpt: preemption signal state */

  /* Process sets (hora_process_set_create, runtime/init/pset.c): a set is a context whose world is
   * a sub-communicator of its parent's world. NULL/0 for a context made by hora_init. */
  struct hora_ctx *parent; /* the context the set was made from */
  int excluded;            /* this rank is not in the set: every use but destroy is refused */
  int *set_ranks;          /* the set's parent ranks, ascending (messages, hora__ctx_check) */
  int set_nranks;
};

/* The context's life, driven by hora_init / hora_finalize (runtime/init/init.c), which start the
 * modules between open and publish and stop them (the finalizers) before discard:
 * - hora__ctx_open: checks opts, reads HORA_LOG* and the parameters, initializes MPI unless the
 *   program did, duplicates the world, runs the world-size checks and builds the layout. Collective
 *   over the world. On error nothing is left behind (MPI is finalized again if it started it).
 * - hora__ctx_publish: makes the context live (hora__ctx_check accepts it) and logs the banner and
 *   the non-default parameters on rank 0. HORA_ERR_NO_MEMORY when too many contexts are live.
 * - hora__ctx_run_finalizers: runs and frees the module finalizers, newest first; returns the first
 *   error.
 * - hora__ctx_discard: no longer live; frees the communicators and the context, and finalizes MPI
 *   if hora initialized it. Run the finalizers first. */
hora_result_t hora__ctx_open(const hora_init_opts_t *opts, hora_ctx_t **out);
/* hora_init in a fork() child of a process that initialized MPI for hora: HORA_ERR_NOT_SUPPORTED
 * naming the fork (fork.c); else HORA_SUCCESS. Checked before hora_init starts anything (its
 * watchdog thread included), so a refused call makes no thread and allocates nothing. */
hora_result_t hora__ctx_init_refused_in_fork(void);
/* The start-up step this process is in, for hora_init's watchdog (runtime/init/init.c) to name
 * when it fires: hora__init_step records `what` (a string literal naming the blocking collective,
 * or NULL once hora_init returns) and when it began; hora__init_step_now gives both (NULL and 0
 * when none). Process-wide, as the watchdog is per hora_init call; a process set's start-up sets
 * none. */
void hora__init_step(const char *what);
const char *hora__init_step_now(double *since_s);
/* A process set's context (runtime/init/pset.c): takes ownership of `comm` (a sub-communicator of
 * parent->world; MPI_COMM_NULL on ranks outside the set, which get an `excluded` context with
 * rank -1 and no communicators) and of `ranks` (the set's parent ranks, ascending; freed with
 * the context). Members build the layout on `comm` (collective over the set). The device is the
 * parent's; MPI is never the set's to finalize. On error nothing is left (comm and ranks freed). */
hora_result_t hora__ctx_open_sub(hora_ctx_t *parent, MPI_Comm comm, int *ranks, int nranks,
                                 hora_ctx_t **out);
hora_result_t hora__ctx_publish(hora_ctx_t *ctx);
hora_result_t hora__ctx_run_finalizers(hora_ctx_t *ctx);
void hora__ctx_discard(hora_ctx_t *ctx);

/* Validate that ctx is a live context (it is looked up by address, never dereferenced when it is
 * not live). HORA_ERR_NOT_INITIALIZED with a message naming `fn` otherwise. */
hora_result_t hora__ctx_check(hora_ctx_t *ctx, const char *fn);
/* The same check, but also accepting a process set this rank is not in (for its destroy).
 * HORA_ERR_NOT_INITIALIZED naming `fn` when ctx is not live. Note hora__ctx_check refuses an
 * excluded set with HORA_ERR_INVALID_ARGUMENT naming `fn` and the set's ranks. */
hora_result_t hora__ctx_check_live(hora_ctx_t *ctx, const char *fn);

/* The failure verdict: the first failure of the job as this rank knows it (a peer declared dead or
 * stopped by the heartbeat thread, or this rank's engine failed). Set once, never cleared; it
 * outlives the context after a failure (a thread stuck in MPI may still read it).
 * - hora__ctx_fail: records rc and msg (the first call wins) and sets ctx->failed. Any thread.
 * - hora__ctx_failed: nonzero once a verdict is set (a process set's own, or its parent's); one
 *   atomic load (two on a set), for wait loops.
 * - hora__ctx_verdict: HORA_SUCCESS while there is none, else the verdict's code with the message
 *   "<what>: <msg>" (hora_last_error). Every wait in a blocking collective calls it while it
 *   waits, so a dead or stopped peer ends the call within HORA_PEER_TIMEOUT_S plus a poll. */
struct hora_verdict {
  int claimed, set; /* __atomic_*: claimed by the first writer, set once rc and msg are written */
  hora_result_t rc;
  char msg[256];
};
void hora__ctx_fail(hora_ctx_t *ctx, hora_result_t rc, const char *msg);
/* hora__ctx_fail, and on a process set the job's context too (its message "on a <set>: msg"):
 * the job's heartbeats then stop, so that the other ranks learn of the failure within
 * HORA_PEER_TIMEOUT_S. For a call that stopped half way and left messages in flight, which the
 * next call on the communicator would take for its own. Any thread. */
void hora__ctx_fail_job(hora_ctx_t *ctx, hora_result_t rc, const char *msg);
static inline int hora__ctx_verdict_set(const struct hora_verdict *v) {
  return v && __atomic_load_n(&v->set, __ATOMIC_ACQUIRE);
}
/* A process set has a verdict of its own and also sees its parent's (a peer declared dead fails
 * the root context and, through this, every wait on its sets). */
static inline int hora__ctx_failed(const hora_ctx_t *ctx) {
  return hora__ctx_verdict_set(ctx->verdict) || (ctx->parent && hora__ctx_verdict_set(ctx->parent->verdict));
}
hora_result_t hora__ctx_verdict(const hora_ctx_t *ctx, const char *what);
/* Wait for one request of the services above core (ckpt/, data/) and end the wait with the
 * context's verdict (HORA_ERR_REMOTE for a lost peer, named in the message with `what`) as soon
 * as there is one, instead of blocking for ever in MPI on a dead peer as a blocking MPI call
 * would (Open MPI 4.1 has no fault tolerance). It polls MPI_Test, yielding for bytes / 50 MB/s
 * (`bytes`: the data the request moves; Open MPI may move it only inside this rank's MPI calls,
 * HORA_WAIT_RATE_FLOOR), then with a sleep that grows from 1 us to 1 ms. After a verdict
 * the request is abandoned: its buffers must stay allocated (leaked). `started`: the return code
 * of the nonblocking call that made *req (MPI_Isomething(..., req)), so that each caller is one
 * call; when it is an error, or MPI_Test fails, HORA_ERR_MPI naming `what`, without waiting. */
hora_result_t hora__ctx_wait(const hora_ctx_t *ctx, int started, MPI_Request *req, const char *what, size_t bytes);
/* MPI_Comm_dup of `base` into *out, and MPI_Barrier on `comm`, as watched waits (MPI_Comm_idup,
 * MPI_Ibarrier, hora__ctx_wait): collectives that a service or a lazily built algorithm state
 * enters after start-up, where a rank that stopped or hangs would otherwise keep every other rank
 * in MPI for ever. Collective over the communicator. Errors: the verdict (HORA_ERR_REMOTE naming
 * the rank, `what` in the message), HORA_ERR_MPI, HORA_ERR_NO_MEMORY; *out is set only on
 * success. */
hora_result_t hora__ctx_dup(const hora_ctx_t *ctx, MPI_Comm base, MPI_Comm *out, const char *what);
hora_result_t hora__ctx_barrier(const hora_ctx_t *ctx, MPI_Comm comm, const char *what);
/* The rate (bytes/s) below which a wait that moves data starts to sleep between polls: the one
 * rule of hora__ctx_wait and of the algorithm layer's waits (algo/state.c explains why). */
#define HORA_WAIT_RATE_FLOOR 50e6

/* The blocking collectives' call counts of the context hora_init made, which its heartbeat thread
 * (engine/heartbeat.c) reads and fills, all with __atomic_* (no lock):
 * - entered, done: written by the public blocking calls (algo/coll.c): `entered` counts every call
 *   that took part in the call check (the same sequence on every rank), `done` is set to it when
 *   no rank needs this rank's part of the call any more (it succeeded, or the check ended it on
 *   every rank). A heartbeat to rank 0 carries `entered`; hora_finalize's announcement carries
 *   `done`: a peer inside a call (its entered > its done) numbered above a finalized rank's `done`
 *   waits for a rank that will never come, and fails (HORA_ERR_REMOTE).
 * - fin: the finalize announcement with the fewest done calls among the peers that sent one,
 *   (done << 24) | (rank + 1); 0: none yet.
 * - lag: rank 0's view, relayed in its heartbeats, of the rank that entered the fewest calls
 *   (hora__calls_lag_pack); the stall inspection of the call check across nodes (algo/state.c)
 *   names it. 0: not known yet. */
struct hora_calls {
  uint64_t entered, done, fin, lag;
  /* Process-set slots only (the world's entry leaves them 0): `live` is 1 while a set of this
   * rank uses the slot (written last at creation, first at destroy; the heartbeat thread reads
   * the slot only while it is 1), `what` names the set in messages. */
  int live;
  char what[56];
};
/* Process-set slots: a set made from the context hora_init made gets the lowest slot free on
 * every rank of its parent, agreed in its creation (runtime/init/pset.c), so that a slot names
 * the same set on every rank; the heartbeat relays each slot's counts as the world's (finalize
 * announcement, stall inspection across nodes). A set made from a set, or made when every slot
 * is taken, has none: its calls are not counted (no finalize announcement, no stall inspection
 * across nodes; docs/api.md). */
#define HORA_SET_SLOTS 64
/* lag's packing: entered (40 bits) | rank + 1 (16 bits) | how many ranks entered that few (8 bits,
 * saturated at 255). Unpacked: *rank is -1 for 0 (not known). */
static inline uint64_t hora__calls_lag_pack(uint64_t entered, int rank, int count) {
  return entered << 24 | (uint64_t)((rank + 1) & 0xffff) << 8 | (uint64_t)(count > 255 ? 255 : count);
}
static inline void hora__calls_lag_unpack(uint64_t v, uint64_t *entered, int *rank, int *count) {
  *entered = v >> 24;
  *rank = (int)((v >> 8) & 0xffff) - 1;
  *count = (int)(v & 0xff);
}

/* Register fn(ctx, arg) to run in hora_finalize (last registered runs first). */
hora_result_t hora__ctx_add_finalizer(hora_ctx_t *ctx, hora_finalizer_fn fn, void *arg);
/* Unregister fn(ctx, arg) without running it (no-op if it is not registered). */
void hora__ctx_remove_finalizer(hora_ctx_t *ctx, hora_finalizer_fn fn, void *arg);

/* Map an MPI error code to HORA_ERR_MPI with MPI's error string and the call's name. */
hora_result_t hora__mpi_error(int mpi_rc, const char *what, const char *file, int line);
#define HORA_MPI_CHECK(call)                                                      \
  do {                                                                            \
    int hora_mpi_rc_ = (call);                                                    \
    if (hora_mpi_rc_ != MPI_SUCCESS)                                              \
      return hora__mpi_error(hora_mpi_rc_, #call, __FILE__, __LINE__);            \
  } while (0)

/* An MPI datatype describing exactly `bytes` contiguous bytes as ONE element, also when bytes
 * exceeds INT_MAX (a struct of a contiguous type of 1 GiB blocks and a remainder: the BigMPI
 * technique). *owned says whether the caller must MPI_Type_free it. */
hora_result_t hora__mpi_bytes_type(size_t bytes, MPI_Datatype *type, int *owned);

/* core/settings.c: the settings every rank must share (HORA_CHECK, HORA_ALLREDUCE_ALGO, the ring,
 * shm and staged chunk sizes, HORA_SHM_FLAT_BYTES, HORA_FUSION_THRESHOLD, HORA_CACHE_CAPACITY,
 * HORA_GPU_PATH, HORA_COMPRESSION), compared across c->world by hora_init. Collective over
 * c->world (blocking). HORA_ERR_INVALID_ARGUMENT on every rank when one differs, naming it, the
 * values and the ranks holding each; before them the same for the ranks' libhora builds (version
 * and git commit, or HORA_TEST_BUILD_ID); HORA_ERR_MPI, HORA_ERR_NO_MEMORY. */
hora_result_t hora__settings_agree(hora_ctx_t *c, const hora_params_t *p);

#endif
