/* Intra-node allreduce over an MPI-3 shared-memory window (one node: ctx->local == world).
 *
 * Every local rank owns two slots of HORA_SHM_CHUNK_BYTES in one window allocated once per
 * context (MPI_Win_allocate_shared over ctx->local; every rank maps every peer's slots). The
 * buffer is processed in pieces of one slot; a piece is cut into L slices (L local ranks,
 * 64-byte aligned), and local rank l is responsible for slice l:
 *
 *   piece k          slice 0          slice 1          (L = 2, ranks A and B)
 *   copy in     A.slot: [ -- ][ A1 ]     B.slot: [ B0 ][ -- ]     each rank copies the slices
 *                                                                 OTHERS reduce (not its own)
 *   barrier
 *   reduce      A: dst0 = A.src0 + B.slot0     B: dst1 = A.slot1 + B.src1   (one pass over L
 *               A.slot0 = dst0                 B.slot1 = dst1                sources, L2-sized)
 *   barrier (of piece k+1)
 *   copy out    A: dst1 = B.slot1              B: dst0 = A.slot0
 *
 * Slice j always occupies region j of a slot (offset j * chunk/L), whatever the piece's length, so
 * a short last piece or the next call never writes into a region a peer may still be reading.
 * The two slots alternate between pieces, so the copy-out of piece k runs after the barrier that
 * also ends the copy-in of piece k+1: one barrier per piece plus one at the end. (Hazards: a slot
 * is rewritten two pieces later, and every rank has passed the barrier in between only after it
 * finished reading it.) Every slice is reduced by exactly one rank, so all ranks get the same bits.
 *
 * Scatter-gather form (hora__shm_run_segs): the buffer may be a list of segments {src, dst, count}
 * that together form one virtual buffer (the engine's fused tensors, each in its own memory). The
 * pieces, slices, slots and barriers are those of the virtual buffer; only the addresses change:
 *
 *   virtual    |a a a b b b b b c c|      piece 0, L = 2 (ranks A, B; 64-byte alignment ignored):
 *                                        slice 0 = a a a b b, slice 1 = b b b c c
 *   copy in    A.slot region 1 <- A's b.src[2..5) + c.src[0..2)     (one memcpy per run)
 *   reduce     A: a.dst = a.src + B.region0[0..3),  b.dst[0..2) = b.src[0..2) + B.region0[3..5)
 *   copy out   A: b.dst[2..5) <- B.region1[0..3),  c.dst <- B.region1[3..5)
 *
 * A run is the part of a slice that lies within one segment; the reduce and the hook see one run
 * at a time. Peers only ever read slots, never a segment, so no fusion buffer is needed and no
 * pack or unpack copy happens. One contiguous buffer (hora__shm_run) is the one-segment case.
 *
 * Flat form (run_flat; messages up to HORA_SHM_FLAT_BYTES and one slot): each rank copies its whole
 * input into its slot, one barrier, and every rank reduces all L slots in local-rank order itself:
 * one barrier instead of two, L x the bytes read, the same bits on every rank.
 *
 * Call check (hora__shm_run_opts with a descriptor): the blocking allreduce's descriptor is written
 * into the rank's header before its first copy-in and compared right after the first barrier,
 * before anything reaches a recv buffer; on a disagreement every local rank stops there (round
 * advanced alike, whichever form or other checked call each rank was in).
 *
 * Cost model (N bytes, L ranks, memory bandwidth M per core): per rank, copy-in (L-1)/L * N,
 * reduce reads N and writes 2N/L, copy-out (L-1)/L * N: about 3N bytes moved per rank, with no
 * extra copy through MPI's buffers (a ring over MPI's shared-memory transport copies every byte
 * twice per step, and MPI_Allreduce on one node does similar). Pieces stay L2-resident between
 * copy-in, reduce and copy-out, which is what makes small chunks (about 1 MiB) fast. Latency: one
 * barrier per piece (sub-microsecond while spinning, some microseconds once asleep).
 *
 * Waiting: the barrier lives in the window (a generation counter). A waiter spins briefly only
 * when the node has at least one core per local rank, then sleeps on a futex on the counter
 * (shared mapping, so it works across processes): with more ranks than cores (4 ranks on 2
 * cores) busy-waiting would steal the core the last rank needs, so waiters go straight to sleep.
 * MPI_Barrier was measured too (docs/benchmarks.md) and is slower: Open MPI polls its queues.
 * Memory ordering: the counter updates are sequentially consistent atomics, which order the
 * plain loads and stores of the slots on both sides (the window is in MPI's unified model).
 *
 * Helper threads (HORA_SHM_THREADS): the work of a rank between two barriers (copy-out of piece
 * k-1, reduce of piece k, copy-in of piece k+1: run_step) is cut into contiguous parts of every
 * slice (cut(), 64-byte aligned, at least PART_MIN_BYTES) and run by the rank's thread and its
 * helpers at once (algo/pool.c); the barrier waits only after every part is done. The barriers,
 * the call check and the hooks that communicate stay on the calling thread. Each element is still
 * reduced by one thread of one rank, so the bits are those of one thread. */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "algo/algo.h"
#include "algo/coll.h"
#include "algo/futex.h"
#include "hora_kernels.h"

#define HDR_BYTES 4096 /* window header before each rank's slots; rank 0's holds the barrier */
/* In each rank's header: the number of the last call check it entered (1, 2, ...), which the
 * stall inspection reads to name the ranks that have not come (hora__shm_exchange_words). */
#define ENTERED_OFF 512
/* In each rank's header: the result of its part of the last pieces-form call, which the others
 * read after that call's last barrier (run_pieces). */
#define RESULT_OFF 1024
#define SLICE_ALIGN 64
#ifndef SPIN_NS
#define SPIN_NS 20000 /* spin budget of a barrier wait when every local rank has a core */
#endif

typedef struct {
  _Atomic uint32_t arrived; /* ranks that entered the current generation */
  _Atomic uint32_t gen;     /* barrier generation (futex word) */
  _Atomic uint32_t sleepers;
} shm_ctl_t;

struct hora_shm {
  hora_ctx_t *ctx;   /* the context it belongs to: its failure verdict ends a barrier wait */
  MPI_Win win;
  int L, l;          /* local size and rank */
  size_t slot_bytes; /* one slot; each rank has two */
  size_t region;     /* bytes of slice j's region, at j*region in every slot */
  char **slot;       /* slot[j] = rank j's first slot (its second follows) */
  shm_ctl_t *ctl;
  int spin;         /* spin before sleeping (0 when oversubscribed) */
  uint64_t round;    /* pieces done so far (same on every local rank): selects the slot */
  int stream;        /* this call writes its results with streaming stores (HORA_SHM_STREAM_BYTES) */
  uint64_t calls;    /* hora__shm_exchange_words calls so far (same on every local rank) */
  int threads;       /* parts a piece's work may be split into on this rank (HORA_SHM_THREADS) */
  hora_pool_t *pool; /* its threads - 1 helpers, started at the first piece that splits */
};

/* Sense-free generation barrier over the local ranks. A waiter also watches the context's failure
 * verdict (a peer declared dead or stopped by the heartbeat thread): then it leaves with the
 * verdict (HORA_ERR_REMOTE) within one futex timeout, and the barrier is left broken: after a
 * verdict every later call fails at its first wait, and the window is never freed. */
static hora_result_t stall_check(struct hora_shm *s, const char *fn, uint64_t call, double t0, int *warned);

/* Take back this rank's arrival at generation g of the barrier (after a stall timeout), so the
 * barrier stays whole for the next call. 1: left; 0: the barrier completed first (then this rank
 * passed it). The last rank to arrive resets `arrived` to 0 before it bumps `gen`: a 0 seen while
 * gen is still g is that moment, and it ends at once. */
static int leave_barrier(shm_ctl_t *c, uint32_t g) {
  for (;;) {
    if (atomic_load(&c->gen) != g) return 0;
    uint32_t a = atomic_load(&c->arrived);
    if (a == 0) {
      hora__cpu_relax();
      continue;
    }
    if (atomic_compare_exchange_weak(&c->arrived, &a, a - 1)) return 1;
  }
}

/* stall_fn: NULL for the algorithms' barriers; the call check's barrier (hora__shm_exchange_words)
 * passes its collective's name and call number, and a sleeping waiter then also runs the stall
 * inspection (stall_check). */
static hora_result_t shm_barrier_at(struct hora_shm *s, const char *stall_fn, uint64_t call) {
  shm_ctl_t *c = s->ctl;
  /* The verdict names the caller's collective (hora_barrier, through the call check) where there
   * is one: a failed barrier reported as an allreduce misleads the reader. */
  const char *what = stall_fn ? stall_fn : "shm allreduce";
  if (hora__ctx_failed(s->ctx)) return hora__ctx_verdict(s->ctx, what);
  uint32_t g = atomic_load(&c->gen);
  if (atomic_fetch_add(&c->arrived, 1) == (uint32_t)s->L - 1) {
    atomic_store(&c->arrived, 0); /* before the release below: the next generation starts clean */
    atomic_fetch_add(&c->gen, 1);
    if (atomic_load(&c->sleepers)) hora__futex_wake(&c->gen, INT_MAX, 1);
    return HORA_SUCCESS;
  }
  if (s->spin) {
    /* Spin for at most SPIN_NS: a peer that is running arrives within microseconds; one that
     * was descheduled takes a time slice, and sleeping is then cheaper for everybody. */
    double until = hora__now_s() + SPIN_NS * 1e-9;
    for (unsigned i = 1;; i++) {
      if (atomic_load_explicit(&c->gen, memory_order_acquire) != g) return HORA_SUCCESS;
      hora__cpu_relax();
      if ((i & 63) == 0 && hora__now_s() > until) break;
    }
  }
  atomic_fetch_add(&c->sleepers, 1);
  hora_result_t rc = HORA_SUCCESS;
  double t0 = stall_fn ? hora__now_s() : 0;
  int warned = 0;
  while (atomic_load(&c->gen) == g) {
    if (hora__ctx_failed(s->ctx)) {
      rc = hora__ctx_verdict(s->ctx, what);
      break;
    }
    if (stall_fn && (rc = stall_check(s, stall_fn, call, t0, &warned)) != HORA_SUCCESS) {
      if (!leave_barrier(c, g)) rc = HORA_SUCCESS; /* everyone came meanwhile: passed after all */
      break;
    }
    hora__futex_wait(&c->gen, g, 1);
  }
  atomic_fetch_sub(&c->sleepers, 1);
  return rc;
}

static hora_result_t shm_barrier(struct hora_shm *s) { return shm_barrier_at(s, NULL, 0); }


static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

#define MAX_AUTO_THREADS 8
int hora__shm_auto_threads(int node_cpus, int local_size, int own_cpus) {
  int share = node_cpus / (local_size > 0 ? local_size : 1);
  share = share < 1 ? 1 : share > MAX_AUTO_THREADS ? MAX_AUTO_THREADS : share;
  return own_cpus < share ? (own_cpus < 1 ? 1 : own_cpus) : share;
}

/* Threads this rank splits a piece's work over: HORA_SHM_THREADS (1: no helper), or for 0 (the
 * default) hora__shm_auto_threads of this node. Across nodes only hier uses the window, whose hook
 * keeps one thread: 1. */
static int shm_threads(const hora_ctx_t *ctx) {
  int64_t want = hora__params()->shm_threads;
  if (ctx->cross_size > 1) return 1;
  if (want > 0) return (int)want;
  cpu_set_t set;
  CPU_ZERO(&set);
  int own = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return hora__shm_auto_threads(ctx->local_cpus, ctx->local_size, own);
}

/* Room for the window. Open MPI's osc/sm puts a shared window in a file of its
 * osc_sm_backing_directory (/dev/shm on Linux), which a container often holds to 64 MiB (Docker's
 * default --shm-size). When the file does not fit, MPI_Win_allocate_shared fails on the rank that
 * makes it while its peers wait inside the call for ever (seen with a 8 MiB /dev/shm: a hang and
 * one "MPI_ERR_INTERN"). So every local rank measures the free room before the call, the ranks
 * agree on the smallest in the window's watched creation, and the chunk shrinks until the window
 * fits, alike on every rank; if even MIN_FIT_CHUNK does not fit, every local rank fails before the
 * call.
 * The directory: Open MPI's setting as its ranks see it (mpirun's --mca and the environment both
 * arrive as OMPI_MCA_osc_sm_backing_directory), else /dev/shm, Open MPI's default on Linux and
 * where MPICH's shared memory lives too. Not through MPI_T: in Open MPI 4.1 each
 * MPI_T_init_thread/MPI_T_finalize pair opens and closes every component, 208 ms here per window,
 * which slowed the whole test suite by two minutes. */
#define MIN_FIT_CHUNK ((uint64_t)64 << 10)
static const char *backing_dir(void) {
  const char *d = getenv("OMPI_MCA_osc_sm_backing_directory");
  return d && d[0] ? d : "/dev/shm";
}

/* Bytes free in dir for this process; INT64_MAX when unknown (no such directory: MPI uses
 * another place, and MPI_Win_allocate_shared reports its own errors). */
static int64_t room_in(const char *dir) {
  struct statvfs v;
  if (statvfs(dir, &v) != 0) return INT64_MAX;
  long double b = (long double)v.f_bavail * (long double)v.f_frsize;
  return b >= (long double)INT64_MAX ? INT64_MAX : (int64_t)b;
}

/* The region of one slice in a slot for this chunk and L local ranks (a slot holds L regions). */
static size_t region_of(uint64_t chunk, int L) {
  return round_up(((size_t)chunk + (size_t)L - 1) / (size_t)L, SLICE_ALIGN);
}

/* The window's bytes on the node for L ranks with this chunk: each rank's header and two slots on
 * pages of their own, plus a margin for MPI's own per-rank state and the file's rounding. */
static uint64_t window_bytes(uint64_t chunk, int L) {
  uint64_t slot = (uint64_t)region_of(chunk, L) * (uint64_t)L;
  return (uint64_t)L * (round_up((size_t)(HDR_BYTES + 2 * slot), 4096) + ((uint64_t)64 << 10)) + ((uint64_t)1 << 20);
}

/* The largest chunk from `chunk` down, halving, whose window fits in `room`; 0 when none down to
 * MIN_FIT_CHUNK does (a chunk set below it is kept when it fits). */
static uint64_t fit_chunk(uint64_t chunk, int L, int64_t room) {
  while (window_bytes(chunk, L) > (uint64_t)room && chunk > MIN_FIT_CHUNK)
    chunk = chunk / 2 > MIN_FIT_CHUNK ? chunk / 2 : MIN_FIT_CHUNK;
  return window_bytes(chunk, L) <= (uint64_t)room ? chunk : 0;
}

/* The chunk, the same on every local rank: HORA_SHM_CHUNK_BYTES, or the default for the local rank
 * with the most threads, shrunk to fit the smallest room any local rank found (`room`). */
static hora_result_t pick_chunk(const hora_ctx_t *ctx, int threads_most, int64_t room, const char *dir,
                                uint64_t *out) {
  uint64_t want = hora__params()->shm_chunk_bytes;
  if (want == 0) want = ctx->local_size > ctx->local_cpus ? ((uint64_t)4 << 20) : ((uint64_t)threads_most << 20);
  if (want < 64) want = 64;
  if (want > ((uint64_t)1 << 30)) want = (uint64_t)1 << 30;
  uint64_t chunk = fit_chunk(want, ctx->local_size, room), least = want < MIN_FIT_CHUNK ? want : MIN_FIT_CHUNK;
  if (chunk == 0)
    return HORA_ERR(HORA_ERR_NO_MEMORY,
                    "shm allreduce: the shared-memory window needs %.1f MiB in %s on this node (%d local ranks, "
                    "two pieces of at least %llu KiB each), and a local rank found only %.1f MiB free there: "
                    "free some, or give the job more (a container's --shm-size)",
                    (double)window_bytes(least, ctx->local_size) / 1048576.0, dir, ctx->local_size,
                    (unsigned long long)(least >> 10), (double)room / 1048576.0);
  if (chunk != want && ctx->local_rank == 0)
    HORA_WARN(SHM, "shm allreduce: %s has %.1f MiB free on this node: pieces of %llu KiB instead of %llu KiB "
              "(slower for large messages; a container's --shm-size gives more room)",
              dir, (double)room / 1048576.0, (unsigned long long)(chunk >> 10), (unsigned long long)(want >> 10));
  *out = chunk;
  return HORA_SUCCESS;
}

/* Create the window (collective over ctx->local). */
static hora_result_t shm_create(hora_ctx_t *ctx, struct hora_shm **out) {
  struct hora_shm *s = calloc(1, sizeof *s);
  if (!s) return HORA_ERR(HORA_ERR_NO_MEMORY, "shm allreduce: out of memory");
  s->win = MPI_WIN_NULL;
  s->ctx = ctx;
  s->L = ctx->local_size;
  s->l = ctx->local_rank;
  s->threads = shm_threads(ctx);
  s->slot = calloc((size_t)s->L, sizeof *s->slot);
  hora_result_t rc = HORA_SUCCESS;
  if (!s->slot) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "shm allreduce: out of memory");
    goto fail;
  }
  /* The default chunk: 1 MiB per thread of the local rank with the most (up to 8), so that each
   * thread keeps about the 1 MiB of a piece that one thread had; the ranks agree on it through the
   * maximum, also where their HORA_SHM_THREADS differ. 4 MiB with more ranks than CPUs: 4 ranks
   * on 2 cores, 16 MiB .. 128 MiB: 1.50, 2.24, 2.74, 2.72x MPI_Allreduce's busbw with 1 MiB
   * pieces, 1.66, 2.95, 2.94, 2.88x with 4 MiB (docs/benchmarks.md). ctx->local_cpus (the union of
   * the node's affinity masks) is the same on every local rank.
   * The window is made at the first call that needs it, maybe long after start-up: that maximum
   * is a watched wait, so that a local rank that stopped or hangs before its first such call ends
   * the others' with the verdict naming it instead of keeping them in MPI. Its buffer is on the
   * heap: a wait abandoned on a verdict leaves it to MPI (leaked). */
  /* most[0]: the most threads of a local rank; most[1]: minus the least room (see pick_chunk). */
  int64_t *most = malloc(2 * sizeof *most);
  if (!most) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "shm allreduce: out of memory");
    goto fail;
  }
  const char *dir = backing_dir();
  most[0] = s->threads < MAX_AUTO_THREADS ? s->threads : MAX_AUTO_THREADS;
  most[1] = -room_in(dir);
  MPI_Request req;
  rc = hora__ctx_wait(ctx, MPI_Iallreduce(MPI_IN_PLACE, most, 2, MPI_INT64_T, MPI_MAX, ctx->local, &req), &req,
                      "shm allreduce (creating the shared window)", 0);
  if (rc != HORA_SUCCESS) goto fail;
  int threads_most = (int)most[0];
  int64_t room = -most[1];
  free(most);
  uint64_t chunk = 0;
  rc = pick_chunk(ctx, threads_most, room, dir, &chunk);
  if (rc != HORA_SUCCESS) {
    /* Every local rank failed here alike; on one node that is every rank of the call, which is
     * then over for all of them (hier's other nodes still wait for this one: not there). */
    if (ctx->cross_size == 1) hora__call_ended_everywhere(ctx);
    goto fail;
  }
  /* Slice j of a piece always lives at j*region in a slot, whatever the piece's length, so that
   * pieces of different lengths (the last one, the next call's) never overlap a region that a
   * peer may still be reading. */
  s->region = region_of(chunk, s->L);
  s->slot_bytes = s->region * (size_t)s->L;
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true"); /* each rank's part on its own pages */
  char *mine = NULL;
  int mrc = MPI_Win_allocate_shared((MPI_Aint)(HDR_BYTES + 2 * s->slot_bytes), 1, info, ctx->local,
                                    &mine, &s->win);
  MPI_Info_free(&info);
  if (mrc != MPI_SUCCESS) {
    /* The other local ranks may be left inside the call for ever (it is collective and blocking):
     * this rank's context fails, so that its later calls return this error at once instead of
     * making a window again, and its heartbeats stop, so that ranks elsewhere hear of it. */
    s->win = MPI_WIN_NULL;
    rc = hora__mpi_error(mrc, "MPI_Win_allocate_shared", __FILE__, __LINE__);
    char msg[256];
    snprintf(msg, sizeof msg, "shm allreduce: MPI_Win_allocate_shared failed on local rank %d (%.*s); the other "
             "local ranks may be stuck inside it: end the job", s->l, 120, hora_last_error());
    hora__ctx_fail_job(ctx, rc, msg);
    rc = HORA_ERR(rc, "%s", msg);
    goto fail;
  }
  for (int j = 0; j < s->L; j++) {
    MPI_Aint sz;
    int du;
    char *base;
    mrc = MPI_Win_shared_query(s->win, j, &sz, &du, &base);
    if (mrc != MPI_SUCCESS) {
      rc = hora__mpi_error(mrc, "MPI_Win_shared_query", __FILE__, __LINE__);
      goto fail;
    }
    s->slot[j] = base + HDR_BYTES;
    if (j == 0) s->ctl = (shm_ctl_t *)base;
  }
  *(uint64_t *)(mine + ENTERED_OFF) = 0; /* no call check entered yet (stall_check) */
  if (s->l == 0) {
    atomic_init(&s->ctl->arrived, 0);
    atomic_init(&s->ctl->gen, 0);
    atomic_init(&s->ctl->sleepers, 0);
  }
  /* Passive-target epoch for the window's lifetime (the unified model then lets loads and
   * stores plus our atomics synchronize), and everyone sees the initialized header. */
  mrc = MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win);
  if (mrc == MPI_SUCCESS) mrc = MPI_Win_sync(s->win);
  if (mrc != MPI_SUCCESS) {
    rc = hora__mpi_error(mrc, "MPI_Win_lock_all/MPI_Win_sync", __FILE__, __LINE__);
    goto fail;
  }
  rc = hora__ctx_barrier(ctx, ctx->local, "shm allreduce (creating the shared window)");
  if (rc != HORA_SUCCESS) goto fail;
  /* The node's CPUs are the union of its ranks' affinity masks (ctx->local_cpus, the same on
   * every local rank), not this rank's own mask: with one core bound per rank (Open MPI's and
   * launch's default) this rank's mask holds one CPU, and comparing L with it made every waiter
   * sleep at once, a futex wake-up (17-20 us here) per barrier where a spin takes well under
   * 1 us (docs/benchmarks.md, "Call check"). */
  s->spin = s->L <= ctx->local_cpus;
  HORA_INFO(SHM, "shared window: %d local ranks, 2 slots of %zu bytes each, %s, up to %d thread(s) per rank",
            s->L, s->slot_bytes, s->spin ? "spin then sleep" : "sleep at once (more ranks than cores)", s->threads);
  *out = s;
  return HORA_SUCCESS;
fail:
  /* MPI_Win_free is collective: after a verdict a peer may never come, so the window is left. */
  if (s->win != MPI_WIN_NULL && !hora__ctx_failed(ctx)) MPI_Win_free(&s->win);
  free(s->slot);
  free(s);
  return rc;
}

hora_result_t hora__shm_free(hora_ctx_t *ctx, struct hora_shm *s) {
  (void)ctx;
  if (!s) return HORA_SUCCESS;
  hora__pool_free(s->pool);
  int mrc = MPI_Win_unlock_all(s->win);
  if (mrc == MPI_SUCCESS) mrc = MPI_Win_free(&s->win);
  free(s->slot);
  free(s);
  if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, "MPI_Win_free", __FILE__, __LINE__);
  return HORA_SUCCESS;
}

static hora_result_t get_shm(hora_ctx_t *ctx, struct hora_shm **out) {
  hora_algo_state_t *st;
  HORA_CHECK(hora__algo_state(ctx, &st));
  if (!st->shm) {
    HORA_CHECK(shm_create(ctx, &st->shm));
    st->shm_free = hora__shm_free;
  }
  *out = st->shm;
  return HORA_SUCCESS;
}

/* The call check's exchange (callcheck.c): each local rank's HORA_SHM_WORDS words live in its
 * window header at DESC_OFF, in two places used by alternate calls. A rank writes place p again
 * two calls later, after the barrier of the call in between, which every rank enters only once it
 * has read this call's words: no peer can still be reading them. */
#define DESC_OFF 256
static uint64_t *desc_place(const struct hora_shm *s, int j, int p) {
  return (uint64_t *)(s->slot[j] - HDR_BYTES + DESC_OFF) + (size_t)p * HORA_SHM_WORDS;
}

static int32_t *result_word(const struct hora_shm *s, int j) {
  return (int32_t *)(s->slot[j] - HDR_BYTES + RESULT_OFF);
}

static uint64_t *entered_word(const struct hora_shm *s, int j) {
  return (uint64_t *)(s->slot[j] - HDR_BYTES + ENTERED_OFF);
}

/* The stall inspection of the call check, run by a sleeping waiter (every futex timeout, 100 ms):
 * the ranks it waits for are alive (else the heartbeat's verdict ends the wait) but have not
 * entered this call: one skipped it, or is still computing. After HORA_STALL_WARNING_S it logs
 * the missing ranks once; after HORA_STALL_SHUTDOWN_S (0: never) it ends the call with
 * HORA_ERR_TIMEOUT naming them; the caller then takes back its arrival (leave_barrier) and its
 * call number, so the context stays usable and a later call is never paired with this one. One
 * node: local ranks are world ranks (ctx.c). */
static hora_result_t stall_check(struct hora_shm *s, const char *fn, uint64_t call, double t0, int *warned) {
  double waited = hora__now_s() - t0, warn = hora__params()->stall_warning_s, stop = hora__params()->stall_shutdown_s;
  int over_warn = warn > 0 && waited >= warn && !*warned, over_stop = stop > 0 && waited >= stop;
  if (!over_warn && !over_stop) return HORA_SUCCESS;
  char missing[200] = "";
  size_t len = 0;
  for (int j = 0; j < s->L && len + 16 < sizeof missing; j++)
    if (__atomic_load_n(entered_word(s, j), __ATOMIC_ACQUIRE) < call)
      len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? "," : "", j);
  if (over_warn) {
    *warned = 1;
    HORA_WARN(SHM, "%s: waited %.0f s for rank(s) %s to call it too (alive, but they skipped this call or are "
              "still busy; HORA_STALL_SHUTDOWN_S ends such a wait with an error)", fn, waited, missing);
  }
  if (!over_stop) return HORA_SUCCESS;
  return HORA_ERR(HORA_ERR_TIMEOUT, "%s: rank(s) %s did not call it within HORA_STALL_SHUTDOWN_S=%g s (alive, but "
                  "they skipped this call or are stuck elsewhere)", fn, missing, stop);
}

/* Publish this rank's call descriptor (place by call parity) and its call number; returns it. */
static uint64_t check_enter(struct hora_shm *s, const uint64_t *mine) {
  uint64_t call = ++s->calls;
  memcpy(desc_place(s, s->l, (int)(call & 1)), mine, HORA_SHM_WORDS * sizeof *mine);
  __atomic_store_n(entered_word(s, s->l), call, __ATOMIC_RELEASE);
  return call;
}

/* The first barrier of a checked call (stall-aware). After HORA_ERR_TIMEOUT this rank left the
 * barrier (stall_check): the call never happened, and its number is taken back. */
static hora_result_t check_barrier(struct hora_shm *s, const char *fn, uint64_t call) {
  hora_result_t rc = shm_barrier_at(s, fn, call); /* HORA_ERR_REMOTE: a peer died or stopped */
  if (rc == HORA_ERR_TIMEOUT) {
    s->calls--;
    __atomic_store_n(entered_word(s, s->l), call - 1, __ATOMIC_RELEASE);
  }
  return rc;
}

static void check_read(const struct hora_shm *s, uint64_t call, uint64_t *all) {
  for (int j = 0; j < s->L; j++)
    memcpy(all + (size_t)j * HORA_SHM_WORDS, desc_place(s, j, (int)(call & 1)), HORA_SHM_WORDS * sizeof *all);
}

/* Every rank's descriptor of this call, compared (callcheck.c): HORA_SUCCESS or HORA_ERR_MISMATCH,
 * the same on every local rank since all read the same words. */
static hora_result_t check_compare(struct hora_shm *s, uint64_t call, const char *fn) {
  uint64_t stack[HORA_SHM_WORDS * 16] = {0}, *all = s->L <= 16 ? stack : malloc((size_t)s->L * sizeof stack[0] * HORA_SHM_WORDS);
  if (!all) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory for the call check", fn);
  check_read(s, call, all);
  hora_result_t rc = hora__call_compare(s->ctx, fn, all);
  if (all != stack) free(all);
  return rc;
}

/* Every pass of a window barrier that ends a call or a piece advances `round` by one on every
 * local rank alike (a checked call that ends in a mismatch included, whatever form each rank was
 * in), so that the slots stay in step. */
hora_result_t hora__shm_exchange_words(hora_ctx_t *ctx, const uint64_t *mine, uint64_t *all, const char *fn) {
  struct hora_shm *s;
  HORA_CHECK(get_shm(ctx, &s));
  uint64_t call = check_enter(s, mine);
  HORA_CHECK(check_barrier(s, fn, call));
  s->round++;
  check_read(s, call, all);
  return HORA_SUCCESS;
}

/* A cursor over the segments that form the virtual buffer: seg[i] starts at virtual element
 * `start`. It only moves forward, so each phase of a piece walks its segments once. */
typedef struct {
  const hora_seg_t *seg;
  size_t i, start;
} seg_cursor_t;

/* The longest run of virtual elements [v, min(end, end of v's segment)): moves the cursor to the
 * segment that holds v (skipping empty ones) and returns the run's length, *off = v's offset in
 * that segment. Needs v < end <= the virtual length, and v at or after the cursor's segment. */
static size_t seg_run(seg_cursor_t *c, size_t v, size_t end, size_t *off) {
  while (v >= c->start + c->seg[c->i].count) c->start += c->seg[c->i++].count;
  size_t o = v - c->start, n = c->seg[c->i].count - o;
  *off = o;
  return n < end - v ? n : end - v;
}

/* Slice geometry of a piece of `pe` elements. */
typedef struct {
  size_t base, pe, sl; /* piece's first element, its length, slice length (elements) */
  seg_cursor_t at;     /* positioned at or before the segment holding `base` */
} piece_t;

static size_t slice_len(const piece_t *p, int j) {
  size_t start = (size_t)j * p->sl;
  if (start >= p->pe) return 0;
  return p->pe - start < p->sl ? p->pe - start : p->sl;
}

/* Part t of P of a slice of n elements starts at element cut(n, t, P): the parts are contiguous,
 * cover the slice, and start on 64-byte boundaries of it (`align` elements). */
static size_t cut(size_t n, int t, int P, size_t align) {
  if (t >= P) return n;
  size_t c = n * (size_t)t / (size_t)P;
  return c - c % align;
}

/* Part t of P of slice j of piece p: the virtual elements [*v, *end); returns *v's offset in the
 * slice. */
static size_t part_of(const piece_t *p, int j, int t, int P, size_t es, size_t *v, size_t *end) {
  size_t n = slice_len(p, j), first = p->base + (size_t)j * p->sl, a = cut(n, t, P, SLICE_ALIGN / es);
  *v = first + a;
  *end = first + cut(n, t + 1, P, SLICE_ALIGN / es);
  return a;
}

static char *slot_of(const struct hora_shm *s, int j, uint64_t round) {
  return s->slot[j] + (round & 1) * s->slot_bytes;
}

/* A result into a recv buffer. Large calls stream it (non-temporal stores): the recv buffers are
 * larger than the caches, so ordinary stores would first read every destination line from
 * memory, a third more traffic for a copy. 4 ranks on 2 cores, 16 MiB: 3.0 -> 3.8-3.9 GB/s
 * busbw; 2 ranks from 32 MiB: 3.7-4.1 -> 4.7-5.5; with the fused float32 pass, 2 ranks at 8 and
 * 16 MiB too (docs/benchmarks.md, "Fused float32 slice"). Below the threshold the results stay
 * in the cache for the caller.
 *
 * Never into a segment reduced in place (its recv buffer is its send buffer: the gradients'
 * case): this rank read those very lines a moment before (its slice in the reduce; the others'
 * slices in the copy-in of the same piece), so they are in the cache and ordinary stores cost
 * no extra read, while streaming stores push them out of it. ResNet-50's gradients (2 ranks,
 * 25 MB buckets in place): 16.1-18.4 ms streamed against 13.0-13.5 ms not (docs/benchmarks.md,
 * "Bound ranks, results in place not streamed"). */
static int stream_to(const struct hora_shm *s, const hora_seg_t *g) { return s->stream && g->dst != g->src; }

static void put(int stream, void *dst, const void *src, size_t bytes) {
  if (stream) hora__copy_stream_host(dst, src, bytes);
  else memcpy(dst, src, bytes);
}

/* Copy the slices that the other ranks reduce into their regions of this rank's slot, straight
 * from the segments' send buffers: part t of P of each slice. */
static void copy_in(struct hora_shm *s, const piece_t *p, size_t es, uint64_t round, int t, int P) {
  char *slot = slot_of(s, s->l, round);
  seg_cursor_t c = p->at;
  for (int j = 0; j < s->L; j++) {
    if (j == s->l) continue;
    size_t v, end, off;
    char *r = slot + (size_t)j * s->region + part_of(p, j, t, P, es, &v, &end) * es;
    while (v < end) {
      size_t n = seg_run(&c, v, end, &off);
      memcpy(r, (const char *)c.seg[c.i].src + off * es, n * es);
      r += n * es;
      v += n;
    }
  }
}

/* Reduce this rank's slice (part t of P of it) from the segments' send buffers and the peers'
 * slots into the segments' recv buffers, one run within one segment at a time, call the hook on
 * each run, then publish it in this rank's region of its slot. */
static hora_result_t reduce_own(struct hora_shm *s, const piece_t *p, size_t es, hora_dtype_t dtype,
                                hora_op_t op, uint64_t round, const void **srcs, const hora_shm_opts_t *o,
                                int t, int P) {
  seg_cursor_t c = p->at;
  size_t v, end, off, done = part_of(p, s->l, t, P, es, &v, &end);
  char *pub = slot_of(s, s->l, round) + (size_t)s->l * s->region;
  while (v < end) {
    size_t n = seg_run(&c, v, end, &off);
    const hora_seg_t *g = &c.seg[c.i];
    srcs[0] = (const char *)g->src + off * es;
    for (int j = 0, k = 1; j < s->L; j++)
      if (j != s->l) srcs[k++] = slot_of(s, j, round) + (size_t)s->l * s->region + done * es;
    char *q = pub + done * es; /* reduced into the slot (in the cache), then copied out */
    char *dst = (char *)g->dst + off * es;
    if (o->fuse_f32 && (((uintptr_t)dst | (uintptr_t)srcs[0]) & 3) == 0) {
      /* One pass instead of three (reduce, scale, copy out): docs/benchmarks.md, "Fused float32
       * slice". Only for float-aligned buffers, which the kernel needs; a buffer that is not
       * (a NumPy view at an odd byte offset) takes the three passes, whose copy out is bytes. */
      hora__sum_scale2_f32_host((float *)dst, (float *)q, (const float *const *)srcs, s->L, n, o->scale, stream_to(s, g));
    } else {
      hora_result_t rc = hora__reduce_n_host(q, srcs, s->L, n, dtype, op, NULL);
      if (rc != HORA_SUCCESS) return HORA_ERR(HORA_ERR_INTERNAL, "shm: host reduce failed (%s)", hora_result_name(rc));
      if (o->hook) HORA_CHECK(o->hook(o->arg, q, n));
      put(stream_to(s, g), dst, q, n * es);
    }
    v += n;
    done += n;
  }
  return HORA_SUCCESS;
}

/* Copy the other ranks' reduced slices (part t of P of each) out of their slots into the segments'
 * recv buffers. */
static void copy_out(struct hora_shm *s, const piece_t *p, size_t es, uint64_t round, int t, int P) {
  seg_cursor_t c = p->at;
  for (int j = 0; j < s->L; j++) {
    if (j == s->l) continue;
    size_t v, end, off;
    const char *r = slot_of(s, j, round) + (size_t)j * s->region + part_of(p, j, t, P, es, &v, &end) * es;
    while (v < end) {
      size_t n = seg_run(&c, v, end, &off);
      put(stream_to(s, &c.seg[c.i]), (char *)c.seg[c.i].dst + off * es, r, n * es);
      r += n * es;
      v += n;
    }
  }
}

/* The flat form, for messages up to HORA_SHM_FLAT_BYTES: every local rank copies its whole input
 * into its slot, one barrier, then every rank reduces all L slots itself, in local-rank order, so
 * every rank gets the same bits; the hook (elementwise and local: o->hook_local) runs on each
 * segment's result. One barrier per call instead of two, and L x the bytes read per rank, which
 * is cheap while the message is a few cache lines to a few pages. The slot is that of `round`,
 * as for a piece: a rank rewrites it two rounds later, after a barrier that every rank enters only
 * once it has read it. */
static hora_result_t run_flat(struct hora_shm *s, const hora_seg_t *seg, size_t nseg, size_t es, hora_dtype_t dtype,
                              hora_op_t op, const hora_shm_opts_t *o, const void **srcs) {
  uint64_t call = o->desc ? check_enter(s, o->desc) : 0;
  char *mine = slot_of(s, s->l, s->round);
  for (size_t i = 0, v = 0; i < nseg; v += seg[i++].count)
    if (seg[i].count) memcpy(mine + v * es, seg[i].src, seg[i].count * es);
  hora_result_t rc = o->desc ? check_barrier(s, o->fn, call) : shm_barrier(s);
  if (rc == HORA_SUCCESS && o->desc) rc = check_compare(s, call, o->fn);
  if (rc != HORA_SUCCESS) {
    if (rc == HORA_ERR_MISMATCH) s->round++; /* every local rank passed the barrier */
    return rc;
  }
  for (size_t i = 0, v = 0; i < nseg && rc == HORA_SUCCESS; v += seg[i++].count) {
    if (!seg[i].count) continue;
    for (int j = 0; j < s->L; j++) srcs[j] = slot_of(s, j, s->round) + v * es;
    rc = hora__reduce_n_host(seg[i].dst, srcs, s->L, seg[i].count, dtype, op, NULL);
    if (rc != HORA_SUCCESS) rc = HORA_ERR(HORA_ERR_INTERNAL, "shm: host reduce failed (%s)", hora_result_name(rc));
    else if (o->hook) rc = o->hook(o->arg, seg[i].dst, seg[i].count);
  }
  s->round++;
  return rc;
}

/* The work of one rank between two barriers, split into parts (algo/pool.c): copy out the
 * previous piece (of round - 1), reduce the current one (of `round`), copy in the next one (of
 * round + 1). The three touch different memory: copy-in writes this rank's slot of round + 1
 * (its regions for the peers), which no peer reads before the next barrier; copy-out reads the
 * peers' slots of round - 1; the reduce the slots of `round`. So the parts of one rank may run
 * them in any order at once; each part only ever touches its own elements. */
typedef struct {
  struct hora_shm *s;
  size_t es;
  hora_dtype_t dtype;
  hora_op_t op;
  const hora_shm_opts_t *o;
  const piece_t *out, *red, *in; /* NULL: that phase has nothing to do */
  uint64_t round;
  const void **srcs;   /* L pointers per part */
  hora_result_t *rc;   /* per part: the reduce's result */
} step_t;

static void step_part(void *arg, int t, int P) {
  step_t *w = arg;
  if (w->out) copy_out(w->s, w->out, w->es, w->round - 1, t, P);
  w->rc[t] = w->red ? reduce_own(w->s, w->red, w->es, w->dtype, w->op, w->round, w->srcs + (size_t)t * w->s->L, w->o, t, P)
                    : HORA_SUCCESS;
  if (w->in) copy_in(w->s, w->in, w->es, w->round + 1, t, P);
}

/* Parts for a step whose largest slice is `slice` elements: one per PART_MIN_BYTES at least, at
 * most the rank's threads; 1 when a hook must see the runs in order on this thread (a hook that
 * communicates, hier.c). Parts below PART_MIN_BYTES would cost more in the join than they save. */
#define PART_MIN_BYTES ((size_t)32 << 10)
static int step_parts(const struct hora_shm *s, const hora_shm_opts_t *o, size_t slice, size_t es) {
  if (s->threads <= 1 || (o->hook && !o->hook_local)) return 1;
  size_t most = slice * es / PART_MIN_BYTES;
  return most < 2 ? 1 : most < (size_t)s->threads ? (int)most : s->threads;
}

/* Run a step on P parts; the first error of a part's reduce, if any. */
static hora_result_t run_step(step_t *w, int P) {
  struct hora_shm *s = w->s;
  if (P > 1 && !s->pool) {
    int spin = s->spin && s->threads <= s->ctx->local_cpus / s->L;
    if (hora__pool_create(s->threads, spin, &s->pool) != HORA_SUCCESS) {
      /* Out of memory: the same work on this thread alone, from now on. */
      HORA_WARN(SHM, "shm allreduce: no helper threads (%s); this rank copies and reduces on one thread",
                hora_last_error());
      s->threads = 1;
      P = 1;
    } else {
      HORA_INFO(SHM, "shm allreduce: %d helper thread(s) started, %s", s->threads - 1,
                spin ? "spin then sleep" : "sleep at once (fewer CPUs than threads)");
    }
  }
  hora__pool_run(P > 1 ? s->pool : NULL, P, step_part, w);
  for (int t = 0; t < P; t++)
    if (w->rc[t] != HORA_SUCCESS)
      return t == 0 ? w->rc[t]
                    : HORA_ERR(w->rc[t], "shm: the reduce of part %d of %d failed on a helper thread (%s)", t, P,
                               hora_result_name(w->rc[t]));
  return HORA_SUCCESS;
}

/* Geometry of the piece that starts at element `base` (< count); moves *at to it. */
static piece_t make_piece(const struct hora_shm *s, seg_cursor_t *at, size_t base, size_t count, size_t cap,
                          size_t align) {
  size_t off;
  seg_run(at, base, count, &off); /* position the cursor on the piece's first segment */
  piece_t p = {base, count - base < cap ? count - base : cap, 0, *at};
  p.sl = round_up((p.pe + (size_t)s->L - 1) / (size_t)s->L, align);
  return p;
}

/* The pieces form (the file's comment). With a call check, the descriptor was published before
 * the first piece's copy-in and is compared after its barrier, before anything reaches a recv
 * buffer (copy-in only writes this rank's own slot). */
static hora_result_t run_pieces(struct hora_shm *s, const hora_seg_t *seg, size_t count, size_t es,
                                hora_dtype_t dtype, hora_op_t op, const hora_shm_opts_t *o, const void **srcs,
                                hora_result_t *prc) {
  uint64_t call = o->desc ? check_enter(s, o->desc) : 0;
  /* A piece is at most L regions' worth of elements; a slice (64-byte aligned length) then
   * always fits its region. */
  size_t cap = (size_t)s->L * (s->region / es), align = SLICE_ALIGN / es;
  uint64_t sb = hora__params()->shm_stream_bytes;
  s->stream = sb > 0 && (uint64_t)count * es * (uint64_t)s->L >= sb; /* same on every local rank */
  hora_result_t rc = HORA_SUCCESS;
  seg_cursor_t at = {seg, 0, 0};
  piece_t cur = make_piece(s, &at, 0, count, cap, align), prev = cur, next = cur;
  step_t w = {s, es, dtype, op, o, NULL, NULL, &cur, s->round - 1, srcs, prc};
  run_step(&w, step_parts(s, o, cur.sl, es)); /* the first piece's copy-in (round s->round) */
  /* An error in the reduce or the hook is remembered and the barriers still run, so that the
   * other local ranks are not left waiting; every rank then returns it or its own. */
  for (int have_prev = 0;; have_prev = 1) {
    hora_result_t brc = cur.base == 0 && o->desc ? check_barrier(s, o->fn, call) : shm_barrier(s);
    if (brc == HORA_SUCCESS && cur.base == 0 && o->desc) brc = check_compare(s, call, o->fn);
    if (brc != HORA_SUCCESS) {
      if (brc == HORA_ERR_MISMATCH) s->round++; /* every local rank passed the barrier and stops */
      return brc; /* a lost peer: no later barrier would complete */
    }
    int last = cur.base + cur.pe >= count;
    if (!last) next = make_piece(s, &at, cur.base + cur.pe, count, cap, align);
    step_t st = {s, es, dtype, op, o, have_prev ? &prev : NULL, rc == HORA_SUCCESS ? &cur : NULL,
                 last ? NULL : &next, s->round, srcs, prc};
    hora_result_t src = run_step(&st, step_parts(s, o, cur.sl, es));
    if (rc == HORA_SUCCESS) rc = src;
    prev = cur;
    s->round++;
    if (last) break;
    cur = next;
  }
  /* A rank whose reduce or hook failed published an unfinished slice, which the others are about
   * to copy out: its result rides in the last barrier, and every other local rank fails too
   * instead of returning that slice as data. A rank rewrites its word only after the next call's
   * first barrier, which the others enter once they have read it. */
  *result_word(s, s->l) = (int32_t)rc;
  hora_result_t brc = shm_barrier(s);
  if (brc != HORA_SUCCESS) return brc;
  step_t fin = {s, es, dtype, op, o, &prev, NULL, NULL, s->round, srcs, prc};
  run_step(&fin, step_parts(s, o, prev.sl, es));
  for (int j = 0; j < s->L && rc == HORA_SUCCESS; j++) {
    hora_result_t other = (hora_result_t)*result_word(s, j);
    if (j != s->l && other != HORA_SUCCESS)
      rc = HORA_ERR(HORA_ERR_REMOTE,
                    "shm allreduce: local rank %d could not finish its slice (%s); the result is incomplete "
                    "(that rank's error says why)", j, hora_result_name(other));
  }
  return rc;
}

hora_result_t hora__shm_run_opts(hora_ctx_t *ctx, const hora_seg_t *seg, size_t nseg, hora_dtype_t dtype,
                                 hora_op_t op, const hora_shm_opts_t *o) {
  size_t count = 0;
  for (size_t i = 0; i < nseg; i++) count += seg[i].count;
  struct hora_shm *s;
  if (count == 0 && !o->desc) return HORA_SUCCESS;
  HORA_CHECK(get_shm(ctx, &s));
  if (count == 0) { /* nothing to move, but the check still meets the other ranks */
    uint64_t call = check_enter(s, o->desc);
    HORA_CHECK(check_barrier(s, o->fn, call));
    s->round++;
    return check_compare(s, call, o->fn);
  }
  size_t es = hora__dtype_size(dtype);
  /* Reduce sources: L pointers for each part of a step; each part's reduce result. */
  size_t nsrcs = (size_t)s->L * (size_t)s->threads;
  const void *srcs_stack[64];
  hora_result_t prc_stack[8];
  const void **srcs = nsrcs <= 64 ? srcs_stack : malloc(nsrcs * sizeof *srcs);
  hora_result_t *prc = s->threads <= 8 ? prc_stack : malloc((size_t)s->threads * sizeof *prc);
  hora_result_t rc;
  if (!srcs || !prc) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "shm allreduce: out of memory");
  } else {
    int flat = (!o->hook || o->hook_local) && count * es <= s->slot_bytes && count * es <= hora__params()->shm_flat_bytes;
    rc = flat ? run_flat(s, seg, nseg, es, dtype, op, o, srcs) : run_pieces(s, seg, count, es, dtype, op, o, srcs, prc);
  }
  if (srcs != srcs_stack) free(srcs);
  if (prc != prc_stack) free(prc);
  return rc;
}

hora_result_t hora__shm_run_segs(hora_ctx_t *ctx, const hora_seg_t *seg, size_t nseg, hora_dtype_t dtype,
                                 hora_op_t op, hora_shm_hook_fn hook, void *arg) {
  hora_shm_opts_t o = {hook, arg, 0, NULL, NULL, 0, 1.0};
  return hora__shm_run_opts(ctx, seg, nseg, dtype, op, &o);
}

hora_result_t hora__shm_run(hora_ctx_t *ctx, const void *src, void *dst, size_t count,
                            hora_dtype_t dtype, hora_op_t op, hora_shm_hook_fn hook, void *arg) {
  hora_seg_t one = {src, dst, count};
  return hora__shm_run_segs(ctx, &one, 1, dtype, op, hook, arg);
}

hora_result_t hora__shm_allreduce(hora_ctx_t *ctx, const void *src, void *dst, size_t count,
                                  hora_dtype_t dtype, hora_op_t op) {
  if (ctx->cross_size != 1)
    return HORA_ERR(HORA_ERR_INTERNAL, "shm allreduce called with %d nodes", ctx->cross_size);
  return hora__shm_run(ctx, src, dst, count, dtype, op, NULL, NULL);
}
