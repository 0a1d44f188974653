/* The program of the fault-injection matrix (fault_test.py): every stage a training job goes
 * through, in order, with real values checked, so that HORA_TEST_FAULT can break any of them:
 *
 *   init      hora_init
 *   save      hora_ckpt_save of step 1 (w = 1), then hora_ckpt_flush (rank 0's copier: "copy")
 *   restore   hora_ckpt_restore: w must be 1 again
 *   reader    each rank writes its own record file, then hora_records_reader_open over all of
 *             them (file r is rank r's share): the records must be this rank's
 *   step      STEPS async allreduces of rank + 1 (sum n(n+1)/2 in every element)
 *   finalize  hora_finalize
 *
 *   fault_probe WORK_DIR [STEPS [STEP_MS]]     (default 20 steps, no pause between them)
 *
 * On any error the rank does what a careful program does: prints one FAULT_PROBE line naming the
 * stage and the error, calls hora_finalize (which must return, within seconds, whatever state
 * the job is in), prints how long that took, and exits 1. Lines: "FAULT_PROBE rank R ok",
 * "FAULT_PROBE rank R error at STAGE: RC: msg", "FAULT_PROBE rank R finalize RC in S s". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hora.h"

enum { N = 1000, RECORDS = 8 };

static int g_rank = -1;
static hora_ctx_t *g_ctx;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The error path under test. After HORA_ERR_REMOTE (hora knows the job failed: every rank
 * learns it) the rank finalizes, which must return within seconds; after any other error, which
 * may be this rank's alone while the others go on into collectives it will never join, it exits
 * at once and leaves ending the job to the launcher (mpirun here, launch under Slurm), as
 * examples/mnist does. */
static int fail_at(const char *stage, hora_result_t rc, const char *msg) {
  fprintf(stderr, "FAULT_PROBE rank %d error at %s: %s: %s\n", g_rank, stage, hora_result_name(rc), msg);
  if (rc != HORA_ERR_REMOTE) {
    fflush(NULL);
    _exit(1);
  }
  double t0 = now_s();
  hora_result_t frc = hora_finalize(g_ctx);
  fprintf(stderr, "FAULT_PROBE rank %d finalize %s in %.1f s\n", g_rank, hora_result_name(frc), now_s() - t0);
  /* mpirun ends the job when the first rank exits: give the others time to report theirs (the
   * last to learn of the failure does so up to two peer timeouts later). */
  const char *pt = getenv("HORA_PEER_TIMEOUT_S");
  double hold = (pt ? 2 * atof(pt) : 0) + 3;
  struct timespec ts = {(time_t)hold, 0};
  nanosleep(&ts, NULL);
  return 1;
}
#define TRY(stage, call)                                              \
  do {                                                                \
    hora_result_t rc_ = (call);                                       \
    if (rc_ != HORA_SUCCESS) return fail_at(stage, rc_, hora_last_error()); \
  } while (0)
#define CHECK(stage, cond, ...)                                       \
  do {                                                                \
    if (!(cond)) {                                                    \
      char m_[256];                                                   \
      snprintf(m_, sizeof m_, __VA_ARGS__);                           \
      return fail_at(stage, HORA_ERR_INTERNAL, m_);                   \
    }                                                                 \
  } while (0)

static int records(const char *dir, int rank, int size) {
  char path[4096], pat[4096];
  snprintf(path, sizeof path, "%s/rec-%03d.rec", dir, rank);
  hora_records_writer_t *w;
  TRY("reader", hora_records_writer_open(path, &w));
  for (int i = 0; i < RECORDS; i++) {
    int v[2] = {rank, i};
    TRY("reader", hora_records_writer_write(w, v, sizeof v));
  }
  TRY("reader", hora_records_writer_close(w));
  int one = 1, all = 0; /* every rank's file exists before any reader globs */
  TRY("reader", hora_allreduce(g_ctx, &one, &all, 1, HORA_INT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST));
  CHECK("reader", all == size, "barrier sum %d, want %d", all, size);
  snprintf(pat, sizeof pat, "%s/rec-*.rec", dir);
  const char *pats[1] = {pat};
  hora_records_reader_opts_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.patterns = pats;
  o.pattern_count = 1;
  o.ctx = g_ctx;
  hora_records_reader_t *r;
  TRY("reader", hora_records_reader_open(&o, &r));
  int n = 0;
  for (;;) {
    const void *d;
    size_t len;
    int eof = 0;
    hora_result_t rc = hora_records_next(r, &d, &len, &eof);
    if (rc == HORA_SUCCESS && eof) break;
    if (rc != HORA_SUCCESS) {
      hora_records_reader_close(r);
      return fail_at("reader", rc, hora_last_error());
    }
    const int *v = d;
    CHECK("reader", len == 2 * sizeof(int) && v[0] == rank && v[1] == n, "record %d of rank %d wrong", n, rank);
    n++;
  }
  hora_records_reader_close(r);
  CHECK("reader", n == RECORDS, "%d records, want %d", n, RECORDS);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: fault_probe WORK_DIR [STEPS [STEP_MS]]\n");
    return 2;
  }
  const char *dir = argv[1];
  int steps = argc > 2 ? atoi(argv[2]) : 20, step_ms = argc > 3 ? atoi(argv[3]) : 0, size = 0;
  hora_result_t rc = hora_init(&g_ctx);
  if (rc != HORA_SUCCESS) {
    /* hora_init fails with HORA_ERR_REMOTE when a peer sends no first heartbeat (init:mute): the
     * rank comes from the launcher then. */
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    g_rank = r ? atoi(r) : -1;
    g_ctx = NULL;
    return fail_at("init", rc, hora_last_error());
  }
  hora_rank(g_ctx, &g_rank);
  hora_size(g_ctx, &size);

  static float w[N], x[N], y[N];
  char local[4096], persist[4096];
  snprintf(local, sizeof local, "%s/local", dir);
  snprintf(persist, sizeof persist, "%s/persist", dir);
  hora_ckpt_opts_t co;
  hora_ckpt_opts_init(&co);
  co.local_dir = local;
  co.persist_dir = persist;
  co.copy_interval_s = 0;
  hora_ckpt_t *ck;
  TRY("save", hora_ckpt_open(g_ctx, &co, &ck));
  for (int i = 0; i < N; i++) w[i] = 1.0f;
  hora_tensor_t t = {"w", w, N, HORA_FLOAT32, HORA_DEVICE_HOST, 0, NULL};
  TRY("save", hora_ckpt_save(ck, 1, &t, 1, NULL, 0));
  TRY("copy", hora_ckpt_flush(ck));
  for (int i = 0; i < N; i++) w[i] = -1.0f;
  int64_t step = 0;
  TRY("restore", hora_ckpt_restore(ck, &step, &t, 1));
  CHECK("restore", step == 1 && w[0] == 1.0f && w[N - 1] == 1.0f, "restored step %lld w %g", (long long)step, w[0]);
  if (records(dir, g_rank, size)) return 1;

  const float want = (float)size * (float)(size + 1) / 2.0f;
  for (int s = 0; s < steps; s++) {
    if (step_ms > 0) {
      struct timespec ts = {step_ms / 1000, (step_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
    for (int i = 0; i < N; i++) x[i] = (float)(g_rank + 1);
    hora_handle_t *h = NULL;
    TRY("step", hora_allreduce_async(g_ctx, "g", x, y, N, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST, &h));
    rc = hora_wait(h);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", hora_last_error());
    hora_handle_free(h);
    if (rc != HORA_SUCCESS) return fail_at("step", rc, msg);
    CHECK("step", y[0] == want && y[N - 1] == want, "step %d: sum %g, want %g", s, y[0], want);
  }
  TRY("finalize", hora_ckpt_close(ck));
  rc = hora_finalize(g_ctx);
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "FAULT_PROBE rank %d error at finalize: %s: %s\n", g_rank, hora_result_name(rc), hora_last_error());
    return 1;
  }
  fprintf(stderr, "FAULT_PROBE rank %d ok\n", g_rank);
  return 0;
}
