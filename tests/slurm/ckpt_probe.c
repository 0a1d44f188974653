/* A training loop for the preemption test (test_ckpt_slurm.py): restores, then each step adds
 * the allreduce average of ones to every weight (so after step s every weight is exactly s),
 * saves every 20 steps, and on SIGUSR1/SIGTERM (hora_should_stop) saves the current step,
 * flushes to persistent storage and exits with HORA_EXIT_REQUEUE.
 *   ckpt_probe PERSIST_DIR STEPS      (local_dir: hora's default; 50 ms per step)
 * Rank 0 prints RESUME, PROGRESS, STOPPED and DONE lines; every rank checks the restored values. */
#include <inttypes.h>
#include <stdlib.h>
#include <time.h>

#include "hora_test.h"

enum { N = 4096 };

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: ckpt_probe PERSIST_DIR STEPS\n");
    return 2;
  }
  int64_t steps = atoll(argv[2]);
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  int rank = 0;
  hora_rank(ctx, &rank);
  EXPECT_OK(hora_ckpt_on_signal(ctx));
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.persist_dir = argv[1];
  hora_ckpt_t *ck = NULL;
  if (hora_ckpt_open(ctx, &o, &ck) != HORA_SUCCESS) {
    fprintf(stderr, "hora_ckpt_open: %s\n", hora_last_error());
    return 1;
  }
  static float w[N], ones[N], g[N];
  for (int i = 0; i < N; i++) ones[i] = 1.0f;
  hora_tensor_t t = {"w", w, N, HORA_FLOAT32, HORA_DEVICE_HOST, 0, NULL};
  int64_t step = 0;
  const char *src = "none";
  hora_result_t rc = hora_ckpt_restore(ck, &step, &t, 1);
  if (rc == HORA_SUCCESS) hora_ckpt_restore_source(ck, &src);
  else EXPECT(rc == HORA_ERR_NOT_FOUND, "restore: %s", hora_last_error());
  int ok = 1;
  for (int i = 0; i < N; i++) ok &= w[i] == (float)step;
  EXPECT(ok, "rank %d: restored weights are not %" PRId64, rank, step);
  const char *rc_env = getenv("SLURM_RESTART_COUNT");
  if (rank == 0)
    printf("RESUME restart=%s step=%" PRId64 " ok=%d source=%s\n", rc_env ? rc_env : "0", step, ok, src);
  fflush(stdout);
  for (int64_t s = step + 1; s <= steps; s++) {
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
    EXPECT_OK(hora_allreduce(ctx, ones, g, N, HORA_FLOAT32, HORA_AVERAGE, 1.0, 1.0, HORA_DEVICE_HOST));
    for (int i = 0; i < N; i++) w[i] += g[i];
    int stop = 0;
    EXPECT_OK(hora_should_stop(ctx, &stop));
    if (stop || s % 20 == 0) EXPECT_OK(hora_ckpt_save(ck, s, &t, 1, NULL, 0));
    if (stop) {
      EXPECT_OK(hora_ckpt_close(ck)); /* flushes to PERSIST_DIR */
      if (rank == 0) printf("STOPPED step=%" PRId64 "\n", s);
      fflush(stdout);
      int errors = hora_test_finish_mpi("ckpt_probe");
      hora_finalize(ctx);
      return errors ? 1 : HORA_EXIT_REQUEUE;
    }
    if (rank == 0 && s % 10 == 0) {
      struct timespec now;
      clock_gettime(CLOCK_REALTIME, &now);
      printf("PROGRESS step=%" PRId64 " time=%ld.%03ld\n", s, (long)now.tv_sec, now.tv_nsec / 1000000);
      fflush(stdout);
    }
  }
  EXPECT_OK(hora_ckpt_close(ck));
  if (rank == 0) printf("DONE step=%" PRId64 " w=%.1f\n", steps, (double)w[0]);
  int errors = hora_test_finish_mpi("ckpt_probe");
  hora_finalize(ctx);
  return errors ? 1 : 0;
}
