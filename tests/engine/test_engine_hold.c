/* hora_hold_submissions: a burst of async allreduces submitted one by one, with pauses longer
 * than the engine's cycle between them, is negotiated only after the hold ends and then runs as
 * one fused group; without a hold a request completes on its own (the control, which shows that
 * the first check can fail). A hold that is never
 * released delays the rank's requests, and so the others', by its time limit and no more; every
 * result is checked element by element; bad arguments are refused.
 *   test_engine_hold */
#include <math.h>
#include <stdint.h>
#include <unistd.h>

#include "engine/engine.h"
#include "hora_test.h"

static int rank, size;

#define K 12       /* requests in a burst */
#define N 1000     /* elements of each */
#define GAP_US 3000 /* pause between two submissions: 3 engine cycles of the default 1 ms */

typedef struct {
  float *buf[K];
  hora_handle_t *h[K];
} burst_t;

/* Submits the burst `tag` one request at a time, GAP_US apart. Element i of request k on rank r
 * is r + k + i % 7, so the sum is size*(size-1)/2 + size*(k + i % 7). */
static void burst_submit(hora_ctx_t *ctx, burst_t *b, const char *tag) {
  MPI_Barrier(MPI_COMM_WORLD);
  for (int k = 0; k < K; k++) {
    char name[64];
    snprintf(name, sizeof name, "hold/%s/%d", tag, k);
    b->buf[k] = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) b->buf[k][i] = (float)(rank + k + i % 7);
    EXPECT_OK(hora_allreduce_async(ctx, name, b->buf[k], b->buf[k], N, HORA_FLOAT32, HORA_SUM, 1.0, 1.0,
                                   HORA_DEVICE_HOST, &b->h[k]));
    usleep(GAP_US);
  }
}

static int done_count(burst_t *b) {
  int n = 0, d;
  for (int k = 0; k < K; k++) {
    EXPECT_OK(hora_poll(b->h[k], &d));
    n += d;
  }
  return n;
}

static void burst_finish(burst_t *b, const char *tag) {
  for (int k = 0; k < K; k++) {
    EXPECT_OK(hora_wait(b->h[k]));
    int bad = 0;
    for (int i = 0; i < N && !bad; i++) {
      float want = (float)(size * (size - 1) / 2 + size * (k + i % 7));
      if (b->buf[k][i] != want) {
        EXPECT(0, "%s request %d element %d: %g, want %g", tag, k, i, b->buf[k][i], want);
        bad = 1;
      }
    }
    hora_handle_free(b->h[k]);
    free(b->buf[k]);
  }
}

static uint64_t fused_groups(hora_ctx_t *ctx) {
  uint64_t cycles, slow, hits, fused = 0;
  EXPECT_OK(hora__engine_stats(ctx, &cycles, &slow, &hits, &fused));
  return fused;
}

int main(int argc, char **argv) {
  hora_ctx_t *ctx = hora_test_init_mpi(&argc, &argv, &rank, &size);
  if (!ctx) return 1;
  static float x0[N], x[N];

  EXPECT_ERR(hora_hold_submissions(ctx, -0.5), HORA_ERR_INVALID_ARGUMENT, "seconds");
  EXPECT_ERR(hora_hold_submissions(ctx, 1.5), HORA_ERR_INVALID_ARGUMENT, "seconds");
  EXPECT_ERR(hora_hold_submissions(ctx, NAN), HORA_ERR_INVALID_ARGUMENT, "seconds");
  EXPECT_RC(hora_hold_submissions(NULL, 0.1), HORA_ERR_NOT_INITIALIZED);
  EXPECT_OK(hora_hold_submissions(ctx, 0)); /* releasing without a hold is fine */

  /* Control: without a hold a request is negotiated on its own, so the check of the held burst
   * below (none done before the release) can fail. */
  burst_t b;
  MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < N; i++) x0[i] = (float)rank;
  hora_handle_t *h;
  EXPECT_OK(hora_allreduce_async(ctx, "hold/free", x0, x0, N, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST, &h));
  int d = 0;
  for (double t = MPI_Wtime(); !d && MPI_Wtime() - t < 10; usleep(1000)) EXPECT_OK(hora_poll(h, &d));
  EXPECT(d == 1, "control: a request without a hold was not done after 10 s");
  EXPECT_OK(hora_wait(h));
  hora_handle_free(h);
  EXPECT(x0[0] == (float)(size * (size - 1) / 2), "control: %g, want %g", x0[0], (float)(size * (size - 1) / 2));

  /* Held: nothing is negotiated while the burst (36 ms) is submitted, nor 50 ms after it; on
   * release the whole burst runs as one fused group. */
  uint64_t before = fused_groups(ctx);
  EXPECT_OK(hora_hold_submissions(ctx, 1.0));
  burst_submit(ctx, &b, "held");
  usleep(50000);
  int early = done_count(&b);
  EXPECT(early == 0, "%d of %d held requests completed before the hold was released", early, K);
  MPI_Barrier(MPI_COMM_WORLD); /* every rank has checked before any releases */
  EXPECT_OK(hora_hold_submissions(ctx, 0));
  burst_finish(&b, "held");
  uint64_t groups = fused_groups(ctx) - before;
  EXPECT(groups == 1, "the held burst of %d ran as %llu fused groups, want 1", K, (unsigned long long)groups);

  /* A hold never released (rank 0's only) ends by its limit: every rank's request waits for it
   * (a name is ready once all ranks have sent it), for about 0.3 s and not much more. */
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  if (rank == 0) EXPECT_OK(hora_hold_submissions(ctx, 0.3));
  for (int i = 0; i < N; i++) x[i] = (float)(rank * i);
  EXPECT_OK(hora_allreduce_async(ctx, "hold/expire", x, x, N, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST, &h));
  EXPECT_OK(hora_wait(h));
  double dt = MPI_Wtime() - t0;
  hora_handle_free(h);
  EXPECT(dt >= 0.25 && dt < 10, "request under rank 0's unreleased 0.3 s hold completed after %.3f s", dt);
  for (int i = 0; i < N; i++)
    if (x[i] != (float)(size * (size - 1) / 2 * i)) {
      EXPECT(0, "expire: element %d is %g, want %g", i, x[i], (float)(size * (size - 1) / 2 * i));
      break;
    }

  /* hora_finalize ends a hold at once (nothing is left queued). */
  EXPECT_OK(hora_hold_submissions(ctx, 1.0));
  EXPECT_OK(hora_finalize(ctx));
  int rc = hora_test_finish_mpi("test_engine_hold");
  MPI_Finalize();
  return rc;
}
