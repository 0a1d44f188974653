/* Faults around checkpoints:
 *  A. write failure in the background (RLIMIT_FSIZE makes write() fail with EFBIG, as a full
 *     disk or a quota would): the save returns at once, the flush returns HORA_ERR_IO naming the
 *     step, no temporary file and no step directory stay behind, the previous checkpoint still
 *     restores, and later saves work (run in a child process: the limit is process-wide).
 *  B. local_dir on small tmpfs mounts (root only; skipped elsewhere): B1 a save that does not fit
 *     beside the kept versions prunes the oldest early; B2 with a step held by the copier every
 *     later save still fits (held + newest complete kept); B3 a save that comes while a write is
 *     in progress waits for it and, not fitting even then, fails at once with HORA_ERR_IO
 *     ("disk full") leaving the only complete version.
 *  C. persist_dir unreachable for a while (renamed away), then back: flush fails with
 *     HORA_ERR_IO after HORA_CKPT_FLUSH_TIMEOUT_S, nothing is created in its place, and the
 *     copies resume by themselves when it returns. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "ckpt/ckpt.h"
#include "ckpt_test.h"
#include "hora_test.h"

static hora_result_t save_bytes(hora_ckpt_t *ck, int64_t step, void *buf, size_t bytes) {
  ck_fill(buf, bytes, step, 0);
  hora_tensor_t t = {"state", buf, bytes, HORA_UINT8, HORA_DEVICE_HOST, 0, NULL};
  return hora_ckpt_save(ck, step, &t, 1, NULL, 0);
}

static int64_t restore_bytes(hora_ckpt_t *ck, void *buf, size_t bytes) {
  memset(buf, 0, bytes);
  hora_tensor_t t = {"state", buf, bytes, HORA_UINT8, HORA_DEVICE_HOST, 0, NULL};
  int64_t step = -1;
  EXPECT_OK(hora_ckpt_restore(ck, &step, &t, 1));
  EXPECT(ck_check(buf, bytes, step, 0) < 0, "restored step %" PRId64 " has wrong values", step);
  return step;
}

static void part_a_child(const char *L) {
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) _exit(100);
  /* After MPI_Init, whose shared-memory files are larger than the limit. */
  struct rlimit rl = {1 << 20, 1 << 20};
  signal(SIGXFSZ, SIG_IGN);
  setrlimit(RLIMIT_FSIZE, &rl);
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = L;
  hora_ckpt_t *ck = NULL;
  EXPECT_OK(hora_ckpt_open(ctx, &o, &ck));
  size_t small = 100 << 10, big = 3 << 20;
  unsigned char *buf = malloc(big);
  EXPECT_OK(save_bytes(ck, 1, buf, small));
  EXPECT_OK(hora_ckpt_flush(ck));
  EXPECT_OK(save_bytes(ck, 2, buf, big)); /* the snapshot is taken; the write fails later */
  EXPECT_RC(hora_ckpt_flush(ck), HORA_ERR_IO);
  EXPECT(strstr(hora_last_error(), "step 2") && strstr(hora_last_error(), "File too large"),
         "flush message: %s", hora_last_error());
  EXPECT_OK(hora_ckpt_flush(ck)); /* reported once */
  char p[4400];
  snprintf(p, sizeof p, "%s/step-2", L);
  EXPECT(!ck_exists(p), "%s left behind", p);
  EXPECT(ck_count_tmp(L) == 0, "temporary files left in %s", L);
  EXPECT(restore_bytes(ck, buf, small) == 1, "step 1 must still restore");
  /* A deferred error is returned by the next save, which takes no snapshot. */
  EXPECT_OK(save_bytes(ck, 3, buf, big));
  hora_result_t rc = save_bytes(ck, 4, buf, small);
  EXPECT(rc == HORA_ERR_IO, "save after a failed write returned %s", hora_result_name(rc));
  EXPECT_OK(save_bytes(ck, 5, buf, small)); /* training goes on */
  EXPECT_OK(hora_ckpt_flush(ck));
  EXPECT(restore_bytes(ck, buf, small) == 5, "step 5");
  EXPECT_OK(hora_ckpt_close(ck));
  free(buf);
  hora_finalize(ctx);
  _exit(hora_test_errors ? 1 : 0);
}

/* A small tmpfs at root/name (8 MiB); 0 when it cannot be mounted. */
static int mount_small(const char *root, const char *name, char *M, size_t cap) {
  snprintf(M, cap, "%s/%s", root, name);
  mkdir(M, 0700);
  if (mount("tmpfs", M, "tmpfs", 0, "size=8m,mode=0700") != 0) {
    printf("part B skipped: cannot mount a tmpfs here (%s); part A covers write failures\n", strerror(errno));
    return 0;
  }
  return 1;
}

static int step_exists(const char *dir, int64_t step) {
  char p[4400];
  snprintf(p, sizeof p, "%s/step-%" PRId64 "/manifest.json", dir, step);
  return ck_exists(p);
}

/* B1: 3 MiB states on 8 MiB: the third save prunes the oldest version early instead of being
 * refused, and the newest complete one stays. */
static void part_b1(hora_ctx_t *ctx, const char *M) {
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = M;
  hora_ckpt_t *ck = NULL;
  EXPECT_OK(hora_ckpt_open(ctx, &o, &ck));
  size_t bytes = 3 << 20;
  unsigned char *buf = malloc(bytes);
  EXPECT_OK(save_bytes(ck, 1, buf, bytes));
  EXPECT_OK(save_bytes(ck, 2, buf, bytes));
  EXPECT_OK(hora_ckpt_flush(ck));
  EXPECT_OK(save_bytes(ck, 3, buf, bytes)); /* 6 of 8 MiB used: step 1 goes early, step 2 stays */
  EXPECT_OK(hora_ckpt_flush(ck));
  EXPECT(!step_exists(M, 1) && step_exists(M, 2) && step_exists(M, 3), "B1: steps 2 and 3 must be there, 1 gone");
  EXPECT(restore_bytes(ck, buf, bytes) == 3, "B1: step 3");
  EXPECT_OK(hora_ckpt_close(ck));
  free(buf);
}

/* B2: the copier holds step 1 (copying_step, as copy_step sets it) while saves go on; room for
 * three 2 MiB versions: every save prunes what is neither the newest complete one nor the held
 * one (before the fix, every save after the third failed for the rest of the run). */
static void part_b2(hora_ctx_t *ctx, const char *M) {
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = M;
  hora_ckpt_t *ck = NULL;
  EXPECT_OK(hora_ckpt_open(ctx, &o, &ck));
  size_t bytes = 2 << 20;
  unsigned char *buf = malloc(bytes);
  EXPECT_OK(save_bytes(ck, 1, buf, bytes));
  EXPECT_OK(hora_ckpt_flush(ck));
  pthread_mutex_lock(&ck->mu);
  ck->copying_step = 1;
  pthread_mutex_unlock(&ck->mu);
  for (int64_t s = 2; s <= 7; s++) {
    EXPECT_OK(save_bytes(ck, s, buf, bytes));
    EXPECT_OK(hora_ckpt_flush(ck));
    EXPECT(step_exists(M, 1) && step_exists(M, s), "B2: after save %" PRId64 ": held step 1 and the new one", s);
  }
  EXPECT(restore_bytes(ck, buf, bytes) == 7, "B2: step 7");
  pthread_mutex_lock(&ck->mu);
  ck->copying_step = INT64_MIN;
  pthread_mutex_unlock(&ck->mu);
  EXPECT_OK(save_bytes(ck, 8, buf, bytes));
  EXPECT_OK(hora_ckpt_flush(ck));
  EXPECT(!step_exists(M, 1) && step_exists(M, 7) && step_exists(M, 8), "B2: once released, step 1 is pruned");
  EXPECT_OK(hora_ckpt_close(ck));
  free(buf);
}

/* B3 (child: the pacing parameter is read once per process): 5 MiB on 8 MiB. The second save
 * comes while the first is still being written; it must wait for that write and fail at once
 * with HORA_ERR_IO (not be accepted and fail later), leaving the only complete version. */
static void part_b3_child(const char *M) {
  setenv("HORA_CKPT_CHUNK_BYTES", "256K", 1);
  setenv("HORA_CKPT_TEST_DELAY_US", "20000", 1); /* 20 chunks: about 0.4 s of writing */
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) _exit(100);
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = M;
  hora_ckpt_t *ck = NULL;
  EXPECT_OK(hora_ckpt_open(ctx, &o, &ck));
  size_t bytes = 5 << 20;
  unsigned char *buf = malloc(bytes);
  EXPECT_OK(save_bytes(ck, 1, buf, bytes));
  EXPECT_RC(save_bytes(ck, 2, buf, bytes), HORA_ERR_IO);
  EXPECT(strstr(hora_last_error(), "disk full") && strstr(hora_last_error(), M), "B3 message: %s", hora_last_error());
  EXPECT_OK(hora_ckpt_flush(ck)); /* nothing deferred: the refusal was immediate */
  EXPECT(step_exists(M, 1), "B3: step 1 must stay");
  char p[4400];
  snprintf(p, sizeof p, "%s/step-2", M);
  EXPECT(!ck_exists(p) && ck_count_tmp(M) == 0, "B3: nothing of step 2 may exist");
  EXPECT(restore_bytes(ck, buf, bytes) == 1, "B3: step 1 restores");
  EXPECT_OK(hora_ckpt_close(ck));
  free(buf);
  hora_finalize(ctx);
  _exit(hora_test_errors ? 1 : 0);
}

static void part_c(hora_ctx_t *ctx, const char *root) {
  char L[4200], P[4200], away[4300], p[4400];
  snprintf(L, sizeof L, "%s/local-c", root);
  snprintf(P, sizeof P, "%s/persist-c", root);
  snprintf(away, sizeof away, "%s.away", P);
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = L;
  o.persist_dir = P;
  o.copy_interval_s = 0;
  hora_ckpt_t *ck = NULL;
  EXPECT_OK(hora_ckpt_open(ctx, &o, &ck));
  size_t bytes = 256 << 10;
  unsigned char *buf = malloc(bytes);
  EXPECT_OK(save_bytes(ck, 1, buf, bytes));
  EXPECT_OK(hora_ckpt_flush(ck));
  EXPECT(rename(P, away) == 0, "rename persist_dir away");
  EXPECT_OK(save_bytes(ck, 2, buf, bytes));
  double t0 = hora__now_s();
  EXPECT_RC(hora_ckpt_flush(ck), HORA_ERR_IO);
  EXPECT(strstr(hora_last_error(), "not reachable"), "flush message: %s", hora_last_error());
  EXPECT(hora__now_s() - t0 < 10, "flush took %.1f s with a 1 s timeout", hora__now_s() - t0);
  EXPECT(!ck_exists(P), "the copier created %s while it was away", P);
  EXPECT_OK(save_bytes(ck, 3, buf, bytes));
  EXPECT(rename(away, P) == 0, "rename persist_dir back");
  /* The copier retries every 0.1 s: step 3 arrives without a flush. */
  snprintf(p, sizeof p, "%s/step-3/manifest.json", P);
  for (int i = 0; i < 100 && !ck_exists(p); i++) usleep(50000);
  EXPECT(ck_exists(p), "copies did not resume after persist_dir came back");
  EXPECT_OK(hora_ckpt_flush(ck));
  EXPECT(ck_count_tmp(P) == 0, "temporary files in %s", P);
  char sd[4400];
  snprintf(sd, sizeof sd, "%s/step-3", P);
  ck_manifest_t m;
  EXPECT(hora__ck_validate(sd, 0, &m, NULL, NULL) == HORA_SUCCESS, "%s: %s", sd, hora_last_error());
  EXPECT_OK(hora_ckpt_close(ck));
  /* The persistent copy alone restores step 3. */
  ck_rmrf(L);
  EXPECT_OK(hora_ckpt_open(ctx, &o, &ck));
  EXPECT(restore_bytes(ck, buf, bytes) == 3, "restore from persist_dir");
  EXPECT_OK(hora_ckpt_close(ck));
  free(buf);
}

int main(void) {
  setenv("HORA_CKPT_RETRY_S", "0.1", 1);
  setenv("HORA_CKPT_FLUSH_TIMEOUT_S", "1", 1);
  char *root = ck_mktemp("ckpt-faults");
  char L[4200];
  snprintf(L, sizeof L, "%s/local-a", root);
  /* A runs in a child before this process starts MPI (forking after MPI_Init is unsafe). */
  pid_t pid = fork();
  if (pid == 0) part_a_child(L);
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "part A (write failure) failed: status %d", st);
  char M[3][4300];
  int mounted[3] = {0, 0, 0};
  if (geteuid() == 0) {
    for (int i = 0; i < 3; i++) {
      char name[24];
      snprintf(name, sizeof name, "small%d", i + 1);
      mounted[i] = mount_small(root, name, M[i], sizeof M[i]);
    }
  } else {
    printf("part B skipped: mounting a tmpfs needs root\n");
  }
  if (mounted[2]) {
    pid = fork();
    if (pid == 0) part_b3_child(M[2]);
    waitpid(pid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "part B3 (save while a write is in progress) failed: status %d", st);
  }
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) return 1;
  if (mounted[0]) part_b1(ctx, M[0]);
  if (mounted[1]) part_b2(ctx, M[1]);
  part_c(ctx, root);
  hora_finalize(ctx);
  for (int i = 0; i < 3; i++)
    if (mounted[i]) umount(M[i]);
  ck_rmrf(root);
  free(root);
  return hora_test_finish("test_ckpt_faults");
}
