/* Peer death detection (HORA_PEER_TIMEOUT_S, HORA_INIT_TIMEOUT_S): a rank that dies must not
 * leave the others hanging (Horovod #642). Open MPI 4.1 has no fault tolerance: a collective with
 * a dead peer never returns. So a separate thread, on its own duplicated communicator, exchanges
 * tiny heartbeat messages in a star around rank 0:
 *
 *     rank 1 ──hb──▶ rank 0 ──hb──▶ rank 1        every period = timeout / 6 (10 ms .. 1 s)
 *     rank 2 ──hb──▶   │    ──hb──▶ rank 2
 *                       └── rank r silent for `timeout` s: DEAD(r) ──▶ every other rank
 *
 * Rank 0 watches every rank, the others watch rank 0. When a rank is declared dead, every live
 * rank completes all its pending handles with HORA_ERR_REMOTE naming that rank, and later async
 * calls fail the same way (hora__engine_fail); the program then exits and launch (or mpirun/srun)
 * ends the job. A rank that is stopped (SIGSTOP) or stuck in a loop with its threads starved
 * looks the same as a dead one: that is intended.
 *
 * Start-up is not steady state. Open MPI opens its TCP connections lazily, on the first message
 * between two ranks, and with many ranks or a loaded node that first message can take longer
 * than the steady-state timeout. So a peer is never declared dead before it has been heard from
 * once: until then the limit is HORA_INIT_TIMEOUT_S (default 300 s), counted from the start of
 * this thread, and the message says start-up and names every rank not heard from yet. Only after
 * the first heartbeat from a peer does HORA_PEER_TIMEOUT_S apply to it.
 *
 * Why MPI and not a socket of our own: the path must not depend on the MPI progress of a busy
 * rank, and it does not. Open MPI (ob1 PML, TCP/vader BTLs, MPI_THREAD_MULTIPLE) progresses every
 * message on whichever thread calls into MPI; this thread's own MPI_Test calls, every few tens of
 * ms, move its heartbeats on both ends, whatever the training thread does (compute without any
 * MPI call, or a blocking collective: Open MPI holds no lock across a blocking wait that would
 * keep another thread from progressing). Its messages travel on a communicator of its own, so
 * they never match the engine's or the program's traffic, and every call it makes is
 * non-blocking, so it cannot hang on a dead peer. A UDP side channel would add address
 * discovery, interface choice and packet loss for no gain; what it would avoid (the first TCP
 * connection taking long) is what HORA_INIT_TIMEOUT_S is for. The thread sleeps between polls,
 * so on an oversubscribed node it needs only a slice of a core every few tens of ms, which the
 * scheduler gives a sleeper promptly (checked: 4 ranks on 2 cores training flat out for 30 min,
 * docs/design.md).
 *
 * A rank whose engine fails by itself (an MPI error), and every rank that learns of a failure
 * (it declared a peer dead, or rank 0 told it), stops sending heartbeats, so that the ranks that
 * may wait for it in a collective it will never finish fail too instead of hanging: the rank
 * declared dead may only have been slow, and it learns of the failure from everyone's silence.
 *
 * Shutdown: each rank sends BYE after its last heartbeat; messages between two ranks arrive in
 * order, so once a rank has BYE from every peer it watches, nothing more is in flight on the
 * communicator and it can be freed. After a failure the communicator and the receive buffer are
 * leaked: a message may still be on its way into them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fault.h"
#include "engine/engine.h"

enum { TAG_HB = 1, TAG_DEAD = 2, TAG_BYE = 3, TAG_DEAD_INIT = 4 };

struct eng_hb {
  hora_engine_t *eng;
  MPI_Comm comm;
  pthread_t thread;
  int started;
  atomic_int stop;
  atomic_int mute; /* stop sending heartbeats (this rank's engine failed): peers will notice */
  int leak;        /* a receive could not be cancelled: rbuf may still be written */
  double timeout_s, init_timeout_s, period_s;
  int rbuf[2];     /* received: {rank, count} of DEAD / DEAD_INIT */
  int sbuf[2];     /* sent: the same (heartbeats and BYE send it too; the content is ignored) */
};

/* Per-thread state of the watcher. */
typedef struct {
  double *last;   /* last message from each rank */
  uint8_t *heard; /* at least one message from the rank */
  uint8_t *bye;
  MPI_Request *sreq;
  int nbye, npeers, declared;
  double t0;      /* start of the thread: HORA_INIT_TIMEOUT_S counts from here */
  double max_gap, first_max; /* longest silence of a heard peer; latest first contact */
  int max_gap_rank, first_max_rank;
} hb_state_t;

static void nap(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static int watches(int me, int r) { return r != me && (me == 0 || r == 0); }

/* Rank 0: tell every other rank which rank died (`tag` DEAD or DEAD_INIT, {rank, count}). The
 * requests are released at once; hb->sbuf stays valid (hb is leaked after a failure). */
static void tell_others(eng_hb_t *hb, int tag, int r, int count) {
  hb->sbuf[0] = r;
  hb->sbuf[1] = count;
  for (int q = 1; q < hb->eng->size; q++) {
    if (q == r) continue;
    MPI_Request x;
    if (MPI_Isend(hb->sbuf, 2, MPI_INT, q, tag, hb->comm, &x) == MPI_SUCCESS) MPI_Request_free(&x);
  }
}

/* Start-up limit passed with some watched ranks never heard from: one message naming them. */
static void declare_init(eng_hb_t *hb, hb_state_t *s) {
  hora_engine_t *eng = hb->eng;
  char list[160] = "";
  size_t len = 0;
  int count = 0, first = -1;
  for (int r = 0; r < eng->size; r++) {
    if (!watches(eng->rank, r) || s->heard[r] || s->bye[r]) continue;
    if (first < 0) first = r;
    count++;
    if (len < sizeof list - 24)
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", count > 1 ? ", " : "", r);
    else if (len < sizeof list - 1)
      len += (size_t)snprintf(list + len, sizeof list - len, ", ...");
  }
  if (first < 0) return;
  s->declared = 1;
  if (eng->rank == 0) tell_others(hb, TAG_DEAD_INIT, first, count);
  hora__engine_fail(eng, HORA_ERR_REMOTE,
                    "start-up: no heartbeat from rank%s %s within HORA_INIT_TIMEOUT_S=%g s of "
                    "hora_init (%d of %d ranks): %s did not start, crashed, or cannot reach rank %d "
                    "over MPI; every pending and later async operation fails",
                    count > 1 ? "s" : "", list, hb->init_timeout_s, count, eng->size,
                    count > 1 ? "they" : "it", eng->rank);
}

/* A message arrived: note it; DEAD from rank 0 fails this rank's engine. */
static void on_message(eng_hb_t *hb, hb_state_t *s, const MPI_Status *st, double now, int stopping) {
  hora_engine_t *eng = hb->eng;
  int from = st->MPI_SOURCE, n = eng->size;
  if (from < 0 || from >= n) return;
  if (s->heard[from] && now - s->last[from] > s->max_gap) {
    s->max_gap = now - s->last[from];
    s->max_gap_rank = from;
  } else if (!s->heard[from] && now - s->t0 > s->first_max) {
    s->first_max = now - s->t0;
    s->first_max_rank = from;
  }
  s->last[from] = now;
  s->heard[from] = 1;
  if (st->MPI_TAG == TAG_BYE && !s->bye[from]) {
    s->bye[from] = 1;
    s->nbye++;
  } else if ((st->MPI_TAG == TAG_DEAD || st->MPI_TAG == TAG_DEAD_INIT) && !s->declared && !stopping) {
    s->declared = 1;
    if (st->MPI_TAG == TAG_DEAD)
      hora__engine_fail(eng, HORA_ERR_REMOTE,
                        "rank %d sent no heartbeat to rank 0 for %g s (HORA_PEER_TIMEOUT_S): it died "
                        "or hangs; every pending and later async operation fails", hb->rbuf[0], hb->timeout_s);
    else
      hora__engine_fail(eng, HORA_ERR_REMOTE,
                        "start-up: rank 0 heard nothing from rank %d%s within HORA_INIT_TIMEOUT_S=%g s of "
                        "hora_init (%d rank%s silent; rank 0's log names them): every pending and "
                        "later async operation fails", hb->rbuf[0], hb->rbuf[1] > 1 ? " and others" : "",
                        hb->init_timeout_s, hb->rbuf[1], hb->rbuf[1] > 1 ? "s" : "");
  }
}

/* Steady-state and start-up limits; declares at most once. */
static void check_peers(eng_hb_t *hb, hb_state_t *s, double now) {
  hora_engine_t *eng = hb->eng;
  if (s->declared || atomic_load(&eng->dead)) return;
  int unheard = 0;
  for (int r = 0; r < eng->size; r++) {
    if (!watches(eng->rank, r) || s->bye[r]) continue;
    if (!s->heard[r]) {
      unheard = 1;
      continue;
    }
    if (now - s->last[r] <= hb->timeout_s) continue;
    s->declared = 1;
    if (eng->rank == 0) tell_others(hb, TAG_DEAD, r, 1);
    hora__engine_fail(eng, HORA_ERR_REMOTE,
                      "rank %d sent no heartbeat for %g s (HORA_PEER_TIMEOUT_S): it died or hangs; "
                      "every pending and later async operation fails", r, hb->timeout_s);
    return;
  }
  if (unheard && hb->init_timeout_s > 0 && now - s->t0 > hb->init_timeout_s) declare_init(hb, s);
}

/* Send one heartbeat (or BYE) to every watched peer whose previous send is done. */
static void send_all(eng_hb_t *hb, hb_state_t *s, int tag) {
  for (int r = 0; r < hb->eng->size; r++) {
    if (!watches(hb->eng->rank, r)) continue;
    int done = 1;
    if (s->sreq[r] != MPI_REQUEST_NULL) MPI_Test(&s->sreq[r], &done, MPI_STATUS_IGNORE);
    if (!done && tag == TAG_BYE) {
      /* BYE must follow the last heartbeat: release the old send (ordered before) and go on. */
      MPI_Request_free(&s->sreq[r]);
      done = 1;
    }
    if (done) MPI_Isend(hb->sbuf, 2, MPI_INT, r, tag, hb->comm, &s->sreq[r]);
  }
}

static void *hb_main(void *arg) {
  eng_hb_t *hb = arg;
  hora_engine_t *eng = hb->eng;
  int me = eng->rank, n = eng->size;
  hb_state_t s = {0};
  s.npeers = me == 0 ? n - 1 : 1;
  s.last = calloc((size_t)n, sizeof *s.last);
  s.heard = calloc((size_t)n, 1);
  s.bye = calloc((size_t)n, 1);
  s.sreq = calloc((size_t)n, sizeof *s.sreq);
  MPI_Request rreq = MPI_REQUEST_NULL;
  if (!s.last || !s.heard || !s.bye || !s.sreq) goto out;
  double now = hora__now_s(), next_send = now, stop_deadline = 0;
  s.t0 = now;
  for (int r = 0; r < n; r++) s.sreq[r] = MPI_REQUEST_NULL;
  int src = me == 0 ? MPI_ANY_SOURCE : 0, stopping = 0;
  if (MPI_Irecv(hb->rbuf, 2, MPI_INT, src, MPI_ANY_TAG, hb->comm, &rreq) != MPI_SUCCESS) goto out;
  for (;;) {
    now = hora__now_s();
    for (;;) { /* everything that has arrived */
      int flag = 0;
      MPI_Status st;
      if (MPI_Test(&rreq, &flag, &st) != MPI_SUCCESS || !flag) break;
      on_message(hb, &s, &st, now, stopping);
      if (s.nbye >= s.npeers) break;
      if (MPI_Irecv(hb->rbuf, 2, MPI_INT, src, MPI_ANY_TAG, hb->comm, &rreq) != MPI_SUCCESS) goto out;
    }
    if (stopping) {
      if (s.nbye >= s.npeers || now > stop_deadline) break;
    } else if (atomic_load(&hb->stop)) {
      /* Last message to each watched peer: BYE, ordered after every heartbeat. A rank that failed
       * (its engine failed, it declared a peer dead, or a test muted it) leaves without: its
       * peers must notice its silence and fail too, not take it for a clean exit. */
      if (atomic_load(&hb->mute) || hora__fault_muted() || atomic_load(&eng->dead)) break;
      stopping = 1;
      stop_deadline = now + 5.0;
      send_all(hb, &s, TAG_BYE);
      if (s.nbye >= s.npeers) break;
      continue;
    } else {
      /* Silent after any failure: a rank that knows the job failed must make the ranks that do
       * not know yet (the one declared dead may be alive, waiting for us) fail too. */
      if (now >= next_send && !atomic_load(&hb->mute) && !hora__fault_muted() && !atomic_load(&eng->dead)) {
        send_all(hb, &s, TAG_HB);
        next_send = now + hb->period_s;
      }
      check_peers(hb, &s, now);
    }
    nap(hb->period_s / 4 < 0.05 ? hb->period_s / 4 : 0.05);
  }
out:
  /* The margins: how close this run came to a false death (docs/design.md, the load test). */
  HORA_INFO(ENGINE, "heartbeat: longest silence %.3f s (rank %d; HORA_PEER_TIMEOUT_S=%g), latest first "
            "heartbeat %.3f s after start (rank %d; HORA_INIT_TIMEOUT_S=%g)", s.max_gap, s.max_gap_rank,
            hb->timeout_s, s.first_max, s.first_max_rank, hb->init_timeout_s);
  /* A receive still posted is cancelled (if that fails, rbuf may still be written: hb_stop leaks
   * hb); unfinished sends are released (they read hb->sbuf, which stays while they may). */
  if (rreq != MPI_REQUEST_NULL) {
    MPI_Status st;
    int cancelled = 0;
    MPI_Cancel(&rreq);
    MPI_Wait(&rreq, &st); /* a cancelled or matched receive completes locally */
    MPI_Test_cancelled(&st, &cancelled);
    (void)cancelled;
  }
  for (int r = 0; s.sreq && r < n; r++)
    if (s.sreq[r] != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&s.sreq[r], &done, MPI_STATUS_IGNORE);
      if (!done) {
        MPI_Request_free(&s.sreq[r]);
        hb->leak = 1;
      }
    }
  free(s.last);
  free(s.heard);
  free(s.bye);
  free(s.sreq);
  return NULL;
}

hora_result_t hora__hb_start(hora_engine_t *eng, eng_hb_t **out) {
  *out = NULL;
  if (eng->size == 1) return HORA_SUCCESS;
  eng_hb_t *hb = calloc(1, sizeof *hb);
  if (!hb) return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_init: out of memory");
  hb->eng = eng;
  hb->timeout_s = eng->prm.peer_timeout_s;
  hb->init_timeout_s = eng->prm.init_timeout_s;
  double p = hb->timeout_s / 6;
  hb->period_s = p < 0.01 ? 0.01 : p > 1.0 ? 1.0 : p;
  int rc = MPI_Comm_dup(eng->ctx->world, &hb->comm);
  if (rc != MPI_SUCCESS) {
    free(hb);
    return hora__mpi_error(rc, "MPI_Comm_dup(heartbeat)", __FILE__, __LINE__);
  }
  MPI_Comm_set_errhandler(hb->comm, MPI_ERRORS_RETURN);
  if (hb->timeout_s > 0) {
    if (pthread_create(&hb->thread, NULL, hb_main, hb) != 0) {
      MPI_Comm_free(&hb->comm);
      free(hb);
      return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_init: cannot create the heartbeat thread");
    }
    hb->started = 1;
  }
  *out = hb;
  return HORA_SUCCESS;
}

void hora__hb_mute(eng_hb_t *hb) {
  if (hb) atomic_store(&hb->mute, 1);
}

void hora__hb_stop(eng_hb_t *hb) {
  if (!hb) return;
  atomic_store(&hb->stop, 1);
  if (hb->started) pthread_join(hb->thread, NULL);
  /* After a failure messages may still be in flight into hb's buffers and on the communicator:
   * keep both (a few bytes) rather than free memory MPI may still write. */
  if (atomic_load(&hb->eng->dead) || hb->leak) return;
  MPI_Comm_free(&hb->comm);
  free(hb);
}
