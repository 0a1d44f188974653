/* hora's fatal-signal handler (fatal.c): one async-signal-safe line, then the default action. */
#ifndef HORA_CORE_FATAL_H
#define HORA_CORE_FATAL_H

#include <signal.h>

/* Install the handler for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT, once per process. Called
 * by hora_init before MPI_Init (so that Open MPI, which allocates in its handler, installs none);
 * keeps handlers the program (or a sanitizer) installed before, replaces Open MPI's when MPI was
 * already up. */
void hora__fatal_on_init(void);

/* Name the calling thread (at most 15 characters: Linux's limit, "hora-" first by convention),
 * as `top -H`, `ps -L`, gdb and py-spy show it; the fatal-signal line names the crashing thread
 * by it. Each thread hora starts calls this first; on the process's main thread it does nothing
 * (that name is the program's). */
void hora__thread_name(const char *name);

/* Block every signal on the calling thread but those a fault raises (SIGSEGV, SIGBUS, SIGFPE,
 * SIGILL), the previous mask to *old. Called around pthread_create, so that the new hora thread
 * leaves process-directed signals (Slurm's SIGUSR1 and SIGTERM) to the application's threads and
 * still runs the fault handlers (data/mapped.c's SIGBUS guard, the fatal line); restore with
 * pthread_sigmask(SIG_SETMASK, old, NULL). */
void hora__block_async_signals(sigset_t *old);

#endif
