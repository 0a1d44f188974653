/* The algorithm layer's per-context state (ctx->algo) and scratch memory: the leaf of runtime/algo
 * that the algorithms (ring.c, shm.c, ...) use. It includes only core and calls no algorithm. */
#ifndef HORA_ALGO_STATE_H
#define HORA_ALGO_STATE_H

#include "core/ctx.h"

struct hora_shm;
typedef struct hora_algo_state {
  void *scratch; /* ring receive slots, grown on demand, freed at finalize */
  size_t scratch_bytes;
  struct hora_shm *shm; /* shm.c's window, created on first use */
  /* Frees `shm` (collective over ctx->local): set by shm.c with the window, called by the state's
   * finalizer at hora_finalize. */
  hora_result_t (*shm_free)(hora_ctx_t *ctx, struct hora_shm *shm);
} hora_algo_state_t;

/* The context's algo state, created (and its finalizer registered) on first use. Thread-safe.
 * HORA_ERR_NO_MEMORY when it cannot be allocated or the finalizer not registered. */
hora_result_t hora__algo_state(hora_ctx_t *ctx, hora_algo_state_t **out);
/* A scratch buffer of at least `bytes` bytes (64-byte aligned) owned by the state, valid until the
 * next call on this context. HORA_ERR_NO_MEMORY when it cannot grow (the old one stays). */
hora_result_t hora__algo_scratch(hora_ctx_t *ctx, size_t bytes, void **out);

/* Wait for n requests like MPI_Waitall, but also end the wait when the context has a failure
 * verdict (hora__ctx_verdict: a peer declared dead or stopped by the heartbeat thread), whose code
 * (HORA_ERR_REMOTE for a lost peer) and message it returns, prefixed by `what`. A verdict that is
 * already set returns at once. After a verdict the requests are abandoned, neither completed nor
 * freed: their buffers must stay allocated (hora_finalize then skips MPI_Finalize). MPI errors:
 * HORA_ERR_MPI naming `what`. Use it for every wait of a blocking collective. */
hora_result_t hora__algo_wait(hora_ctx_t *ctx, int n, MPI_Request *req, const char *what);
/* hora__algo_wait for requests that move `bytes` bytes between this rank and others (the sum of
 * what this rank sends and receives, about): the wait polls without napping for bytes / 50 MB/s
 * longer, since Open MPI moves such data only inside this rank's MPI calls where it has no
 * single-copy path (state.c, HORA_WAIT_RATE_FLOOR in core/ctx.h). Same errors as hora__algo_wait. */
hora_result_t hora__algo_wait_data(hora_ctx_t *ctx, int n, MPI_Request *req, const char *what, size_t bytes);
/* hora__algo_wait for the call check across nodes (callcheck.c) of the context hora_init made:
 * it also runs the stall inspection there. After HORA_STALL_WARNING_S it logs (once) the rank that
 * entered the fewest blocking calls as rank 0 last saw it (struct hora_calls' lag: the heartbeats
 * carry each rank's count), and after HORA_STALL_SHUTDOWN_S it returns HORA_ERR_TIMEOUT naming
 * it and fails the context (hora__ctx_fail): the posted allreduce cannot be taken back, so every
 * later call returns that verdict too, and the heartbeat falls silent so that the missing rank
 * learns of it. Other contexts (sets, the engine's) and both limits 0: plain hora__algo_wait. */
hora_result_t hora__algo_wait_call(hora_ctx_t *ctx, int n, MPI_Request *req, const char *what);
/* The backoff of those polls, for loops that poll otherwise (the ring's MPI_Testsome): call it
 * after the i-th unsuccessful poll (i from 0, *b zeroed at the start of the wait but for `bytes`);
 * it spins for about 20 us, then yields the core until the wait has lasted 10 ms plus bytes /
 * 50 MB/s, then sleeps 1/16 of the time waited (at most 1 ms) per poll. Returns 0 when it only
 * spun, 1 when it yielded, 2 when it slept. */
typedef struct {
  double start; /* when the spinning began (hora__now_s) */
  double until; /* end of the spin budget; 0 once spent */
  size_t bytes; /* data the waited requests move: polls without naps for bytes / 50 MB/s longer */
} hora_backoff_t;
int hora__algo_wait_backoff(unsigned i, hora_backoff_t *b);

/* The ring's segment in elements of `es` bytes, from HORA_RING_SEGMENT_BYTES (0: HORA_RING_SEGMENT_LOCAL
 * on one node, HORA_RING_SEGMENT_NET when the context spans nodes, which every ring of a context then
 * does: ctx->world and ctx->cross), at least one element and at most 1 GiB so that one MPI message
 * count fits an int. */
#define HORA_RING_SEGMENT_LOCAL ((uint64_t)1 << 20)
#define HORA_RING_SEGMENT_NET ((uint64_t)65024) /* Open MPI's TCP eager limit, 64 KiB, less headers */
size_t hora__ring_segment_elems(const hora_ctx_t *ctx, size_t es);

#endif
