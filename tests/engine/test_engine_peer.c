/* Peer death: a loop of async allreduces in which one rank, after 20 steps, kills itself with
 * SIGKILL ("kill"), or stops itself with SIGSTOP ("stop": mpirun does not notice, so only hora's
 * heartbeat can), or rank 0 stops ("stop0": the others watch rank 0), or rank 1 stops between
 * its allreduce and hora_should_stop, which every rank calls each step ("stopshould": the others
 * wait in hora_should_stop, which must end with the verdict, not hang; "stopbarrier": the same
 * before hora_barrier, whose verdict must name hora_barrier), or rank 0 stops right
 * before a hora_ckpt_save ("stop0save": the others wait in the save for rank 0's result, which
 * must end with the verdict naming rank 0; checkpoints go to $HORA_TEST_CKPT_DIR, made and
 * removed by peer_test.py), or rank 1 stops at step 20 right before a call that builds a
 * collective object for the first time, which the others enter ("stopopen": hora_ckpt_open and
 * its communicator; "stopwin": the first blocking hora_allreduce and its shared window): theirs
 * must end with the verdict too; or rank 1 stops between MPI_Init_thread and hora_init
 * ("stopinit": the others' hora_init, blocked in a start-up collective, must end the process
 * with the watchdog's message after 2 x HORA_INIT_TIMEOUT_S, runtime/init/init.c). The survivors
 * print the
 * error (which must be HORA_ERR_REMOTE naming the rank) and exit 3 without hora_finalize, as a
 * training program would. Both print CLOCK_MONOTONIC ("at t=..."; the clock Python's
 * time.monotonic() reads on Linux): peer_test.py bounds the detection from the stop itself, which
 * a loaded machine may reach late, and the job's end from the errors.
 *   test_engine_peer kill|stop|stop0|stopshould|stopbarrier|stop0save|stopopen|stopwin|stopinit */
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "hora_test.h"

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The victim says where it stops and stops (SIGSTOP), or dies (SIGKILL). Once the survivors'
 * errors end the job, mpirun's teardown sends SIGCONT before SIGTERM: a victim that went on from
 * there would finish the call it stopped before (rank 0's hora_ckpt_save then broadcast a real
 * result, and a survivor still waiting took it and failed only at the next step's allreduce). A
 * hung rank does not come back: exit at once instead. */
static void stop_self(int rank, int sig, const char *before, int step) {
  char where[64] = "";
  if (before) snprintf(where, sizeof where, "before %s ", before);
  fprintf(stderr, "rank %d: raising %s %sat step %d at t=%.3f\n", rank, sig == SIGKILL ? "SIGKILL" : "SIGSTOP", where,
          step, mono());
  fflush(stderr);
  raise(sig);
  _exit(9);
}

/* stopopen, stopwin at step 20: the victim stops; the others make the object (see above). */
static hora_result_t first_call(const char *mode, hora_ctx_t *ctx, int rank, int victim, const char **call) {
  int open = strcmp(mode, "stopopen") == 0;
  *call = open ? "hora_ckpt_open" : "hora_allreduce";
  if (rank == victim) stop_self(rank, SIGSTOP, open ? "hora_ckpt_open" : "hora_allreduce", 20);
  if (open) {
    hora_ckpt_opts_t o;
    hora_ckpt_opts_init(&o);
    o.local_dir = getenv("HORA_TEST_CKPT_DIR");
    hora_ckpt_t *ck = NULL;
    return hora_ckpt_open(ctx, &o, &ck);
  }
  size_t n = 262144; /* 1 MiB: the shared-memory algorithm on one node */
  float *b = calloc(n, sizeof *b); /* left to an abandoned request on error */
  return b ? hora_allreduce(ctx, b, b, n, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST) : HORA_ERR_NO_MEMORY;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "kill";
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (strcmp(mode, "stopinit") == 0) {
    int wr;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    if (wr == 1) stop_self(1, SIGSTOP, "hora_init", 0);
  }
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) return 1;
  int rank, size;
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);
  int victim = strcmp(mode, "stop0") == 0 || strcmp(mode, "stop0save") == 0 ? 0 : 1;
  int save = strcmp(mode, "stop0save") == 0, first = !strcmp(mode, "stopopen") || !strcmp(mode, "stopwin");
  int should = strcmp(mode, "stopshould") == 0, barrier = strcmp(mode, "stopbarrier") == 0;
  hora_ckpt_t *ck = NULL;
  if (save) {
    hora_ckpt_opts_t o;
    hora_ckpt_opts_init(&o);
    o.local_dir = getenv("HORA_TEST_CKPT_DIR");
    if (!o.local_dir || hora_ckpt_open(ctx, &o, &ck) != HORA_SUCCESS) {
      fprintf(stderr, "rank %d: no checkpointer (HORA_TEST_CKPT_DIR=%s): %s\n", rank, o.local_dir ? o.local_dir : "unset",
              hora_last_error());
      return 1;
    }
  }
  float x[256], y[256];
  for (int i = 0; i < 256; i++) x[i] = 1;
  double t0 = MPI_Wtime();
  for (int step = 0; MPI_Wtime() - t0 < 60; step++) {
    if (step == 20 && rank == victim && !should && !barrier && !save && !first)
      stop_self(rank, strcmp(mode, "kill") ? SIGSTOP : SIGKILL, NULL, step);
    hora_handle_t *h;
    hora_result_t rc = hora_allreduce_async(ctx, "peer/grad", x, y, 256, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h);
    if (rc == HORA_SUCCESS) {
      rc = hora_wait(h);
      hora_handle_free(h);
    }
    const char *call = "the allreduce";
    if (rc == HORA_SUCCESS && barrier) {
      if (step == 20 && rank == victim) stop_self(rank, SIGSTOP, "hora_barrier", step);
      call = "hora_barrier";
      rc = hora_barrier(ctx);
    }
    if (rc == HORA_SUCCESS && should) {
      if (step == 20 && rank == victim) stop_self(rank, SIGSTOP, "hora_should_stop", step);
      int stop = 0;
      call = "hora_should_stop";
      rc = hora_should_stop(ctx, &stop);
      if (rc == HORA_SUCCESS && stop) {
        fprintf(stderr, "rank %d: hora_should_stop said stop without a signal\n", rank);
        _exit(5);
      }
    }
    if (rc == HORA_SUCCESS && first && step == 20) rc = first_call(mode, ctx, rank, victim, &call);
    if (rc == HORA_SUCCESS && save && step % 5 == 0) {
      if (step == 20 && rank == victim) stop_self(rank, SIGSTOP, "hora_ckpt_save", step);
      hora_tensor_t t = {"x", x, 256, HORA_FLOAT32, HORA_DEVICE_HOST, 0, NULL};
      call = "hora_ckpt_save";
      rc = hora_ckpt_save(ck, step, &t, 1, NULL, 0);
    }
    if (rc != HORA_SUCCESS) {
      fprintf(stderr, "rank %d: step %d: %s failed after %.1f s at t=%.3f: %s: %s\n", rank, step, call, MPI_Wtime() - t0,
              mono(), hora_result_name(rc), hora_last_error());
      fflush(stderr);
      _exit(3);
    }
    usleep(10000);
  }
  fprintf(stderr, "rank %d: NOT DETECTED\n", rank);
  return 4;
}
