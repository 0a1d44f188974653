/* Peer death detection (HORA_PEER_TIMEOUT_S): a rank that dies must not leave the others hanging
 * (Horovod #642). Open MPI 4.1 has no fault tolerance: a collective with a dead peer never
 * returns. So a separate thread, on its own duplicated communicator, exchanges tiny heartbeat
 * messages in a star around rank 0:
 *
 *     rank 1 ──hb──▶ rank 0 ──hb──▶ rank 1        every period = timeout / 6 (10 ms .. 1 s)
 *     rank 2 ──hb──▶   │    ──hb──▶ rank 2
 *                       └── rank r silent for `timeout` s: DEAD(r) ──▶ every other rank
 *
 * Rank 0 watches every rank, the others watch rank 0. When a rank is declared dead, every live
 * rank completes all its pending handles with HORA_ERR_REMOTE naming that rank, and later async
 * calls fail the same way (hora__engine_fail); the program then exits and mpirun/srun end the
 * job. The thread only makes non-blocking MPI calls, so it cannot hang on the dead peer. A rank
 * that is stopped (SIGSTOP) or stuck in a loop with its threads starved looks the same as a dead
 * one: that is intended.
 *
 * A rank whose engine fails by itself (an MPI error) mutes its heartbeats, so that the other ranks,
 * which may wait for it in a collective it will never finish, fail too instead of hanging.
 *
 * Shutdown: each rank sends BYE after its last heartbeat; messages between two ranks arrive in
 * order, so once a rank has BYE from every peer it watches, nothing more is in flight on the
 * communicator and it can be freed. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"

enum { TAG_HB = 1, TAG_DEAD = 2, TAG_BYE = 3 };

struct eng_hb {
  hora_engine_t *eng;
  MPI_Comm comm;
  pthread_t thread;
  int started;
  atomic_int stop;
  atomic_int mute; /* stop sending heartbeats (this rank's engine failed): peers will notice */
  double timeout_s, period_s;
};

static void nap(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static void *hb_main(void *arg) {
  eng_hb_t *hb = arg;
  hora_engine_t *eng = hb->eng;
  int me = eng->rank, n = eng->size;
  int npeers = me == 0 ? n - 1 : 1;
  double *last = calloc((size_t)n, sizeof *last);
  uint8_t *bye = calloc((size_t)n, 1);
  MPI_Request *sreq = calloc((size_t)n, sizeof *sreq);
  MPI_Request rreq = MPI_REQUEST_NULL;
  int rbuf = 0, sbuf = 0, nbye = 0, declared = 0;
  if (!last || !bye || !sreq) goto out;
  double now = hora__now_s(), next_send = now, stop_deadline = 0;
  for (int r = 0; r < n; r++) {
    last[r] = now;
    sreq[r] = MPI_REQUEST_NULL;
  }
  int src = me == 0 ? MPI_ANY_SOURCE : 0;
  if (MPI_Irecv(&rbuf, 1, MPI_INT, src, MPI_ANY_TAG, hb->comm, &rreq) != MPI_SUCCESS) goto out;
  int stopping = 0;
  for (;;) {
    now = hora__now_s();
    /* Receive everything that has arrived. */
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Test(&rreq, &flag, &st) != MPI_SUCCESS || !flag) break;
      int from = st.MPI_SOURCE;
      if (from >= 0 && from < n) last[from] = now;
      if (st.MPI_TAG == TAG_BYE && from >= 0 && from < n && !bye[from]) {
        bye[from] = 1;
        nbye++;
      } else if (st.MPI_TAG == TAG_DEAD && !declared && !stopping) {
        declared = 1;
        hora__engine_fail(eng, HORA_ERR_REMOTE,
                          "rank %d sent no heartbeat to rank 0 for %g s (HORA_PEER_TIMEOUT_S): it died "
                          "or hangs; every pending and later async operation fails", rbuf, hb->timeout_s);
      }
      if (nbye >= npeers) break;
      if (MPI_Irecv(&rbuf, 1, MPI_INT, src, MPI_ANY_TAG, hb->comm, &rreq) != MPI_SUCCESS) goto out;
    }
    if (stopping) {
      if (nbye >= npeers || now > stop_deadline) break;
    } else if (atomic_load(&hb->stop)) {
      /* Last message to each watched peer: BYE (ordered after every heartbeat). */
      stopping = 1;
      stop_deadline = now + 5.0;
      for (int r = 0; r < n; r++) {
        if (r == me || (me != 0 && r != 0)) continue;
        if (sreq[r] != MPI_REQUEST_NULL) MPI_Wait(&sreq[r], MPI_STATUS_IGNORE);
        MPI_Isend(&sbuf, 1, MPI_INT, r, TAG_BYE, hb->comm, &sreq[r]);
      }
      if (nbye >= npeers) break;
      continue;
    } else {
      if (now >= next_send && !atomic_load(&hb->mute)) {
        for (int r = 0; r < n; r++) {
          if (r == me || (me != 0 && r != 0)) continue;
          int done = 1;
          if (sreq[r] != MPI_REQUEST_NULL) MPI_Test(&sreq[r], &done, MPI_STATUS_IGNORE);
          if (done) MPI_Isend(&sbuf, 1, MPI_INT, r, TAG_HB, hb->comm, &sreq[r]);
        }
        next_send = now + hb->period_s;
      }
      if (!declared && !atomic_load(&eng->dead)) {
        for (int r = 0; r < n; r++) {
          if (r == me || (me != 0 && r != 0) || bye[r]) continue;
          if (now - last[r] <= hb->timeout_s) continue;
          declared = 1;
          if (me == 0) { /* tell everyone else which rank died */
            int *dead = malloc(sizeof *dead);
            for (int q = 1; q < n && dead; q++) {
              if (q == r) continue;
              *dead = r;
              MPI_Request x;
              if (MPI_Isend(dead, 1, MPI_INT, q, TAG_DEAD, hb->comm, &x) == MPI_SUCCESS) MPI_Request_free(&x);
            }
            /* `dead` stays allocated: freed requests may still read it. */
          }
          hora__engine_fail(eng, HORA_ERR_REMOTE,
                            "rank %d sent no heartbeat for %g s (HORA_PEER_TIMEOUT_S): it died or hangs; "
                            "every pending and later async operation fails", r, hb->timeout_s);
          break;
        }
      }
    }
    nap(hb->period_s / 4 < 0.05 ? hb->period_s / 4 : 0.05);
  }
out:
  /* Leftover requests: a receive still posted is cancelled; unfinished sends are released. */
  if (rreq != MPI_REQUEST_NULL) {
    MPI_Cancel(&rreq);
    MPI_Request_free(&rreq);
  }
  for (int r = 0; sreq && r < n; r++)
    if (sreq[r] != MPI_REQUEST_NULL) MPI_Request_free(&sreq[r]);
  free(last);
  free(bye);
  free(sreq);
  return NULL;
}

hora_result_t hora__hb_start(hora_engine_t *eng, eng_hb_t **out) {
  *out = NULL;
  if (eng->size == 1) return HORA_SUCCESS;
  eng_hb_t *hb = calloc(1, sizeof *hb);
  if (!hb) return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_init: out of memory");
  hb->eng = eng;
  hb->timeout_s = eng->prm.peer_timeout_s;
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
  /* After a failure messages may still be in flight: keep the communicator (a few bytes). */
  if (!atomic_load(&hb->eng->dead)) MPI_Comm_free(&hb->comm);
  free(hb);
}
