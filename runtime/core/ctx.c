/* The context: its creation and release (MPI, the world communicator, the layout checks, the
 * layout: rank, local, cross), the table of live contexts, module finalizers and the layout
 * getters. hora_init / hora_finalize themselves, which start and stop the modules around this,
 * are runtime/init/init.c: core calls no module. */
#include <limits.h>
#include <sched.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/ctx.h"
#include "core/fatal.h"

/* Live contexts, looked up by address so that a stale pointer is reported instead of being
 * dereferenced. A handful of contexts at most live at once. */
#define MAX_LIVE 64
static hora_ctx_t *live[MAX_LIVE];
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
/* fork() while another thread holds live_lock would leave it locked forever in the child, whose
 * every call then hangs in hora__ctx_check instead of being refused: the lock is taken around
 * fork() (the pthread_atfork idiom for a lock the child uses). */
static pthread_once_t live_fork_once = PTHREAD_ONCE_INIT;
static void live_lock_take(void) { pthread_mutex_lock(&live_lock); }
static void live_lock_give(void) { pthread_mutex_unlock(&live_lock); }
static void live_fork_register(void) { pthread_atfork(live_lock_take, live_lock_give, live_lock_give); }

/* What a process made by fork() from a rank should do instead, for the messages. */
#define FORK_FIX "use hora in the parent only; a child that needs it must start a new program " \
                 "(exec; Python: subprocess, or multiprocessing's 'spawn' or 'forkserver')"

/* The fork generation in which this process saw MPI initialized (hora_init), or -1. */
static long long mpi_gen = -1;

hora_result_t hora__ctx_init_refused_in_fork(void) {
  if (mpi_gen < 0) return HORA_SUCCESS;
  return hora__fork_check((unsigned)mpi_gen, "hora_init", "MPI (initialized for hora)", FORK_FIX);
}

static const char *init_step_what;
static double init_step_at;

void hora__init_step(const char *what) {
  double t = hora__now_s();
  __atomic_store(&init_step_at, &t, __ATOMIC_RELAXED);
  __atomic_store_n(&init_step_what, what, __ATOMIC_RELEASE);
}

const char *hora__init_step_now(double *since_s) {
  const char *what = __atomic_load_n(&init_step_what, __ATOMIC_ACQUIRE);
  double t = 0;
  __atomic_load(&init_step_at, &t, __ATOMIC_RELAXED);
  *since_s = what ? hora__now_s() - t : 0;
  return what;
}

static int live_add(hora_ctx_t *c) {
  pthread_once(&live_fork_once, live_fork_register);
  pthread_mutex_lock(&live_lock);
  for (int i = 0; i < MAX_LIVE; i++)
    if (!live[i]) {
      live[i] = c;
      pthread_mutex_unlock(&live_lock);
      return 1;
    }
  pthread_mutex_unlock(&live_lock);
  return 0;
}

static void live_remove(hora_ctx_t *c) {
  pthread_mutex_lock(&live_lock);
  for (int i = 0; i < MAX_LIVE; i++)
    if (live[i] == c) live[i] = NULL;
  pthread_mutex_unlock(&live_lock);
}

static int live_has(hora_ctx_t *ctx) {
  int found = 0;
  pthread_mutex_lock(&live_lock);
  for (int i = 0; i < MAX_LIVE && ctx; i++)
    if (live[i] == ctx) found = 1;
  pthread_mutex_unlock(&live_lock);
  return found;
}

/* Live in this process or in the one it was forked from (the layout getters: reading the rank in
 * a DataLoader worker is fine, as in Horovod). */
static hora_result_t check_known(hora_ctx_t *ctx, const char *fn) {
  if (live_has(ctx)) return HORA_SUCCESS;
  return HORA_ERR(HORA_ERR_NOT_INITIALIZED,
                  "%s: the context is %s: call hora_init first (and not after hora_finalize)", fn,
                  ctx ? "not a live hora context" : "NULL");
}

hora_result_t hora__ctx_check_live(hora_ctx_t *ctx, const char *fn) {
  HORA_CHECK(check_known(ctx, fn));
  return hora__fork_check_rc(ctx->fork_gen, HORA_ERR_NOT_INITIALIZED, fn, "its hora context", FORK_FIX);
}

static hora_result_t check_member(hora_ctx_t *ctx, const char *fn) {
  if (ctx->excluded) {
    char list[96] = "";
    size_t len = 0;
    for (int i = 0; i < ctx->set_nranks && len + 16 < sizeof list; i++)
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", i ? "," : "", ctx->set_ranks[i]);
    if (len + 16 >= sizeof list) snprintf(list + len, sizeof list - len, ",...");
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                    "%s: this rank (%d of the parent context) is not in the process set of ranks "
                    "{%s}: only its members may use it", fn, ctx->parent ? ctx->parent->rank : -1, list);
  }
  return HORA_SUCCESS;
}

hora_result_t hora__ctx_check(hora_ctx_t *ctx, const char *fn) {
  HORA_CHECK(hora__ctx_check_live(ctx, fn));
  return check_member(ctx, fn);
}

hora_result_t hora__ctx_add_finalizer(hora_ctx_t *ctx, hora_finalizer_fn fn, void *arg) {
  struct hora_finalizer *f = calloc(1, sizeof *f);
  if (!f) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory registering a finalizer");
  f->fn = fn;
  f->arg = arg;
  pthread_mutex_lock(&ctx->lock);
  f->next = ctx->finalizers;
  ctx->finalizers = f;
  pthread_mutex_unlock(&ctx->lock);
  return HORA_SUCCESS;
}

void hora__ctx_remove_finalizer(hora_ctx_t *ctx, hora_finalizer_fn fn, void *arg) {
  pthread_mutex_lock(&ctx->lock);
  for (struct hora_finalizer **pp = &ctx->finalizers; *pp; pp = &(*pp)->next) {
    if ((*pp)->fn == fn && (*pp)->arg == arg) {
      struct hora_finalizer *f = *pp;
      *pp = f->next;
      free(f);
      break;
    }
  }
  pthread_mutex_unlock(&ctx->lock);
}

hora_result_t hora__mpi_error(int mpi_rc, const char *what, const char *file, int line) {
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(mpi_rc, msg, &len);
  return hora__error(HORA_ERR_MPI, file, line, "%s failed: %s", what, msg);
}

hora_result_t hora__mpi_bytes_type(size_t bytes, MPI_Datatype *type, int *owned) {
  if (bytes <= (size_t)INT_MAX) {
    /* Exactly `bytes` bytes as one element. */
    if (bytes == 0) {
      *type = MPI_BYTE;
      *owned = 0;
      return HORA_SUCCESS;
    }
    HORA_MPI_CHECK(MPI_Type_contiguous((int)bytes, MPI_BYTE, type));
    HORA_MPI_CHECK(MPI_Type_commit(type));
    *owned = 1;
    return HORA_SUCCESS;
  }
  const size_t block = (size_t)1 << 30;
  size_t nblocks = bytes / block, rem = bytes % block;
  MPI_Datatype blk;
  HORA_MPI_CHECK(MPI_Type_contiguous((int)block, MPI_BYTE, &blk));
  int lens[2] = {(int)nblocks, (int)rem};
  MPI_Aint disps[2] = {0, (MPI_Aint)(nblocks * block)};
  MPI_Datatype types[2] = {blk, MPI_BYTE};
  int rc = MPI_Type_create_struct(rem ? 2 : 1, lens, disps, types, type);
  MPI_Type_free(&blk);
  if (rc != MPI_SUCCESS) return hora__mpi_error(rc, "MPI_Type_create_struct", __FILE__, __LINE__);
  HORA_MPI_CHECK(MPI_Type_commit(type));
  *owned = 1;
  return HORA_SUCCESS;
}

/* Node index of this rank: launch's HORA_CROSS_RANK, else SLURM_NODEID inside an srun step, else
 * -1 (then only shared memory decides). Fake multi-node Slurm setups put several nodes on one
 * host, so the hostname is never used. */
static int env_node_id(const hora_params_t *p) {
  if (p->env_cross_rank >= 0) return (int)p->env_cross_rank;
  const char *step = getenv("SLURM_STEP_ID"), *nid = getenv("SLURM_NODEID");
  if (step && nid && *nid) {
    char *end;
    long v = strtol(nid, &end, 10);
    if (!*end && v >= 0 && v < INT_MAX) return (int)v;
  }
  return -1;
}

static hora_result_t build_layout(hora_ctx_t *c, const hora_params_t *p) {
  MPI_Comm shared = MPI_COMM_NULL;
  HORA_MPI_CHECK(MPI_Comm_split_type(c->world, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &shared));
  int nid = env_node_id(p);
  /* Within one shared-memory domain, split further by the node id Slurm/launch gave us. */
  int rc = MPI_Comm_split(shared, nid < 0 ? 0 : nid, c->rank, &c->local);
  MPI_Comm_free(&shared);
  if (rc != MPI_SUCCESS) return hora__mpi_error(rc, "MPI_Comm_split(local)", __FILE__, __LINE__);
  MPI_Comm_rank(c->local, &c->local_rank);
  MPI_Comm_size(c->local, &c->local_size);

  /* Node index: leaders (local rank 0) are numbered in rank order; the index is broadcast
   * within the node. */
  int leader = c->local_rank == 0, before = 0, nodes = 0;
  HORA_MPI_CHECK(MPI_Exscan(&leader, &before, 1, MPI_INT, MPI_SUM, c->world));
  if (c->rank == 0) before = 0; /* MPI_Exscan leaves rank 0's output undefined */
  HORA_MPI_CHECK(MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, c->world));
  c->cross_rank = before;
  HORA_MPI_CHECK(MPI_Bcast(&c->cross_rank, 1, MPI_INT, 0, c->local));
  c->cross_size = nodes;
  HORA_MPI_CHECK(MPI_Comm_split(c->world, c->local_rank, c->cross_rank, &c->cross));
  int mn, mx;
  HORA_MPI_CHECK(MPI_Allreduce(&c->local_size, &mn, 1, MPI_INT, MPI_MIN, c->world));
  HORA_MPI_CHECK(MPI_Allreduce(&c->local_size, &mx, 1, MPI_INT, MPI_MAX, c->world));
  c->uniform_local_size = (mn == mx);

  /* CPUs the node's ranks may run on: the union of their affinity masks. More local ranks than
   * CPUs (oversubscription, e.g. 4 ranks on 2 cores) makes algorithms that wait for every local
   * rank at each step slow, and the allreduce `auto` choice avoids them at medium sizes. */
  unsigned long mask[CPU_SETSIZE / (8 * sizeof(unsigned long))], all[CPU_SETSIZE / (8 * sizeof(unsigned long))];
  memset(mask, 0, sizeof mask);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < n && i < CPU_SETSIZE; i++) CPU_SET((int)i, &set);
  }
  for (int i = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, &set)) mask[i / (8 * sizeof(unsigned long))] |= 1ul << (i % (8 * sizeof(unsigned long)));
  HORA_MPI_CHECK(MPI_Allreduce(mask, all, (int)(sizeof mask / sizeof *mask), MPI_UNSIGNED_LONG, MPI_BOR, c->local));
  c->local_cpus = 0;
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) c->local_cpus += __builtin_popcountl(all[i]);
  return HORA_SUCCESS;
}

/* The check that makes Horovod #2588's silent failure loud: N tasks started, but each one is
 * its own MPI world. `mpirun_started` is true when Open MPI's mpirun launched us (its own
 * world is authoritative even inside a Slurm step of its daemons). */
static hora_result_t check_world(hora_ctx_t *c, const hora_params_t *p, int mpirun_started) {
  if (p->env_size >= 0 && p->env_size != c->size) {
    return HORA_ERR(HORA_ERR_LAYOUT,
                    "launch started %lld ranks (HORA_SIZE) but MPI sees %d process%s: MPI did not "
                    "join the ranks into one world. Under srun use `srun --mpi=pmix` (Debian's "
                    "Open MPI supports only PMIx under srun); outside Slurm use `launch -np N`",
                    (long long)p->env_size, c->size, c->size == 1 ? "" : "es");
  }
  if (p->env_rank >= 0 && p->env_rank != c->rank) {
    return HORA_ERR(HORA_ERR_LAYOUT,
                    "launch assigned rank %lld (HORA_RANK) but MPI says this process is rank %d: "
                    "the launcher and MPI disagree on the layout",
                    (long long)p->env_rank, c->rank);
  }
  const char *step = getenv("SLURM_STEP_ID"), *nt = getenv("SLURM_NTASKS");
  if (!mpirun_started && p->env_size < 0 && step && nt && *nt) {
    char *end;
    long n = strtol(nt, &end, 10);
    if (!*end && n > 0 && n != c->size) {
      return HORA_ERR(HORA_ERR_LAYOUT,
                      "srun started %ld tasks but MPI sees %d process%s: run srun with --mpi=pmix "
                      "(or set MpiDefault=pmix in slurm.conf); without PMI every task is its own "
                      "single-rank world and would train alone",
                      n, c->size, c->size == 1 ? "" : "es");
    }
  }
  return HORA_SUCCESS;
}

static void ctx_free_comms(hora_ctx_t *c) {
  /* After a failure a wait may have abandoned non-blocking collectives on them (hora__algo_wait),
   * which MPI still progresses: freeing their communicator would let that progress touch freed
   * state (a crash in the next context's first MPI call). Leak them. */
  if (hora__ctx_failed(c)) return;
  if (c->cross != MPI_COMM_NULL) MPI_Comm_free(&c->cross);
  if (c->local != MPI_COMM_NULL) MPI_Comm_free(&c->local);
  if (c->world != MPI_COMM_NULL) MPI_Comm_free(&c->world);
}

hora_result_t hora__ctx_run_finalizers(hora_ctx_t *ctx) {
  hora_result_t first = HORA_SUCCESS;
  for (;;) {
    pthread_mutex_lock(&ctx->lock);
    struct hora_finalizer *f = ctx->finalizers;
    if (f) ctx->finalizers = f->next;
    pthread_mutex_unlock(&ctx->lock);
    if (!f) break;
    hora_result_t rc = f->fn(ctx, f->arg);
    if (rc != HORA_SUCCESS && first == HORA_SUCCESS) first = rc;
    free(f);
  }
  return first;
}

static void log_nondefault_params(void) {
  for (size_t i = 0; i < hora__param_count; i++) {
    const char *v = getenv(hora__param_info[i].env);
    if (v && *v && strcmp(v, hora__param_info[i].def) != 0)
      HORA_INFO(INIT, "%s=%s (default %s)", hora__param_info[i].env, v, hora__param_info[i].def);
  }
}

/* MPI itself: initialized here with MPI_THREAD_MULTIPLE unless the program did (*owned then says
 * hora must finalize it), or checked for that thread level. */
static hora_result_t mpi_start(int *owned) {
  int inited = 0, finalized = 0;
  *owned = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized)
    return HORA_ERR(HORA_ERR_MPI,
                    "hora_init: MPI is already finalized in this process, and MPI cannot start "
                    "twice (hora_finalize finalizes MPI when hora_init started it: to start hora "
                    "again, initialize MPI before the first hora_init, for example with mpi4py)");
  int provided = 0;
  if (!inited) {
    int mrc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, "MPI_Init_thread", __FILE__, __LINE__);
    *owned = 1;
    if (provided < MPI_THREAD_MULTIPLE) {
      MPI_Finalize();
      *owned = 0;
      return HORA_ERR(HORA_ERR_MPI,
                      "hora_init: MPI provides thread level %d, hora needs MPI_THREAD_MULTIPLE "
                      "(its engine and checkpoint threads call MPI)", provided);
    }
    return HORA_SUCCESS;
  }
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE)
    return HORA_ERR(HORA_ERR_MPI,
                    "hora_init: the program initialized MPI with thread level %d; hora needs "
                    "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)", provided);
  return HORA_SUCCESS;
}

hora_result_t hora__ctx_open(const hora_init_opts_t *opts, hora_ctx_t **out) {
  hora_result_t rc = HORA_SUCCESS;
  if (opts && opts->size < offsetof(hora_init_opts_t, mpi_comm) + sizeof(void *))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                    "hora_init_ex: opts->size=%zu is too small: set it to sizeof(hora_init_opts_t)",
                    opts->size);
  HORA_CHECK(hora__log_configure());
  unsigned gen = hora__fork_watch();
  HORA_CHECK(hora__ctx_init_refused_in_fork());
  HORA_CHECK(hora__params_reload());
  const hora_params_t *p = hora__params();

  hora__fatal_on_init(); /* before MPI_Init: then Open MPI installs no fatal-signal handler */
  int mpirun_started = getenv("OMPI_COMM_WORLD_SIZE") != NULL;
  int mpi_owned = 0;
  hora__init_step("MPI_Init_thread (MPI's own start-up, which waits for every rank of the job)");
  HORA_CHECK(mpi_start(&mpi_owned));
  mpi_gen = gen;

  hora_ctx_t *c = calloc(1, sizeof *c);
  if (!c) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "hora_init: out of memory");
    goto fail_mpi;
  }
  c->world = c->local = c->cross = MPI_COMM_NULL;
  c->device = -1;
  c->verdict = calloc(1, sizeof *c->verdict);
  c->calls = calloc(1 + HORA_SET_SLOTS, sizeof *c->calls);
  if (!c->verdict || !c->calls) {
    free(c->verdict);
    free(c->calls);
    free(c);
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "hora_init: out of memory");
    goto fail_mpi;
  }
  c->mpi_owned = mpi_owned;
  c->fork_gen = gen;
  pthread_mutex_init(&c->lock, NULL);
  MPI_Comm base = (opts && opts->mpi_comm) ? (MPI_Comm)opts->mpi_comm : MPI_COMM_WORLD;
  hora__init_step("MPI_Comm_dup of the world communicator");
  int mrc = MPI_Comm_dup(base, &c->world);
  if (mrc != MPI_SUCCESS) {
    rc = hora__mpi_error(mrc, "MPI_Comm_dup", __FILE__, __LINE__);
    goto fail_ctx;
  }
  /* Errors come back as codes so hora can report them instead of MPI aborting the job. */
  MPI_Comm_set_errhandler(c->world, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->world, &c->rank);
  MPI_Comm_size(c->world, &c->size);
  hora__log_set_rank(c->rank);
  if (!(opts && opts->mpi_comm)) HORA_CHECK_GOTO(check_world(c, p, mpirun_started), rc, fail_ctx);
  hora__init_step("the layout (MPI_Comm_split_type and MPI_Comm_split by node, MPI_Allreduce of the node count)");
  HORA_CHECK_GOTO(build_layout(c, p), rc, fail_ctx);
  hora__init_step("the comparison of the HORA_* settings across ranks (MPI_Allreduce)");
  HORA_CHECK_GOTO(hora__settings_agree(c, p), rc, fail_ctx);
  if (p->device >= 0) c->device = (int)p->device;
  *out = c;
  return HORA_SUCCESS;

fail_ctx:
  hora__ctx_discard(c);
  return rc;
fail_mpi:
  if (mpi_owned) MPI_Finalize();
  return rc;
}

hora_result_t hora__ctx_open_sub(hora_ctx_t *parent, MPI_Comm comm, int *ranks, int nranks,
                                 hora_ctx_t **out) {
  hora_result_t rc = HORA_SUCCESS;
  hora_ctx_t *c = calloc(1, sizeof *c);
  if (!c) {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    free(ranks);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_process_set_create: out of memory");
  }
  c->world = comm;
  c->local = c->cross = MPI_COMM_NULL;
  c->device = parent->device;
  c->fork_gen = parent->fork_gen;
  c->parent = parent;
  c->set_ranks = ranks;
  c->set_nranks = nranks;
  c->rank = c->size = -1;
  c->verdict = calloc(1, sizeof *c->verdict);
  if (!c->verdict) {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    free(ranks);
    free(c);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_process_set_create: out of memory");
  }
  pthread_mutex_init(&c->lock, NULL);
  if (comm == MPI_COMM_NULL) {
    c->excluded = 1;
    *out = c;
    return HORA_SUCCESS;
  }
  MPI_Comm_set_errhandler(c->world, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->world, &c->rank);
  MPI_Comm_size(c->world, &c->size);
  HORA_CHECK_GOTO(build_layout(c, hora__params()), rc, fail);
  *out = c;
  return HORA_SUCCESS;
fail:
  hora__ctx_discard(c);
  return rc;
}

hora_result_t hora__ctx_publish(hora_ctx_t *c) {
  if (!live_add(c)) return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_init: more than %d live contexts", MAX_LIVE);
  if (c->rank == 0 && !c->parent) {
    HORA_INFO(INIT, "hora %s: %d ranks on %d node%s (local size %d)", HORA_VERSION_STRING,
              c->size, c->cross_size, c->cross_size == 1 ? "" : "s", c->local_size);
    log_nondefault_params();
  }
  return HORA_SUCCESS;
}

void hora__ctx_discard(hora_ctx_t *c) {
  live_remove(c);
  /* After a failure (ctx->failed: a peer declared dead, or a module of this rank alone failed to
   * start) MPI_Finalize would wait for ranks that are gone or going on: the process ends with MPI
   * initialized instead. */
  int owned = c->mpi_owned && !__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE);
  ctx_free_comms(c);
  if (!hora__ctx_verdict_set(c->verdict)) free(c->verdict); /* else leaked: a thread stuck in MPI may read it */
  /* The heartbeat thread, the counts' only other reader, stopped in the finalizers; a set's are
   * a slot of its root's. */
  if (!c->parent) free(c->calls);
  pthread_mutex_destroy(&c->lock);
  free(c->set_ranks);
  free(c);
  if (owned) MPI_Finalize();
}

void hora__ctx_fail(hora_ctx_t *ctx, hora_result_t rc, const char *msg) {
  struct hora_verdict *v = ctx->verdict;
  /* The first caller claims it, writes it, then publishes it (no lock: callers hold engine locks). */
  if (v && !__atomic_exchange_n(&v->claimed, 1, __ATOMIC_ACQ_REL)) {
    v->rc = rc;
    snprintf(v->msg, sizeof v->msg, "%s", msg ? msg : "failed");
    __atomic_store_n(&v->set, 1, __ATOMIC_RELEASE);
  }
  __atomic_store_n(&ctx->failed, 1, __ATOMIC_RELEASE);
}

void hora__ctx_fail_job(hora_ctx_t *ctx, hora_result_t rc, const char *msg) {
  hora__ctx_fail(ctx, rc, msg);
  if (!ctx->parent) return;
  hora_ctx_t *root = ctx->parent;
  while (root->parent) root = root->parent;
  char rmsg[256];
  snprintf(rmsg, sizeof rmsg, "on a %s: %.180s", ctx->calls ? ctx->calls->what : "process set", msg);
  hora__ctx_fail(root, rc, rmsg);
}

hora_result_t hora__ctx_verdict(const hora_ctx_t *ctx, const char *what) {
  if (!hora__ctx_failed(ctx)) return HORA_SUCCESS;
  const struct hora_verdict *v = hora__ctx_verdict_set(ctx->verdict) ? ctx->verdict : ctx->parent->verdict;
  return HORA_ERR(v->rc, "%s: %s", what, v->msg);
}

hora_result_t hora__ctx_wait(const hora_ctx_t *ctx, int started, MPI_Request *req, const char *what, size_t bytes) {
  if (started != MPI_SUCCESS) return hora__mpi_error(started, what, __FILE__, __LINE__);
  double nap = 1e-6, poll_until = bytes ? hora__now_s() + (double)bytes / HORA_WAIT_RATE_FLOOR : 0;
  for (unsigned i = 0;; i++) {
    int done = 0, mrc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, what, __FILE__, __LINE__);
    if (done) return HORA_SUCCESS;
    if (hora__ctx_failed(ctx)) return hora__ctx_verdict(ctx, what);
    if (i < 64 || (poll_until > 0 && ((i & 63) || hora__now_s() < poll_until))) {
      if (i >= 64) sched_yield();
      continue;
    }
    poll_until = 0;
    struct timespec ts = {0, (long)(nap * 1e9)};
    nanosleep(&ts, NULL);
    if (nap < 1e-3) nap *= 2;
  }
}

hora_result_t hora__ctx_dup(const hora_ctx_t *ctx, MPI_Comm base, MPI_Comm *out, const char *what) {
  MPI_Comm *cell = malloc(sizeof *cell); /* apart: an abandoned MPI_Comm_idup may still write it */
  if (!cell) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", what);
  MPI_Request req = MPI_REQUEST_NULL;
  hora_result_t rc = hora__ctx_wait(ctx, MPI_Comm_idup(base, cell, &req), &req, what, 0);
  if (rc == HORA_SUCCESS) *out = *cell;
  if (rc == HORA_SUCCESS || rc == HORA_ERR_MPI) free(cell); /* else leaked: see above */
  return rc;
}

hora_result_t hora__ctx_barrier(const hora_ctx_t *ctx, MPI_Comm comm, const char *what) {
  MPI_Request req = MPI_REQUEST_NULL;
  return hora__ctx_wait(ctx, MPI_Ibarrier(comm, &req), &req, what, 0);
}

/* Also in a fork() child of the rank: they read memory only. */
#define LAYOUT_GETTER(fn, field)                                                  \
  HORA_EXPORT hora_result_t fn(hora_ctx_t *ctx, int *out) {                       \
    HORA_CHECK(check_known(ctx, #fn));                                            \
    HORA_CHECK(check_member(ctx, #fn));                                           \
    if (!out) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, #fn ": output is NULL"); \
    *out = ctx->field;                                                            \
    return HORA_SUCCESS;                                                          \
  }
LAYOUT_GETTER(hora_rank, rank)
LAYOUT_GETTER(hora_size, size)
LAYOUT_GETTER(hora_local_rank, local_rank)
LAYOUT_GETTER(hora_local_size, local_size)
LAYOUT_GETTER(hora_cross_rank, cross_rank)
LAYOUT_GETTER(hora_cross_size, cross_size)
LAYOUT_GETTER(hora_is_homogeneous, uniform_local_size)

HORA_EXPORT hora_result_t hora_device_index(hora_ctx_t *ctx, int *device) {
  HORA_CHECK(check_known(ctx, "hora_device_index"));
  HORA_CHECK(check_member(ctx, "hora_device_index"));
  if (!device) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_device_index: device is NULL");
  if (ctx->device < 0)
    return HORA_ERR(HORA_ERR_NOT_SUPPORTED, "hora_device_index: this rank uses no GPU");
  *device = ctx->device;
  return HORA_SUCCESS;
}
