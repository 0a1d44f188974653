/* Faults around checkpoints:
 *  A. write failure in the background (RLIMIT_FSIZE makes write() fail with EFBIG, as a full
 *     disk or a quota would): the save returns at once, the flush returns HORA_ERR_IO naming the
 *     step, no temporary file and no step directory stay behind, the previous checkpoint still
 *     restores, and later saves work (run in a child process: the limit is process-wide).
 *  B. local_dir on a small tmpfs (root only; skipped elsewhere): a save that does not fit fails
 *     with HORA_ERR_IO ("disk full") before taking a snapshot, the previous checkpoints stay
 *     intact, and after the file system grows saving goes on.
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

static void part_b(hora_ctx_t *ctx, const char *root) {
  char M[4200];
  snprintf(M, sizeof M, "%s/small", root);
  mkdir(M, 0755);
  if (mount("tmpfs", M, "tmpfs", 0, "size=8m") != 0) {
    printf("part B skipped: cannot mount a tmpfs here (%s); part A covers write failures\n", strerror(errno));
    return;
  }
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
  EXPECT_RC(save_bytes(ck, 3, buf, bytes), HORA_ERR_IO); /* 6 of 8 MiB used: no room for a third */
  EXPECT(strstr(hora_last_error(), "disk full") && strstr(hora_last_error(), M), "message: %s", hora_last_error());
  EXPECT_OK(hora_ckpt_flush(ck));
  EXPECT(restore_bytes(ck, buf, bytes) == 2, "step 2 intact");
  char p[4400];
  snprintf(p, sizeof p, "%s/step-1/manifest.json", M);
  EXPECT(ck_exists(p), "step 1 must stay");
  EXPECT(mount("tmpfs", M, "tmpfs", MS_REMOUNT, "size=16m") == 0, "remount: %s", strerror(errno));
  EXPECT_OK(save_bytes(ck, 3, buf, bytes));
  EXPECT_OK(hora_ckpt_flush(ck));
  EXPECT(restore_bytes(ck, buf, bytes) == 3, "step 3 after the file system grew");
  EXPECT(!ck_exists(p), "step 1 pruned after step 3 verified");
  EXPECT_OK(hora_ckpt_close(ck));
  free(buf);
  umount(M);
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
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) return 1;
  if (geteuid() == 0)
    part_b(ctx, root);
  else
    printf("part B skipped: mounting a tmpfs needs root\n");
  part_c(ctx, root);
  hora_finalize(ctx);
  ck_rmrf(root);
  free(root);
  return hora_test_finish("test_ckpt_faults");
}
