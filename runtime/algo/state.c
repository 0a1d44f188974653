/* The algorithm layer's per-context state and scratch memory (see state.h). The state lives in
 * ctx->algo from its first use to hora_finalize, where its finalizer frees the shared-memory
 * window (through the function shm.c left in it) and the scratch buffer. */
#include <sched.h>
#include <stdlib.h>

#include "algo/state.h"

/* Polling, not MPI_Waitall: a blocking MPI wait never returns when a peer is dead or stopped (Open
 * MPI 4.1 has no fault tolerance), and the heartbeat thread's verdict must end it. Open MPI moves
 * data only inside MPI calls, and MPI_Waitall itself spins on its progress engine, so a tight
 * MPI_Testall loop costs the same on the healthy path (docs/benchmarks.md). After WAIT_SPINS polls
 * and WAIT_SPIN_NS of polling (a peer that is running answers within microseconds) each poll also
 * yields the core, which a rank sharing it (more ranks than cores) then gets. */
#define WAIT_SPINS 64
#define WAIT_SPIN_NS 20000
int hora__algo_wait_backoff(unsigned i, double *until) {
  if (i < WAIT_SPINS) return 0;
  if (i == WAIT_SPINS) *until = hora__now_s() + WAIT_SPIN_NS * 1e-9;
  if (*until > 0 && ((i & 63) != 0 || hora__now_s() < *until)) return 0;
  *until = 0; /* spun long enough: yield from now on */
  sched_yield();
  return 1;
}

hora_result_t hora__algo_wait(hora_ctx_t *ctx, int n, MPI_Request *req, const char *what) {
  double until = 0;
  for (unsigned i = 0;; i++) {
    int flag = 0;
    int mrc = MPI_Testall(n, req, &flag, MPI_STATUSES_IGNORE);
    if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, what, __FILE__, __LINE__);
    if (flag) return HORA_SUCCESS;
    /* Leave the requests: MPI may still use their buffers, which the caller therefore leaks. */
    if (hora__ctx_failed(ctx)) return hora__ctx_verdict(ctx, what);
    hora__algo_wait_backoff(i, &until);
  }
}

size_t hora__ring_segment_elems(size_t es) {
  uint64_t b = hora__params()->ring_segment_bytes;
  if (b > ((uint64_t)1 << 30)) b = (uint64_t)1 << 30;
  size_t n = (size_t)b / es;
  return n ? n : 1;
}

static hora_result_t state_finalize(hora_ctx_t *ctx, void *arg) {
  hora_algo_state_t *st = arg;
  hora_result_t rc = HORA_SUCCESS;
  /* Freeing the window waits for every local rank: after a failure (ctx->failed) leak it. */
  if (st->shm && st->shm_free && !__atomic_load_n(&ctx->failed, __ATOMIC_ACQUIRE)) rc = st->shm_free(ctx, st->shm);
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
