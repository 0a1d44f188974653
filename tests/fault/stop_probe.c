/* The program of the stopped-rank test (stop_test.py): TRIALS trials in one mpirun job. In each
 * trial every rank opens a hora context and runs one kind of collective in a loop, checking each
 * result, until a call fails; the driver stops one rank (SIGSTOP) in the middle of the loop.
 * Every other rank must then get HORA_ERR_REMOTE from the call it is in; the driver checks that
 * it came within HORA_PEER_TIMEOUT_S plus a second of the stop. The driver then resumes the
 * stopped rank (SIGCONT), which fails too (its peers went silent), every rank closes its context
 * (hora_finalize must return promptly after the failure), and the next trial starts on a new
 * context. In the last trial the driver kills the stopped rank instead (SIGKILL), once the others
 * have reported: they exit without MPI_Finalize, as a program does after a lost peer.
 *
 *   stop_probe WORK_DIR KIND TRIALS
 *
 * KIND: allreduce (the algorithm from HORA_ALLREDUCE_ALGO; HIER_NODES=2 in the environment makes
 * each half of the ranks a pretend node, so that hier runs shm inside and the ring across),
 * barrier, broadcast, allgather, async (hora_allreduce_async + hora_wait).
 *
 * The program calls MPI_Init itself, so that hora_init on a new context works after a failure.
 * Files in WORK_DIR (the driver's protocol; times are CLOCK_MONOTONIC seconds, which Python's
 * time.monotonic() reads too):
 *   pid.R             this rank's pid, written once
 *   ready.T.R         rank R runs trial T's loop (written READY_AFTER_S into it)
 *   res.T.R           "RC_NAME T_END CALLS FINALIZE_S BAD T_FINALIZE" once trial T's failing call
 *                     returned and the context was finalized (T_FINALIZE: when hora_finalize began),
 *                     then the message on the next line, then "stalls" and this process's stalls
 *                     since the trial began, each FROM:TO (tests/common/stall_meter.h)
 *   go.T              written by the driver: every rank may start trial T (after it resumed the
 *                     stopped rank of trial T-1)
 *   end               written by the driver once it has the last trial's results: exit now (also
 *                     instead of the next go.T: TRIALS is the most the driver may need, as it
 *                     repeats a trial that the loaded machine spoiled) */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hora.h"
#include "stall_meter.h"

enum { COUNT_SMALL = 256, COUNT_LARGE = 1 << 16 };
/* Ready only after this long in the loop: a margin kept from when a peer stopped before its first
 * heartbeat arrived was watched with HORA_INIT_TIMEOUT_S (hora_init now waits for those first
 * heartbeats, so the bound holds from the start: test_fault_hang_early_np2_v1). */
#define READY_AFTER_S 0.6

static void put_file(const char *dir, const char *name, const char *text) {
  char path[512], tmp[520];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  fputs(text, f);
  fclose(f);
  rename(tmp, path); /* the driver never sees a half-written file */
}

static int file_exists(const char *dir, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return access(path, F_OK) == 0;
}

static void wait_file(const char *dir, const char *name) {
  while (!file_exists(dir, name)) usleep(2000);
}

/* One call of KIND; *bad counts wrong values (rank-dependent inputs, exact results). */
static hora_result_t one_call(hora_ctx_t *ctx, const char *kind, int rank, int n, float *a, float *b,
                              size_t count, int iter, int *bad) {
  hora_result_t rc;
  if (!strcmp(kind, "barrier")) return hora_barrier(ctx);
  if (!strcmp(kind, "broadcast")) {
    int root = iter % n;
    for (size_t i = 0; i < count; i++) a[i] = rank == root ? (float)(root + 1) : -1.0f;
    rc = hora_broadcast(ctx, a, count, HORA_FLOAT32, root, HORA_DEVICE_HOST);
    for (size_t i = 0; rc == HORA_SUCCESS && i < count; i++) *bad += a[i] != (float)(root + 1);
    return rc;
  }
  if (!strcmp(kind, "allgather")) {
    for (size_t i = 0; i < count; i++) a[i] = (float)(rank + 1);
    rc = hora_allgather(ctx, a, b, count, HORA_FLOAT32, HORA_DEVICE_HOST);
    for (size_t i = 0; rc == HORA_SUCCESS && i < count * (size_t)n; i++) *bad += b[i] != (float)(i / count + 1);
    return rc;
  }
  for (size_t i = 0; i < count; i++) a[i] = (float)(rank + 1);
  if (!strcmp(kind, "async")) {
    hora_handle_t *h = NULL;
    rc = hora_allreduce_async(ctx, "stop_probe", a, b, count, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST, &h);
    if (rc == HORA_SUCCESS) {
      rc = hora_wait(h);
      hora_handle_free(h);
    }
  } else {
    rc = hora_allreduce(ctx, a, b, count, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST);
  }
  float want = (float)n * (float)(n + 1) / 2;
  for (size_t i = 0; rc == HORA_SUCCESS && i < count; i++) *bad += b[i] != want;
  return rc;
}

/* HIER_NODES=2: this rank's half of the world is its pretend node (what launch sets per node). */
static void pretend_nodes(int rank, int n) {
  const char *h = getenv("HIER_NODES");
  if (!h || atoi(h) != 2 || n % 2) return;
  char v[16];
  snprintf(v, sizeof v, "%d", n / 2);
  setenv("HORA_LOCAL_SIZE", v, 1);
  snprintf(v, sizeof v, "%d", rank / (n / 2));
  setenv("HORA_CROSS_RANK", v, 1);
  setenv("HORA_CROSS_SIZE", "2", 1);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: stop_probe WORK_DIR KIND TRIALS\n");
    return 2;
  }
  const char *dir = argv[1], *kind = argv[2];
  int trials = atoi(argv[3]);
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  pretend_nodes(rank, n);
  char name[64], text[512];
  snprintf(name, sizeof name, "pid.%d", rank);
  snprintf(text, sizeof text, "%d\n", (int)getpid());
  put_file(dir, name, text);
  const char *algo = getenv("HORA_ALLREDUCE_ALGO");
  size_t count = (!strcmp(kind, "allreduce") && algo && strcmp(algo, "mpi")) ? COUNT_LARGE : COUNT_SMALL;
  float *a = malloc(count * sizeof *a), *b = malloc(count * (size_t)n * sizeof *b);
  if (!a || !b) return 2;
  if (stall_meter_start() != 0) return 2;
  for (int t = 0; t < trials; t++) {
    snprintf(name, sizeof name, "go.%d", t);
    while (!file_exists(dir, name) && !file_exists(dir, "end")) usleep(2000);
    if (!file_exists(dir, name)) break; /* the driver needs no more trials */
    double t_trial = stall_meter_now();
    hora_ctx_t *ctx = NULL;
    hora_init_opts_t opts = {sizeof opts, NULL};
    hora_result_t rc = hora_init_ex(&opts, &ctx);
    if (rc != HORA_SUCCESS) {
      fprintf(stderr, "STOP_PROBE rank %d trial %d: hora_init: %s: %s\n", rank, t, hora_result_name(rc),
                      hora_last_error());
      return 1;
    }
    int bad = 0;
    long calls = 0;
    double t_end = 0, t_ready = stall_meter_now() + READY_AFTER_S;
    int ready = 0;
    for (;;) {
      rc = one_call(ctx, kind, rank, n, a, b, count, (int)calls, &bad);
      t_end = stall_meter_now();
      if (rc != HORA_SUCCESS) break;
      ++calls;
      if (!ready && t_end >= t_ready) {
        ready = 1;
        snprintf(name, sizeof name, "ready.%d.%d", t, rank);
        put_file(dir, name, "1\n");
      }
    }
    char msg[400], res[STALL_METER_MAX * 48 + 1024];
    snprintf(msg, sizeof msg, "%s", hora_last_error());
    for (char *p = msg; *p; p++)
      if (*p == '\n') *p = ' ';
    double f0 = stall_meter_now();
    hora_finalize(ctx);
    double fin = stall_meter_now() - f0;
    snprintf(name, sizeof name, "res.%d.%d", t, rank);
    snprintf(res, sizeof res, "%s %.6f %ld %.3f %d %.6f\n%s\nstalls", hora_result_name(rc), t_end, calls, fin, bad,
             f0, msg);
    stall_meter_append(res, sizeof res - 1, t_trial, 0);
    strcat(res, "\n");
    put_file(dir, name, res);
  }
  /* The last trial's stopped rank is killed: MPI_Finalize would wait for it. Leave only when the
   * driver has every rank's result (a rank that exits without MPI_Finalize makes mpirun end the
   * others, which may not have written theirs yet). */
  fflush(NULL);
  wait_file(dir, "end");
  _exit(0);
}
