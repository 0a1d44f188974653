/* The program of the hang-path tests (hang_test.py): one rank, the victim, leaves the others
 * waiting in a way that is not a death, and every rank must end in bounded time with the error
 * that names it. Each rank prints one result line per step (the driver reads them):
 *
 *   HANG_PROBE rank R STEP RC_NAME in SECONDS s: MESSAGE
 *
 *   hang_probe CASE VICTIM
 *
 * CASE:
 *   finalize  the victim skips the next blocking allreduce (as a program that caught an error of
 *             its own and returns early) and calls hora_finalize: the others' allreduce must fail
 *             with HORA_ERR_REMOTE saying the victim called hora_finalize, and every rank's
 *             hora_finalize must return (issue 14: it hung, each side waiting for the other)
 *   async     as finalize, but the others wait for an async allreduce (hora_allreduce_async +
 *             hora_wait) that the victim never submits: it must fail with HORA_ERR_SHUTDOWN naming
 *             the victim (one rank's hora_finalize stops the async engine on every rank)
 *   pset      the victim stops (SIGSTOP) instead of calling hora_process_set_create: the others'
 *             create must fail with HORA_ERR_REMOTE naming it (it waited in MPI_Allreduce forever)
 *   destroy   every rank makes a process set of all ranks and runs an allreduce on it; then the
 *             victim stops (SIGSTOP) instead of destroying it: the others' hora_process_set_destroy
 *             must return (HORA_ERR_REMOTE) within HORA_PEER_TIMEOUT_S plus a few seconds, and so
 *             must their hora_finalize
 *   early     the victim's first heartbeat is late (HORA_TEST_FAULT=init:late:VICTIM, set by the
 *             driver) and it stops (SIGSTOP) after a few allreduces: the others' next allreduce must
 *             fail within HORA_PEER_TIMEOUT_S (it waited for HORA_INIT_TIMEOUT_S: a peer never
 *             heard from was not watched with the steady-state timeout)
 *   stall     two fake nodes (HORA_CROSS_RANK); the victim sleeps instead of calling the next
 *             allreduce: the others must log the stall warning naming it after HORA_STALL_WARNING_S
 *             and fail with HORA_ERR_TIMEOUT naming it after HORA_STALL_SHUTDOWN_S; the victim, once
 *             awake, fails at its next call (the context failed)
 *   psetfin   as finalize, on a process set of all ranks (made, and used, before): the others'
 *             allreduce on the set must fail with HORA_ERR_REMOTE saying the victim called
 *             hora_finalize, naming the set
 *   psetstall as stall, on a process set of all ranks: the others must fail with HORA_ERR_TIMEOUT
 *             naming the victim after HORA_STALL_SHUTDOWN_S
 *
 * Before each case the ranks run WARMUP allreduces whose results are checked (a wrong value is
 * step "warmup" with rc BAD). After a failure MPI is left unfinalized (hora skips MPI_Finalize):
 * the rank holds a few seconds so that the others can report, then exits 0. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hora.h"

enum { COUNT = 1024, WARMUP = 10 };

static int rank = -1;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static void report(const char *step, hora_result_t rc, double secs) {
  char msg[600];
  snprintf(msg, sizeof msg, "%s", rc == HORA_SUCCESS ? "" : hora_last_error());
  for (char *p = msg; *p; p++)
    if (*p == '\n') *p = ' ';
  printf("HANG_PROBE rank %d %s %s in %.3f s: %s\n", rank, step, hora_result_name(rc), secs, msg);
  fflush(stdout);
}

static hora_result_t allreduce(hora_ctx_t *ctx, int n, int *bad) {
  static float a[COUNT], b[COUNT];
  for (int i = 0; i < COUNT; i++) a[i] = (float)(rank + 1), b[i] = -1.0f;
  hora_result_t rc = hora_allreduce(ctx, a, b, COUNT, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST);
  for (int i = 0; rc == HORA_SUCCESS && i < COUNT; i++) *bad += b[i] != (float)n * (float)(n + 1) / 2;
  return rc;
}

/* One timed step: report it, and return its rc. */
#define STEP(name, call)                   \
  do {                                     \
    double t0_ = now_s();                  \
    rc = (call);                           \
    report(name, rc, now_s() - t0_);       \
  } while (0)

static void finish(hora_ctx_t *ctx, double hold_s) {
  hora_result_t rc;
  STEP("finalize", hora_finalize(ctx));
  sleep_s(hold_s); /* mpirun ends the job when the first rank exits: let the others report */
  fflush(NULL);
  _exit(0);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: hang_probe CASE VICTIM\n");
    return 2;
  }
  const char *kase = argv[1];
  int victim = atoi(argv[2]);
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  rank = r ? atoi(r) : 0;
  const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
  int wsize = ws ? atoi(ws) : 1;
  /* Two fake nodes, the first half of the ranks and the rest, as test_call_check's. */
  if (!strcmp(kase, "stall") || !strcmp(kase, "psetstall")) setenv("HORA_CROSS_RANK", rank < (wsize + 1) / 2 ? "0" : "1", 1);
  const char *pt = getenv("HORA_PEER_TIMEOUT_S");
  double peer_s = pt ? atof(pt) : 30, hold = 2 * peer_s + 4;
  hora_ctx_t *ctx = NULL;
  hora_result_t rc;
  STEP("init", hora_init(&ctx));
  if (rc != HORA_SUCCESS) return 1;
  int n = 0, bad = 0;
  hora_size(ctx, &n);
  for (int i = 0; i < WARMUP; i++) {
    rc = allreduce(ctx, n, &bad);
    if (rc != HORA_SUCCESS || bad) {
      report("warmup", bad ? HORA_ERR_DATA : rc, 0);
      finish(ctx, hold);
    }
  }
  hora_ctx_t *set = NULL;
  int on_set = !strcmp(kase, "psetfin") || !strcmp(kase, "psetstall");
  if (!strcmp(kase, "destroy") || on_set) {
    int *all = malloc((size_t)n * sizeof *all);
    for (int i = 0; i < n; i++) all[i] = i;
    rc = hora_process_set_create(ctx, all, (size_t)n, &set);
    free(all);
    if (rc == HORA_SUCCESS) rc = allreduce(set, n, &bad);
    if (rc != HORA_SUCCESS || bad) {
      report("warmup", bad ? HORA_ERR_DATA : rc, 0);
      finish(ctx, hold);
    }
  }
  if (rank == victim) {
    if (!strcmp(kase, "finalize") || !strcmp(kase, "psetfin")) finish(ctx, hold);
    if (!strcmp(kase, "async")) {
      sleep_s(0.5); /* the others' request is pending by then */
      finish(ctx, hold);
    }
    if (!strcmp(kase, "stall") || !strcmp(kase, "psetstall")) {
      const char *ss = getenv("HORA_STALL_SHUTDOWN_S");
      sleep_s((ss ? atof(ss) : 0) + 2 * peer_s + 2); /* alive, heartbeats flowing, not calling */
      STEP("late_call", allreduce(set ? set : ctx, n, &bad));
      finish(ctx, hold);
    }
    kill(getpid(), SIGSTOP); /* pset, early: hung, not dead (the driver's mpirun kills it at the end) */
    return 0;
  }
  if (strcmp(kase, "async")) sleep_s(0.1);
  if (!strcmp(kase, "destroy")) {
    STEP("call", hora_process_set_destroy(set));
  } else if (!strcmp(kase, "pset")) {
    int *all = malloc((size_t)n * sizeof *all);
    for (int i = 0; i < n; i++) all[i] = i;
    hora_ctx_t *set = NULL;
    STEP("call", hora_process_set_create(ctx, all, (size_t)n, &set));
    free(all);
    if (rc == HORA_SUCCESS) hora_process_set_destroy(set);
  } else if (!strcmp(kase, "async")) {
    static float a[COUNT], b[COUNT];
    hora_handle_t *h = NULL;
    double t0 = now_s();
    rc = hora_allreduce_async(ctx, "never", a, b, COUNT, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST, &h);
    if (rc == HORA_SUCCESS) {
      rc = hora_wait(h);
      hora_handle_free(h);
    }
    report("call", rc, now_s() - t0);
    STEP("submit_after", hora_allreduce_async(ctx, "later", a, b, COUNT, HORA_FLOAT32, HORA_SUM, 1.0, 1.0,
                                              HORA_DEVICE_HOST, &h));
  } else {
    STEP("call", allreduce(on_set ? set : ctx, n, &bad));
  }
  finish(ctx, hold);
  return 0;
}
