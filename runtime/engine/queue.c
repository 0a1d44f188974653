/* Handles and the submission queue (the table of pending requests is util.c's).
 *
 * A user thread builds a request and pushes it on the queue under the engine's mutex (a grouped
 * allreduce pushes its whole chain in one step, so its members are always drained in the same
 * cycle). The engine thread drains the queue at the start of each cycle into the pending table,
 * keyed by name, where the request waits until negotiation makes it ready.
 *
 * A handle is completed member by member (a grouped allreduce has several); the first error
 * wins. It is reference counted: one reference for the user (dropped by hora_handle_free) and
 * one per pending request (dropped when the engine finishes it), so neither side frees memory the
 * other still uses. Live handles sit on a list so that a dead peer can complete them all from
 * the heartbeat thread while the engine thread may be stuck inside an MPI call. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

/* ---- handles ---- */

hora_result_t hora__handle_new(hora_engine_t *eng, int members, hora_handle_t **out) {
  hora_handle_t *h = calloc(1, sizeof *h);
  if (!h) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory for a handle");
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  h->refs = 1 + members;
  h->remaining = members;
  h->eng = eng;
  h->last_rank = -1;
  h->fork_gen = eng->ctx->fork_gen; /* the engine's context was made in this process */
  atomic_store(&h->linked, 1);
  pthread_mutex_lock(&eng->mu);
  h->next = eng->handles.next;
  h->prev = &eng->handles;
  eng->handles.next->prev = h;
  eng->handles.next = h;
  pthread_mutex_unlock(&eng->mu);
  *out = h;
  return HORA_SUCCESS;
}

/* Once unlinked (completed, or failed/shut down by the engine) a handle never touches the
 * engine again, so the user may free it after hora_finalize. */
static void handle_unlink(hora_handle_t *h) {
  if (!atomic_load(&h->linked)) return;
  hora_engine_t *eng = h->eng;
  pthread_mutex_lock(&eng->mu);
  if (atomic_load(&h->linked)) {
    h->prev->next = h->next;
    h->next->prev = h->prev;
    h->prev = h->next = NULL;
    atomic_store(&h->linked, 0);
  }
  pthread_mutex_unlock(&eng->mu);
}

/* Record rc/msg (first error wins) and wake waiters when the last member is in. Caller holds h->mu. */
static int complete_locked(hora_handle_t *h, hora_result_t rc, const char *msg, int all) {
  if (h->done) return 0;
  if (rc != HORA_SUCCESS && h->rc == HORA_SUCCESS) {
    h->rc = rc;
    free(h->msg);
    h->msg = msg ? strdup(msg) : NULL;
  }
  if (all) h->remaining = 0;
  else if (h->remaining > 0) h->remaining--;
  if (h->remaining == 0) {
    h->done = 1;
    pthread_cond_broadcast(&h->cv);
    return 1;
  }
  return 0;
}

void hora__handle_release(hora_handle_t *h) {
  pthread_mutex_lock(&h->mu);
  int last = --h->refs == 0;
  pthread_mutex_unlock(&h->mu);
  if (!last) return;
  handle_unlink(h);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  free(h->msg);
  free(h);
}

void hora__handle_member_done(hora_handle_t *h, hora_result_t rc, const char *msg) {
  pthread_mutex_lock(&h->mu);
  int finished = complete_locked(h, rc, msg, 0);
  pthread_mutex_unlock(&h->mu);
  if (finished) handle_unlink(h);
  hora__handle_release(h);
}

/* Complete every live handle with the engine's failure (heartbeat thread or engine thread).
 * The engine's own references stay: its requests are freed when (if) its thread gets there. */
void hora__engine_fail(hora_engine_t *eng, hora_result_t rc, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&eng->mu);
  if (atomic_load(&eng->dead)) {
    pthread_mutex_unlock(&eng->mu);
    return;
  }
  snprintf(eng->dead_msg, sizeof eng->dead_msg, "%s", msg);
  eng->fail_rc = rc;
  atomic_store(&eng->dead, 1);
  hora__ctx_fail(eng->ctx, rc, msg); /* the blocking collectives' waits watch this verdict */
  /* Complete under eng->mu (lock order eng->mu -> h->mu everywhere); unlink all. */
  hora_handle_t *h = eng->handles.next;
  while (h != &eng->handles) {
    hora_handle_t *nx = h->next;
    pthread_mutex_lock(&h->mu);
    complete_locked(h, rc, msg, 1);
    pthread_mutex_unlock(&h->mu);
    h->prev = h->next = NULL;
    atomic_store(&h->linked, 0);
    h = nx;
  }
  eng->handles.next = eng->handles.prev = &eng->handles;
  pthread_cond_broadcast(&eng->cv);
  /* A failure of our own (not a dead peer): go silent so that the peers, which may be waiting
   * for us inside a collective, time out instead of hanging. */
  if (rc != HORA_ERR_REMOTE) hora__hb_mute(eng->hb);
  /* The process sets' engines share this rank's fate (they have no heartbeat of their own).
   * Under eng->mu, so that none is freed meanwhile (lock order: parent's mu, then a set's). */
  for (size_t i = 0; i < eng->nsubs; i++) hora__engine_fail(eng->subs[i], rc, "%s", msg);
  pthread_mutex_unlock(&eng->mu);
  HORA_WARN(ENGINE, "%s", msg);
}

const char *hora__engine_who_finalized(const hora_engine_t *eng) {
  static _Thread_local char buf[48];
  const hora_engine_t *root = eng->up ? eng->up : eng;
  uint64_t fin = root->ctx->calls ? __atomic_load_n(&root->ctx->calls->fin, __ATOMIC_ACQUIRE) : 0;
  if (!fin && !eng->up && eng->stopped_by >= 0) fin = (uint64_t)eng->stopped_by + 1; /* engine.c */
  if (!fin) return "another rank";
  snprintf(buf, sizeof buf, eng->up ? "rank %d of the parent context" : "rank %d", (int)(fin & 0xffffff) - 1);
  return buf;
}

/* ---- queue ---- */

hora_result_t hora__engine_submit(hora_engine_t *eng, eng_req_t *first, eng_req_t *last) {
  pthread_mutex_lock(&eng->mu);
  hora_result_t rc = HORA_SUCCESS;
  if (atomic_load(&eng->dead)) {
    rc = HORA_ERR(eng->fail_rc, "%s", eng->dead_msg);
  } else if (eng->stop_requested) {
    rc = HORA_ERR(HORA_ERR_SHUTDOWN, "async collective submitted after hora_finalize began");
  } else if (eng->peer_stopped) {
    rc = HORA_ERR(HORA_ERR_SHUTDOWN, "async collective submitted after %s called hora_finalize (the async "
                  "engine stops on every rank once a rank in hora_finalize has nothing pending)", hora__engine_who_finalized(eng));
  } else {
    last->qnext = NULL;
    if (eng->qtail) eng->qtail->qnext = first;
    else eng->qhead = first;
    eng->qtail = last;
    pthread_cond_signal(&eng->cv);
  }
  pthread_mutex_unlock(&eng->mu);
  return rc;
}

void hora__req_free(eng_req_t *r) {
  if (!r) return;
  free(r->name);
  free(r->recvcounts);
  free(r);
}

void hora__req_finish(hora_engine_t *eng, eng_req_t *r, hora_result_t rc, const char *msg) {
  hora__eng_table_del(&eng->pending, r);
  if (r->h) hora__handle_member_done(r->h, rc, msg);
  hora__req_free(r);
}

/* ---- public handle calls ---- */

/* In a fork() child the engine thread that completes the handle does not exist (and the handle's
 * mutex may have been held by it at the fork): refused before touching it. */
#define HANDLE_FORK_CHECK(h, fn) \
  HORA_CHECK(hora__fork_check((h)->fork_gen, fn, "the handle (its async engine)", \
                              "wait for it in the parent"))

HORA_EXPORT hora_result_t hora_poll(hora_handle_t *handle, int *done) {
  if (!handle || !done)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_poll: %s is NULL", !handle ? "handle" : "done");
  HANDLE_FORK_CHECK(handle, "hora_poll");
  pthread_mutex_lock(&handle->mu);
  *done = handle->done;
  pthread_mutex_unlock(&handle->mu);
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_wait(hora_handle_t *handle) {
  if (!handle) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_wait: handle is NULL");
  HANDLE_FORK_CHECK(handle, "hora_wait");
  pthread_mutex_lock(&handle->mu);
  while (!handle->done) pthread_cond_wait(&handle->cv, &handle->mu);
  hora_result_t rc = handle->rc;
  char buf[1536];
  snprintf(buf, sizeof buf, "%s", handle->msg ? handle->msg : hora_strerror(rc));
  pthread_mutex_unlock(&handle->mu);
  if (rc == HORA_SUCCESS) return HORA_SUCCESS;
  /* Set it as this thread's last error; INFO level because the origin logged it already. */
  return HORA_ERR(rc, "%s", buf);
}

HORA_EXPORT hora_result_t hora_handle_free(hora_handle_t *handle) {
  if (!handle) return HORA_SUCCESS;
  HANDLE_FORK_CHECK(handle, "hora_handle_free");
  pthread_mutex_lock(&handle->mu);
  while (!handle->done) pthread_cond_wait(&handle->cv, &handle->mu);
  pthread_mutex_unlock(&handle->mu);
  hora__handle_release(handle);
  return HORA_SUCCESS;
}
