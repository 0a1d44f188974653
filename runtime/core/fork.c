/* fork() children. A child gets a copy of its parent's memory but only the thread that called
 * fork(): hora's engine, heartbeat, prefetch, checkpoint writer and copier and GPU monitor threads
 * are not there, and MPI's sockets and shared memory still belong to the parent. A call that
 * waits for such a thread waits forever (a PyTorch DataLoader worker iterating a RecordReader
 * opened before the workers were forked; Python's exit handler finalizing hora in a child made by
 * os.fork), and one that talks MPI corrupts the parent's job. Every object that owns a thread,
 * and every context, records the fork generation it was made in; a call from another generation
 * is refused with a message that says so (hora__fork_check). Our own code because no library
 * covers it: pthread_atfork is the mechanism, and the generation count is one integer. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "core/internal.h"

static atomic_uint fork_gen;   /* 0 in the first process; +1 in each fork() child */
static atomic_int forked_from; /* pid that called fork() to make this process, or 0 */
static atomic_int before_fork; /* the forking process's pid, stored by the prepare handler */
static pthread_once_t watch_once = PTHREAD_ONCE_INIT;

static void on_prepare(void) { atomic_store_explicit(&before_fork, (int)getpid(), memory_order_relaxed); }

static void on_child(void) {
  atomic_store_explicit(&forked_from, atomic_load_explicit(&before_fork, memory_order_relaxed),
                        memory_order_relaxed);
  atomic_fetch_add_explicit(&fork_gen, 1, memory_order_relaxed);
}

static void watch_register(void) { pthread_atfork(on_prepare, NULL, on_child); }

unsigned hora__fork_watch(void) {
  pthread_once(&watch_once, watch_register);
  return atomic_load_explicit(&fork_gen, memory_order_relaxed);
}

hora_result_t hora__fork_check_rc(unsigned gen, hora_result_t rc, const char *fn, const char *what, const char *fix) {
  if (__builtin_expect(atomic_load_explicit(&fork_gen, memory_order_relaxed) == gen, 1)) return HORA_SUCCESS;
  return HORA_ERR(rc,
                  "%s: this process (pid %d) is a fork() child of pid %d, and %s was made before the fork: "
                  "its threads and MPI state exist only in the parent, so it cannot be used here%s%s",
                  fn, (int)getpid(), atomic_load_explicit(&forked_from, memory_order_relaxed), what,
                  fix && *fix ? "; " : "", fix ? fix : "");
}
