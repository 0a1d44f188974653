/* A fork() child of a rank (core/fork.c): every call on what the parent made before the fork is
 * refused, naming the fork (HORA_ERR_NOT_INITIALIZED for the context, which is not live in the
 * child; HORA_ERR_NOT_SUPPORTED for handles, readers, checkpointers and a second hora_init), instead of waiting forever
 * for a thread the child does not have (the engine's, the prefetch thread, the checkpoint writer)
 * or talking MPI on the parent's behalf. What the child makes itself (a records reader) works
 * (not checked under ASan: CHILD_THREADS).
 * The parent goes on unharmed: its pending request completes with the right sum, its reader
 * still yields every record it had not yet given (none went to the child), its checkpointer
 * saves, and the timeline (rank 0, HORA_TIMELINE) holds its header once although the child ends
 * with exit(), which flushes whatever stdio buffers it inherited.
 * Run with HORA_TIMELINE=test_fork_np<N>.json; argv[1] is that name. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hora_test.h"

#define NFILES 3
#define NREC 2000 /* per file: far more than the reader's prefetch of 16 */

static void rec_text(char *buf, size_t cap, int file, int i) { snprintf(buf, cap, "file %d record %d", file, i); }

/* Every record of the NFILES files, in order, each checked against its text. Returns the count. */
static long read_all(hora_records_reader_t *r, int skip_checked) {
  long n = 0;
  for (;;) {
    const void *data;
    size_t len;
    int eof = 0;
    hora_result_t rc = hora_records_next(r, &data, &len, &eof);
    EXPECT(rc == HORA_SUCCESS, "hora_records_next: %s", hora_last_error());
    if (rc != HORA_SUCCESS || eof) break;
    long k = n + skip_checked;
    char want[64];
    rec_text(want, sizeof want, (int)(k / NREC), (int)(k % NREC));
    EXPECT(len == strlen(want) && memcmp(data, want, len) == 0, "record %ld is '%.*s', want '%s'", k, (int)len,
           (const char *)data, want);
    n++;
  }
  return n;
}

static int open_reader(char files[NFILES][512], hora_records_reader_t **r) {
  const char *pats[NFILES];
  for (int f = 0; f < NFILES; f++) pats[f] = files[f];
  hora_records_reader_opts_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.patterns = pats;
  o.pattern_count = NFILES;
  o.world_size = 1;
  o.prefetch = 16;
  return hora_records_reader_open(&o, r) == HORA_SUCCESS;
}

/* Whether the child may allocate and start threads of its own (its own records reader). Not
 * under ASan: the ASan runtime of Debian 12's GCC 12 does not keep its allocator and thread
 * registry usable across fork() (newer sanitizer runtimes lock them around it), so a child of a
 * process whose other threads were allocating at that moment can hang at its first allocation or
 * thread; a CI-sized ASan pass saw it once (the child ended by its alarm after hora_init, whose
 * refusal then still started a watchdog thread). hora's own refusals allocate nothing. The plain
 * build runs that part. */
#if defined(__SANITIZE_ADDRESS__)
enum { CHILD_THREADS = 0 };
#else
enum { CHILD_THREADS = 1 };
#endif

/* The child's part. Returns its error count (its exit status). */
static int child(int want_rank, int want_size, hora_ctx_t *ctx, hora_handle_t *h, hora_records_reader_t *r, hora_ckpt_t *ck,
                 hora_records_writer_t *w, hora_tb_t *tb, char files[NFILES][512]) {
  alarm(30); /* a regression that waits forever ends the child by SIGALRM: the parent reports it */
  hora_test_errors = 0;
  float x[4] = {1, 2, 3, 4}, y[4];
  int done = 0;
  hora_handle_t *h2 = NULL;
  EXPECT_ERR(hora_allreduce(ctx, x, y, 4, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST), HORA_ERR_NOT_INITIALIZED,
             "fork() child of pid");
  EXPECT_ERR(hora_allreduce(ctx, x, y, 4, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST), HORA_ERR_NOT_INITIALIZED,
             "hora_allreduce");
  /* The layout queries work (they read memory only): a DataLoader worker may shard by rank. */
  int prank = -1, psize = -1;
  EXPECT_OK(hora_rank(ctx, &prank));
  EXPECT_OK(hora_size(ctx, &psize));
  EXPECT(prank == want_rank && psize == want_size, "the child reads rank %d of %d, want %d of %d", prank, psize,
         want_rank, want_size);
  EXPECT_ERR(hora_timeline_start(ctx, "child.json", 0), HORA_ERR_NOT_INITIALIZED, "its hora context");
  EXPECT_ERR(hora_barrier(ctx), HORA_ERR_NOT_INITIALIZED, "fork() child");
  EXPECT_ERR(hora_allreduce_async(ctx, "in.child", x, y, 4, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST, &h2),
             HORA_ERR_NOT_INITIALIZED, "fork() child");
  if (h) {
    EXPECT_ERR(hora_poll(h, &done), HORA_ERR_NOT_SUPPORTED, "hora_poll");
    EXPECT_ERR(hora_wait(h), HORA_ERR_NOT_SUPPORTED, "the handle");
    EXPECT_ERR(hora_handle_free(h), HORA_ERR_NOT_SUPPORTED, "hora_handle_free");
  }
  const void *data;
  size_t len;
  int eof;
  EXPECT_ERR(hora_records_next(r, &data, &len, &eof), HORA_ERR_NOT_SUPPORTED, "records reader");
  EXPECT_ERR(hora_records_next(r, &data, &len, &eof), HORA_ERR_NOT_SUPPORTED, "in __iter__");
  EXPECT_ERR(hora_records_reader_close(r), HORA_ERR_NOT_SUPPORTED, "records reader");
  hora_tensor_t t = {"x", x, 4, HORA_FLOAT32, HORA_DEVICE_HOST, 0, NULL};
  EXPECT_ERR(hora_ckpt_save(ck, 1, &t, 1, NULL, 0), HORA_ERR_NOT_SUPPORTED, "checkpointer");
  EXPECT_ERR(hora_ckpt_flush(ck), HORA_ERR_NOT_SUPPORTED, "checkpointer");
  EXPECT_ERR(hora_timeline_stop(ctx), HORA_ERR_NOT_INITIALIZED, "hora_timeline_stop");
  /* The parent's writer: not appended to, and above all not aborted (which unlinks its file). */
  EXPECT_ERR(hora_records_writer_write(w, "child", 5), HORA_ERR_NOT_SUPPORTED, "records writer");
  EXPECT_ERR(hora_records_writer_abort(w), HORA_ERR_NOT_SUPPORTED, "hora_records_writer_abort");
  EXPECT_ERR(hora_records_writer_close(w), HORA_ERR_NOT_SUPPORTED, "records writer");
  EXPECT_ERR(hora_tb_scalar(tb, "child", 1, 1.0), HORA_ERR_NOT_SUPPORTED, "TensorBoard writer");
  EXPECT_ERR(hora_tb_close(tb), HORA_ERR_NOT_SUPPORTED, "hora_tb_close");
  hora_ctx_t *again = NULL;
  EXPECT_ERR(hora_init(&again), HORA_ERR_NOT_SUPPORTED, "hora_init");
  EXPECT(again == NULL, "hora_init in the child gave a context");
  EXPECT_ERR(hora_finalize(ctx), HORA_ERR_NOT_INITIALIZED, "hora_finalize");
  /* A reader the child opens itself works, and sees every record (not under ASan: CHILD_THREADS). */
  if (CHILD_THREADS) {
    hora_records_reader_t *mine = NULL;
    EXPECT(open_reader(files, &mine), "a reader opened in the child: %s", hora_last_error());
    if (mine) {
      long n = read_all(mine, 0);
      EXPECT(n == NFILES * NREC, "the child's own reader gave %ld records, want %d", n, NFILES * NREC);
      EXPECT_OK(hora_records_reader_close(mine));
    }
  }
  return hora_test_errors ? 1 : 0;
}

int main(int argc, char **argv) {
  int rank = 0, size = 0;
  hora_ctx_t *ctx = hora_test_init_mpi(&argc, &argv, &rank, &size);
  if (!ctx) return 1;
  const char *timeline = argc > 1 ? argv[1] : NULL;

  char dir[256], files[NFILES][512];
  snprintf(dir, sizeof dir, "test_fork.%d.%d", size, rank);
  mkdir(dir, 0700);
  for (int f = 0; f < NFILES; f++) {
    snprintf(files[f], sizeof files[f], "%s/part-%d.tfrecord", dir, f);
    hora_records_writer_t *w = NULL;
    EXPECT_OK(hora_records_writer_open(files[f], &w));
    for (int i = 0; i < NREC && w; i++) {
      char rec[64];
      rec_text(rec, sizeof rec, f, i);
      EXPECT_OK(hora_records_writer_write(w, rec, strlen(rec)));
    }
    EXPECT_OK(hora_records_writer_close(w));
  }
  hora_records_reader_t *r = NULL;
  EXPECT(open_reader(files, &r), "hora_records_reader_open: %s", hora_last_error());
  const void *data;
  size_t len;
  int eof = 0;
  EXPECT_OK(hora_records_next(r, &data, &len, &eof)); /* the parent takes record 0 */

  /* A record file being written, and TensorBoard events, across the fork. */
  char outpath[600], tbdir[300];
  snprintf(outpath, sizeof outpath, "%s/written-across-fork.tfrecord", dir);
  hora_records_writer_t *w = NULL;
  EXPECT_OK(hora_records_writer_open(outpath, &w));
  EXPECT_OK(hora_records_writer_write(w, "before", 6));
  snprintf(tbdir, sizeof tbdir, "%s/tb", dir);
  mkdir(tbdir, 0700);
  hora_tb_t *tb = NULL;
  EXPECT_OK(hora_tb_open(tbdir, &tb));
  EXPECT_OK(hora_tb_scalar(tb, "before", 1, 1.0));

  hora_ckpt_opts_t co;
  hora_ckpt_opts_init(&co);
  char ckdir[300];
  snprintf(ckdir, sizeof ckdir, "test_fork.%d.ckpt", size);
  co.local_dir = ckdir;
  hora_ckpt_t *ck = NULL;
  EXPECT_OK(hora_ckpt_open(ctx, &co, &ck));

  /* A request in flight at the fork: every rank but the last submits it now, the last after its
   * child is done (with one rank it completes at once; the child's calls on it are refused all
   * the same). */
  int early = size == 1 || rank < size - 1;
  float in[8], outv[8];
  for (int i = 0; i < 8; i++) in[i] = (float)(rank + 1) * (float)(i + 1);
  hora_handle_t *h = NULL;
  if (early)
    EXPECT_OK(hora_allreduce_async(ctx, "pending.at.fork", in, outv, 8, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST, &h));

  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) exit(child(rank, size, ctx, h, r, ck, w, tb, files)); /* exit(), not _exit(): stdio is flushed */
  EXPECT(pid > 0, "fork: %s", strerror(errno));
  int status = 0;
  if (pid > 0) {
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d: the child %s %d", rank,
           WIFEXITED(status) ? "exited with status" : "was ended by signal",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }

  /* The parent goes on. */
  if (!early)
    EXPECT_OK(hora_allreduce_async(ctx, "pending.at.fork", in, outv, 8, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST, &h));
  EXPECT_OK(hora_wait(h));
  EXPECT_OK(hora_handle_free(h));
  for (int i = 0; i < 8; i++) {
    float want = (float)(size * (size + 1) / 2) * (float)(i + 1);
    EXPECT(outv[i] == want, "rank %d: element %d is %g, want %g", rank, i, outv[i], want);
  }
  long n = read_all(r, 1);
  EXPECT(n == NFILES * NREC - 1, "rank %d: the parent's reader gave %ld more records, want %d", rank, n,
         NFILES * NREC - 1);
  EXPECT_OK(hora_records_reader_close(r));
  EXPECT_OK(hora_records_writer_write(w, "after", 5));
  EXPECT_OK(hora_records_writer_close(w));
  uint64_t nw = 0;
  EXPECT_OK(hora_records_count(outpath, &nw));
  EXPECT(nw == 2, "rank %d: the file written across the fork holds %llu records, want 2", rank,
         (unsigned long long)nw);
  unlink(outpath);
  EXPECT_OK(hora_tb_scalar(tb, "after", 2, 2.0));
  EXPECT_OK(hora_tb_close(tb));
  float st[4] = {(float)rank, 1, 2, 3};
  hora_tensor_t t = {"x", st, 4, HORA_FLOAT32, HORA_DEVICE_HOST, 0, NULL};
  EXPECT_OK(hora_ckpt_save(ck, 7, &t, 1, NULL, 0));
  EXPECT_OK(hora_ckpt_close(ck));
  float x = 1, y = 0;
  EXPECT_OK(hora_allreduce(ctx, &x, &y, 1, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST));
  EXPECT(y == (float)size, "rank %d: allreduce after the fork gave %g, want %d", rank, y, size);
  EXPECT_OK(hora_finalize(ctx));

  /* rank 0's timeline: written once (a second copy of the buffered header would follow the
   * first if the child had flushed it). */
  if (rank == 0 && timeline) {
    FILE *f = fopen(timeline, "r");
    EXPECT(f != NULL, "timeline %s: %s", timeline, strerror(errno));
    if (f) {
      static char text[1 << 20];
      size_t got = fread(text, 1, sizeof text - 1, f);
      text[got] = 0;
      fclose(f);
      int headers = 0;
      for (const char *p = text; (p = strstr(p, "\"name\":\"process_name\"")); p++) headers++;
      EXPECT(headers == 1, "timeline: %d process_name events, want 1", headers);
      EXPECT(got > 4 && strncmp(text, "[\n", 2) == 0 && strcmp(text + got - 2, "]\n") == 0,
             "timeline: not one JSON array (starts '%.8s', ends '%s')", text, got > 8 ? text + got - 8 : text);
      EXPECT(strstr(text, "pending.at.fork") != NULL, "timeline: no row of the request pending at the fork");
    }
    unlink(timeline);
  }
  for (int f = 0; f < NFILES; f++) unlink(files[f]);
  DIR *d = opendir(tbdir);
  for (struct dirent *e; d && (e = readdir(d));)
    if (e->d_name[0] != '.') {
      char p[900];
      snprintf(p, sizeof p, "%s/%s", tbdir, e->d_name);
      unlink(p);
    }
  if (d) closedir(d);
  rmdir(tbdir);
  EXPECT(rmdir(dir) == 0, "rank %d: %s is not empty after the test: %s", rank, dir, strerror(errno));
  int rc = hora_test_finish_mpi("test_fork");
  MPI_Finalize();
  return rc;
}
