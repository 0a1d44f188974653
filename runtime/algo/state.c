/* The algorithm layer's per-context state and scratch memory (see state.h). The state lives in
 * ctx->algo from its first use to hora_finalize, where its finalizer frees the shared-memory
 * window (through the function shm.c left in it) and the scratch buffer. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "algo/state.h"

/* Polling, not MPI_Waitall: a blocking MPI wait never returns when a peer is dead or stopped (Open
 * MPI 4.1 has no fault tolerance), and the heartbeat thread's verdict must end it. Open MPI moves
 * data only inside MPI calls, and MPI_Waitall itself spins on its progress engine, so a tight
 * MPI_Testall loop costs the same on the healthy path (docs/benchmarks.md).
 * The backoff: WAIT_SPINS polls and WAIT_SPIN_NS of polling (a peer that is running answers
 * within microseconds), then each poll also yields the core (which a rank sharing it, more ranks
 * than cores, then gets) until the wait has lasted WAIT_YIELD_S; from then on each poll is
 * followed by a sleep of 1/16 of the time waited so far, at most WAIT_SLEEP_MAX_S, so a long wait
 * (a slow link, a peer busy elsewhere) costs at most about 6 % in latency and leaves the core.
 * Why not yield for ever: a rank that yields in a loop for seconds kept its core on the
 * development VM while runnable processes of other sessions (other emulated nodes' ranks and
 * their heartbeat threads, other jobs) waited 1.5-10 s on the run queue: sched_yield only yields
 * to tasks of the caller's own scheduling group (docs/design.md, "A frozen machine"). Why 10 ms
 * before sleeping: with 1 ms, 4 ranks on 2 cores (each wait there often outlasts a peer's time
 * slice) took 15-25 % longer at 2-8 MiB; from 10 ms they were as fast as before. */
#define WAIT_SPINS 64
#define WAIT_SPIN_NS 20000
#define WAIT_YIELD_S 10e-3
#define WAIT_SLEEP_MAX_S 1e-3
/* Why a wait for data polls longer: Open MPI moves a large message only inside the MPI calls of
 * the ranks that exchange it whenever no single-copy mechanism is there (shared memory without
 * CMA, which containers without ptrace rights lack; its non-blocking collectives' rounds; the
 * fragments of a rendezvous), so a nap between two polls stalls the transfer itself: on 2 ranks
 * without CMA a polled 32 MiB MPI_Iallreduce took 347 ms (0.1 GB/s) against 10 ms at 16 MiB, whose
 * wait ended before the naps began (docs/benchmarks.md, "Waits that move data"). A wait for an
 * operation of `bytes` therefore yields without napping for bytes / HORA_WAIT_RATE_FLOOR longer: a
 * transfer slower than 50 MB/s (a slow link, or a peer that is not there yet) then naps as any
 * other wait, and a wait that moves no data (a barrier, a control message) is unchanged. */
int hora__algo_wait_backoff(unsigned i, hora_backoff_t *b) {
  if (i < WAIT_SPINS) return 0;
  if (i == WAIT_SPINS) {
    b->start = hora__now_s();
    b->until = b->start + WAIT_SPIN_NS * 1e-9;
  }
  if (b->until > 0 && ((i & 63) != 0 || hora__now_s() < b->until)) return 0;
  b->until = 0; /* spun long enough: yield, then sleep, from now on */
  double waited = hora__now_s() - b->start;
  if (waited < WAIT_YIELD_S + (double)b->bytes / HORA_WAIT_RATE_FLOOR) {
    sched_yield();
    return 1;
  }
  double nap = waited / 16 < WAIT_SLEEP_MAX_S ? waited / 16 : WAIT_SLEEP_MAX_S;
  struct timespec ts = {0, (long)(nap * 1e9)};
  nanosleep(&ts, NULL);
  return 2;
}

/* The stall inspection across nodes: the rank that entered the fewest calls, as rank 0 last saw
 * it (its heartbeats relay it: core/ctx.h, struct hora_calls), written into `out`; "" when none is
 * known to be behind this rank's call `call`. */
static void laggards(const hora_ctx_t *ctx, uint64_t call, char *out, size_t cap) {
  uint64_t low = 0;
  int rank = -1, count = 0;
  hora__calls_lag_unpack(__atomic_load_n(&ctx->calls->lag, __ATOMIC_ACQUIRE), &low, &rank, &count);
  out[0] = 0;
  if (rank < 0 || low >= call) return;
  if (count > 1) snprintf(out, cap, "rank %d and %d other%s", rank, count - 1, count > 2 ? "s" : "");
  else snprintf(out, cap, "rank %d", rank);
}

/* State of one wait's stall inspection (hora__algo_wait_call). */
typedef struct {
  uint64_t call;
  double t0;
  int warned;
} stall_t;

/* One look of the stall inspection, `waited` seconds into the wait: a warning after
 * HORA_STALL_WARNING_S, the context's failure after HORA_STALL_SHUTDOWN_S (returned). */
static hora_result_t stall_look(hora_ctx_t *ctx, stall_t *st, double waited, const char *what) {
  const hora_params_t *p = hora__params();
  int over_warn = p->stall_warning_s > 0 && waited >= p->stall_warning_s && !st->warned;
  int over_stop = p->stall_shutdown_s > 0 && waited >= p->stall_shutdown_s;
  if (!over_warn && !over_stop) return HORA_SUCCESS;
  char who[64];
  laggards(ctx, st->call, who, sizeof who);
  if (over_warn) {
    st->warned = 1;
    HORA_WARN(COMM, "%s: waited %.0f s for %s to call it too (alive, but skipped this call or still busy; "
              "HORA_STALL_SHUTDOWN_S ends such a wait with an error)", what, waited,
              who[0] ? who : "another rank (rank 0 has not seen who is behind yet)");
  }
  if (!over_stop) return HORA_SUCCESS;
  /* The check's allreduce is posted and cannot be taken back: a later call would be paired with
   * it. So the context fails (its verdict), and its heartbeats stop: the rank that never came
   * learns of it within HORA_PEER_TIMEOUT_S instead of waiting for this one. */
  char msg[256];
  snprintf(msg, sizeof msg, "%s did not call %s within HORA_STALL_SHUTDOWN_S=%g s (alive, but skipped this "
           "call or stuck elsewhere); the context is failed: every later call returns this error",
           who[0] ? who : "another rank", what, p->stall_shutdown_s);
  /* On a process set, the job's context fails too: its heartbeats carry the silence that tells
   * the rank that never came, as for the context itself. */
  hora__ctx_fail_job(ctx, HORA_ERR_TIMEOUT, msg);
  return hora__ctx_verdict(ctx, what);
}

/* The polled wait of both entry points; st NULL: no stall inspection. */
static hora_result_t wait_all(hora_ctx_t *ctx, int n, MPI_Request *req, const char *what, stall_t *st,
                              size_t bytes) {
  hora_backoff_t backoff = {0, 0, bytes};
  double next_look = st ? st->t0 + 0.1 : 0;
  for (unsigned i = 0;; i++) {
    int flag = 0;
    int mrc = MPI_Testall(n, req, &flag, MPI_STATUSES_IGNORE);
    if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, what, __FILE__, __LINE__);
    if (flag) return HORA_SUCCESS;
    /* Leave the requests: MPI may still use their buffers, which the caller therefore leaks. */
    if (hora__ctx_failed(ctx)) return hora__ctx_verdict(ctx, what);
    if (hora__algo_wait_backoff(i, &backoff) && st && hora__now_s() >= next_look) {
      double now = hora__now_s();
      next_look = now + 0.1;
      HORA_CHECK(stall_look(ctx, st, now - st->t0, what));
    }
  }
}

hora_result_t hora__algo_wait(hora_ctx_t *ctx, int n, MPI_Request *req, const char *what) {
  return wait_all(ctx, n, req, what, NULL, 0);
}

hora_result_t hora__algo_wait_data(hora_ctx_t *ctx, int n, MPI_Request *req, const char *what, size_t bytes) {
  return wait_all(ctx, n, req, what, NULL, bytes);
}

hora_result_t hora__algo_wait_call(hora_ctx_t *ctx, int n, MPI_Request *req, const char *what) {
  const hora_params_t *p = hora__params();
  if (!ctx->calls || (p->stall_warning_s <= 0 && p->stall_shutdown_s <= 0)) return wait_all(ctx, n, req, what, NULL, 0);
  stall_t st = {__atomic_load_n(&ctx->calls->entered, __ATOMIC_ACQUIRE), hora__now_s(), 0};
  return wait_all(ctx, n, req, what, &st, 0);
}

/* Why 65024 bytes across nodes: Open MPI sends a message above its TCP eager limit (64 KiB with
 * the headers) as a rendezvous: a first fragment, then the rest only once the receiver's progress
 * engine has matched it and replied, a round trip through both ranks' MPI calls per segment. On
 * nodes where a rank may wait a time slice for its core, each such round trip idles the link; an
 * eager segment goes into the socket at once and the kernel sends it while the rank is not
 * running. 2 emulated nodes x 2 ranks, 1 Gbit/s, 16 MiB hier: 192-200 ms against 609-766 ms with
 * 1 MiB segments in the same run (docs/benchmarks.md). The ring keeps the bytes in flight, not
 * the number of segments, about constant (ring.c), so small segments do not starve the link. */
size_t hora__ring_segment_elems(const hora_ctx_t *ctx, size_t es) {
  uint64_t b = hora__params()->ring_segment_bytes;
  if (b == 0) b = ctx->cross_size > 1 ? HORA_RING_SEGMENT_NET : HORA_RING_SEGMENT_LOCAL;
  if (b > ((uint64_t)1 << 30)) b = (uint64_t)1 << 30;
  size_t n = (size_t)b / es;
  return n ? n : 1;
}

/* MPI_Win_free waits for every local rank in a barrier that nothing can end: a local rank that
 * failed skips it (state_finalize), and one that finalizes while a peer waits for it elsewhere (a
 * blocking call it left) would wait there for ever. So the local ranks first meet in a barrier
 * that watches the verdict; after a verdict the window is leaked. */
static int local_ranks_meet(hora_ctx_t *ctx) {
  if (ctx->local == MPI_COMM_NULL || ctx->local_size <= 1) return 1;
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(ctx->local, &req) != MPI_SUCCESS) return 0;
  return hora__algo_wait(ctx, 1, &req, "hora_finalize (shared-memory window)") == HORA_SUCCESS;
}

static hora_result_t state_finalize(hora_ctx_t *ctx, void *arg) {
  hora_algo_state_t *st = arg;
  hora_result_t rc = HORA_SUCCESS;
  if (st->shm && st->shm_free && !__atomic_load_n(&ctx->failed, __ATOMIC_ACQUIRE) && !hora__ctx_failed(ctx) &&
      !local_ranks_meet(ctx))
    hora__error_clear(); /* failed now: the window is leaked below, as after any failure */
  /* Freeing the window waits for every local rank: after a failure (ctx->failed, or a verdict,
   * which a process set shares with nothing but may see through its own flag) leak it. */
  if (st->shm && st->shm_free && !__atomic_load_n(&ctx->failed, __ATOMIC_ACQUIRE) && !hora__ctx_failed(ctx))
    rc = st->shm_free(ctx, st->shm);
  /* The scratch may still be the target of a receive abandoned by a failed wait: leak it then. */
  if (!hora__ctx_failed(ctx)) free(st->scratch);
  pthread_mutex_lock(&ctx->lock);
  if (ctx->algo == st) ctx->algo = NULL;
  pthread_mutex_unlock(&ctx->lock);
  free(st);
  return rc;
}

hora_result_t hora__algo_state(hora_ctx_t *ctx, hora_algo_state_t **out) {
  pthread_mutex_lock(&ctx->lock);
  hora_algo_state_t *st = ctx->algo;
  pthread_mutex_unlock(&ctx->lock);
  if (st) {
    *out = st;
    return HORA_SUCCESS;
  }
  /* First use: create it, then publish it unless another thread was faster. */
  hora_algo_state_t *mine = calloc(1, sizeof *mine);
  if (!mine) return HORA_ERR(HORA_ERR_NO_MEMORY, "allreduce: out of memory for the algorithm state");
  pthread_mutex_lock(&ctx->lock);
  if (!ctx->algo) ctx->algo = mine;
  st = ctx->algo;
  pthread_mutex_unlock(&ctx->lock);
  if (st != mine) {
    free(mine);
  } else {
    hora_result_t rc = hora__ctx_add_finalizer(ctx, state_finalize, st);
    if (rc != HORA_SUCCESS) {
      pthread_mutex_lock(&ctx->lock);
      ctx->algo = NULL;
      pthread_mutex_unlock(&ctx->lock);
      free(mine);
      return rc;
    }
  }
  *out = st;
  return HORA_SUCCESS;
}

hora_result_t hora__algo_scratch(hora_ctx_t *ctx, size_t bytes, void **out) {
  hora_algo_state_t *st = NULL;
  HORA_CHECK(hora__algo_state(ctx, &st));
  if (st->scratch_bytes < bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
      return HORA_ERR(HORA_ERR_NO_MEMORY, "allreduce: out of memory (%zu bytes of scratch)", bytes);
    free(st->scratch);
    st->scratch = p;
    st->scratch_bytes = bytes;
  }
  *out = st->scratch;
  return HORA_SUCCESS;
}
