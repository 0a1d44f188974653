/* A crashing rank must end, at once and with one clear line, never hang.
 *
 * Open MPI installs a handler for SIGABRT, SIGBUS, SIGFPE and SIGSEGV (MCA param opal_signal) that
 * prints a backtrace with backtrace() and malloc(): on a corrupt heap that handler deadlocks in
 * malloc, and the crashed rank sits there until someone kills it by hand (the job never ends).
 * Open MPI does not replace a handler that is already installed when MPI_Init runs (ompi_info:
 * "Open MPI will *not* replace signals if handlers are already installed by the time MPI_INIT is
 * invoked"). So hora_init installs this module's handler for SIGSEGV, SIGBUS, SIGFPE, SIGILL and
 * SIGABRT before it calls MPI_Init; when the program initialized MPI itself, Open MPI's handlers
 * are already there and are replaced (not chained: they are what must not run). A handler is
 * Open MPI's when its code lies in libopen-pal or libmpi (dladdr).
 *
 * The handler first write(2)s ONE line with async-signal-safe calls only: the prefix prepared at
 * install time plus the signal number, thread id, fault address and faulting instruction
 * formatted by hand (no printf, no malloc). It then restores the default action and prints the
 * thread's stack (glibc's backtrace, loaded at install time, and backtrace_symbols_fd, which do
 * not allocate; alarm(10) bounds them), and re-raises, so the process ends by the signal (core
 * dump where enabled) and launch/srun/mpirun see a rank killed by a signal:
 *
 *   hora: rank 3 (node n2, host gpu07, pid 4242, tid 4250, thread hora-engine): fatal signal 11
 *   (SIGSEGV) at address 0x10, instruction 0x7f3a5c2b1e40; the process ends now
 *   hora: rank 3 (node n2, host gpu07, pid 4242, tid 4250): the stack, innermost frame first:
 *   /usr/lib/libhora.so.0(+0x1e40)[0x7f3a5c2b1e40]
 *   ...
 *
 * (module+offset resolves to a line with `addr2line -e MODULE OFFSET`.) The thread is "main thread"
 * when its tid is the pid, else its name (prctl PR_GET_NAME, a plain system call): hora's own
 * threads are named hora-* (hora__thread_name), threads of MPI, CUDA or the program keep theirs.
 *
 * Handlers that the program (or hora's record reader, for SIGBUS on its file mappings) installed
 * before hora_init are kept: they run instead of this one (the reader's guard chains to whatever
 * was there before it, which is this handler when the reader opens after hora_init). The rank in
 * the line comes from the launcher's environment (HORA_RANK, OMPI_COMM_WORLD_RANK, PMIX_RANK,
 * SLURM_PROCID), since MPI has not started yet; "?" when none is set. */
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "core/fatal.h"

static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
static const char *const names[] = {"SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT"};
enum { NSIGS = sizeof sigs / sizeof *sigs };

static char g_prefix[256]; /* "hora: rank 3 (node n2, host h, pid 4242" */
static size_t g_prefix_len;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Append s to b[*n] (bounded), async-signal-safe. */
static void put(char *b, size_t cap, size_t *n, const char *s) {
  while (*s && *n + 1 < cap) b[(*n)++] = *s++;
}
static void put_num(char *b, size_t cap, size_t *n, unsigned long v, unsigned base) {
  char t[24];
  int k = 0;
  do {
    unsigned d = (unsigned)(v % base);
    t[k++] = (char)(d < 10 ? '0' + d : 'a' + d - 10);
    v /= base;
  } while (v && k < (int)sizeof t);
  while (k && *n + 1 < cap) b[(*n)++] = t[--k];
}

/* The program counter of the faulting instruction, from the signal's machine context. */
static void *fault_pc(void *uc) {
  if (!uc) return NULL;
#if defined(__x86_64__)
  return (void *)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
  return (void *)((ucontext_t *)uc)->uc_mcontext.pc;
#else
  return NULL;
#endif
}

/* write(2) "<a><b><num><c>" as one line (async-signal-safe; num omitted when b is empty). */
static void put_line(const char *a, const char *b, unsigned long num, const char *c) {
  char t[400];
  size_t n = 0;
  put(t, sizeof t, &n, a);
  if (*b) {
    put(t, sizeof t, &n, b);
    put_num(t, sizeof t, &n, num, 10);
  }
  put(t, sizeof t, &n, c);
  ssize_t w = write(STDERR_FILENO, t, n);
  (void)w;
}

static void on_fatal(int sig, siginfo_t *si, void *uc) {
  char b[400];
  size_t n = 0;
  const char *name = "?";
  for (int i = 0; i < NSIGS; i++)
    if (sigs[i] == sig) name = names[i];
  put(b, sizeof b, &n, g_prefix);
  unsigned long tid = (unsigned long)syscall(SYS_gettid);
  put(b, sizeof b, &n, ", tid ");
  put_num(b, sizeof b, &n, tid, 10);
  char tname[17] = "";
  if (tid == (unsigned long)getpid()) {
    put(b, sizeof b, &n, ", main thread");
  } else if (prctl(PR_GET_NAME, tname, 0, 0, 0) == 0 && tname[0]) {
    tname[16] = 0;
    put(b, sizeof b, &n, ", thread ");
    put(b, sizeof b, &n, tname);
  }
  put(b, sizeof b, &n, "): fatal signal ");
  put_num(b, sizeof b, &n, (unsigned long)sig, 10);
  put(b, sizeof b, &n, " (");
  put(b, sizeof b, &n, name);
  put(b, sizeof b, &n, ")");
  if (si && si->si_code > 0 && sig != SIGABRT) { /* raised by a fault, not sent */
    put(b, sizeof b, &n, " at address 0x");
    put_num(b, sizeof b, &n, (unsigned long)(uintptr_t)si->si_addr, 16);
  }
  void *pc = fault_pc(uc), *caller = NULL;
  if (si && si->si_code > 0 && sig != SIGABRT) {
    put(b, sizeof b, &n, ", instruction 0x");
    put_num(b, sizeof b, &n, (unsigned long)(uintptr_t)pc, 16);
#if defined(__x86_64__)
    /* The fetch of the instruction itself faulted (PC = fault address): most likely a call
     * through a NULL or wild function pointer. The unwinder cannot step from there, but the call
     * left its return address on top of the stack. */
    if (uc && pc == si->si_addr && sig == SIGSEGV)
      caller = *(void **)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RSP];
#endif
  }
  put(b, sizeof b, &n, "; the process ends now\n");
  ssize_t w = write(STDERR_FILENO, b, n);
  (void)w;
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, NULL);
  /* Then the stack, after the line (which is all that must get out). backtrace() was loaded at
   * install time, so it does not allocate here; backtrace_symbols_fd writes without allocating but
   * takes the dynamic loader's lock (dladdr): alarm() ends the process should that lock never come
   * free. A second fault while unwinding a smashed stack ends it too (the signal is blocked in its
   * handler and now has its default action, so the kernel kills the process). */
  sigaction(SIGALRM, &dfl, NULL);
  alarm(10);
  put_line(g_prefix, ", tid ", (unsigned long)syscall(SYS_gettid), "): the stack, innermost frame first:\n");
  void *frames[64];
  int nf = backtrace(frames, 64);
  if (caller) {
    put_line("  (a jump to a bad address, from the call at:)", "", 0, "\n");
    backtrace_symbols_fd(&caller, 1, STDERR_FILENO);
  }
  backtrace_symbols_fd(frames, nf, STDERR_FILENO);
  /* Pending until we return (the signal is blocked in its handler), then the default action. A
   * fault would repeat on return anyway; a sent signal would not. */
  raise(sig);
}

/* The handler in `sa` belongs to Open MPI (libopen-pal or libmpi, where opal_signal's handler
 * lives): found by the shared object that holds its code. */
static int is_open_mpi(const struct sigaction *sa) {
  void *fn = (sa->sa_flags & SA_SIGINFO) ? (void *)sa->sa_sigaction : (void *)sa->sa_handler;
  Dl_info info;
  if (!fn || !dladdr(fn, &info) || !info.dli_fname) return 0;
  return strstr(info.dli_fname, "libopen-pal") || strstr(info.dli_fname, "libmpi");
}

static const char *first_env(const char *const *vars) {
  for (; *vars; vars++) {
    const char *v = getenv(*vars);
    if (v && *v) return v;
  }
  return NULL;
}

static void install(void) {
  static const char *const rank_vars[] = {"HORA_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", NULL};
  static const char *const node_vars[] = {"SLURMD_NODENAME", NULL};
  const char *rank = first_env(rank_vars), *node = first_env(node_vars);
  char host[128] = "?";
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = 0;
  int len = snprintf(g_prefix, sizeof g_prefix, "hora: rank %.16s (%s%.64s%shost %.64s, pid %ld",
                     rank ? rank : "?", node ? "node " : "", node ? node : "", node ? ", " : "", host,
                     (long)getpid());
  g_prefix_len = len < 0 ? 0 : (size_t)len < sizeof g_prefix ? (size_t)len : sizeof g_prefix - 1;
  void *warm[2];
  (void)backtrace(warm, 2); /* loads the unwinder (libgcc_s, with malloc) now, not in the handler */
  for (int i = 0; i < NSIGS; i++) {
    struct sigaction old, sa;
    if (sigaction(sigs[i], NULL, &old) != 0) continue;
    int has = (old.sa_flags & SA_SIGINFO) ? old.sa_sigaction != NULL
                                          : (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
    if (has && !is_open_mpi(&old)) continue; /* the program's own (or a sanitizer's): it stays */
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, NULL);
  }
}

void hora__fatal_on_init(void) { pthread_once(&g_once, install); }

void hora__thread_name(const char *name) {
  /* Never the main thread: its name is the program's, which ps, pkill and Slurm show. */
  if ((pid_t)syscall(SYS_gettid) == getpid()) return;
  char n[16];
  snprintf(n, sizeof n, "%s", name); /* the kernel keeps 15 characters and a NUL */
  prctl(PR_SET_NAME, n, 0, 0, 0);
}

void hora__block_async_signals(sigset_t *old) {
  sigset_t blocked;
  sigfillset(&blocked);
  sigdelset(&blocked, SIGBUS);
  sigdelset(&blocked, SIGSEGV);
  sigdelset(&blocked, SIGFPE);
  sigdelset(&blocked, SIGILL);
  pthread_sigmask(SIG_SETMASK, &blocked, old);
}
