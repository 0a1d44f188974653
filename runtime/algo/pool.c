/* Helper threads for the shared-memory allreduce (algo/shm.c): one fork-join per piece, so that a
 * rank with several cores of its own copies and reduces its part of a piece on all of them. One
 * core copies far less than a socket's memory system can carry (docs/benchmarks.md, "On a 16-core
 * Xeon": 11.2 ms for 102 MB on one core, hardly slower with four copying at once).
 *
 * Our own code, about 150 lines, because what is needed is small and specific: a join per piece
 * that spins only while the ranks have cores of their own and then sleeps on a futex, as the
 * window's barrier does. OpenMP was the library candidate; in a PyTorch process it would be a
 * second OpenMP runtime beside the one PyTorch's wheels bundle, steered by the OMP_* settings
 * users make for PyTorch's own threads.
 *
 * Protocol. Helper h (h = 0 .. n-2) runs part h+1 of a run; the caller runs part 0. Each helper
 * has its own futex word `go`, bumped only for the runs it takes part in, so a helper never reads
 * a run it is not part of, and the caller's next run cannot overwrite the description of a run a
 * slow helper has yet to read: the caller returns only after every part's helper decremented
 * `left`. All counters are sequentially consistent atomics; the sleep flags and the counters form
 * Dekker pairs (a sleeper stores its flag, then reads the counter inside FUTEX_WAIT; the waker
 * changes the counter, then reads the flag), so a wake-up is never lost. */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "algo/algo.h"

#define POOL_SPIN_NS 20000 /* as the window's barrier (algo/shm.c SPIN_NS) */

typedef struct {
  _Alignas(64) _Atomic uint32_t go; /* bumped by the caller for each run this helper is part of */
  _Atomic uint32_t sleeping;        /* the helper is (about to be) asleep on `go` */
  struct hora_pool *pool;
  int part;
  pthread_t th;
} helper_t;

struct hora_pool {
  int n;       /* parts at most: the helpers and the caller */
  int started; /* helpers running (the first `started` of them) */
  int spin;
  _Atomic int stop;
  _Alignas(64) _Atomic uint32_t left; /* helper parts of the current run not yet done */
  _Atomic uint32_t caller_sleeping;
  hora_pool_fn fn; /* the current run, written before the helpers' `go` is bumped */
  void *arg;
  int nparts;
  helper_t *h;
};

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* A timeout bounds the sleep if a wake-up were ever lost; the caller re-reads the word. */
static void fwait(_Atomic uint32_t *w, uint32_t val) {
  struct timespec ts = {0, 100 * 1000 * 1000};
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

static void fwake(_Atomic uint32_t *w) { syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0); }

/* Wait until *w differs from `old` (spinning first when `spin`); returns its new value. */
static uint32_t wait_change(_Atomic uint32_t *w, uint32_t old, _Atomic uint32_t *sleeping, int spin) {
  uint32_t v;
  if (spin) {
    double t0 = now_ns();
    for (int i = 1;; i++) {
      if ((v = atomic_load(w)) != old) return v;
      relax();
      if ((i & 63) == 0 && now_ns() - t0 > POOL_SPIN_NS) break;
    }
  }
  atomic_store(sleeping, 1);
  while ((v = atomic_load(w)) == old) fwait(w, old);
  atomic_store(sleeping, 0);
  return v;
}

static void *helper_main(void *a) {
  helper_t *h = a;
  struct hora_pool *p = h->pool;
  uint32_t seen = 0;
  for (;;) {
    seen = wait_change(&h->go, seen, &h->sleeping, p->spin);
    if (atomic_load(&p->stop)) return NULL;
    p->fn(p->arg, h->part, p->nparts);
    if (atomic_fetch_sub(&p->left, 1) == 1 && atomic_load(&p->caller_sleeping)) fwake(&p->left);
  }
}

hora_result_t hora__pool_create(int n, int spin, hora_pool_t **out) {
  *out = NULL;
  if (n < 2) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "thread pool: %d parts (at least 2)", n);
  struct hora_pool *p = calloc(1, sizeof *p);
  helper_t *h = p ? aligned_alloc(64, sizeof *h * (size_t)(n - 1)) : NULL;
  if (!h) {
    free(p);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "thread pool: out of memory for %d helpers", n - 1);
  }
  p->n = n;
  p->spin = spin;
  p->h = h;
  atomic_init(&p->stop, 0);
  atomic_init(&p->left, 0);
  atomic_init(&p->caller_sleeping, 0);
  for (int i = 0; i < n - 1; i++) {
    atomic_init(&h[i].go, 0);
    atomic_init(&h[i].sleeping, 0);
    h[i].pool = p;
    h[i].part = i + 1;
  }
  /* A helper that cannot be started leaves its parts to the caller (hora__pool_run): fewer
   * threads, the same results. */
  int prc = 0;
  while (p->started < n - 1 && (prc = pthread_create(&h[p->started].th, NULL, helper_main, &h[p->started])) == 0)
    p->started++;
  if (p->started < n - 1)
    HORA_WARN(SHM, "thread pool: started %d of %d helper threads (%s); the rest of the work runs on the caller",
              p->started, n - 1, strerror(prc));
  *out = p;
  return HORA_SUCCESS;
}

int hora__pool_size(const hora_pool_t *p) { return p ? p->n : 1; }

void hora__pool_run(hora_pool_t *p, int nparts, hora_pool_fn fn, void *arg) {
  if (nparts < 1) nparts = 1;
  if (p && nparts > p->n) nparts = p->n;
  if (!p || nparts == 1) {
    for (int t = 0; t < nparts; t++) fn(arg, t, nparts);
    return;
  }
  int helped = nparts - 1 < p->started ? nparts - 1 : p->started; /* parts 1..helped go to helpers */
  p->fn = fn;
  p->arg = arg;
  p->nparts = nparts;
  atomic_store(&p->left, (uint32_t)helped);
  for (int i = 0; i < helped; i++) {
    atomic_fetch_add(&p->h[i].go, 1);
    if (atomic_load(&p->h[i].sleeping)) fwake(&p->h[i].go);
  }
  fn(arg, 0, nparts);
  for (int t = helped + 1; t < nparts; t++) fn(arg, t, nparts); /* parts of helpers never started */
  uint32_t v;
  if (p->spin) {
    double t0 = now_ns();
    for (int i = 1; atomic_load(&p->left) != 0; i++) {
      relax();
      if ((i & 63) == 0 && now_ns() - t0 > POOL_SPIN_NS) break;
    }
  }
  atomic_store(&p->caller_sleeping, 1);
  while ((v = atomic_load(&p->left)) != 0) fwait(&p->left, v);
  atomic_store(&p->caller_sleeping, 0);
}

void hora__pool_free(hora_pool_t *p) {
  if (!p) return;
  atomic_store(&p->stop, 1);
  for (int i = 0; i < p->started; i++) {
    atomic_fetch_add(&p->h[i].go, 1);
    fwake(&p->h[i].go);
  }
  for (int i = 0; i < p->started; i++) pthread_join(p->h[i].th, NULL);
  free(p->h);
  free(p);
}
