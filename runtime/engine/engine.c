/* The engine's lifecycle and its background thread.
 *
 * hora_init starts the engine (hora__engine_on_init): it duplicates the world communicator for
 * negotiation and builds a private "shadow" context, a copy of the layout on duplicated world,
 * local and cross communicators with its own algorithm state (scratch, shared-memory window).
 * The host algorithms of runtime/algo run on the shadow, so the engine's traffic can never match
 * a blocking collective that a user thread runs on the context at the same time. The engine
 * starts at init rather than on the first async call because creating communicators is itself
 * collective on the world: done lazily, it could interleave with the user's own collectives.
 *
 * The thread runs cycles: sleep until the cycle time has passed (HORA_CYCLE_TIME_MS; after 50
 * cycles in which no rank had anything pending the sleep doubles up to 10 ms, and then an
 * enqueue wakes it at once), negotiate (negotiate.c), run what is ready (fusion.c). It stops on
 * every rank when every rank has asked it to (hora_finalize), or as soon as one rank that asked
 * has nothing pending: that rank submits nothing more, so the requests still pending anywhere
 * fail with HORA_ERR_SHUTDOWN, and so do later submits on the ranks that have not finalized
 * (Horovod's behaviour: one rank's shutdown ends the others' waits instead of hanging them).
 *
 * Failure: a dead peer (heartbeat.c) or a failed MPI call completes every live handle with the
 * error (hora__engine_fail) and the thread leaves its loop at its next check. If it is stuck in a
 * blocking MPI call with the dead peer, hora_finalize gives up on it after 2 s and leaks the
 * engine's memory instead of hanging. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fatal.h"
#include "core/fault.h"
#include "engine/engine.h"
#include "engine/engine_init.h"

#define IDLE_CYCLES_BEFORE_BACKOFF 50
#define IDLE_MAX_SLEEP_S 0.010

hora_result_t hora__engine_get(hora_ctx_t *ctx, const char *fn, hora_engine_t **out) {
  HORA_CHECK(hora__ctx_check(ctx, fn));
  pthread_mutex_lock(&ctx->lock);
  hora_engine_t *eng = ctx->engine;
  pthread_mutex_unlock(&ctx->lock);
  if (!eng) return HORA_ERR(HORA_ERR_SHUTDOWN, "%s: the async engine is stopped (hora_finalize began)", fn);
  *out = eng;
  return HORA_SUCCESS;
}

hora_result_t hora__engine_stats(hora_ctx_t *ctx, uint64_t *cycles, uint64_t *slow_cycles,
                                 uint64_t *cache_hits, uint64_t *fused_groups) {
  hora_engine_t *eng;
  HORA_CHECK(hora__engine_get(ctx, "hora__engine_stats", &eng));
  *cycles = atomic_load(&eng->stat_cycles);
  *slow_cycles = atomic_load(&eng->stat_slow_cycles);
  *cache_hits = atomic_load(&eng->stat_cache_hits);
  *fused_groups = atomic_load(&eng->stat_fused_groups);
  return HORA_SUCCESS;
}

hora_result_t hora__engine_sg_groups(hora_ctx_t *ctx, uint64_t *sg_groups) {
  hora_engine_t *eng;
  HORA_CHECK(hora__engine_get(ctx, "hora__engine_sg_groups", &eng));
  *sg_groups = atomic_load(&eng->stat_sg_groups);
  return HORA_SUCCESS;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* Which rank's hora_finalize stopped the engine (for the messages of hora__engine_who_finalized).
 * The heartbeat's FIN datagram usually names it first, but it travels apart from the engine's bit
 * vector and can come later (a heartbeat thread left waiting for a core on a loaded machine): a
 * rank then said "another rank". So the root engine does one MIN-allreduce of the ranks that
 * called hora_finalize, on every rank: all of them leave the loop after the same cycle, on the
 * same AND of flags (negotiate.c), so all of them reach this call. Waited for like every engine
 * call (a peer found dead meanwhile ends it); left at -1 then. */
static void find_stopper(hora_engine_t *eng) {
  if (eng->up || eng->size <= 1) return;
  int *v = malloc(2 * sizeof *v);
  if (!v) return;
  pthread_mutex_lock(&eng->mu);
  v[0] = eng->stop_requested ? eng->rank : INT_MAX;
  pthread_mutex_unlock(&eng->mu);
  MPI_Request mr;
  if (MPI_Iallreduce(&v[0], &v[1], 1, MPI_INT, MPI_MIN, eng->comm, &mr) != MPI_SUCCESS) {
    free(v);
    return;
  }
  if (hora__engine_mpi_wait(eng, &mr, "the engine's finalize exchange") != HORA_SUCCESS) {
    hora__error_clear();
    return; /* v leaked: MPI may still write it (hora__engine_mpi_wait) */
  }
  pthread_mutex_lock(&eng->mu);
  if (v[1] != INT_MAX) eng->stopped_by = v[1];
  pthread_mutex_unlock(&eng->mu);
  free(v);
}

hora_result_t hora__engine_mpi_wait(hora_engine_t *eng, MPI_Request *req, const char *what) {
  /* Poll with a growing sleep (1 us .. 200 us): a spinning waiter would take the core another
   * rank needs when ranks outnumber cores, and Open MPI progresses non-blocking collectives only
   * inside MPI calls, so the sleep must stay short. */
  double nap = 1e-6;
  for (int i = 0;; i++) {
    int flag = 0;
    int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return hora__mpi_error(rc, what, __FILE__, __LINE__);
    if (flag) return HORA_SUCCESS;
    if (atomic_load(&eng->dead)) {
      /* Leave the request: it cannot be cancelled (collective) or freed while MPI may still use
       * its buffers, which the caller must therefore leak (eng->abandoned). */
      eng->abandoned = 1;
      return HORA_ERR(eng->fail_rc, "%s: %s", what, eng->dead_msg);
    }
    if (i < 20) continue;
    if ((i & 255) == 0) hora__timeline_poll(eng);
    sleep_s(nap);
    if (nap < 200e-6) nap *= 2;
  }
}

/* ---- the shadow context ---- */

static hora_result_t shadow_create(hora_ctx_t *ctx, hora_ctx_t **out) {
  hora_ctx_t *s = calloc(1, sizeof *s);
  if (!s) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
  *s = *ctx;
  s->world = s->local = s->cross = MPI_COMM_NULL;
  s->finalizers = NULL;
  s->algo = s->engine = s->ckpt = s->trace = s->signal = NULL;
  s->mpi_owned = 0;
  s->calls = NULL; /* the engine's traffic is not the program's blocking calls */
  s->overlaps_compute = 1; /* the engine reduces while the training loop computes (algo/dispatch.c) */
  pthread_mutex_init(&s->lock, NULL);
  int rc = MPI_Comm_dup(ctx->world, &s->world);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(ctx->local, &s->local);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(ctx->cross, &s->cross);
  if (rc != MPI_SUCCESS) {
    if (s->world != MPI_COMM_NULL) MPI_Comm_free(&s->world);
    if (s->local != MPI_COMM_NULL) MPI_Comm_free(&s->local);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return hora__mpi_error(rc, "MPI_Comm_dup(engine)", __FILE__, __LINE__);
  }
  MPI_Comm_set_errhandler(s->world, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(s->local, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(s->cross, MPI_ERRORS_RETURN);
  *out = s;
  return HORA_SUCCESS;
}

/* Run the shadow's module finalizers (the algorithm state: collective over its local comm) and
 * free it. `collective` 0 after a failure: skip what would wait for peers, leak instead. */
static hora_result_t shadow_destroy(hora_ctx_t *s, int collective) {
  hora_result_t first = HORA_SUCCESS;
  if (collective) {
    while (s->finalizers) {
      struct hora_finalizer *f = s->finalizers;
      s->finalizers = f->next;
      hora_result_t rc = f->fn(s, f->arg);
      if (rc != HORA_SUCCESS && first == HORA_SUCCESS) first = rc;
      free(f);
    }
    MPI_Comm_free(&s->cross);
    MPI_Comm_free(&s->local);
    MPI_Comm_free(&s->world);
    pthread_mutex_destroy(&s->lock);
    free(s);
  }
  return first;
}

/* ---- the thread ---- */

static void fail_all_pending(hora_engine_t *eng, hora_result_t rc, const char *msg) {
  for (size_t i = 0; i < eng->pending.nb; i++) {
    eng_req_t *r = eng->pending.b[i];
    while (r) {
      eng_req_t *nx = r->hnext;
      hora__req_finish(eng, r, rc, msg);
      r = nx;
    }
  }
  if (eng->join_req) {
    hora__handle_member_done(eng->join_req->h, rc, msg);
    hora__req_free(eng->join_req);
    eng->join_req = NULL;
  }
  pthread_mutex_lock(&eng->mu);
  eng_req_t *q = eng->qhead;
  eng->qhead = eng->qtail = NULL;
  pthread_mutex_unlock(&eng->mu);
  for (int pass = 0; pass < 2; pass++) { /* the queue, then the held group members */
    while (q) {
      eng_req_t *nx = q->qnext;
      hora__handle_member_done(q->h, rc, msg);
      hora__req_free(q);
      q = nx;
    }
    q = eng->held;
    eng->held = NULL;
  }
}

static void *engine_main(void *arg) {
  hora__thread_name("hora-engine");
  hora_engine_t *eng = arg;
  double cycle_s = eng->prm.cycle_time_ms / 1000.0, sleep_for = cycle_s;
  double next = hora__now_s();
  hora_result_t rc = HORA_SUCCESS;
  for (;;) {
    /* Sleep until the next cycle (an enqueue cuts a backed-off sleep short). */
    pthread_mutex_lock(&eng->mu);
    for (;;) {
      double now = hora__now_s();
      if (now >= next || eng->stop_requested || atomic_load(&eng->dead)) break;
      if (sleep_for > cycle_s && eng->qhead) break;
      double until = next;
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      double d = until - now;
      ts.tv_sec += (time_t)d;
      ts.tv_nsec += (long)((d - (double)(time_t)d) * 1e9);
      if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
      pthread_cond_timedwait(&eng->cv, &eng->mu, &ts);
    }
    pthread_mutex_unlock(&eng->mu);
    if (atomic_load(&eng->dead)) break;
    double start = hora__now_s();
    eng->cycle++;
    atomic_fetch_add(&eng->stat_cycles, 1);

    eng_resp_t *list = NULL;
    size_t n = 0;
    int stop = 0, idle = 0;
    rc = hora__negotiate(eng, &list, &n, &stop, &idle);
    if (rc == HORA_SUCCESS && n) rc = hora__fusion_run(eng, list, n);
    for (size_t i = 0; i < n; i++) free(list[i].name);
    free(list);
    if (rc != HORA_SUCCESS) {
      if (!atomic_load(&eng->dead))
        hora__engine_fail(eng, rc, "async engine stopped: %s", hora_last_error());
      break;
    }
    if (stop) break;
    hora__timeline_poll(eng);
    eng->idle_cycles = idle ? eng->idle_cycles + 1 : 0;
    if (eng->idle_cycles > IDLE_CYCLES_BEFORE_BACKOFF) {
      double d = sleep_for > 1e-4 ? sleep_for * 2 : 1e-4; /* also from HORA_CYCLE_TIME_MS=0 */
      sleep_for = d > IDLE_MAX_SLEEP_S ? IDLE_MAX_SLEEP_S : d;
      if (sleep_for < cycle_s) sleep_for = cycle_s;
    } else {
      sleep_for = cycle_s;
    }
    next = start + sleep_for;
  }
  if (atomic_load(&eng->dead)) {
    fail_all_pending(eng, eng->fail_rc, eng->dead_msg);
  } else {
    /* Stopped by this rank's hora_finalize, or by another rank's: then refuse later submits. */
    find_stopper(eng);
    pthread_mutex_lock(&eng->mu);
    int mine = eng->stop_requested;
    eng->peer_stopped = !mine;
    pthread_mutex_unlock(&eng->mu);
    char msg[256];
    if (mine)
      snprintf(msg, sizeof msg, "cancelled: hora_finalize ran while this request was pending");
    else
      snprintf(msg, sizeof msg, "cancelled: %s called hora_finalize while this request was pending (the async engine "
               "stops on every rank once a rank in hora_finalize has nothing pending)", hora__engine_who_finalized(eng));
    fail_all_pending(eng, HORA_ERR_SHUTDOWN, msg);
  }
  pthread_mutex_lock(&eng->mu);
  eng->exited = 1;
  pthread_cond_broadcast(&eng->exit_cv);
  pthread_mutex_unlock(&eng->mu);
  return NULL;
}

/* ---- start / stop ---- */

static void engine_free(hora_engine_t *eng, int collective) {
  if (eng->tl) hora__timeline_close(eng->tl);
  hora__cache_free(&eng->cache);
  hora__coord_free(eng);
  free(eng->pending.b);
  free(eng->fusion);
  free(eng->zeros);
  free(eng->subs);
  eng->subs = NULL;
  if (collective) {
    if (eng->shadow) shadow_destroy(eng->shadow, 1);
    if (eng->comm != MPI_COMM_NULL) MPI_Comm_free(&eng->comm);
    pthread_mutex_destroy(&eng->mu);
    pthread_mutex_destroy(&eng->tl_mu);
    pthread_cond_destroy(&eng->cv);
    pthread_cond_destroy(&eng->exit_cv);
    free(eng);
  }
}

/* A process set's engine (ctx->parent set): share the parent engine's heartbeat and be failed
 * with it. HORA_ERR_SHUTDOWN when the parent's engine is stopping, its failure when it failed. */
static hora_result_t sub_register(hora_engine_t *eng, hora_ctx_t *parent) {
  pthread_mutex_lock(&parent->lock);
  hora_engine_t *up = parent->engine;
  pthread_mutex_unlock(&parent->lock);
  if (!up) return HORA_ERR(HORA_ERR_SHUTDOWN, "hora_process_set_create: the parent's async engine is stopped");
  hora_result_t rc = HORA_SUCCESS;
  pthread_mutex_lock(&up->mu);
  if (atomic_load(&up->dead)) {
    rc = HORA_ERR(up->fail_rc, "hora_process_set_create: %s", up->dead_msg);
  } else if (up->nsubs == up->capsubs) {
    size_t cap = up->capsubs ? 2 * up->capsubs : 4;
    hora_engine_t **n = realloc(up->subs, cap * sizeof *n);
    if (!n) rc = HORA_ERR(HORA_ERR_NO_MEMORY, "hora_process_set_create: out of memory");
    else up->subs = n, up->capsubs = cap;
  }
  if (rc == HORA_SUCCESS) {
    up->subs[up->nsubs++] = eng;
    eng->up = up;
    eng->hb = up->hb;
  }
  pthread_mutex_unlock(&up->mu);
  return rc;
}

static void sub_unregister(hora_engine_t *eng) {
  hora_engine_t *up = eng->up;
  if (!up) return;
  pthread_mutex_lock(&up->mu);
  for (size_t i = 0; i < up->nsubs; i++)
    if (up->subs[i] == eng) up->subs[i] = up->subs[--up->nsubs];
  pthread_mutex_unlock(&up->mu);
  eng->up = NULL;
}

static hora_result_t engine_finalize(hora_ctx_t *ctx, void *arg) {
  hora_engine_t *eng = arg;
  hora_result_t frc = eng->up ? HORA_SUCCESS : hora__fault_hit("finalize", eng->rank);
  if (frc != HORA_SUCCESS) hora__engine_fail(eng, frc, "hora_finalize: %s", hora_last_error());
  pthread_mutex_lock(&ctx->lock);
  ctx->engine = NULL; /* later async calls get HORA_ERR_SHUTDOWN */
  pthread_mutex_unlock(&ctx->lock);
  pthread_mutex_lock(&eng->mu);
  eng->stop_requested = 1;
  pthread_cond_broadcast(&eng->cv);
  /* Wait for every rank to agree (the thread exits); after a failure, at most 2 s. */
  double give_up = 0;
  while (!eng->exited) {
    if (atomic_load(&eng->dead)) {
      if (give_up == 0) give_up = hora__now_s() + 2.0;
      if (hora__now_s() > give_up) break;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&eng->exit_cv, &eng->mu, &ts);
  }
  int exited = eng->exited, dead = atomic_load(&eng->dead);
  hora_result_t fail_rc = eng->fail_rc;
  char msg[256];
  snprintf(msg, sizeof msg, "%s", eng->dead_msg);
  pthread_mutex_unlock(&eng->mu);
  if (eng->hb_owned) hora__hb_stop(eng->hb);
  eng->hb = NULL;
  sub_unregister(eng);
  if (!exited) {
    /* Stuck in MPI with a dead peer: leave it (and the memory it may touch) alone. */
    pthread_detach(eng->thread);
    return HORA_ERR(fail_rc, "%s: the async engine is stuck after a failure (%s)",
                    ctx->parent ? "hora_process_set_destroy" : "hora_finalize", msg);
  }
  pthread_join(eng->thread, NULL);
  HORA_INFO(ENGINE, "async engine stopped: %llu cycles, %llu with a rank-0 round, %llu cache hits, "
            "%llu fused groups (%llu without the fusion buffer)", (unsigned long long)eng->stat_cycles,
            (unsigned long long)eng->stat_slow_cycles, (unsigned long long)eng->stat_cache_hits,
            (unsigned long long)eng->stat_fused_groups, (unsigned long long)eng->stat_sg_groups);
  engine_free(eng, !dead);
  if (dead) return HORA_ERR(fail_rc, "%s: %s", ctx->parent ? "hora_process_set_destroy" : "hora_finalize", msg);
  return HORA_SUCCESS;
}

void hora__engine_abort(hora_ctx_t *ctx, hora_result_t rc, const char *msg) {
  pthread_mutex_lock(&ctx->lock);
  hora_engine_t *eng = ctx->engine;
  pthread_mutex_unlock(&ctx->lock);
  if (eng) hora__engine_fail(eng, rc, "%s", msg);
}

void hora__engine_on_finalize_begin(hora_ctx_t *ctx) {
  pthread_mutex_lock(&ctx->lock);
  hora_engine_t *eng = ctx->engine;
  pthread_mutex_unlock(&ctx->lock);
  if (!eng) return;
  if (eng->hb_owned) hora__hb_announce_finalize(eng->hb);
  /* Ask the engine, and every process set's, to stop now rather than when its finalizer comes:
   * the finalizers that run before it (newest first: the algorithm state's, the sets') meet the
   * other ranks, which may be waiting for an async request of this rank's that will never come;
   * the stop cancels those (negotiate.c) so that they come to their own hora_finalize. */
  pthread_mutex_lock(&eng->mu);
  eng->stop_requested = 1;
  pthread_cond_broadcast(&eng->cv);
  for (size_t i = 0; i < eng->nsubs; i++) {
    hora_engine_t *sub = eng->subs[i];
    pthread_mutex_lock(&sub->mu);
    sub->stop_requested = 1;
    pthread_cond_broadcast(&sub->cv);
    pthread_mutex_unlock(&sub->mu);
  }
  pthread_mutex_unlock(&eng->mu);
}

hora_result_t hora__engine_on_init(hora_ctx_t *ctx) {
  hora_engine_t *eng = calloc(1, sizeof *eng);
  if (!eng) return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_init: out of memory for the async engine");
  hora_result_t rc = HORA_SUCCESS;
  eng->ctx = ctx;
  eng->comm = MPI_COMM_NULL;
  eng->rank = ctx->rank;
  eng->size = ctx->size;
  eng->prm = *hora__params();
  eng->fail_rc = HORA_ERR_REMOTE;
  eng->stopped_by = -1;
  eng->handles.next = eng->handles.prev = &eng->handles;
  pthread_mutex_init(&eng->mu, NULL);
  pthread_mutex_init(&eng->tl_mu, NULL);
  pthread_cond_init(&eng->cv, NULL);
  pthread_cond_init(&eng->exit_cv, NULL);
  int mrc = MPI_Comm_dup(ctx->world, &eng->comm);
  if (mrc != MPI_SUCCESS) {
    rc = hora__mpi_error(mrc, "MPI_Comm_dup(engine)", __FILE__, __LINE__);
    goto fail;
  }
  MPI_Comm_set_errhandler(eng->comm, MPI_ERRORS_RETURN);
  HORA_CHECK_GOTO(shadow_create(ctx, &eng->shadow), rc, fail);
  HORA_CHECK_GOTO(hora__cache_init(&eng->cache, (int)eng->prm.cache_capacity), rc, fail);
  if (ctx->parent) HORA_CHECK_GOTO(sub_register(eng, ctx->parent), rc, fail);
  if (eng->rank == 0) {
    eng->coord_joined = calloc((size_t)eng->size, 1);
    eng->coord_join_seq = calloc((size_t)eng->size, sizeof *eng->coord_join_seq);
    if (!eng->coord_joined || !eng->coord_join_seq) {
      rc = HORA_ERR(HORA_ERR_NO_MEMORY, "hora_init: out of memory for the async engine");
      goto fail;
    }
    if (!ctx->parent && eng->prm.timeline && *eng->prm.timeline) { /* the root context's only */
      /* The timeline is optional: a bad path is logged, not fatal. */
      if (hora__timeline_open("HORA_TIMELINE", eng->prm.timeline, eng->prm.timeline_max_bytes,
                              (int)eng->prm.timeline_mark_cycles, &eng->tl) != HORA_SUCCESS)
        eng->tl = NULL;
    }
  }
  double w = eng->prm.stall_warning_s, s = eng->prm.stall_shutdown_s;
  double m = w > 0 && s > 0 ? (w < s ? w : s) : (w > 0 ? w : s);
  eng->stall_fallback_s = m > 0 ? m / 2 : 0;
  if (!ctx->parent) {
    HORA_CHECK_GOTO(hora__fault_hit("init", eng->rank), rc, fail); /* before any heartbeat */
    HORA_CHECK_GOTO(hora__hb_start(eng, &eng->hb), rc, fail);
    eng->hb_owned = 1;
  }
  if (pthread_create(&eng->thread, NULL, engine_main, eng) != 0) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "hora_init: cannot create the async engine thread");
    goto fail;
  }
  eng->thread_started = 1;
  HORA_CHECK_GOTO(hora__ctx_add_finalizer(ctx, engine_finalize, eng), rc, fail_thread);
  pthread_mutex_lock(&ctx->lock);
  ctx->engine = eng;
  pthread_mutex_unlock(&ctx->lock);
  HORA_INFO(ENGINE, "async engine started: cycle %g ms, fusion buffer %llu bytes, cache %lld entries",
            eng->prm.cycle_time_ms, (unsigned long long)eng->prm.fusion_threshold,
            (long long)eng->prm.cache_capacity);
  return HORA_SUCCESS;

fail_thread:
  /* Cannot agree with the other ranks on stopping: mark failed and leave the thread. */
  hora__engine_fail(eng, rc, "async engine could not start");
  pthread_detach(eng->thread);
  return rc;
fail:
  if (eng->hb_owned) {
    hora__hb_mute(eng->hb); /* no BYE: the peers must see this rank go, not leave cleanly */
    hora__hb_stop(eng->hb);
  } /* a process set's creation agrees on the result over the parent instead */
  eng->hb = NULL;
  sub_unregister(eng);
  if (eng->tl) hora__timeline_close(eng->tl);
  eng->tl = NULL;
  engine_free(eng, 1);
  return rc;
}
