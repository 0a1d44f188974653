/* Preemption: SIGUSR1 (Slurm's --signal=USR1@T) and SIGTERM (scancel, the time limit's first
 * signal) set a process-wide flag; hora_should_stop turns the flags of all ranks into one
 * collective answer (MPI_Allreduce MAX), so every rank leaves its loop at the same step.
 * The handler only stores to a volatile sig_atomic_t (async-signal-safe). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"

static volatile sig_atomic_t got_signal = 0;

typedef struct {
  struct sigaction old_usr1, old_term;
  int installed;
  MPI_Comm comm; /* dup of the world for hora_should_stop (made on its first call) */
  int announced;
} signal_state_t;

static void on_signal(int sig) { got_signal = sig; }

static hora_result_t signal_finalizer(hora_ctx_t *ctx, void *arg) {
  signal_state_t *st = arg;
  /* Once hora_should_stop has answered "stop", the flag handler stays: the rank is on its way out
   * (save, flush, exit HORA_EXIT_REQUEUE), and the same signal may still arrive. Slurm signals each
   * node on its own, and the stop reaches the other ranks through hora_should_stop first, so on a
   * slow node the USR1 came after hora_finalize had put back the default action, and killed the
   * rank before its exit status (slurm_ckpt_requeue, docs/testing.md). */
  if (st->installed && !st->announced) {
    sigaction(SIGUSR1, &st->old_usr1, NULL);
    sigaction(SIGTERM, &st->old_term, NULL);
  }
  /* After a verdict a hora_should_stop request may be abandoned on the communicator: leak it. */
  if (st->comm != MPI_COMM_NULL && !hora__ctx_failed(ctx)) MPI_Comm_free(&st->comm);
  pthread_mutex_lock(&ctx->lock);
  ctx->signal = NULL;
  pthread_mutex_unlock(&ctx->lock);
  free(st);
  return HORA_SUCCESS;
}

/* The context's signal state, created (with its finalizer) on first use. */
static hora_result_t get_state(hora_ctx_t *ctx, signal_state_t **out) {
  pthread_mutex_lock(&ctx->lock);
  signal_state_t *st = ctx->signal;
  pthread_mutex_unlock(&ctx->lock);
  if (!st) {
    st = calloc(1, sizeof *st);
    if (!st) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
    st->comm = MPI_COMM_NULL;
    hora_result_t rc = hora__ctx_add_finalizer(ctx, signal_finalizer, st);
    if (rc != HORA_SUCCESS) {
      free(st);
      return rc;
    }
    pthread_mutex_lock(&ctx->lock);
    ctx->signal = st;
    pthread_mutex_unlock(&ctx->lock);
  }
  *out = st;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_ckpt_on_signal(hora_ctx_t *ctx) {
  HORA_CHECK(hora__ctx_check(ctx, "hora_ckpt_on_signal"));
  if (ctx->parent)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_on_signal: the context is a process set: "
                    "signals are handled for the root context (the one hora_init made)");
  signal_state_t *st;
  HORA_CHECK(get_state(ctx, &st));
  if (st->installed) return HORA_SUCCESS;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(SIGUSR1, &sa, &st->old_usr1) != 0 || sigaction(SIGTERM, &sa, &st->old_term) != 0)
    return HORA_ERR(HORA_ERR_INTERNAL, "hora_ckpt_on_signal: sigaction failed");
  st->installed = 1;
  HORA_INFO(CKPT, "SIGUSR1 and SIGTERM now request a checkpoint and a stop (hora_should_stop)");
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_should_stop(hora_ctx_t *ctx, int *stop) {
  HORA_CHECK(hora__ctx_check(ctx, "hora_should_stop"));
  if (!stop) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_should_stop: stop is NULL");
  signal_state_t *st;
  HORA_CHECK(get_state(ctx, &st));
  if (st->comm == MPI_COMM_NULL) {
    /* Watched, as the allreduce below: the first call's duplicate must not hang either. */
    HORA_CHECK(hora__ctx_dup(ctx, ctx->world, &st->comm, "hora_should_stop (duplicating the communicator)"));
    MPI_Comm_set_errhandler(st->comm, MPI_ERRORS_RETURN);
  }
  /* Non-blocking and watched: a peer that dies while the others are here (one call per step,
   * so often) must end the call with the verdict, not hang every survivor in MPI_Allreduce. The
   * two ints are a per-thread static, never freed, which an abandoned request may still write
   * (as hora_ckpt_restore's and hora_elastic_open's flags); after a verdict no call comes here. */
  HORA_CHECK(hora__ctx_verdict(ctx, "hora_should_stop"));
  static _Thread_local int v[2];
  v[0] = got_signal, v[1] = 0;
  MPI_Request req = MPI_REQUEST_NULL;
  HORA_CHECK(hora__ctx_wait(ctx, MPI_Iallreduce(&v[0], &v[1], 1, MPI_INT, MPI_MAX, st->comm, &req), &req,
                            "hora_should_stop", 0));
  int any = v[1];
  if (any && !st->announced) {
    st->announced = 1;
    if (ctx->rank == 0)
      HORA_WARN(CKPT, "stop requested (signal %d reached at least one rank): every rank stops at this step", any);
  }
  *stop = any != 0;
  return HORA_SUCCESS;
}
