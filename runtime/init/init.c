/* hora_init / hora_finalize: the top floor of libhora. Core (runtime/core) builds the context and
 * the layout; this file starts the modules on it, in order, by explicit calls:
 *
 *   hora__ctx_open          core: MPI, the world communicator, layout checks, layout
 *   hora__gpu_on_init       comm: this rank's GPU (a no-op without CUDA), before the engine
 *   hora__engine_on_init    engine: its thread and the heartbeat thread (collective: they dup
 *                           communicators, which must not interleave with the program's own
 *                           collectives, so the engine starts here and not lazily)
 *   hora__ctx_publish       core: the context becomes live; rank 0 logs the banner
 *   hora__trace_on_init     trace: optional services set by environment (GPU monitor); they only
 *                           log on failure
 *
 * Modules stop in hora_finalize through the finalizers they registered (newest first), then core
 * releases the context. Every module is linked into libhora and hora_static, so no reference here
 * is weak. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "core/ctx.h"
#include "comm/gpu.h"
#include "core/fatal.h"
#include "engine/engine_init.h"
#include "trace/trace.h"

/* Start-up watchdog. hora_init's first collectives (MPI_Init_thread when hora calls it, the
 * layout's communicator splits, the engine's duplicates, the heartbeat's address exchange) are
 * blocking MPI calls that nothing can leave: a rank that never reaches hora_init (it crashed
 * before MPI noticed, hangs in the program's own set-up, or was never started) would keep every
 * other rank there, silent, until the job's time limit. Once the heartbeat runs, its start-up
 * limit (HORA_INIT_TIMEOUT_S) ends hora_init with HORA_ERR_REMOTE naming the silent ranks; this
 * thread is the backstop before that: if hora_init has not returned 2 x HORA_INIT_TIMEOUT_S after
 * it began (twice, so that a slow but healthy start of a large job is never cut short), it says
 * so on stderr and ends the process with exit status 1, and mpirun, srun or launch end the job.
 * A watchdog thread and not a timed wait because no MPI call here can be left; our own code
 * because MPI has no start-up timeout of its kind. HORA_INIT_TIMEOUT_S=0 turns it off. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  double limit_s;
} init_watch_t;

static void *init_watch_main(void *arg) {
  hora__thread_name("hora-init-watch");
  init_watch_t *w = arg;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)w->limit_s;
  until.tv_nsec += (long)((w->limit_s - (double)(time_t)w->limit_s) * 1e9);
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&w->mu);
  int rc = 0;
  while (!w->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&w->cv, &w->mu, &until);
  int late = !w->done;
  pthread_mutex_unlock(&w->mu);
  if (late) {
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    double since = 0;
    const char *step = hora__init_step_now(&since);
    fprintf(stderr, "hora: hora_init on host %s (pid %d) has not returned after %g s (2 x HORA_INIT_TIMEOUT_S): "
            "it waits in a start-up collective for a rank that has not called hora_init (that rank crashed, "
            "hangs in the program's own set-up, or never started; its log and the launcher's say which); "
            "the step it waits in: %s, for %.1f s; ending this process\n", host, (int)getpid(), w->limit_s,
            step ? step : "(none recorded)", since);
    fflush(stderr);
    _exit(1);
  }
  return NULL;
}

static int init_watch_start(init_watch_t *w, pthread_t *th) {
  double t = hora__params()->init_timeout_s;
  if (t <= 0) return 0;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->done = 0;
  w->limit_s = 2 * t;
  if (pthread_create(th, NULL, init_watch_main, w) == 0) return 1;
  pthread_cond_destroy(&w->cv); /* no watchdog: hora_init goes on without it */
  pthread_mutex_destroy(&w->mu);
  return 0;
}

static void init_watch_stop(init_watch_t *w, pthread_t th) {
  pthread_mutex_lock(&w->mu);
  w->done = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(th, NULL);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
}

static hora_result_t init_steps(const hora_init_opts_t *opts, hora_ctx_t **out) {
  hora_result_t rc = HORA_SUCCESS;
  hora_ctx_t *c = NULL;
  HORA_CHECK(hora__ctx_open(opts, &c));
  hora__init_step("the GPU selection (its agreement across ranks, the node's GPU UUIDs)");
  HORA_CHECK_GOTO(hora__gpu_on_init(c), rc, fail);
  hora__init_step("the async engine's start-up (MPI_Comm_dup of its communicators)");
  HORA_CHECK_GOTO(hora__engine_on_init(c), rc, fail);
  HORA_CHECK_GOTO(hora__ctx_publish(c), rc, fail);
  hora__trace_on_init(c);
  *out = c;
  return HORA_SUCCESS;

fail:
  /* Stop whatever started (the finalizers registered so far), then release the context. This
   * failure can be this rank's alone (GPU, engine): the other ranks go on, so it counts as failed
   * (ctx->failed): finalizers skip what waits for every rank and MPI is not finalized. */
  __atomic_store_n(&c->failed, 1, __ATOMIC_RELEASE);
  hora__ctx_run_finalizers(c);
  hora__ctx_discard(c);
  return rc;
}

HORA_EXPORT hora_result_t hora_init_ex(const hora_init_opts_t *opts, hora_ctx_t **out) {
  hora__error_clear();
  if (!out) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_init: ctx (output pointer) is NULL");
  HORA_CHECK(hora__ctx_init_refused_in_fork()); /* before the watchdog thread: a child makes none */
  init_watch_t w;
  pthread_t th;
  int watching = init_watch_start(&w, &th);
  hora_result_t rc = init_steps(opts, out);
  if (watching) init_watch_stop(&w, th);
  hora__init_step(NULL);
  return rc;
}

HORA_EXPORT hora_result_t hora_init(hora_ctx_t **ctx) { return hora_init_ex(NULL, ctx); }

HORA_EXPORT hora_result_t hora_finalize(hora_ctx_t *ctx) {
  if (!ctx) return HORA_SUCCESS;
  HORA_CHECK(hora__ctx_check_live(ctx, "hora_finalize"));
  if (ctx->parent)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_finalize: the context is a process set: release "
                    "it with hora_process_set_destroy");
  /* Tell the peers first that this rank makes no more calls: one that waits for it in a blocking
   * call it never completed then fails instead of hanging (and so does not keep this rank waiting
   * in the finalizers below, which agree with every rank). */
  hora__engine_on_finalize_begin(ctx);
  /* Module finalizers, newest first, while the context is still live for them. */
  hora_result_t first = hora__ctx_run_finalizers(ctx);
  hora__ctx_discard(ctx);
  return first;
}
