/* Peer death detection (HORA_PEER_TIMEOUT_S, HORA_INIT_TIMEOUT_S): a rank that dies must not
 * leave the others hanging (Horovod #642). Open MPI 4.1 has no fault tolerance: a collective with
 * a dead peer never returns. So a separate thread exchanges tiny UDP datagrams in a star around
 * rank 0:
 *
 *     rank 1 ──hb──▶ rank 0 ──hb──▶ rank 1        every period = timeout / 6 (10 ms .. 1 s)
 *     rank 2 ──hb──▶   │    ──hb──▶ rank 2
 *                       └── rank r silent for `timeout` s: DEAD(r) ──▶ every other rank
 *
 * Rank 0 watches every rank, the others watch rank 0. When a rank is declared dead, every live
 * rank completes all its pending handles with HORA_ERR_REMOTE naming that rank, and later async
 * calls fail the same way (hora__engine_fail); that also sets the context's verdict
 * (hora__ctx_fail), which every wait of a blocking collective watches, so a blocking call in
 * progress and every later one return it too; the program then exits and launch (or mpirun/srun)
 * ends the job. A rank that is stopped (SIGSTOP) or stuck in a loop with its threads starved
 * looks the same as a dead one: that is intended.
 *
 * Why UDP and not MPI: the heartbeat must not depend on the MPI progress of a busy rank, nor on
 * MPI's connections. The first version sent MPI messages on a communicator of its own, and it gave
 * false deaths: rank 0's heartbeat sends to two ranks stopped completing for 30 s in the middle of
 * a 4-ranks-on-2-cores training run (a small send completes only when the transport moves it:
 * behind the engine's own traffic to the same peer, in the same shared-memory queue or TCP
 * connection), and at start-up Open MPI opens its TCP connections lazily, on the first message,
 * which with many ranks or a loaded node takes longer than the timeout (issue 20). A datagram
 * needs neither: the kernel delivers it into the peer's socket buffer whatever the peer's threads
 * do, and the peer's heartbeat thread, which sleeps in poll() on that socket alone, reads it. At
 * init each rank binds a UDP socket on every interface (port chosen by the kernel) and the ranks
 * exchange their IPv4 addresses and ports with one MPI_Allgather; a rank then sends each datagram
 * to every address of the peer that is not also one of its own (a bridge address every node has
 * says nothing), and to 127.0.0.1 when both ranks run on the same host. Every datagram carries
 * the job's cookie (rank 0's random nonce) and the sender's rank; anything else is ignored. A
 * lost datagram costs nothing: six go out per timeout, and DEAD and BYE are sent three times.
 *
 * Start-up is not steady state: a peer is never declared dead before its first datagram has
 * arrived. Until then the limit is HORA_INIT_TIMEOUT_S (default 300 s), counted from the start of
 * this thread, and the message says start-up and names every rank not heard from yet (they did
 * not start, or UDP from them cannot reach this rank: a firewall between the nodes). Only after
 * the first heartbeat from a peer does HORA_PEER_TIMEOUT_S apply to it, and hora_init waits for
 * that first heartbeat of every watched rank (wait_first_contact), so that a peer that stops
 * right after start-up is not watched with the start-up limit.
 *
 * The datagrams also carry the blocking-call counts of the context (struct hora_calls, core/ctx.h):
 * each heartbeat to rank 0 the sender's count of entered calls, each of rank 0's heartbeats the
 * rank with the fewest (the stall inspection of the call check across nodes names it), and
 * hora_finalize sends FIN to every rank with its count of completed calls: a rank inside, or
 * entering, a call above that number waits for a rank that will never come, and fails
 * (check_outside) instead of hanging.
 *
 * A rank whose engine fails by itself (an MPI error), and every rank that learns of a failure
 * (it declared a peer dead, or rank 0 told it), stops sending heartbeats, so that the ranks that
 * may wait for it in a collective it will never finish fail too instead of hanging: the rank
 * declared dead may only have been slow, and it learns of the failure from everyone's silence.
 *
 * Shutdown: at hora_finalize each rank sends BYE (unless it failed: its peers must notice its
 * silence instead), and a peer that said BYE is no longer watched. Nothing MPI is in flight, so
 * nothing needs to be kept after a failure: the socket is closed and the state freed. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/fatal.h"
#include "core/fault.h"
#include "engine/engine.h"

enum { KIND_HB = 1, KIND_DEAD = 2, KIND_BYE = 3, KIND_DEAD_INIT = 4, KIND_FIN = 5, KIND_SET_HB = 6, KIND_SET_LAG = 7,
       REPEAT = 3, MAX_ADDRS = 8 };

/* One datagram (host byte order: a job's ranks share an architecture). */
typedef struct {
  uint64_t cookie;
  int32_t from, kind, a, b; /* DEAD / DEAD_INIT: a = rank, b = count; FIN: a = 0 (the context) or
                             * 1 + a process-set slot; SET_HB / SET_LAG: a = the slot */
  uint64_t c; /* HB and SET_HB to rank 0: the sender's entered calls; HB and SET_LAG from rank 0: its
               * lag view; FIN: done calls (struct hora_calls, core/ctx.h) */
} hb_msg_t;

/* What each rank tells the others at start: where to send it datagrams. */
typedef struct {
  uint64_t nonce;
  uint32_t addr[MAX_ADDRS]; /* IPv4, network byte order, loopback excluded */
  int32_t naddr;
  uint16_t port;            /* network byte order */
  char host[64];
} hb_card_t;

typedef struct {
  struct sockaddr_in to[MAX_ADDRS + 1];
  int n;
} hb_dest_t;

struct eng_hb {
  hora_engine_t *eng;
  int sock;
  uint64_t cookie;
  hb_dest_t *dest; /* per rank */
  pthread_t thread;
  int started;
  atomic_int stop;
  atomic_int mute; /* stop sending heartbeats (this rank's engine failed): peers will notice */
  atomic_int ready; /* every watched rank heard from (or it said BYE): hora_init may return */
  struct hora_calls *calls; /* the context's blocking-call counts (NULL: not the root context) */
  double timeout_s, init_timeout_s, period_s;
};

/* Per-thread state of the watcher. */
typedef struct {
  double *last;   /* last message from each rank */
  uint8_t *heard; /* at least one message from the rank */
  uint8_t *bye;
  uint64_t *entered; /* rank 0: each rank's entered calls, from its heartbeats */
  /* Rank 0, per process-set slot (allocated on its first SET_HB): each member's entered calls and
   * when they came; entries older than three periods are left out (a set destroyed, a slot
   * reused). */
  uint64_t *set_entered[HORA_SET_SLOTS];
  double *set_seen[HORA_SET_SLOTS];
  int declared;
  double t0;      /* start of the thread: HORA_INIT_TIMEOUT_S counts from here */
  double max_gap, first_max; /* longest silence of a heard peer; latest first contact */
  double max_stall;          /* longest turn of the loop (this thread not running) */
  int max_gap_rank, first_max_rank;
} hb_state_t;

static int watches(int me, int r) { return r != me && (me == 0 || r == 0); }

static void send_to(eng_hb_t *hb, int r, int kind, int a, int b, uint64_t c) {
  hb_msg_t m = {hb->cookie, hb->eng->rank, kind, a, b, c};
  for (int i = 0; i < hb->dest[r].n; i++)
    (void)sendto(hb->sock, &m, sizeof m, MSG_DONTWAIT, (const struct sockaddr *)&hb->dest[r].to[i],
                 sizeof hb->dest[r].to[i]);
}

/* Rank 0: tell every other rank which rank died (KIND_DEAD or KIND_DEAD_INIT, {rank, count}). */
static void tell_others(eng_hb_t *hb, int kind, int r, int count) {
  for (int k = 0; k < REPEAT; k++)
    for (int q = 1; q < hb->eng->size; q++)
      if (q != r) send_to(hb, q, kind, r, count, 0);
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
  if (eng->rank == 0) tell_others(hb, KIND_DEAD_INIT, first, count);
  hora__engine_fail(eng, HORA_ERR_REMOTE,
                    "start-up: no heartbeat from rank%s %s within HORA_INIT_TIMEOUT_S=%g s of "
                    "hora_init (%d of %d ranks): %s did not start, crashed, or cannot send UDP to rank "
                    "%d (a firewall between the nodes?); every pending and later call fails",
                    count > 1 ? "s" : "", list, hb->init_timeout_s, count, eng->size,
                    count > 1 ? "they" : "it", eng->rank);
}

/* Rank 0: member `r` of the set in `slot` entered `entered` calls (heard at `now`). */
static void set_note(hb_state_t *s, int n, int slot, int r, uint64_t entered, double now) {
  if (!s->set_entered[slot]) {
    s->set_entered[slot] = calloc((size_t)n, sizeof *s->set_entered[slot]);
    s->set_seen[slot] = malloc((size_t)n * sizeof *s->set_seen[slot]);
    if (!s->set_entered[slot] || !s->set_seen[slot]) {
      free(s->set_entered[slot]);
      free(s->set_seen[slot]);
      s->set_entered[slot] = NULL, s->set_seen[slot] = NULL;
      return; /* out of memory: this set's stall inspection names nobody */
    }
    for (int q = 0; q < n; q++) s->set_seen[slot][q] = -1e300;
  }
  s->set_entered[slot][r] = entered;
  s->set_seen[slot][r] = now;
}

/* A datagram from `from` arrived: note it; DEAD from rank 0 fails this rank's engine. */
static void on_message(eng_hb_t *hb, hb_state_t *s, const hb_msg_t *m, double now) {
  hora_engine_t *eng = hb->eng;
  int from = m->from;
  int watched = watches(eng->rank, from); /* the margins are about the watched ranks only */
  if (watched && s->heard[from] && now - s->last[from] > s->max_gap) {
    s->max_gap = now - s->last[from];
    s->max_gap_rank = from;
  } else if (watched && !s->heard[from] && now - s->t0 > s->first_max) {
    s->first_max = now - s->t0;
    s->first_max_rank = from;
  }
  s->last[from] = now;
  s->heard[from] = 1;
  if (m->kind == KIND_HB && hb->calls) {
    if (eng->rank == 0) s->entered[from] = m->c;
    else if (from == 0) __atomic_store_n(&hb->calls->lag, m->c, __ATOMIC_RELEASE);
  } else if (m->kind == KIND_FIN && hb->calls && m->a >= 0 && m->a <= HORA_SET_SLOTS) {
    /* Keep the announcement with the fewest done calls (the first to bite); a set's only while
     * this rank's set holds the slot. */
    struct hora_calls *k = &hb->calls[m->a];
    uint64_t fin = m->c << 24 | (uint64_t)(from + 1), old = __atomic_load_n(&k->fin, __ATOMIC_ACQUIRE);
    if ((m->a == 0 || __atomic_load_n(&k->live, __ATOMIC_ACQUIRE)) && (!old || (old >> 24) > m->c))
      __atomic_store_n(&k->fin, fin, __ATOMIC_RELEASE);
  } else if (m->kind == KIND_SET_HB && hb->calls && eng->rank == 0 && m->a >= 0 && m->a < HORA_SET_SLOTS) {
    set_note(s, eng->size, m->a, from, m->c, now);
  } else if (m->kind == KIND_SET_LAG && hb->calls && from == 0 && m->a >= 0 && m->a < HORA_SET_SLOTS) {
    struct hora_calls *k = &hb->calls[1 + m->a];
    if (__atomic_load_n(&k->live, __ATOMIC_ACQUIRE)) __atomic_store_n(&k->lag, m->c, __ATOMIC_RELEASE);
  }
  if (m->kind == KIND_BYE) {
    s->bye[from] = 1;
  } else if ((m->kind == KIND_DEAD || m->kind == KIND_DEAD_INIT) && from == 0 && !s->declared) {
    s->declared = 1;
    HORA_INFO(ENGINE, "heartbeat: rank 0 declared rank %d dead; longest stall of this thread %.3f s", (int)m->a,
              s->max_stall);
    if (m->kind == KIND_DEAD)
      hora__engine_fail(eng, HORA_ERR_REMOTE,
                        "rank %d sent no heartbeat to rank 0 for %g s (HORA_PEER_TIMEOUT_S): it died "
                        "or hangs; every pending and later call fails", (int)m->a, hb->timeout_s);
    else
      hora__engine_fail(eng, HORA_ERR_REMOTE,
                        "start-up: rank 0 heard nothing from rank %d%s within HORA_INIT_TIMEOUT_S=%g s of "
                        "hora_init (%d rank%s silent; rank 0's log names them): every pending and "
                        "later call fails", (int)m->a, m->b > 1 ? " and others" : "",
                        hb->init_timeout_s, (int)m->b, m->b > 1 ? "s" : "");
  }
}

/* Steady-state and start-up limits; declares at most once. `upto`: silences count until then
 * (`now`, or the start of this thread's pause while it has just woken from one: hb_main). */
static void check_peers(eng_hb_t *hb, hb_state_t *s, double now, double upto) {
  hora_engine_t *eng = hb->eng;
  if (s->declared || atomic_load(&eng->dead)) return;
  int unheard = 0;
  for (int r = 0; r < eng->size; r++) {
    if (!watches(eng->rank, r) || s->bye[r]) continue;
    if (!s->heard[r]) {
      unheard = 1;
      continue;
    }
    if (now - s->last[r] <= hb->timeout_s || upto - s->last[r] <= hb->timeout_s) continue;
    s->declared = 1;
    /* The margins at the verdict (the program may exit without hora_finalize, which logs them
     * again): a stall of this thread delays the verdict by as long (tests/engine/peer_test.py). */
    HORA_INFO(ENGINE, "heartbeat: rank %d declared dead after %.3f s of silence; longest stall of this thread %.3f s",
              r, now - s->last[r], s->max_stall);
    if (eng->rank == 0) tell_others(hb, KIND_DEAD, r, 1);
    hora__engine_fail(eng, HORA_ERR_REMOTE,
                      "rank %d sent no heartbeat for %g s (HORA_PEER_TIMEOUT_S): it died or hangs; "
                      "every pending and later call fails", r, hb->timeout_s);
    return;
  }
  if (unheard && hb->init_timeout_s > 0 && now - s->t0 > hb->init_timeout_s) declare_init(hb, s);
}

/* Every watched rank heard from (or gone with BYE): what hora_init waits for (hora__hb_start). */
static void note_ready(eng_hb_t *hb, const hb_state_t *s) {
  if (atomic_load(&hb->ready)) return;
  for (int r = 0; r < hb->eng->size; r++)
    if (watches(hb->eng->rank, r) && !s->heard[r] && !s->bye[r]) return;
  atomic_store(&hb->ready, 1);
}

/* Rank 0: the rank that entered the fewest blocking calls, how many ranks entered that few (its
 * own count included), packed for its heartbeats and for its own stall inspection. */
/* The rank with the fewest entered calls among those that did not say BYE (and, with `seen`, were
 * heard since `since`), packed (hora__calls_lag_pack); 0 when there is none. */
static uint64_t lowest(const hb_state_t *s, int n, const uint64_t *entered, const double *seen, double since) {
  uint64_t low = UINT64_MAX;
  int low_rank = -1, low_count = 0;
  for (int r = 0; r < n; r++) {
    if (s->bye[r] || (seen && seen[r] < since)) continue;
    if (entered[r] < low) low = entered[r], low_rank = r, low_count = 0;
    low_count += entered[r] == low;
  }
  return low_rank < 0 ? 0 : hora__calls_lag_pack(low, low_rank, low_count);
}

static uint64_t lag_view(eng_hb_t *hb, hb_state_t *s) {
  s->entered[0] = __atomic_load_n(&hb->calls->entered, __ATOMIC_ACQUIRE);
  uint64_t v = lowest(s, hb->eng->size, s->entered, NULL, 0);
  __atomic_store_n(&hb->calls->lag, v, __ATOMIC_RELEASE);
  return v;
}

/* Failures that come from outside this thread: a peer's hora_finalize announcement (KIND_FIN) when
 * this rank is in, or enters, a blocking call that the peer never completed, and a verdict that the
 * algorithm layer set on the context (a stall across nodes ended a call): both fail the engine,
 * whose silence then tells the peers. */
static void check_outside(eng_hb_t *hb, hb_state_t *s) {
  hora_engine_t *eng = hb->eng;
  if (atomic_load(&eng->dead)) return;
  if (hora__ctx_failed(eng->ctx)) {
    s->declared = 1;
    hora__engine_fail(eng, eng->ctx->verdict->rc, "%s", eng->ctx->verdict->msg);
    return;
  }
  for (int k = 0; hb->calls && k <= HORA_SET_SLOTS; k++) {
    struct hora_calls *c = &hb->calls[k];
    if (k > 0 && !__atomic_load_n(&c->live, __ATOMIC_ACQUIRE)) continue;
    uint64_t fin = __atomic_load_n(&c->fin, __ATOMIC_ACQUIRE);
    if (!fin) continue;
    /* Only while this rank is inside a call (entered > its own done) that the peer never finished;
     * between calls nothing waits, and the next call, numbered higher, fails here then. */
    uint64_t done = fin >> 24, entered = __atomic_load_n(&c->entered, __ATOMIC_ACQUIRE);
    if (entered <= done || entered <= __atomic_load_n(&c->done, __ATOMIC_ACQUIRE)) continue;
    s->declared = 1;
    hora__engine_fail(eng, HORA_ERR_REMOTE,
                      "rank %d called hora_finalize after completing %llu blocking collective%s on %s, so it "
                      "will never join this rank's call number %llu there (it skipped that call or left it with "
                      "an error of its own: its log says which); every pending and later call fails",
                      (int)(fin & 0xffffff) - 1, (unsigned long long)done, done == 1 ? "" : "s",
                      k ? c->what : "this context", (unsigned long long)entered);
    return;
  }
}

/* Each heartbeat period, for the process sets (core/ctx.h, HORA_SET_SLOTS): every rank sends rank
 * 0 its entered calls on each set it is in (SET_HB); rank 0 relays, per slot, the member that
 * entered the fewest (SET_LAG), which the stall inspection across nodes of that set names, as
 * KIND_HB does for the context itself. */
static void set_heartbeats(eng_hb_t *hb, hb_state_t *s, double now) {
  hora_engine_t *eng = hb->eng;
  for (int k = 0; hb->calls && k < HORA_SET_SLOTS; k++) {
    struct hora_calls *c = &hb->calls[1 + k];
    int live = __atomic_load_n(&c->live, __ATOMIC_ACQUIRE);
    uint64_t entered = live ? __atomic_load_n(&c->entered, __ATOMIC_ACQUIRE) : 0;
    if (eng->rank != 0) {
      if (live) send_to(hb, 0, KIND_SET_HB, k, 0, entered);
      continue;
    }
    if (live) set_note(s, eng->size, k, 0, entered, now);
    if (!s->set_entered[k]) continue;
    uint64_t v = lowest(s, eng->size, s->set_entered[k], s->set_seen[k], now - 3 * hb->period_s);
    if (!v) continue;
    if (live) __atomic_store_n(&c->lag, v, __ATOMIC_RELEASE);
    for (int r = 1; r < eng->size; r++) send_to(hb, r, KIND_SET_LAG, k, 0, v);
  }
}

/* Read every datagram waiting on the socket. */
static void drain(eng_hb_t *hb, hb_state_t *s, double now) {
  for (;;) {
    hb_msg_t m;
    ssize_t got = recv(hb->sock, &m, sizeof m, MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return; /* EAGAIN: nothing more (errors from earlier sends also land here) */
    if (got != (ssize_t)sizeof m || m.cookie != hb->cookie || m.from < 0 || m.from >= hb->eng->size ||
        m.from == hb->eng->rank)
      continue; /* not ours */
    on_message(hb, s, &m, now);
  }
}

static void *hb_main(void *arg) {
  hora__thread_name("hora-heartbeat");
  eng_hb_t *hb = arg;
  hora_engine_t *eng = hb->eng;
  int me = eng->rank, n = eng->size;
  hb_state_t s = {0};
  s.last = calloc((size_t)n, sizeof *s.last);
  s.heard = calloc((size_t)n, 1);
  s.bye = calloc((size_t)n, 1);
  s.entered = calloc((size_t)n, sizeof *s.entered);
  if (!s.last || !s.heard || !s.bye || !s.entered) goto out;
  double now = hora__now_s(), next_send = now, prev = now;
  s.t0 = now;
  const int poll_ms = (int)(1000 * (hb->period_s / 4 < 0.05 ? hb->period_s / 4 : 0.05)) + 1;
  /* A turn of this loop longer than a period means this thread did not run: the process or the
   * whole machine was stopped or not scheduled (on the development VM, runnable threads sat on the
   * run queue for seconds behind polling ranks of other sessions: docs/design.md). Nothing could be heard in that time, and peers
   * stopped with it sent nothing, so on waking (`woke`) a silence that began during the pause is
   * not held against a peer until it has had `grace` to be heard again (it sends at once on its
   * own waking): without this, every rank declared every other dead on waking. A peer already
   * silent for the whole timeout before the pause began is declared at once, so a thread slowed
   * by load (many long turns) still finds a dead peer within one turn of the timeout. */
  const double grace = hb->period_s + 2 * poll_ms / 1000.0;
  double woke = -1e300;
  for (;;) {
    now = hora__now_s();
    double turn = now - prev, began = prev;
    prev = now;
    if (turn > s.max_stall) s.max_stall = turn;
    if (turn > hb->period_s) woke = now;
    drain(hb, &s, now);
    int failed = atomic_load(&hb->mute) || hora__fault_muted() || atomic_load(&eng->dead) ||
                 hora__ctx_failed(eng->ctx);
    if (atomic_load(&hb->stop)) {
      /* BYE to each watched peer, unless this rank failed: then its silence must be noticed. */
      for (int k = 0; k < REPEAT && !failed; k++)
        for (int r = 0; r < n; r++)
          if (watches(me, r)) send_to(hb, r, KIND_BYE, 0, 0, 0);
      break;
    }
    /* Silent after any failure: a rank that knows the job failed must make the ranks that do not
     * know yet (the one declared dead may be alive, waiting for us) fail too. */
    if (now >= next_send && !failed) {
      uint64_t c = !hb->calls ? 0 : me == 0 ? lag_view(hb, &s) : __atomic_load_n(&hb->calls->entered, __ATOMIC_ACQUIRE);
      for (int r = 0; r < n; r++)
        if (watches(me, r)) send_to(hb, r, KIND_HB, 0, 0, c);
      set_heartbeats(hb, &s, now);
      next_send = now + hb->period_s;
    }
    check_peers(hb, &s, now, now < woke + grace ? began : now);
    check_outside(hb, &s);
    note_ready(hb, &s);
    struct pollfd pfd = {hb->sock, POLLIN, 0};
    (void)poll(&pfd, 1, poll_ms);
  }
out:
  /* The margins: how close this run came to a false death (docs/design.md, the load test). */
  HORA_INFO(ENGINE, "heartbeat: longest silence %.3f s (rank %d; HORA_PEER_TIMEOUT_S=%g), latest first "
            "heartbeat %.3f s after start (rank %d; HORA_INIT_TIMEOUT_S=%g), longest stall of this thread "
            "%.3f s (a pause over one period, %g s, gives the peers a grace to be heard first)", s.max_gap,
            s.max_gap_rank, hb->timeout_s, s.first_max, s.first_max_rank, hb->init_timeout_s, s.max_stall,
            hb->period_s);
  free(s.last);
  free(s.heard);
  free(s.bye);
  free(s.entered);
  for (int k = 0; k < HORA_SET_SLOTS; k++) {
    free(s.set_entered[k]);
    free(s.set_seen[k]);
  }
  atomic_store(&hb->ready, 1); /* nobody waits for a thread that left */
  return NULL;
}

/* This rank's card: a UDP socket bound on every interface, its port, its IPv4 addresses. */
static hora_result_t open_socket(eng_hb_t *hb, hb_card_t *card) {
  memset(card, 0, sizeof *card);
  hb->sock = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (hb->sock < 0) return HORA_ERR(HORA_ERR_IO, "hora_init: heartbeat socket: %s", strerror(errno));
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  if (bind(hb->sock, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(hb->sock, (struct sockaddr *)&a, &len) != 0)
    return HORA_ERR(HORA_ERR_IO, "hora_init: heartbeat socket: bind: %s", strerror(errno));
  card->port = a.sin_port;
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) == 0) {
    for (struct ifaddrs *i = ifs; i && card->naddr < MAX_ADDRS; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
          (i->ifa_flags & IFF_LOOPBACK))
        continue;
      card->addr[card->naddr++] = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
    }
    freeifaddrs(ifs);
  }
  if (gethostname(card->host, sizeof card->host - 1) != 0) snprintf(card->host, sizeof card->host, "?");
  uint64_t nonce = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(hora__now_s() * 1e9);
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &nonce, sizeof nonce) != (ssize_t)sizeof nonce) nonce ^= (uint64_t)fd;
    close(fd);
  }
  card->nonce = nonce;
  return HORA_SUCCESS;
}

/* Where to send rank r's datagrams: its addresses that are not also ours, and loopback when it
 * runs on this host (or has no other address). */
static void plan_dest(hb_dest_t *d, const hb_card_t *me, const hb_card_t *peer) {
  d->n = 0;
  for (int i = 0; i < peer->naddr && i < MAX_ADDRS; i++) {
    int mine = 0;
    for (int j = 0; j < me->naddr; j++) mine |= me->addr[j] == peer->addr[i];
    if (mine && strcmp(me->host, peer->host) != 0) continue;
    d->to[d->n].sin_family = AF_INET;
    d->to[d->n].sin_port = peer->port;
    d->to[d->n].sin_addr.s_addr = peer->addr[i];
    d->n++;
  }
  if (d->n == 0 || strcmp(me->host, peer->host) == 0) {
    d->to[d->n].sin_family = AF_INET;
    d->to[d->n].sin_port = peer->port;
    d->to[d->n].sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    d->n++;
  }
}

static void hb_free(eng_hb_t *hb) {
  if (hb->sock >= 0) close(hb->sock);
  free(hb->dest);
  free(hb);
}

/* hora_init returns only once every rank this one watches has been heard from, so that from then
 * on HORA_PEER_TIMEOUT_S applies to every peer: a peer that stops right after start-up is found
 * in that time, not after HORA_INIT_TIMEOUT_S. The first datagrams go out as the threads start, so
 * this costs one exchange; a peer not heard from within HORA_INIT_TIMEOUT_S fails hora_init with
 * the start-up message (declare_init). */
static hora_result_t wait_first_contact(eng_hb_t *hb) {
  hora_engine_t *eng = hb->eng;
  while (!atomic_load(&hb->ready) && !atomic_load(&eng->dead)) {
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
  }
  if (!atomic_load(&eng->dead)) return HORA_SUCCESS;
  pthread_mutex_lock(&eng->mu);
  hora_result_t rc = HORA_ERR(eng->fail_rc, "hora_init: %s", eng->dead_msg);
  pthread_mutex_unlock(&eng->mu);
  return rc;
}

/* Collective over the world (inside hora_init): every rank's card to every rank. */
hora_result_t hora__hb_start(hora_engine_t *eng, eng_hb_t **out) {
  *out = NULL;
  if (eng->size == 1) return HORA_SUCCESS;
  eng_hb_t *hb = calloc(1, sizeof *hb);
  hb_card_t *cards = calloc((size_t)eng->size, sizeof *cards);
  hora_result_t rc = HORA_SUCCESS;
  if (hb) hb->sock = -1;
  if (hb) hb->dest = calloc((size_t)eng->size, sizeof *hb->dest);
  if (!hb || !cards || !hb->dest) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "hora_init: out of memory");
    goto fail;
  }
  hb->eng = eng;
  hb->calls = eng->ctx->calls;
  hb->timeout_s = eng->prm.peer_timeout_s;
  hb->init_timeout_s = eng->prm.init_timeout_s;
  double p = hb->timeout_s / 6;
  hb->period_s = p < 0.01 ? 0.01 : p > 1.0 ? 1.0 : p;
  hb_card_t me;
  hora_result_t orc = open_socket(hb, &me);
  /* Every rank takes part in the exchange, also one whose socket failed (naddr -1): the others
   * must not wait for it, and all fail together. */
  if (orc != HORA_SUCCESS) me.naddr = -1;
  hora__init_step("the heartbeat's address exchange (MPI_Allgather)");
  int mrc = MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, cards, (int)sizeof me, MPI_BYTE, eng->ctx->world);
  if (mrc != MPI_SUCCESS) {
    rc = hora__mpi_error(mrc, "MPI_Allgather(heartbeat addresses)", __FILE__, __LINE__);
    goto fail;
  }
  for (int r = 0; r < eng->size; r++)
    if (cards[r].naddr < 0) {
      rc = orc != HORA_SUCCESS ? orc
                               : HORA_ERR(HORA_ERR_IO, "hora_init: rank %d could not open its heartbeat socket", r);
      goto fail;
    }
  hb->cookie = cards[0].nonce;
  for (int r = 0; r < eng->size; r++)
    if (r != eng->rank) plan_dest(&hb->dest[r], &me, &cards[r]);
  free(cards);
  cards = NULL;
  /* HORA_PEER_TIMEOUT_S=0: no heartbeats (the exchange above still ran: a collective every rank
   * makes, whatever its own setting). */
  if (hb->timeout_s > 0 && pthread_create(&hb->thread, NULL, hb_main, hb) != 0) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "hora_init: cannot create the heartbeat thread");
    goto fail;
  }
  hb->started = hb->timeout_s > 0;
  hora__init_step("the first heartbeat of every peer (HORA_INIT_TIMEOUT_S bounds it)");
  if (hb->started && hb->init_timeout_s > 0 && (rc = wait_first_contact(hb)) != HORA_SUCCESS) {
    hora__hb_mute(hb);
    hora__hb_stop(hb);
    return rc;
  }
  *out = hb;
  return HORA_SUCCESS;
fail:
  free(cards);
  if (hb) hb_free(hb);
  return rc;
}

void hora__hb_mute(eng_hb_t *hb) {
  if (hb) atomic_store(&hb->mute, 1);
}

void hora__hb_announce_finalize(eng_hb_t *hb) {
  /* After a failure the peers learn it from this rank's silence, with the real cause. */
  if (!hb || !hb->started || !hb->calls || hora__ctx_failed(hb->eng->ctx)) return;
  /* The context's done calls (a = 0), then each live process set's (a = 1 + its slot). */
  for (int s = 0; s <= HORA_SET_SLOTS; s++) {
    struct hora_calls *c = &hb->calls[s];
    if (s > 0 && !__atomic_load_n(&c->live, __ATOMIC_ACQUIRE)) continue;
    uint64_t done = __atomic_load_n(&c->done, __ATOMIC_ACQUIRE);
    for (int k = 0; k < REPEAT; k++)
      for (int r = 0; r < hb->eng->size; r++)
        if (r != hb->eng->rank) send_to(hb, r, KIND_FIN, s, 0, done);
  }
}

void hora__hb_stop(eng_hb_t *hb) {
  if (!hb) return;
  atomic_store(&hb->stop, 1);
  if (hb->started) pthread_join(hb->thread, NULL);
  hb_free(hb);
}
