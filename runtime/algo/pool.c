/* Helper threads for the shared-memory allreduce (algo/shm.c): one fork-join per piece, so that a
 * rank with several cores of its own copies and reduces its part of a piece on all of them. One
 * core copies far less than a socket's memory system can carry (docs/benchmarks.md, "On a 16-core
 * Xeon": 11.2 ms for 102 MB on one core, hardly slower with four copying at once).
 *
 * Our own code, about 130 lines, because what is needed is small and specific: a join per piece
 * that spins only while the ranks have cores of their own and then sleeps on a futex, as the
 * window's barrier does, and that never waits for a helper the scheduler has not run. OpenMP was
 * the library candidate; in a PyTorch process it would be a second OpenMP runtime beside the one
 * PyTorch's wheels bundle, steered by the OMP_* settings users make for PyTorch's own threads, and
 * its static schedules wait for every thread of the team.
 *
 * Protocol. A run publishes its parts in one word, `state` = parts << 32 | next part to claim.
 * The caller and the helpers it woke claim parts by compare-and-swap until none is left, so a
 * helper that is slow to be scheduled (the rank's cores busy with the training's own threads)
 * takes no part and delays nothing: the caller does its parts. A claim names the part and the
 * run's number of parts at once, and a run's fn and arg are written before its `state`, so a claim
 * always reads the current run's. The caller returns when `done` reaches the number of parts; the
 * next run starts only then, so no part of an earlier run is ever outstanding. All counters are
 * sequentially consistent atomics; each sleep flag or count and the counter it guards form a
 * Dekker pair (a sleeper announces itself, then reads the word inside FUTEX_WAIT; the waker
 * changes the word, then reads the announcement), so a wake-up is never lost. */
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "algo/futex.h"
#include "core/fatal.h"

#define POOL_SPIN_NS 20000 /* as the window's barrier (algo/shm.c SPIN_NS) */
#define POOL_MAX_PARTS 255

struct hora_pool {
  int n;       /* threads: the helpers and the caller */
  int started; /* helpers running */
  int spin;
  _Atomic int stop;
  hora_pool_fn fn; /* the current run, written before its `state` */
  void *arg;
  pthread_t *th;
  _Alignas(64) _Atomic uint64_t state; /* parts << 32 | next part to claim */
  _Alignas(64) _Atomic uint32_t done;  /* parts of the current run finished */
  _Atomic uint32_t caller_sleeping;
  _Alignas(64) _Atomic uint32_t gen; /* bumped per run: the helpers' futex word */
  _Atomic uint32_t sleepers;         /* helpers asleep (or about to be) on `gen` */
};

/* Claim and run parts of the current run until none is left. */
static void work(struct hora_pool *p) {
  uint64_t s = atomic_load(&p->state);
  for (;;) {
    uint32_t t = (uint32_t)s, np = (uint32_t)(s >> 32);
    if (t >= np) return;
    if (!atomic_compare_exchange_weak(&p->state, &s, s + 1)) continue; /* s now holds the new value */
    p->fn(p->arg, (int)t, (int)np);
    if (atomic_fetch_add(&p->done, 1) + 1 == np && atomic_load(&p->caller_sleeping)) hora__futex_wake(&p->done, 1, 0);
    s = atomic_load(&p->state);
  }
}

static void *helper_main(void *a) {
  struct hora_pool *p = a;
  hora__thread_name("hora-shm");
  uint32_t seen = atomic_load(&p->gen), v;
  for (;;) {
    if (p->spin) {
      double until = hora__now_s() + POOL_SPIN_NS * 1e-9;
      for (int i = 1; atomic_load(&p->gen) == seen; i++) {
        hora__cpu_relax();
        if ((i & 63) == 0 && hora__now_s() > until) break;
      }
    }
    atomic_fetch_add(&p->sleepers, 1);
    while ((v = atomic_load(&p->gen)) == seen) hora__futex_wait(&p->gen, seen, 0);
    atomic_fetch_sub(&p->sleepers, 1);
    seen = v;
    if (atomic_load(&p->stop)) return NULL;
    work(p);
  }
}

hora_result_t hora__pool_create(int n, int spin, hora_pool_t **out) {
  *out = NULL;
  if (n < 2) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "thread pool: %d threads (at least 2)", n);
  struct hora_pool *p = aligned_alloc(64, (sizeof *p + 63) / 64 * 64);
  pthread_t *th = p ? calloc((size_t)(n - 1), sizeof *th) : NULL;
  if (!th) {
    free(p);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "thread pool: out of memory for %d helpers", n - 1);
  }
  memset(p, 0, sizeof *p);
  p->n = n;
  p->spin = spin;
  p->th = th;
  atomic_init(&p->stop, 0);
  atomic_init(&p->state, 0);
  atomic_init(&p->done, 0);
  atomic_init(&p->caller_sleeping, 0);
  atomic_init(&p->gen, 0);
  atomic_init(&p->sleepers, 0);
  /* A helper that cannot be started leaves its parts to the others: fewer threads, the same
   * results. Helpers leave process-directed signals to the application's threads. */
  sigset_t old;
  hora__block_async_signals(&old);
  int prc = 0;
  while (p->started < n - 1 && (prc = pthread_create(&th[p->started], NULL, helper_main, p)) == 0) p->started++;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (p->started < n - 1)
    HORA_WARN(SHM, "thread pool: started %d of %d helper threads (%s); the others do their work",
              p->started, n - 1, strerror(prc));
  *out = p;
  return HORA_SUCCESS;
}

void hora__pool_run(hora_pool_t *p, int nparts, hora_pool_fn fn, void *arg) {
  if (nparts < 1) nparts = 1;
  if (nparts > POOL_MAX_PARTS) nparts = POOL_MAX_PARTS;
  if (!p || nparts == 1 || p->started == 0) {
    for (int t = 0; t < nparts; t++) fn(arg, t, nparts);
    return;
  }
  p->fn = fn;
  p->arg = arg;
  atomic_store(&p->done, 0);
  atomic_store(&p->state, (uint64_t)nparts << 32);
  atomic_fetch_add(&p->gen, 1);
  uint32_t asleep = atomic_load(&p->sleepers);
  if (asleep) hora__futex_wake(&p->gen, nparts - 1 < (int)asleep ? nparts - 1 : (int)asleep, 0);
  work(p);
  uint32_t v;
  if (p->spin) {
    double until = hora__now_s() + POOL_SPIN_NS * 1e-9;
    for (int i = 1; atomic_load(&p->done) != (uint32_t)nparts; i++) {
      hora__cpu_relax();
      if ((i & 63) == 0 && hora__now_s() > until) break;
    }
  }
  atomic_store(&p->caller_sleeping, 1);
  while ((v = atomic_load(&p->done)) != (uint32_t)nparts) hora__futex_wait(&p->done, v, 0);
  atomic_store(&p->caller_sleeping, 0);
}

void hora__pool_free(hora_pool_t *p) {
  if (!p) return;
  atomic_store(&p->stop, 1);
  atomic_fetch_add(&p->gen, 1);
  hora__futex_wake(&p->gen, INT_MAX, 0);
  for (int i = 0; i < p->started; i++) pthread_join(p->th[i], NULL);
  free(p->th);
  free(p);
}
