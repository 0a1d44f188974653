/* The fatal-signal handler (runtime/core/fatal.c) in a real crash:
 *   fatal_probe hora-first|mpi-first segv|call|abort|fpe|bus|ill
 * hora-first: hora_init starts MPI (hora's handler goes in before MPI_Init, Open MPI installs
 * none); mpi-first: the program calls MPI_Init_thread itself, so Open MPI's handler is there and
 * hora_init must replace it. Then every rank allreduces once (the world works) and the last rank
 * crashes: a write to a PROT_NONE page for segv, a call through a NULL function pointer for call,
 * abort(), or the signal raised. fatal_test.py checks the output. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "hora.h"

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: fatal_probe hora-first|mpi-first segv|call|abort|fpe|bus|ill\n");
    return 2;
  }
  if (strcmp(argv[1], "mpi-first") == 0) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  }
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  int rank = 0, size = 1, one = 1, sum = 0;
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);
  if (hora_allreduce(ctx, &one, &sum, 1, HORA_INT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST) != HORA_SUCCESS ||
      sum != size) {
    fprintf(stderr, "allreduce: %s (sum %d, want %d)\n", hora_last_error(), sum, size);
    return 1;
  }
  if (rank == size - 1) {
    fflush(NULL);
    const char *k = argv[2];
    if (!strcmp(k, "segv")) {
      /* A real fault on a valid pointer (a NULL store would be caught by UBSan first). */
      volatile char *p = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p != MAP_FAILED) *p = 1;
    } else if (!strcmp(k, "call")) {
      void (*volatile fn)(void) = NULL;
      fn();
    } else if (!strcmp(k, "abort")) {
      abort();
    } else {
      raise(!strcmp(k, "fpe") ? SIGFPE : !strcmp(k, "bus") ? SIGBUS : SIGILL);
    }
    fprintf(stderr, "fatal_probe: still alive after %s\n", k);
    return 1;
  }
  /* The others wait in a collective the crashed rank never joins: mpirun must end them. */
  hora_allreduce(ctx, &one, &sum, 1, HORA_INT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST);
  hora_finalize(ctx);
  return 0;
}
