/* The async engine's internal types, shared by its files:
 *
 *   api.c        public *_async calls: check arguments, build requests, push them on the queue
 *   queue.c      handles, the submission queue, this rank's table of pending requests
 *   engine.c     the background thread: start at hora_init, the cycle, stop at hora_finalize
 *   negotiate.c  one cycle's agreement: the bit-vector allreduce and rank 0's round trip
 *   coord.c      rank 0's table of names, agreement (mismatch) checks, responses
 *   cache.c      the response cache (identical on every rank)
 *   fusion.c     grouping of ready responses, pack/unpack, running the collectives
 *   stall.c      rank 0's stall inspector (warnings and HORA_STALL_SHUTDOWN_S)
 *   heartbeat.c  peer death detection (HORA_PEER_TIMEOUT_S, HORA_INIT_TIMEOUT_S)
 *   timeline.c   the Chrome-trace timeline (HORA_TIMELINE)
 *
 * Ownership: the user's threads own a request until it is on the queue; from then on only the
 * engine thread touches it (and frees it). Handles are shared: the user holds one reference,
 * the engine one per pending request; the last one frees it. The heartbeat thread never touches
 * requests: when a peer dies it completes the live handles through the handle list. */
#ifndef HORA_ENGINE_ENGINE_H
#define HORA_ENGINE_ENGINE_H

#include <stdatomic.h>
#include <stdio.h>

#include "core/ctx.h"

#define ENG_NAME_MAX 1024 /* bytes including the NUL */

typedef enum {
  ENG_ALLREDUCE = 0,
  ENG_ALLGATHER = 1,
  ENG_ALLGATHERV = 2,
  ENG_BROADCAST = 3,
  ENG_REDUCESCATTER = 4,
  ENG_ALLTOALL = 5,
  ENG_JOIN = 6, /* hora_join: a pseudo-request that only the coordinator sees */
  ENG_GROUP_FAIL = 7, /* a response only: every member of group p.group fails (coord.c) */
  ENG_REFUSED = 8, /* hora_refuse_async: this rank's call of the name failed its own checks;
                    * every rank's request of the name fails (coord.c), nothing runs */
  ENG_KIND_COUNT
} eng_kind_t;

const char *hora__eng_kind_name(int kind); /* "ALLREDUCE", ... (timeline phase names) */

/* What every rank must agree on for one name: the wire form of a request (fixed size; ranks
 * of one job run the same build on the same architecture). */
typedef struct {
  uint8_t kind, dtype, op, device;
  int32_t root;      /* broadcast root; -1 otherwise */
  uint64_t count;    /* elements: count, recvcount (reducescatter), sum of recvcounts (allgatherv) */
  double prescale, postscale;
  uint64_t vhash;    /* allgatherv: hash of recvcounts; 0 otherwise */
  uint64_t shape;    /* hora_set_call_shape's fingerprint (0: not given; compared as a value) */
  uint64_t group;    /* grouped allreduce: a hash of the group's member names and their number
                      * (the same for every member); 0 for a request of its own */
  uint32_t gsize;    /* grouped allreduce: the number of members; 0 otherwise */
} eng_params_t;

int hora__eng_params_equal(const eng_params_t *a, const eng_params_t *b);

/* ---- handles (queue.c) ---- */
struct hora_handle {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;       /* user + one per pending request; the last release frees */
  int remaining;  /* members not yet complete (grouped allreduce: ntensors) */
  int done;
  hora_result_t rc;
  char *msg;      /* detailed message of rc (malloc'd), or NULL */
  struct hora_handle *prev, *next; /* the engine's list of live handles (under eng->mu) */
  atomic_int linked;
  struct hora_engine *eng;
  int last_rank;  /* hora_join's result */
  unsigned fork_gen; /* hora__fork_watch() when made: a fork() child's calls are refused */
};

/* ---- requests ---- */
typedef enum { REQ_NEW = 0, REQ_SENT = 1, REQ_CACHED = 2 } eng_req_state_t;

typedef struct eng_req {
  char *name;
  eng_params_t p;
  const void *send;
  void *recv;
  size_t *recvcounts; /* allgatherv: copy of the world-size array */
  void *ready;        /* hora_set_call_ready's CUDA event (NULL: none), waited for before the data moves */
  hora_handle_t *h;
  double t_enqueue, t_negotiate; /* timeline: queue and negotiation start (s) */
  eng_req_state_t state;
  int cache_pos;
  double t_cached; /* since when it waits on the cache fast path */
  struct eng_req *qnext;  /* submission queue */
  struct eng_req *hnext;  /* pending table bucket chain */
} eng_req_t;

/* A name -> request table (chained hashing; libc's hsearch has one global table and no delete,
 * so the engine keeps its own small one). */
typedef struct {
  eng_req_t **b;
  size_t nb, n;
} eng_table_t;
uint64_t hora__eng_hash(const char *s, size_t len);
eng_req_t *hora__eng_table_get(eng_table_t *t, const char *name);
hora_result_t hora__eng_table_put(eng_table_t *t, eng_req_t *r);
void hora__eng_table_del(eng_table_t *t, eng_req_t *r);

/* ---- response cache (cache.c) ---- */
typedef struct {
  char *name;     /* NULL: free slot */
  eng_params_t p;
  uint64_t stamp; /* LRU order, advanced identically on every rank */
} eng_cache_entry_t;
typedef struct {
  eng_cache_entry_t *e;
  int cap;
  uint64_t clock;
  /* name -> slot: open addressing over 2*cap slots of (slot index + 1), 0 = empty */
  int *idx;
  size_t nidx;
} eng_cache_t;
hora_result_t hora__cache_init(eng_cache_t *c, int cap);
void hora__cache_free(eng_cache_t *c);
int hora__cache_find(const eng_cache_t *c, const char *name); /* slot or -1 */
int hora__cache_put(eng_cache_t *c, const char *name, const eng_params_t *p); /* slot or -1 */
void hora__cache_touch(eng_cache_t *c, int pos);
void hora__cache_erase(eng_cache_t *c, int pos);

/* ---- one executable response (fusion.c) ---- */
typedef struct {
  char *name;     /* owned */
  eng_params_t p;
  eng_req_t *req; /* this rank's request, or NULL when this rank has joined */
} eng_resp_t;

/* ---- coordinator (rank 0) table entry (negotiate.c, stall.c) ---- */
typedef struct eng_coord {
  char *name;
  eng_params_t *p;  /* per rank */
  uint8_t *have;    /* per rank: submitted */
  int nhave;
  double first_seen, last_warn;
  struct eng_coord *next;  /* list in the order names were first seen */
  struct eng_coord *hnext; /* hash chain of eng->cidx */
} eng_coord_t;

/* A response as rank 0 broadcasts it. */
typedef struct {
  char *name;
  eng_params_t p;
  hora_result_t rc;
  char *msg;
} eng_wire_resp_t;

/* ---- timeline (timeline.c) ---- */
typedef struct eng_timeline eng_timeline_t;
/* `what` names the caller in error messages ("HORA_TIMELINE", "hora_timeline_start"). */
hora_result_t hora__timeline_open(const char *what, const char *path, uint64_t max_bytes, int mark_cycles,
                                  eng_timeline_t **out);
/* One complete event ("ph":"X") on the tensor's row; times in s of hora__now_s(). */
void hora__timeline_span(eng_timeline_t *t, const char *tensor, const char *phase, double t0, double t1);
void hora__timeline_cycle(eng_timeline_t *t, double ts, uint64_t cycle);
hora_result_t hora__timeline_close(eng_timeline_t *t);
/* Flush the buffered events if some have waited TL_FLUSH_S (timeline.c): takes eng->tl_mu, and
 * costs one atomic load when no timeline records. Called by the engine thread every cycle and
 * while it waits, so the file holds every completed request within about a second, hung job or
 * not. */
struct hora_engine;
void hora__timeline_poll(struct hora_engine *eng);

/* ---- heartbeat (heartbeat.c) ---- */
typedef struct eng_hb eng_hb_t;
hora_result_t hora__hb_start(struct hora_engine *eng, eng_hb_t **out);
void hora__hb_stop(eng_hb_t *hb); /* sends BYE unless failed, joins the thread, closes the socket */
void hora__hb_mute(eng_hb_t *hb); /* stop sending heartbeats, keep listening */
/* hora_finalize began: tell every other rank (three datagrams each, from the caller's thread) how
 * many blocking calls this rank completed on the context (struct hora_calls), so that a peer
 * inside, or later entering, a call above that number fails with HORA_ERR_REMOTE naming this rank
 * instead of waiting for it. No-op without heartbeats, and after a failure (the peers learn of it
 * from this rank's silence, with its cause). */
void hora__hb_announce_finalize(eng_hb_t *hb);

/* ---- the engine ---- */
typedef struct hora_engine {
  hora_ctx_t *ctx;    /* the user's context */
  hora_ctx_t *shadow; /* a private context on duplicated communicators, for the algorithms */
  MPI_Comm comm;      /* negotiation (dup of the world) */
  int rank, size;
  hora_params_t prm;  /* parameters at start */

  pthread_t thread;
  int thread_started;
  pthread_mutex_t mu;  /* guards the queue, stop flag, handle list, wake */
  pthread_cond_t cv;   /* enqueue / stop wakes the thread */
  eng_req_t *qhead, *qtail;
  int stop_requested;
  int exited;          /* the thread has left its loop */
  int peer_stopped;    /* it left because another rank's hora_finalize began (under mu) */
  int stopped_by;      /* root engine: the lowest rank whose hora_finalize stopped it, -1 unknown */
  pthread_cond_t exit_cv;
  hora_handle_t handles; /* sentinel of the live handle list */

  /* Dead peer: set once by the heartbeat thread (or the engine on a failed MPI call). */
  atomic_int dead;
  char dead_msg[256];
  hora_result_t fail_rc; /* REMOTE, or MPI/INTERNAL if the engine itself failed */
  eng_hb_t *hb;
  int hb_owned; /* 0 on a process set's engine: hb is its root engine's, which it never stops */
  /* Process sets: a set's engine has no heartbeat or timeline of its own; it is registered with
   * its parent context's engine (`up`), whose failure (hora__engine_fail) fails it too. The parent
   * lists its sets' engines in `subs` (guarded by the parent's mu). */
  struct hora_engine *up;
  struct hora_engine **subs;
  size_t nsubs, capsubs;
  /* hora__engine_mpi_wait gave up on a request after the failure: MPI may still read or write
   * its buffers (a nonblocking collective cannot be cancelled, and a peer declared dead may be
   * alive and send). Engine thread only; whoever owns such buffers leaks them instead of freeing. */
  int abandoned;

  /* Engine-thread-only state. */
  eng_table_t pending;  /* this rank's requests by name */
  eng_req_t *held;      /* members of a group (eng_params_t.group) whose other members this rank
                         * has not submitted yet: released together (negotiate.c, drain) */
  size_t npending;
  eng_cache_t cache;
  int joined;           /* this rank called hora_join and waits */
  int any_joined;       /* some rank had joined at the last bit-vector allreduce */
  eng_req_t *join_req;
  eng_coord_t *coord;   /* rank 0: names submitted by some ranks */
  eng_coord_t *coord_tail;
  eng_coord_t **cidx;   /* rank 0: name -> entry (chained hashing, power-of-two buckets) */
  size_t ncidx, ncoord;
  uint8_t *coord_joined; /* rank 0: per rank */
  uint64_t *coord_join_seq;
  uint64_t join_seq;
  eng_wire_resp_t *outbox; /* rank 0: responses to broadcast next slow path */
  size_t noutbox, capoutbox;
  uint64_t cycle;
  int idle_cycles;
  void *fusion;          /* fusion buffer */
  size_t fusion_bytes;
  void *zeros;           /* joined ranks' zero contributions */
  size_t zeros_bytes;
  eng_timeline_t *tl;    /* rank 0 of the root context; guarded by tl_mu (hora_timeline_start swaps it) */
  pthread_mutex_t tl_mu;
  double stall_fallback_s; /* cached requests older than this go to the coordinator */
  /* Counters for tests and logs (written by the engine thread only). */
  _Atomic uint64_t stat_cycles, stat_slow_cycles, stat_cache_hits, stat_fused_groups;
  _Atomic uint64_t stat_sg_groups; /* fused groups reduced without the fusion buffer */
  double last_stall_check;
} hora_engine_t;

/* engine.c */
/* Counters of this context's engine: cycles, cycles with a rank-0 round, responses taken from the
 * cache, fused groups of more than one tensor. For tests. */
hora_result_t hora__engine_stats(hora_ctx_t *ctx, uint64_t *cycles, uint64_t *slow_cycles,
                                 uint64_t *cache_hits, uint64_t *fused_groups);
/* Fused groups that skipped the fusion buffer (the shm scatter-gather path of fusion.c). For tests. */
hora_result_t hora__engine_sg_groups(hora_ctx_t *ctx, uint64_t *sg_groups);
hora_result_t hora__engine_get(hora_ctx_t *ctx, const char *fn, hora_engine_t **out);
/* Fail `rc` with a message for every live handle and mark the engine failed (thread-safe). */
void hora__engine_fail(hora_engine_t *eng, hora_result_t rc, const char *fmt, ...) HORA_PRINTF(3, 4);
/* Wait for an MPI request while watching for a dead peer; HORA_ERR_REMOTE if one died. */
hora_result_t hora__engine_mpi_wait(hora_engine_t *eng, MPI_Request *req, const char *what);

/* queue.c */
hora_result_t hora__handle_new(hora_engine_t *eng, int members, hora_handle_t **out);
/* Complete one member with rc/msg (first error wins); drops the engine's reference. */
void hora__handle_member_done(hora_handle_t *h, hora_result_t rc, const char *msg);
void hora__handle_release(hora_handle_t *h);
/* Push requests (a NULL-terminated chain through qnext) in one step; fails when stopping. */
/* "rank R" for the peer whose hora_finalize announcement arrived (heartbeat.c; "rank R of the
 * parent context" on a process set's engine), else "another rank". Per-thread buffer. */
const char *hora__engine_who_finalized(const hora_engine_t *eng);
hora_result_t hora__engine_submit(hora_engine_t *eng, eng_req_t *first, eng_req_t *last);
void hora__req_free(eng_req_t *r);
/* Complete a request with rc (removing it from the pending table) and free it. */
void hora__req_finish(hora_engine_t *eng, eng_req_t *r, hora_result_t rc, const char *msg);

/* negotiate.c: one cycle. *run_list receives the executable responses in the agreed order;
 * *stop is set when every rank asked to stop. */
hora_result_t hora__negotiate(hora_engine_t *eng, eng_resp_t **run_list, size_t *nrun, int *stop,
                              int *all_idle);
void hora__coord_free(hora_engine_t *eng);

/* fusion.c: run the responses (groups fused), complete their requests. */
hora_result_t hora__fusion_run(hora_engine_t *eng, eng_resp_t *list, size_t n);

/* stall.c: rank 0, once per cycle: warnings and timeout responses. */
void hora__stall_check(hora_engine_t *eng, double now);
/* stall.c: "1,3-5" style list of the ranks whose flag is `want` (flags has size entries). */
void hora__rank_list(const uint8_t *flags, int size, int want, char *out, size_t outsz);
/* negotiate.c: queue a response for the next broadcast (rank 0). */
/* coord.c: record one rank's new request (takes `name`); a JOIN marks the rank joined. */
hora_result_t hora__coord_add(hora_engine_t *eng, int rank, char *name, const eng_params_t *p, double now);
/* coord.c: move every ready name (and a completed join) to the outbox, checking agreement. */
hora_result_t hora__coord_ready(hora_engine_t *eng);
/* Unlink *pp (an entry of eng->coord) from the list and the index, and free it. */
void hora__coord_remove(hora_engine_t *eng, eng_coord_t **pp);
hora_result_t hora__coord_respond(hora_engine_t *eng, const char *name, const eng_params_t *p,
                                  hora_result_t rc, const char *msg);

#endif
