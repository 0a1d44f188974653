/* Waiting on a 32-bit word, shared by the window's barrier (algo/shm.c, across processes) and the
 * helper threads' fork-join (algo/pool.c, within one): a pause between spins, and Linux futexes.
 * A futex is the kernel's own sleep-on-a-word; no library wraps it more simply. */
#ifndef HORA_ALGO_FUTEX_H
#define HORA_ALGO_FUTEX_H

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* One pause of a spin loop (lets the sibling hyperthread run; saves power). */
static inline void hora__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Sleep while *w == val, at most 100 ms (which bounds the wait if a wake-up were ever lost, and
 * how late a waiter sees a failure verdict); the caller re-checks the word. shared: the word is
 * in memory mapped by several processes (the shm window), else private to this process. */
static inline void hora__futex_wait(_Atomic uint32_t *w, uint32_t val, int shared) {
  struct timespec ts = {0, 100 * 1000 * 1000};
  syscall(SYS_futex, (uint32_t *)w, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

/* Wake up to n sleepers on w (INT_MAX: all). */
static inline void hora__futex_wake(_Atomic uint32_t *w, int n, int shared) {
  syscall(SYS_futex, (uint32_t *)w, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

#endif
