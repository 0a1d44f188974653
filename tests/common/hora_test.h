/* Test helpers: error counting that is summed across ranks so every rank exits with the same
 * code, exact-in-any-order inputs, and the GPU skip convention (exit 77). */
#ifndef HORA_TEST_H
#define HORA_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* HORA_TEST_NO_MPI: only EXPECT and hora_test_finish, for tests of single source files built
 * without MPI and libhora (tests/unit/cross_arch.sh builds them for other architectures). */
#ifndef HORA_TEST_NO_MPI
#include <mpi.h>

#include "hora.h"
#endif

#define HORA_TEST_SKIP 77

static long hora_test_errors = 0;

#define EXPECT(cond, ...)                                              \
  do {                                                                 \
    if (!(cond)) {                                                     \
      hora_test_errors++;                                              \
      if (hora_test_errors < 20) {                                     \
        fprintf(stderr, "%s:%d: EXPECT(%s) failed: ", __FILE__, __LINE__, #cond); \
        fprintf(stderr, __VA_ARGS__);                                  \
        fprintf(stderr, "\n");                                         \
      }                                                                \
    }                                                                  \
  } while (0)

/* call must return `want`, and hora_last_error() must contain `word`. */
#define EXPECT_ERR(call, want, word)                                                           \
  do {                                                                                         \
    hora_result_t got_ = (call);                                                               \
    EXPECT(got_ == (want), "%s returned %s, want %s (%s)", #call, hora_result_name(got_),      \
           hora_result_name(want), hora_last_error());                                         \
    EXPECT(strstr(hora_last_error(), word) != NULL, "%s: message '%s' does not name '%s'", #call, \
           hora_last_error(), word);                                                           \
  } while (0)

#ifndef HORA_TEST_NO_MPI
#define EXPECT_RC(call, want)                                                          \
  do {                                                                                 \
    hora_result_t got_ = (call);                                                       \
    EXPECT(got_ == (want), "%s returned %s, want %s (%s)", #call, hora_result_name(got_), \
           hora_result_name(want), hora_last_error());                                 \
  } while (0)

#define EXPECT_OK(call) EXPECT_RC(call, HORA_SUCCESS)

/* MPI_Init_thread with MPI_THREAD_MULTIPLE (the async engine needs it) unless MPI is initialized
 * already, then hora_init; the context, or NULL after printing why hora_init failed. *rank and
 * *size get the world's. */
static inline hora_ctx_t *hora_test_init_mpi(int *argc, char ***argv, int *rank, int *size) {
  int provided, inited = 0;
  MPI_Initialized(&inited);
  if (!inited) MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  hora_ctx_t *ctx = NULL;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return NULL;
  }
  hora_rank(ctx, rank);
  hora_size(ctx, size);
  return ctx;
}

/* Sum the error counts over MPI_COMM_WORLD (MPI must still be initialized) and return the
 * exit code every rank uses. */
static inline int hora_test_finish_mpi(const char *name) {
  long total = 0;
  MPI_Allreduce(&hora_test_errors, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) printf("%s: %s (%ld errors over all ranks)\n", name, total ? "FAILED" : "passed", total);
  return total ? 1 : 0;
}
#endif

static inline int hora_test_finish(const char *name) {
  printf("%s: %s (%ld errors)\n", name, hora_test_errors ? "FAILED" : "passed", hora_test_errors);
  return hora_test_errors ? 1 : 0;
}

#endif
