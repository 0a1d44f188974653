/* Shared nodes (docs/checkpoint.md, "Shared nodes"): another local user prepares hostile
 * directories in a sticky, world-writable directory (like /tmp) and hora must refuse to save,
 * copy or restore through them, with HORA_ERR_IO naming the path, its owner and mode, and write
 * nothing there; the same for TensorBoard event files and record files. Also: default modes 0700/0600, `latest`, step symlinks and manifest entries
 * never lead restore out of its directory. Needs root (useradd, runuser): exits 77 otherwise.
 * The test user is removed at exit, also when a check fails. */
#include <errno.h>
#include <inttypes.h>
#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>

#include "ckpt_test.h"
#include "hora_test.h"

static char g_user[32];
static int g_user_made;

static void remove_user(void) {
  if (!g_user_made) return;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "userdel %s >/dev/null 2>&1", g_user);
  if (system(cmd) != 0) fprintf(stderr, "userdel %s failed\n", g_user);
  g_user_made = 0;
}

static void on_signal(int sig) {
  remove_user();
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Run a shell command as the test user. */
static int as_user(const char *fmt, const char *a, const char *b) {
  char inner[3000], cmd[3400];
  snprintf(inner, sizeof inner, fmt, a, b ? b : "");
  snprintf(cmd, sizeof cmd, "runuser -u %s -- sh -c '%s'", g_user, inner);
  int rc = system(cmd);
  EXPECT(rc == 0, "as %s: %s failed (%d)", g_user, inner, rc);
  return rc;
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static unsigned char g_buf[64 << 10];

static hora_result_t save(hora_ckpt_t *ck, int64_t step) {
  ck_fill(g_buf, sizeof g_buf, step, 0);
  hora_tensor_t t = {"w", g_buf, sizeof g_buf, HORA_UINT8, HORA_DEVICE_HOST, 0, NULL};
  return hora_ckpt_save(ck, step, &t, 1, NULL, 0);
}

static hora_result_t restore(hora_ckpt_t *ck, int64_t *step) {
  memset(g_buf, 0, sizeof g_buf);
  hora_tensor_t t = {"w", g_buf, sizeof g_buf, HORA_UINT8, HORA_DEVICE_HOST, 0, NULL};
  return hora_ckpt_restore(ck, step, &t, 1);
}

static hora_ckpt_t *open_ck(hora_ctx_t *ctx, const char *local, const char *persist, hora_result_t want) {
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = local;
  o.persist_dir = persist;
  o.copy_interval_s = 0;
  hora_ckpt_t *ck = NULL;
  EXPECT_RC(hora_ckpt_open(ctx, &o, &ck), want);
  return ck;
}

static void expect_mode(const char *path, unsigned want) {
  struct stat st;
  EXPECT(lstat(path, &st) == 0 && (st.st_mode & 07777) == want, "%s has mode %04o, want %04o", path,
         (unsigned)(st.st_mode & 07777), want);
}

/* The refusal message names the path, the owner and the mode. */
static void expect_refusal(const char *path, const char *mode) {
  const char *e = hora_last_error();
  EXPECT(strstr(e, path) && strstr(e, g_user) && (!mode || strstr(e, mode)), "refusal message for %s: %s", path, e);
}

static void wide_child(const char *R) {
  setenv("HORA_FILE_MODE", "0640", 1);
  umask(022);
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) _exit(100);
  char L[4200], p[4400];
  snprintf(L, sizeof L, "%s/wide/local", R);
  hora_ckpt_t *ck = open_ck(ctx, L, NULL, HORA_SUCCESS);
  EXPECT_OK(save(ck, 1));
  EXPECT_OK(hora_ckpt_close(ck));
  expect_mode(L, 0750);
  snprintf(p, sizeof p, "%s/step-1", L);
  expect_mode(p, 0750);
  snprintf(p, sizeof p, "%s/step-1/state.safetensors", L);
  expect_mode(p, 0640);
  snprintf(p, sizeof p, "%s/latest", L);
  expect_mode(p, 0640);
  hora_finalize(ctx);
  _exit(hora_test_errors ? 1 : 0);
}

/* Directories of our own that still fail or pass the rule: group-writable without the sticky
 * bit is refused; a symlink owned by root (us) is followed and its target checked; relative
 * paths with ".." work. */
static void own_dirs(hora_ctx_t *ctx, const char *R) {
  char g[4200], p[4400], l[4200];
  snprintf(g, sizeof g, "%s/groupw", R);
  mkdir(g, 0700);
  chmod(g, 0770);
  snprintf(p, sizeof p, "%s/local", g);
  open_ck(ctx, p, NULL, HORA_ERR_IO);
  EXPECT(strstr(hora_last_error(), g) && strstr(hora_last_error(), "0770") && strstr(hora_last_error(), "group"),
         "group-writable message: %s", hora_last_error());
  EXPECT(count_entries(g) == 0, "something was created in %s", g);
  chmod(g, 01770); /* sticky: accepted, like /tmp */
  hora_ckpt_t *ck = open_ck(ctx, p, NULL, HORA_SUCCESS);
  if (ck) EXPECT_OK(hora_ckpt_close(ck));
  snprintf(l, sizeof l, "%s/ownlink", R);
  EXPECT(symlink(p, l) == 0, "symlink %s", l);
  ck = open_ck(ctx, l, NULL, HORA_SUCCESS); /* our own symlink to a checked directory */
  if (ck) {
    EXPECT_OK(save(ck, 3));
    EXPECT_OK(hora_ckpt_close(ck));
  }
  snprintf(p, sizeof p, "%s/local/step-3/manifest.json", g);
  EXPECT(ck_exists(p), "save through our own symlink did not land in its target");
  chmod(g, 0770); /* the symlink's target is checked too */
  open_ck(ctx, l, NULL, HORA_ERR_IO);
  char cwd[4096];
  if (getcwd(cwd, sizeof cwd) && chdir(R) == 0) {
    ck = open_ck(ctx, "x/../rel/local", NULL, HORA_SUCCESS);
    if (ck) EXPECT_OK(hora_ckpt_close(ck));
    snprintf(p, sizeof p, "%s/rel/local", R);
    expect_mode(p, 0700);
    if (chdir(cwd) != 0) EXPECT(0, "chdir back");
  }
}

int main(void) {
  if (geteuid() != 0) {
    printf("test_ckpt_hostile skipped: it needs root to add a second local user (useradd, runuser)\n");
    return 77;
  }
  if (system("command -v useradd >/dev/null && command -v runuser >/dev/null") != 0) {
    printf("test_ckpt_hostile skipped: useradd or runuser is missing\n");
    return 77;
  }
  snprintf(g_user, sizeof g_user, "horack%ld", (long)getpid() % 100000);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "useradd -M -s /bin/sh %s", g_user);
  if (system(cmd) != 0) {
    printf("test_ckpt_hostile skipped: useradd %s failed\n", g_user);
    return 77;
  }
  g_user_made = 1;
  atexit(remove_user);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  signal(SIGSEGV, on_signal);
  signal(SIGABRT, on_signal);

  setenv("HORA_CKPT_RETRY_S", "0.1", 1);
  setenv("HORA_CKPT_FLUSH_TIMEOUT_S", "1", 1); /* a refused copy is given up after 1 s */
  /* R: a shared directory like /tmp (root, 1777). */
  char *R = ck_mktemp("ckpt-hostile");
  chmod(R, 01777);
  /* HORA_FILE_MODE=0640 widens to group-readable (0750 directories, 0640 files); in a child, as
   * parameters are read once per process (and before MPI starts in this one). */
  pid_t pid = fork();
  if (pid == 0) wide_child(R);
  int wst = 0;
  waitpid(pid, &wst, 0);
  EXPECT(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "HORA_FILE_MODE=0640 child failed: status %d", wst);
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) return 1;
  char mine[4200], pers[4200], ww[4200], link[4200], target[4200], swap[4200], away[4200], p[20000];

  /* Default modes: directories hora creates 0700, files 0600. */
  snprintf(mine, sizeof mine, "%s/mine/local", R);
  snprintf(pers, sizeof pers, "%s/mine/persist", R);
  hora_ckpt_t *ck = open_ck(ctx, mine, pers, HORA_SUCCESS);
  EXPECT_OK(save(ck, 5));
  EXPECT_OK(hora_ckpt_flush(ck));
  const char *dirs[2] = {mine, pers};
  for (int i = 0; i < 2; i++) {
    expect_mode(dirs[i], 0700);
    snprintf(p, sizeof p, "%s/step-5", dirs[i]);
    expect_mode(p, 0700);
    snprintf(p, sizeof p, "%s/step-5/state.safetensors", dirs[i]);
    expect_mode(p, 0600);
    snprintf(p, sizeof p, "%s/step-5/manifest.json", dirs[i]);
    expect_mode(p, 0600);
    snprintf(p, sizeof p, "%s/latest", dirs[i]);
    expect_mode(p, 0600);
  }
  snprintf(p, sizeof p, "%s/mine", R);
  expect_mode(p, 0700);

  /* `latest` pointing outside, a step symlink to a valid checkpoint elsewhere, and a manifest
   * whose file entry leaves the step directory: restore uses its own step 5 only. */
  snprintf(target, sizeof target, "%s/outside", R);
  hora_ckpt_t *co = open_ck(ctx, target, NULL, HORA_SUCCESS);
  EXPECT_OK(save(co, 9));
  EXPECT_OK(hora_ckpt_close(co));
  snprintf(p, sizeof p, "%s/latest", mine);
  FILE *f = fopen(p, "w");
  if (f) {
    fprintf(f, "../../outside/step-9\n");
    fclose(f);
  }
  snprintf(p, sizeof p, "%s/step-9", mine);
  char to[4400];
  snprintf(to, sizeof to, "%s/step-9", target);
  EXPECT(symlink(to, p) == 0, "symlink %s", p);
  snprintf(p, sizeof p, "rm -rf '%s/step-9' && mkdir '%s/step-7' && sed -e 's/\"step\": 5/\"step\": 7/' -e "
           "'s#\"file\": \"state.safetensors\"#\"file\": \"../step-5/state.safetensors\"#' '%s/step-5/manifest.json'"
           " > '%s/step-7/manifest.json'", pers, pers, pers, pers);
  EXPECT(system(p) == 0, "craft persistent step 7");
  int64_t step = -1;
  EXPECT_OK(restore(ck, &step));
  EXPECT(step == 5 && ck_check(g_buf, sizeof g_buf, 5, 0) < 0, "restore followed a link out: step %" PRId64, step);
  const char *src = NULL;
  EXPECT_OK(hora_ckpt_restore_source(ck, &src));
  snprintf(p, sizeof p, "%s/step-5", mine);
  EXPECT(src && strcmp(src, p) == 0, "restored from %s", src ? src : "(null)");
  EXPECT_OK(hora_ckpt_close(ck));

  own_dirs(ctx, R);

  /* 1. A world-writable directory owned by the other user under the expected name. */
  snprintf(ww, sizeof ww, "%s/hora-ckpt-ww", R);
  as_user("mkdir %s && chmod 0777 %s", ww, ww);
  open_ck(ctx, ww, NULL, HORA_ERR_IO);
  expect_refusal(ww, "0777");
  snprintf(p, sizeof p, "%s/sub", ww);
  open_ck(ctx, p, NULL, HORA_ERR_IO); /* below it too, and nothing is created there */
  /* The other files hora writes for the job: TensorBoard events and record files. */
  hora_tb_t *tb = NULL;
  EXPECT_RC(hora_tb_open(ww, &tb), HORA_ERR_IO);
  expect_refusal(ww, "0777");
  snprintf(p, sizeof p, "%s/tb", ww);
  EXPECT_RC(hora_tb_open(p, &tb), HORA_ERR_IO);
  hora_records_writer_t *rw = NULL;
  snprintf(p, sizeof p, "%s/train-0.rec", ww);
  EXPECT_RC(hora_records_writer_open(p, &rw), HORA_ERR_IO);
  expect_refusal(ww, "0777");
  EXPECT(tb == NULL && rw == NULL, "outputs set on error");
  EXPECT(count_entries(ww) == 0, "something was written into %s", ww);

  /* 2. A symlink owned by the other user, pointing at a directory of ours. */
  snprintf(link, sizeof link, "%s/hora-ckpt-link", R);
  snprintf(p, sizeof p, "%s/empty", R);
  mkdir(p, 0700);
  as_user("ln -s %s %s", p, link);
  open_ck(ctx, link, NULL, HORA_ERR_IO);
  expect_refusal(link, NULL);
  EXPECT(strstr(hora_last_error(), "symlink"), "message says symlink: %s", hora_last_error());
  EXPECT(count_entries(p) == 0, "something was written through the link into %s", p);
  {
    hora_tb_t *tb = NULL;
    EXPECT_RC(hora_tb_open(link, &tb), HORA_ERR_IO);
    char rec[4400];
    snprintf(rec, sizeof rec, "%s/x.rec", link);
    hora_records_writer_t *rw = NULL;
    EXPECT_RC(hora_records_writer_open(rec, &rw), HORA_ERR_IO);
    EXPECT(count_entries(p) == 0, "TensorBoard or records wrote through the link into %s", p);
  }

  /* 3. A swapped local/: the directory an open checkpointer uses is replaced by one of the
   * other user holding a consistent checkpoint (CRCs and manifest match) of step 50. */
  snprintf(swap, sizeof swap, "%s/job", R);
  snprintf(mine, sizeof mine, "%s/job/local", R);
  snprintf(pers, sizeof pers, "%s/job-persist", R);
  ck = open_ck(ctx, mine, pers, HORA_SUCCESS);
  EXPECT_OK(save(ck, 10));
  EXPECT_OK(hora_ckpt_flush(ck));
  snprintf(away, sizeof away, "%s/job-away", R);
  EXPECT(rename(swap, away) == 0, "rename %s", swap);
  hora_ckpt_t *cf = open_ck(ctx, target, NULL, HORA_SUCCESS);
  EXPECT_OK(save(cf, 50));
  EXPECT_OK(hora_ckpt_close(cf));
  snprintf(p, sizeof p, "mkdir -p '%s/local' && cp -r '%s/step-50' '%s/local/' && chown -R %s '%s'", swap, target, swap,
           g_user, swap);
  EXPECT(system(p) == 0, "prepare the swapped directory");
  snprintf(p, sizeof p, "%s/local", swap);
  int before = count_entries(p);
  step = -1;
  EXPECT_RC(restore(ck, &step), HORA_ERR_IO);
  expect_refusal(swap, NULL);
  EXPECT(step == -1 && ck_check(g_buf, sizeof g_buf, 50, 0) >= 0, "restore loaded the other user's tensors");
  EXPECT_RC(save(ck, 11), HORA_ERR_IO);
  expect_refusal(swap, NULL);
  EXPECT(count_entries(p) == before, "save wrote into the swapped %s", p);
  /* Copy: persist_dir replaced by the other user's directory. */
  char paway[4300];
  snprintf(paway, sizeof paway, "%s.away", pers);
  EXPECT(rename(pers, paway) == 0, "rename %s", pers);
  as_user("mkdir %s && chmod 0777 %s", pers, pers);
  snprintf(p, sizeof p, "rm -rf '%s' && mv '%s' '%s'", swap, away, swap);
  EXPECT(system(p) == 0, "put local back");
  EXPECT_OK(save(ck, 12)); /* local is ours again */
  EXPECT_RC(hora_ckpt_flush(ck), HORA_ERR_IO);
  expect_refusal(pers, "0777");
  EXPECT(count_entries(pers) == 0, "the copier wrote into the other user's %s", pers);
  hora_ckpt_close(ck); /* fails the same way (the copy cannot be made durable) */
  /* Restore refuses a persist_dir failing the check even when local_dir is fine. */
  ck = NULL;
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = mine;
  o.persist_dir = pers;
  EXPECT_RC(hora_ckpt_open(ctx, &o, &ck), HORA_ERR_IO);
  expect_refusal(pers, "0777");

  hora_finalize(ctx);
  ck_rmrf(R);
  free(R);
  remove_user();
  return hora_test_finish("test_ckpt_hostile");
}
