/* hora's fatal-signal handler (fatal.c): one async-signal-safe line, then the default action. */
#ifndef HORA_CORE_FATAL_H
#define HORA_CORE_FATAL_H

/* Install the handler for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT, once per process. Called
 * by hora_init before MPI_Init (so that Open MPI, which allocates in its handler, installs none);
 * keeps handlers the program (or a sanitizer) installed before, replaces Open MPI's when MPI was
 * already up. */
void hora__fatal_on_init(void);

#endif
