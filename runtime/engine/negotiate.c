/* Negotiation: each cycle, every rank learns which named requests ALL ranks have submitted, in
 * one order that is the same everywhere (after Horovod's controller, rewritten).
 *
 * Step 1, every cycle: one MPI_Iallreduce(BAND) of a bit vector over the engine's communicator.
 *   word 0        flags, each phrased so that AND gives the answer:
 *                   NO_SLOW      "I need no coordinator round"       AND=0: run step 2
 *                   WANT_STOP    "hora_finalize is waiting"          AND=1: stop after this cycle
 *                   NOT_DONE     "I have not begun hora_finalize     AND=0: every rank stops after
 *                                with nothing pending"               this cycle: that rank will
 *                                submit nothing more, so what the others still wait for is
 *                                cancelled with HORA_ERR_SHUTDOWN instead of hanging (as in
 *                                Horovod, where one rank's shutdown ends every rank's); while it
 *                                still has requests pending they may complete (the others submit
 *                                them, then finalize too), as when every rank finalizes
 *                   IDLE         "nothing pending here"              AND=1: back off the cycle
 *                   NOT_JOINED   "I have not called hora_join"       AND=0: some rank joined
 *                   JOINED       "I have called hora_join"           AND=1: all joined, the
 *                                join completes this cycle: run no cached zeros
 *   hit bits      bit s: "my pending request matches cache slot s"  (see cache.c)
 *   valid bits    bit s: 0 = "my request for slot s's name has other parameters": erase s
 * Cached names whose hit bit survives the AND run this cycle, in slot order.
 *
 * Step 2, only when some rank has names the cache does not know (or rank 0 has responses to
 * send): every rank sends its new requests (name + parameters, sent once) to rank 0
 * (MPI_Igather of the sizes, MPI_Igatherv of the bytes). Rank 0 keeps a table of names seen from
 * some ranks; a name is ready when every rank that has not joined has sent it. Rank 0 checks that
 * the ranks agree (else the response is HORA_ERR_MISMATCH naming tensor, field and ranks), adds
 * the stall inspector's timeouts, and broadcasts the responses (MPI_Ibcast). Every rank then
 * runs the successful ones in that order and inserts them into its cache, also in that order.
 *
 *   rank 1 --new names--> rank 0: table[name].have[1] = 1 ... all have it?
 *   rank 2 --new names-->   |      yes: check fields, response (ok | MISMATCH)
 *                           +-- responses --> every rank: run, cache insert
 *
 * All MPI calls here are non-blocking and waited for with hora__engine_mpi_wait, so a dead peer
 * (heartbeat.c) ends the wait instead of hanging the thread. The request given up on stays live
 * inside MPI (a nonblocking collective cannot be cancelled), and the "dead" peer may only have
 * been slow: its data can still land in our buffers whenever any thread next enters MPI. So after
 * such a wait the cycle's wire buffers are leaked, never freed (freeing them let a late bit vector
 * overwrite malloc's chunk headers: `malloc(): mismatching next->prev_size` in the next thread to
 * allocate). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

enum { F_NO_SLOW = 1, F_WANT_STOP = 2, F_IDLE = 4, F_NOT_JOINED = 8, F_JOINED = 16, F_NOT_DONE = 32 };

/* ---- a growable byte buffer for the wire format ---- */
typedef struct {
  char *p;
  size_t n, cap;
  int oom;
} buf_t;

static void put(buf_t *b, const void *d, size_t n) {
  if (b->oom || n == 0) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->n + n) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
}

static void put_str(buf_t *b, const char *s) {
  uint32_t n = s ? (uint32_t)strlen(s) : 0;
  put(b, &n, sizeof n);
  put(b, s, n);
}

/* Reader over a received buffer; returns NULL/0 past the end (a malformed message). */
typedef struct {
  const char *p;
  size_t n, off;
  int bad;
} rd_t;

static int get(rd_t *r, void *d, size_t n) {
  if (r->bad || r->off + n > r->n) {
    r->bad = 1;
    return 0;
  }
  memcpy(d, r->p + r->off, n);
  r->off += n;
  return 1;
}

static char *get_str(rd_t *r) {
  uint32_t n;
  if (!get(r, &n, sizeof n) || r->off + n > r->n) {
    r->bad = 1;
    return NULL;
  }
  char *s = malloc((size_t)n + 1);
  if (!s) {
    r->bad = 1;
    return NULL;
  }
  memcpy(s, r->p + r->off, n);
  s[n] = 0;
  r->off += n;
  return s;
}

/* ---- the cycle ---- */

static int is_joinable(const eng_params_t *p) {
  return p->kind == ENG_ALLREDUCE && (p->op == HORA_SUM || p->op == HORA_AVERAGE);
}

/* Engine-side list of drained requests (the table is the name index; this is the iteration
 * order). Kept as a growable array rebuilt each cycle from the table walk. */
static hora_result_t collect(hora_engine_t *eng, eng_req_t ***out, size_t *n) {
  eng_req_t **a = malloc((eng->pending.n + 1) * sizeof *a);
  if (!a) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
  size_t k = 0;
  for (size_t i = 0; i < eng->pending.nb; i++)
    for (eng_req_t *r = eng->pending.b[i]; r; r = r->hnext) a[k++] = r;
  *out = a;
  *n = k;
  return HORA_SUCCESS;
}

/* Hold back the members of groups not yet complete on this rank. A group's members must reach
 * rank 0 in one round: a group that the ranks disagree on is failed there in that round (coord.c,
 * GROUP_FAIL), and a member submitted a cycle later would be left waiting for the others
 * forever. hora_grouped_allreduce_async enqueues its members at once; the members tagged one by
 * one with hora_set_call_group (Python's grouped allgather and reducescatter) may be split by a
 * cycle. Returns the list to drain now; the incomplete ones stay in eng->held (in order), with a
 * warning per group member every HORA_STALL_WARNING_S. */
static eng_req_t *hold_incomplete_groups(hora_engine_t *eng, eng_req_t *q, double now) {
  eng_req_t *all = eng->held, **tail = &all;
  while (*tail) tail = &(*tail)->qnext;
  *tail = q;
  eng->held = NULL;
  eng_req_t *out = NULL, **otail = &out, **htail = &eng->held;
  while (all) {
    eng_req_t *r = all;
    all = all->qnext;
    r->qnext = NULL;
    uint32_t have = 0; /* the members of r's group in the whole list (out, held, all and r) */
    if (r->p.gsize > 1) {
      /* The usual case first: the whole group enqueued together (hora_grouped_allreduce_async),
       * released at once. */
      uint32_t run = 1;
      eng_req_t *last = r;
      for (eng_req_t *x = all; x && run < r->p.gsize && x->p.gsize && x->p.group == r->p.group; x = x->qnext) {
        run++;
        last = x;
      }
      if (run == r->p.gsize) {
        r->qnext = last == r ? NULL : all;
        all = last->qnext;
        last->qnext = NULL;
        *otail = r;
        otail = &last->qnext;
        continue;
      }
      for (eng_req_t *x = out; x; x = x->qnext) have += x->p.gsize && x->p.group == r->p.group;
      for (eng_req_t *x = eng->held; x; x = x->qnext) have += x->p.gsize && x->p.group == r->p.group;
      for (eng_req_t *x = all; x; x = x->qnext) have += x->p.gsize && x->p.group == r->p.group;
      have++; /* r */
    }
    if (r->p.gsize <= 1 || have >= r->p.gsize) {
      *otail = r;
      otail = &r->qnext;
      continue;
    }
    double warn = eng->prm.stall_warning_s;
    if (warn > 0 && now - r->t_enqueue > warn && now - r->t_cached > warn) {
      HORA_WARN(ENGINE, "tensor '%.300s': held for %.0f s: a member of a group of %u of which this rank has "
                "submitted %u (hora_set_call_group); none is negotiated until all are",
                r->name, now - r->t_enqueue, (unsigned)r->p.gsize, (unsigned)have);
      r->t_cached = now;
    }
    *htail = r;
    htail = &r->qnext;
  }
  return out;
}

/* Drain the submission queue into the pending table. A name already pending on this rank fails
 * the new request (checked here, on the engine thread, which owns the table). */
static void drain(hora_engine_t *eng, double now) {
  pthread_mutex_lock(&eng->mu);
  eng_req_t *q = eng->qhead;
  eng->qhead = eng->qtail = NULL;
  pthread_mutex_unlock(&eng->mu);
  if (q || eng->held) q = hold_incomplete_groups(eng, q, now);
  while (q) {
    eng_req_t *r = q;
    q = q->qnext;
    r->qnext = NULL;
    r->state = REQ_NEW;
    r->cache_pos = -1;
    if (r->p.kind == ENG_JOIN) {
      if (eng->joined) {
        hora__handle_member_done(r->h, HORA_ERR_INVALID_ARGUMENT, "hora_join: this rank has already joined");
        hora__req_free(r);
        continue;
      }
      eng->joined = 1;
      eng->join_req = r;
      continue;
    }
    if (hora__eng_table_get(&eng->pending, r->name)) {
      char msg[1200];
      snprintf(msg, sizeof msg, "tensor '%.1000s': a request with this name is already pending on this rank", r->name);
      HORA_WARN(ENGINE, "%s", msg);
      hora__handle_member_done(r->h, HORA_ERR_INVALID_ARGUMENT, msg);
      hora__req_free(r);
      continue;
    }
    if (hora__eng_table_put(&eng->pending, r) != HORA_SUCCESS) {
      hora__handle_member_done(r->h, HORA_ERR_NO_MEMORY, "engine: out of memory for the pending table");
      hora__req_free(r);
      continue;
    }
    int pos = hora__cache_find(&eng->cache, r->name);
    if (pos >= 0) {
      r->state = REQ_CACHED;
      r->cache_pos = pos;
      r->t_cached = now;
    }
  }
}

/* One cycle's working set, shared by its rounds. */
typedef struct {
  hora_engine_t *eng;
  double now;
  int cap, cw;         /* cache slots and 64-bit words per bit set */
  size_t nw;           /* words in the bit vector: 1 + 2 * cw */
  uint64_t *bits;      /* word 0 flags, then the hit bits, then the valid bits */
  eng_req_t **reqs;    /* this rank's pending requests */
  size_t nreq;
  eng_resp_t *list;    /* what runs this cycle, in order */
  size_t nlist;
} cycle_t;

#define HIT(c) ((c)->bits + 1)
#define VALID(c) ((c)->bits + 1 + (c)->cw)

/* Step 1, local part: this rank's hit and valid bits and flags. */
static void bits_fill(cycle_t *c) {
  hora_engine_t *eng = c->eng;
  uint64_t *hit = HIT(c), *valid = VALID(c);
  for (int w = 0; w < c->cw; w++) valid[w] = ~0ull;
  int any_new = eng->join_req && eng->join_req->state == REQ_NEW;
  for (size_t i = 0; i < c->nreq; i++) {
    eng_req_t *r = c->reqs[i];
    if (r->state == REQ_CACHED) {
      int pos = hora__cache_find(&eng->cache, r->name);
      if (pos < 0) {
        r->state = REQ_NEW;
      } else if (!hora__eng_params_equal(&eng->cache.e[pos].p, &r->p) ||
                 (eng->stall_fallback_s > 0 && c->now - r->t_cached > eng->stall_fallback_s) ||
                 (eng->any_joined && !is_joinable(&r->p))) {
        /* Other parameters, waited too long for the others (let rank 0 see it: stall report),
         * or a rank has joined (rank 0 must answer non-allreduce requests): erase everywhere. */
        valid[pos / 64] &= ~(1ull << (pos % 64));
        r->state = REQ_NEW;
      } else {
        r->cache_pos = pos;
        hit[pos / 64] |= 1ull << (pos % 64);
      }
    }
    if (r->state == REQ_NEW) any_new = 1;
  }
  if (eng->joined)
    for (int s = 0; s < c->cap; s++)
      if (eng->cache.e[s].name && is_joinable(&eng->cache.e[s].p)) hit[s / 64] |= 1ull << (s % 64);
  int want_slow = any_new || (eng->rank == 0 && eng->noutbox > 0);
  uint64_t flags = 0;
  if (!want_slow) flags |= F_NO_SLOW;
  pthread_mutex_lock(&eng->mu);
  int stopping = eng->stop_requested;
  if (stopping) flags |= F_WANT_STOP;
  if (!(stopping && c->nreq == 0 && !eng->joined)) flags |= F_NOT_DONE;
  pthread_mutex_unlock(&eng->mu);
  if (c->nreq == 0 && !eng->joined) flags |= F_IDLE;
  if (!eng->joined) flags |= F_NOT_JOINED;
  else flags |= F_JOINED;
  c->bits[0] = flags;
}

/* Step 1, the exchange: AND of every rank's bit vector, in place. */
static hora_result_t bits_exchange(cycle_t *c) {
  hora_engine_t *eng = c->eng;
  if (eng->size <= 1) return HORA_SUCCESS;
  MPI_Request mr;
  int mrc = MPI_Iallreduce(MPI_IN_PLACE, c->bits, (int)c->nw, MPI_UINT64_T, MPI_BAND, eng->comm, &mr);
  if (mrc != MPI_SUCCESS)
    return hora__mpi_error(mrc, "MPI_Iallreduce(engine bit vector)", __FILE__, __LINE__);
  return hora__engine_mpi_wait(eng, &mr, "the engine's bit-vector allreduce");
}

/* Step 1, applied: erase the slots some rank invalidated (every rank, same cycle; their requests
 * go to rank 0), then list the slots every rank hit, in slot order. */
static hora_result_t bits_apply(cycle_t *c) {
  hora_engine_t *eng = c->eng;
  uint64_t *hit = HIT(c), *valid = VALID(c), flags = c->bits[0];
  for (int s = 0; s < c->cap; s++) {
    if (valid[s / 64] & (1ull << (s % 64))) continue;
    for (size_t i = 0; i < c->nreq; i++)
      if (c->reqs[i]->state == REQ_CACHED && c->reqs[i]->cache_pos == s) c->reqs[i]->state = REQ_NEW;
    hora__cache_erase(&eng->cache, s);
  }
  if (flags & F_JOINED) /* every rank joined: the hits would all be zeros from everyone */
    for (int w = 0; w < c->cw; w++) hit[w] = 0;
  size_t nhits = 0;
  for (int s = 0; s < c->cap; s++)
    if ((hit[s / 64] & valid[s / 64]) & (1ull << (s % 64))) nhits++;
  c->list = calloc(nhits + 1, sizeof *c->list);
  if (!c->list) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
  for (int s = 0; s < c->cap; s++) {
    if (!((hit[s / 64] & valid[s / 64]) & (1ull << (s % 64)))) continue;
    eng_resp_t *x = &c->list[c->nlist];
    x->name = strdup(eng->cache.e[s].name);
    if (!x->name) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
    x->p = eng->cache.e[s].p;
    eng_req_t *r = hora__eng_table_get(&eng->pending, x->name);
    x->req = (r && r->state == REQ_CACHED && r->cache_pos == s) ? r : NULL;
    if (x->req) x->req->t_negotiate = x->req->t_cached;
    hora__cache_touch(&eng->cache, s);
    c->nlist++;
  }
  atomic_fetch_add(&eng->stat_cache_hits, c->nlist);
  return HORA_SUCCESS;
}

/* Step 2, every rank: serialize the requests the cache did not answer (and a new join). */
static hora_result_t coord_pack_new(cycle_t *c, buf_t *out) {
  hora_engine_t *eng = c->eng;
  for (size_t i = 0; i < c->nreq; i++) {
    eng_req_t *r = c->reqs[i];
    if (r->state != REQ_NEW) continue;
    put_str(out, r->name);
    put(out, &r->p, sizeof r->p);
    r->state = REQ_SENT;
    r->t_negotiate = c->now;
  }
  if (eng->join_req && eng->join_req->state == REQ_NEW) {
    eng_params_t jp = {.kind = ENG_JOIN, .root = -1};
    put_str(out, "");
    put(out, &jp, sizeof jp);
    eng->join_req->state = REQ_SENT;
  }
  if (out->oom) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
  return HORA_SUCCESS;
}

/* Step 2: gather every rank's new requests at rank 0 (sizes, then bytes). On rank 0 *gathered,
 * *sizes and *displs are allocated (the caller frees them). */
static hora_result_t coord_gather(cycle_t *c, const buf_t *out, char **gathered, int **sizes,
                                  int **displs) {
  hora_engine_t *eng = c->eng;
  int mine = (int)out->n, n = eng->size;
  if (eng->rank == 0) {
    *sizes = calloc((size_t)n, sizeof **sizes);
    *displs = calloc((size_t)n, sizeof **displs);
    if (!*sizes || !*displs) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
  }
  MPI_Request mr;
  int mrc = MPI_Igather(&mine, 1, MPI_INT, *sizes, 1, MPI_INT, 0, eng->comm, &mr);
  if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, "MPI_Igather(engine sizes)", __FILE__, __LINE__);
  HORA_CHECK(hora__engine_mpi_wait(eng, &mr, "gathering new tensor names at rank 0"));
  if (eng->rank == 0) {
    size_t total = 0;
    for (int r = 0; r < n; r++) {
      (*displs)[r] = (int)total;
      total += (size_t)(*sizes)[r];
    }
    *gathered = malloc(total ? total : 1);
    if (!*gathered) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
  }
  mrc = MPI_Igatherv(out->p, mine, MPI_BYTE, *gathered, *sizes, *displs, MPI_BYTE, 0, eng->comm, &mr);
  if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, "MPI_Igatherv(engine requests)", __FILE__, __LINE__);
  return hora__engine_mpi_wait(eng, &mr, "gathering new tensor names at rank 0");
}

/* Step 2, rank 0: feed the gathered requests to the coordinator (coord.c) and serialize its
 * responses into *resp (emptying the outbox). */
static hora_result_t coord_decide(cycle_t *c, const char *gathered, const int *sizes,
                                  const int *displs, buf_t *resp) {
  hora_engine_t *eng = c->eng;
  for (int r = 0; r < eng->size; r++) {
    rd_t rd = {gathered + displs[r], (size_t)sizes[r], 0, 0};
    while (rd.off < rd.n && !rd.bad) {
      char *name = get_str(&rd);
      eng_params_t p;
      if (!name || !get(&rd, &p, sizeof p)) {
        free(name);
        break;
      }
      HORA_CHECK(hora__coord_add(eng, r, name, &p, c->now));
    }
    if (rd.bad) return HORA_ERR(HORA_ERR_INTERNAL, "engine: malformed request list from rank %d", r);
  }
  HORA_CHECK(hora__coord_ready(eng));
  for (size_t i = 0; i < eng->noutbox; i++) {
    eng_wire_resp_t *w = &eng->outbox[i];
    put_str(resp, w->name);
    put(resp, &w->p, sizeof w->p);
    int32_t wrc = (int32_t)w->rc;
    put(resp, &wrc, sizeof wrc);
    put_str(resp, w->msg);
    free(w->name);
    free(w->msg);
  }
  eng->noutbox = 0;
  if (resp->oom) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
  return HORA_SUCCESS;
}

/* Step 2: rank 0's responses to every rank (size, then bytes); *rsize is their length. */
static hora_result_t coord_bcast(cycle_t *c, buf_t *resp, uint64_t *rsize) {
  hora_engine_t *eng = c->eng;
  MPI_Request mr;
  *rsize = eng->rank == 0 ? resp->n : 0;
  int mrc = MPI_Ibcast(rsize, 1, MPI_UINT64_T, 0, eng->comm, &mr);
  if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, "MPI_Ibcast(engine responses)", __FILE__, __LINE__);
  HORA_CHECK(hora__engine_mpi_wait(eng, &mr, "receiving rank 0's responses"));
  if (eng->rank != 0) {
    resp->p = malloc(*rsize ? *rsize : 1);
    if (!resp->p) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
    resp->n = *rsize;
  }
  if (*rsize > (uint64_t)INT32_MAX)
    return HORA_ERR(HORA_ERR_INTERNAL, "engine: response list of %llu bytes", (unsigned long long)*rsize);
  if (!*rsize) return HORA_SUCCESS;
  mrc = MPI_Ibcast(resp->p, (int)*rsize, MPI_BYTE, 0, eng->comm, &mr);
  if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, "MPI_Ibcast(engine responses)", __FILE__, __LINE__);
  return hora__engine_mpi_wait(eng, &mr, "receiving rank 0's responses");
}

/* Rank 0 has answered this rank's join: the join completes. */
static void join_done(hora_engine_t *eng, const eng_params_t *p) {
  if (eng->join_req) {
    eng->join_req->h->last_rank = p->root; /* read by hora_join after the wait */
    hora__handle_member_done(eng->join_req->h, HORA_SUCCESS, NULL);
    hora__req_free(eng->join_req);
    eng->join_req = NULL;
  }
  eng->joined = 0;
}

/* Rank 0 failed group `key` (its ranks disagree on the members: coord.c): every pending member
 * of it on this rank fails now, in whatever state (sent to rank 0, or on the cache fast path,
 * where a member only some ranks submitted would otherwise wait forever). None of them is on
 * this cycle's run list (a cached name runs only when every rank holds it with the same
 * parameters, and the ranks' keys differ); checked anyway. */
static void group_fail(cycle_t *c, uint64_t key, const char *why) {
  hora_engine_t *eng = c->eng;
  if (eng->rank == 0) HORA_WARN(ENGINE, "%s: every member of the group fails", why);
  for (;;) { /* one at a time: finishing a request changes the table */
    eng_req_t *hit = NULL;
    for (size_t b = 0; b < eng->pending.nb && !hit; b++)
      for (eng_req_t *r = eng->pending.b[b]; r && !hit; r = r->hnext) {
        if (!r->p.gsize || r->p.group != key) continue;
        int running = 0;
        for (size_t k = 0; k < c->nlist && !running; k++) running = c->list[k].req == r;
        if (!running) hit = r;
      }
    if (!hit) return;
    char msg[1024];
    snprintf(msg, sizeof msg, "tensor '%.200s': a member of a grouped call whose ranks disagree on its tensors (%.700s)",
             hit->name, why);
    hora__req_finish(eng, hit, HORA_ERR_MISMATCH, msg);
  }
}

/* Step 2, every rank: apply the responses in order: failures complete requests, successes are
 * cached and appended to the run list. */
static hora_result_t coord_apply(cycle_t *c, const char *resp, uint64_t rsize) {
  hora_engine_t *eng = c->eng;
  rd_t rd = {resp, (size_t)rsize, 0, 0};
  while (rd.off < rd.n) {
    eng_params_t p;
    int32_t wrc;
    char *name = get_str(&rd);
    if (!name) break;
    char *msg = NULL;
    if (!get(&rd, &p, sizeof p) || !get(&rd, &wrc, sizeof wrc) || !(msg = get_str(&rd))) {
      free(name);
      break;
    }
    if (p.kind == ENG_JOIN) {
      join_done(eng, &p);
      free(name);
      free(msg);
      continue;
    }
    if (p.kind == ENG_GROUP_FAIL) {
      group_fail(c, p.group, msg);
      free(name);
      free(msg);
      continue;
    }
    eng_req_t *r = hora__eng_table_get(&eng->pending, name);
    if (r && r->state != REQ_SENT) r = NULL;
    if (wrc != HORA_SUCCESS) {
      if (eng->rank == 0) HORA_WARN(ENGINE, "%s", msg);
      if (r) hora__req_finish(eng, r, (hora_result_t)wrc, msg);
      free(name);
      free(msg);
      continue;
    }
    free(msg);
    if (c->cap > 0 && hora__cache_put(&eng->cache, name, &p) < 0) {
      free(name);
      return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory in the response cache");
    }
    eng_resp_t *nl = realloc(c->list, (c->nlist + 1) * sizeof *c->list);
    if (!nl) {
      free(name);
      return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
    }
    c->list = nl;
    c->list[c->nlist].name = name;
    c->list[c->nlist].p = p;
    c->list[c->nlist].req = r;
    c->nlist++;
  }
  if (rd.bad) return HORA_ERR(HORA_ERR_INTERNAL, "engine: malformed response list from rank 0");
  return HORA_SUCCESS;
}

/* Step 2 as a whole: the round trip to rank 0. */
static hora_result_t coord_round(cycle_t *c) {
  hora_engine_t *eng = c->eng;
  hora_result_t rc = HORA_SUCCESS;
  buf_t out = {0}, resp = {0};
  char *gathered = NULL;
  int *sizes = NULL, *displs = NULL;
  uint64_t rsize = 0;
  atomic_fetch_add(&eng->stat_slow_cycles, 1);
  HORA_CHECK_GOTO(coord_pack_new(c, &out), rc, done);
  HORA_CHECK_GOTO(coord_gather(c, &out, &gathered, &sizes, &displs), rc, done);
  if (eng->rank == 0) HORA_CHECK_GOTO(coord_decide(c, gathered, sizes, displs, &resp), rc, done);
  HORA_CHECK_GOTO(coord_bcast(c, &resp, &rsize), rc, done);
  HORA_CHECK_GOTO(coord_apply(c, resp.p, rsize), rc, done);
done:
  /* An abandoned MPI request (eng->abandoned: a wait given up after a peer was declared dead)
   * may still write into these buffers whenever any thread next enters MPI: leak them. */
  if (eng->abandoned) return rc;
  free(out.p);
  free(resp.p);
  free(gathered);
  free(sizes);
  free(displs);
  return rc;
}

hora_result_t hora__negotiate(hora_engine_t *eng, eng_resp_t **run_list, size_t *nrun, int *stop,
                              int *all_idle) {
  hora_result_t rc = HORA_SUCCESS;
  cycle_t c = {.eng = eng, .now = hora__now_s(), .cap = eng->cache.cap};
  c.cw = (c.cap + 63) / 64;
  c.nw = 1 + 2 * (size_t)c.cw;
  c.bits = calloc(c.nw, sizeof *c.bits);
  *run_list = NULL;
  *nrun = 0;
  *stop = 0;
  *all_idle = 0;
  if (!c.bits) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");

  drain(eng, c.now);
  if (eng->rank == 0) hora__stall_check(eng, c.now);
  HORA_CHECK_GOTO(collect(eng, &c.reqs, &c.nreq), rc, done);

  /* ---- step 1: the bit vector ---- */
  bits_fill(&c);
  HORA_CHECK_GOTO(bits_exchange(&c), rc, done);
  uint64_t flags = c.bits[0];
  *stop = (flags & F_WANT_STOP) != 0 || (flags & F_NOT_DONE) == 0;
  *all_idle = (flags & F_IDLE) != 0;
  eng->any_joined = !(flags & F_NOT_JOINED);
  HORA_CHECK_GOTO(bits_apply(&c), rc, done);

  /* ---- step 2: rank 0 coordination ---- */
  if (!(flags & F_NO_SLOW)) HORA_CHECK_GOTO(coord_round(&c), rc, done);

done:
  if (rc == HORA_SUCCESS) {
    *run_list = c.list;
    *nrun = c.nlist;
  } else {
    for (size_t i = 0; i < c.nlist; i++) free(c.list[i].name);
    free(c.list);
  }
  free(c.reqs);
  if (!eng->abandoned) free(c.bits); /* a late bit vector may still land in it: see coord_round */
  return rc;
}
