/* Crash consistency: a child process saves in a loop (copy to persist_dir after every save,
 * flush every other step, reporting each durable step through a pipe) and is killed with
 * SIGKILL at a random moment; the writer and copier are paced (HORA_CKPT_TEST_DELAY_US) so that
 * kills land mid-write and mid-copy. After every kill the parent checks, without MPI, that
 *  - the newest valid checkpoint exists and is not older than the newest step reported durable,
 *  - its tensors hold exactly that step's values,
 *  - every step directory with a manifest (in either place) verifies: nothing torn is committed.
 * The next child restores from what is left and continues, as a requeued job would.
 *   test_ckpt_crash [trials]   (default 50) */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "ckpt/ckpt.h"
#include "ckpt_test.h"
#include "hora_test.h"

#define NT 4
static const size_t tensor_bytes[NT] = {1 << 20, 512 << 10, 256 << 10, 4096};
static const char *names[NT] = {"w1", "w2", "b", "opt/step"};

static void child(const char *L, const char *P, int fd) {
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) _exit(3);
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = L;
  o.persist_dir = P;
  o.copy_interval_s = 0;
  hora_ckpt_t *ck;
  if (hora_ckpt_open(ctx, &o, &ck) != HORA_SUCCESS) _exit(4);
  hora_tensor_t t[NT];
  void *b[NT];
  for (int k = 0; k < NT; k++) {
    b[k] = malloc(tensor_bytes[k]);
    t[k] = (hora_tensor_t){names[k], b[k], tensor_bytes[k], HORA_UINT8, HORA_DEVICE_HOST, 0, NULL};
  }
  int64_t step = 0;
  hora_result_t rc = hora_ckpt_restore(ck, &step, t, NT);
  if (rc == HORA_SUCCESS) {
    for (int k = 0; k < NT; k++)
      if (ck_check(b[k], tensor_bytes[k], step, k) >= 0) _exit(5); /* restored wrong values */
  } else if (rc != HORA_ERR_NOT_FOUND) {
    _exit(6);
  }
  char line[64];
  int n = snprintf(line, sizeof line, "R %" PRId64 "\n", step);
  if (write(fd, line, (size_t)n) != n) _exit(7);
  for (int64_t s = step + 1;; s++) {
    for (int k = 0; k < NT; k++) ck_fill(b[k], tensor_bytes[k], s, k);
    if (hora_ckpt_save(ck, s, t, NT, NULL, 0) != HORA_SUCCESS) _exit(8);
    if (s % 2 == 0) {
      if (hora_ckpt_flush(ck) != HORA_SUCCESS) _exit(9);
      n = snprintf(line, sizeof line, "D %" PRId64 "\n", s);
      if (write(fd, line, (size_t)n) != n) _exit(7);
    }
  }
}

/* Every committed step directory of `dir` must verify. Returns the number checked. */
static int check_committed(const char *dir) {
  int64_t *steps;
  size_t n;
  if (hora__ck_list_steps(dir, &steps, &n) != HORA_SUCCESS) return 0;
  for (size_t i = 0; i < n; i++) {
    char sd[4200];
    hora__ck_step_dir(dir, steps[i], sd, sizeof sd);
    if (!hora__ck_has_manifest(sd)) continue;
    ck_manifest_t m;
    EXPECT(hora__ck_validate(sd, 0, &m, NULL, NULL) == HORA_SUCCESS, "committed %s does not verify: %s", sd,
           hora_last_error());
  }
  free(steps);
  return (int)n;
}

int main(int argc, char **argv) {
  int trials = argc > 1 ? atoi(argv[1]) : 50;
  setenv("HORA_CKPT_CHUNK_BYTES", "64K", 1);
  setenv("HORA_CKPT_TEST_DELAY_US", "1500", 1);
  /* Each child is an MPI singleton. Without this, Open MPI starts a daemon (orted) for every one
   * of them, which costs about a second per trial, and the parent's read of the pipe waits for
   * that daemon (it holds the pipe's write end) to notice the kill and exit. The children never
   * spawn processes, so they need no daemon: same trials and checks, half the CPU time, and on a
   * loaded machine a fraction of the wall time. */
  setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
  if (!getenv("HORA_LOG")) setenv("HORA_LOG", "NONE", 1);
  char *root = ck_mktemp("ckpt-crash");
  char L[4200], P[4200];
  snprintf(L, sizeof L, "%s/local", root);
  snprintf(P, sizeof P, "%s/persist", root);
  srand((unsigned)time(NULL) ^ (unsigned)getpid());
  int64_t durable = 0, restored_max = 0;
  int mid_write = 0, mid_copy = 0, resumed = 0;
  double t0 = hora__now_s();
  for (int trial = 0; trial < trials; trial++) {
    int fds[2];
    if (pipe(fds) != 0) return 1;
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      child(L, P, fds[1]);
      _exit(0);
    }
    close(fds[1]);
    FILE *in = fdopen(fds[0], "r");
    char line[64];
    int64_t start = -1;
    /* Wait for the child to have restored, then kill it 20..400 ms later. */
    if (fgets(line, sizeof line, in) && line[0] == 'R') start = strtoll(line + 2, NULL, 10);
    EXPECT(start >= 0, "trial %d: the child did not start", trial);
    EXPECT(start >= durable, "trial %d: the child restored step %" PRId64 ", older than step %" PRId64
           " reported durable", trial, start, durable);
    if (start > 0) resumed++;
    struct timespec ts = {0, (20 + rand() % 380) * 1000000L};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "trial %d: the child ended by itself (status %d)", trial,
           WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    while (fgets(line, sizeof line, in))
      if (line[0] == 'D') durable = strtoll(line + 2, NULL, 10);
    fclose(in);
    /* What the kill left behind. */
    mid_write += ck_count_tmp(L) > 0;
    mid_copy += ck_count_tmp(P) > 0;
    check_committed(L);
    check_committed(P);
    char *path = NULL;
    unsigned char *buf = NULL;
    ck_snap_t snap;
    hora_result_t rc = hora__ck_find_newest(L, P, &path, &buf, &snap);
    if (durable > 0 || rc == HORA_SUCCESS) {
      EXPECT(rc == HORA_SUCCESS, "trial %d: no valid checkpoint although step %" PRId64 " was durable: %s", trial,
             durable, hora_last_error());
    }
    if (rc == HORA_SUCCESS) {
      EXPECT(snap.step >= durable, "trial %d: newest valid step %" PRId64 " < durable step %" PRId64, trial,
             snap.step, durable);
      if (snap.step > restored_max) restored_max = snap.step;
      EXPECT(snap.ntensors == NT, "trial %d: %zu tensors", trial, snap.ntensors);
      for (size_t i = 0; i < snap.ntensors; i++) {
        int k = -1;
        for (int j = 0; j < NT; j++)
          if (strcmp(snap.t[i].name, names[j]) == 0) k = j;
        EXPECT(k >= 0 && snap.t[i].bytes == tensor_bytes[k] && ck_check(snap.data + snap.t[i].offset, snap.t[i].bytes,
               snap.step, k) < 0, "trial %d: tensor %s of step %" PRId64 " has wrong values", trial,
               snap.t[i].name, snap.step);
      }
      hora__ck_snap_free(&snap);
      free(buf);
      free(path);
    }
  }
  printf("%d trials in %.1f s: %d killed mid-write, %d mid-copy, %d resumed from a checkpoint; newest durable step "
         "%" PRId64 ", newest valid %" PRId64 "\n", trials, hora__now_s() - t0, mid_write, mid_copy, resumed, durable,
         restored_max);
  EXPECT(durable > 0, "no step ever became durable");
  EXPECT(trials < 20 || (mid_write > 0 && mid_copy > 0),
         "kills never landed mid-write (%d) or mid-copy (%d): the test does not test what it should", mid_write,
         mid_copy);
  ck_rmrf(root);
  free(root);
  return hora_test_finish("test_ckpt_crash");
}
