/* A small elastic training program for test_elastic_slurm.py, run by `launch --elastic`:
 *
 *   elastic_probe WORK_DIR EPOCHS STEPS_PER_EPOCH STEP_MS
 *
 * Model: w[N] floats. Global step s (epoch * STEPS + step) consumes the samples 4s .. 4s+3; rank r
 * of a world of W takes the samples 4s+j with j % W == r. Sample k's gradient is the integer
 * vector g_k[i] = ((31k + i) % 17) - 8 + (k & 1) (the last term makes every step's sum differ from
 * zero: 17 consecutive samples of the first term alone cancel), the ranks' sums are allreduced (exact in any order: small
 * integers) and w -= 2^-6 * sum. So the final w is exactly -2^-6 * (sum of g_k over every sample
 * of every epoch) whatever the world sizes and restarts were, if and only if every sample was
 * applied exactly once: a lost, repeated or torn step changes it. The probe checks it itself
 * and prints the sum of w for the test to check independently.
 *
 * Elastic: sync at start (commit id, epoch, step in the blob), commit every 5 steps and at each
 * epoch's end, hora_elastic_hosts_changed at each epoch's end; HORA_ERR_REMOTE anywhere: save
 * the commit, exit 4. Lines (rank 0 unless said):
 *   ELASTIC_PROBE sync rank R world W commit C crc X           (every rank)
 *   ELASTIC_PROBE train world W epoch E step S t=REALTIME      (first step after each sync)
 *   ELASTIC_PROBE commit C world W crc X
 *   ELASTIC_PROBE saved rank R commit C                        (a survivor, before exit 4)
 *   ELASTIC_PROBE stalls rank R: FROM:TO ...                   (the same survivor: the intervals,
 *                                                               UNIX times, in which this process
 *                                                               was not run; tests/common/stall_meter.h)
 *   ELASTIC_PROBE done world W wsum V errors N
 * Every rank writes WORK_DIR/pid.<node>.<rank> (its pid) so that the test can kill one node. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hora.h"
#include "stall_meter.h"

#define N 4096
#define COMMIT_EVERY 5

static float w[N], grad[N];
static int g_rank, g_size;
static hora_ctx_t *g_ctx;
static hora_elastic_t *g_es;

typedef struct {
  int64_t epoch, step;
} blob_t;

static uint64_t crc_w(void) { /* FNV-1a of w's bytes */
  uint64_t h = 1469598103934665603ull;
  const unsigned char *p = (const unsigned char *)w;
  for (size_t i = 0; i < sizeof w; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static double realtime(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A peer is gone: keep the last commit for the next step and leave with HORA_EXIT_ELASTIC. */
static void lost(const char *what, hora_result_t rc) {
  int64_t c = -1;
  hora_elastic_commit_id(g_es, &c);
  fprintf(stderr, "ELASTIC_PROBE rank %d: %s: %s: %s\n", g_rank, what, hora_result_name(rc), hora_last_error());
  if (rc != HORA_ERR_REMOTE) exit(1);
  hora_result_t s = hora_elastic_save(g_es);
  printf("ELASTIC_PROBE saved rank %d commit %" PRId64 " %s\n", g_rank, c, hora_result_name(s));
  /* On a frozen machine the survivors notice the loss late, by as long as they were not run:
   * the test takes that off the recovery it bounds. */
  static char stalls[STALL_METER_MAX * 48 + 64];
  snprintf(stalls, sizeof stalls, "ELASTIC_PROBE stalls rank %d:", g_rank);
  stall_meter_append(stalls, sizeof stalls - 1, 0, realtime() - stall_meter_now());
  puts(stalls);
  fflush(NULL);
  hora_finalize(g_ctx);
  exit(HORA_EXIT_ELASTIC);
}
#define TRY(what, call)                      \
  do {                                       \
    hora_result_t rc_ = (call);              \
    if (rc_ != HORA_SUCCESS) lost(what, rc_); \
  } while (0)

static void step_grad(int64_t gs) {
  memset(grad, 0, sizeof grad);
  for (int j = 0; j < 4; j++) {
    if (j % g_size != g_rank) continue;
    int64_t k = 4 * gs + j;
    for (int i = 0; i < N; i++) grad[i] += (float)((31 * k + i) % 17 - 8 + (k & 1));
  }
}

static void commit(blob_t *b) {
  hora_tensor_t t = {"w", w, N, HORA_FLOAT32, HORA_DEVICE_HOST, 0, NULL};
  TRY("commit", hora_elastic_commit(g_es, &t, 1, b, sizeof *b));
  int64_t c = -1;
  hora_elastic_commit_id(g_es, &c);
  if (g_rank == 0) printf("ELASTIC_PROBE commit %" PRId64 " world %d crc %016" PRIx64 "\n", c, g_size, crc_w());
}

/* The final w, computed directly: the number of w[i] that differ. */
static long check_final(int64_t steps_total) {
  long bad = 0;
  for (int i = 0; i < N; i++) {
    double s = 0;
    for (int64_t k = 0; k < 4 * steps_total; k++) s += (double)((31 * k + i) % 17 - 8 + (k & 1));
    if ((float)(-s / 64.0) != w[i]) bad++;
  }
  return bad;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: elastic_probe WORK_DIR EPOCHS STEPS_PER_EPOCH STEP_MS\n");
    return 2;
  }
  const char *work = argv[1];
  int epochs = atoi(argv[2]), steps = atoi(argv[3]), step_ms = atoi(argv[4]);
  if (stall_meter_start() != 0) return 2;
  if (hora_init(&g_ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  hora_rank(g_ctx, &g_rank);
  hora_size(g_ctx, &g_size);
  char path[4096], dir[4096];
  const char *node = getenv("SLURMD_NODENAME");
  snprintf(path, sizeof path, "%s/pid.%s.%d", work, node ? node : "local", g_rank);
  FILE *pf = fopen(path, "w");
  if (pf) fprintf(pf, "%ld\n", (long)getpid()), fclose(pf);
  snprintf(dir, sizeof dir, "%s/elastic", work);
  TRY("open", hora_elastic_open(g_ctx, dir, NULL, 0, &g_es));
  hora_tensor_t t = {"w", w, N, HORA_FLOAT32, HORA_DEVICE_HOST, 0, NULL};
  blob_t b = {0, 0};
  size_t bb = 0;
  int64_t c = -1;
  TRY("sync", hora_elastic_sync(g_es, &t, 1, &b, sizeof b, &bb, &c));
  if (bb != sizeof b) b = (blob_t){0, 0}; /* a fresh start: commit 0, no blob */
  printf("ELASTIC_PROBE sync rank %d world %d commit %" PRId64 " crc %016" PRIx64 "\n", g_rank, g_size, c, crc_w());
  fflush(stdout);
  int first = 1;
  for (; b.epoch < epochs; b.epoch++, b.step = 0) {
    for (; b.step < steps; b.step++) {
      if (first && g_rank == 0) printf("ELASTIC_PROBE train world %d epoch %" PRId64 " step %" PRId64 " t=%.3f\n",
                                       g_size, b.epoch, b.step, realtime());
      first = 0;
      step_grad(b.epoch * steps + b.step);
      hora_handle_t *h = NULL;
      TRY("allreduce", hora_allreduce_async(g_ctx, "grad", grad, grad, N, HORA_FLOAT32, HORA_SUM, 1.0, 1.0,
                                            HORA_DEVICE_HOST, &h));
      hora_result_t rc = hora_wait(h);
      hora_handle_free(h);
      if (rc != HORA_SUCCESS) lost("allreduce", rc);
      for (int i = 0; i < N; i++) w[i] -= grad[i] / 64.0f;
      if (step_ms > 0) usleep((useconds_t)step_ms * 1000);
      if ((b.step + 1) % COMMIT_EVERY == 0 && b.step + 1 < steps) {
        blob_t nb = {b.epoch, b.step + 1};
        commit(&nb);
      }
      fflush(stdout);
    }
    blob_t nb = {b.epoch + 1, 0};
    commit(&nb);
    int changed = 0;
    TRY("hosts", hora_elastic_hosts_changed(g_es, &changed));
    if (changed) {
      TRY("save", hora_elastic_save(g_es));
      if (g_rank == 0) printf("ELASTIC_PROBE re-forming after epoch %" PRId64 "\n", b.epoch);
      fflush(NULL);
      hora_finalize(g_ctx);
      return HORA_EXIT_ELASTIC;
    }
  }
  long bad = check_final((int64_t)epochs * steps);
  double sum = 0;
  for (int i = 0; i < N; i++) sum += w[i];
  if (g_rank == 0) printf("ELASTIC_PROBE done world %d wsum %.17g errors %ld\n", g_size, sum, bad);
  fflush(NULL);
  hora_elastic_close(g_es);
  hora_finalize(g_ctx);
  return bad ? 1 : 0;
}
