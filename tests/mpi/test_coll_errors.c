/* Error paths of the blocking collectives: each bad input returns the documented code on every
 * rank, with a message naming the bad argument, and leaves the output buffer untouched. */
#include <math.h>
#include <stdint.h>

#include "hora_test.h"

static int rank, size;

#define SENTINEL 0x5a
static int untouched(const void *p, size_t n) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++)
    if (c[i] != SENTINEL) return 0;
  return 1;
}

/* The call returns `want` and hora_last_error() mentions `word`. */

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  setenv("HORA_LOG", "NONE", 1);

  /* An unknown algorithm name fails init, naming the variable. */
  setenv("HORA_ALLREDUCE_ALGO", "butterfly", 1);
  hora_ctx_t *ctx = NULL;
  EXPECT_ERR(hora_init(&ctx), HORA_ERR_INVALID_ARGUMENT, "HORA_ALLREDUCE_ALGO");
  unsetenv("HORA_ALLREDUCE_ALGO");
  EXPECT_OK(hora_init(&ctx));

  const size_t N = 64;
  size_t S = (size_t)size;
  float *in = malloc(N * S * sizeof *in), *out = malloc(N * S * sizeof *out);
  for (size_t i = 0; i < N * S; i++) in[i] = (float)i;
  size_t ob = N * S * sizeof *out;
#define RESET() memset(out, SENTINEL, ob)
#define CHECK_OUT() EXPECT(untouched(out, ob), "output was written on error (line %d)", __LINE__)

  /* allreduce */
  RESET();
  EXPECT_ERR(hora_allreduce(ctx, NULL, out, N, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "sendbuf");
  CHECK_OUT();
  EXPECT_ERR(hora_allreduce(ctx, in, NULL, N, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "recvbuf");
  EXPECT_ERR(hora_allreduce(ctx, in, out, N, (hora_dtype_t)99, HORA_SUM, 1, 1, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "dtype");
  EXPECT_ERR(hora_allreduce(ctx, in, out, N, HORA_FLOAT32, (hora_op_t)7, 1, 1, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "op");
  EXPECT_ERR(hora_allreduce(ctx, in, out, N, HORA_FLOAT32, HORA_SUM, 1, 1, (hora_device_t)5),
             HORA_ERR_INVALID_ARGUMENT, "device");
  EXPECT_ERR(hora_allreduce(ctx, in, out, SIZE_MAX / 2, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "overflows");
  EXPECT_ERR(hora_allreduce(ctx, in, out, N, HORA_INT32, HORA_SUM, 2.0, 1, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "prescale");
  EXPECT_ERR(hora_allreduce(ctx, in, in + 1, N, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "overlap");
  CHECK_OUT();
  /* A float buffer at an odd byte offset is refused on every rank, naming the buffer; a bf16 one
   * at an even offset is fine (aligned to its 2-byte elements). */
  EXPECT_ERR(hora_allreduce(ctx, (const char *)in + 1, out, N, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "sendbuf");
  EXPECT(strstr(hora_last_error(), "not aligned to 4 bytes") != NULL, "message: %s", hora_last_error());
  EXPECT_ERR(hora_allreduce(ctx, in, (char *)out + 2, N, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "recvbuf");
  CHECK_OUT();
  {
    uint16_t *h = (uint16_t *)((char *)out + 2), hin[8];
    for (int i = 0; i < 8; i++) hin[i] = 0x3f80; /* 1.0 in bfloat16 */
    EXPECT_OK(hora_allreduce(ctx, hin, h, 8, HORA_BFLOAT16, HORA_SUM, 1, 1, HORA_DEVICE_HOST));
    uint16_t want = size == 1 ? 0x3f80 : size == 2 ? 0x4000 : size == 3 ? 0x4040 : 0x4080;
    for (int i = 0; i < 8; i++) EXPECT(h[i] == want, "bf16 sum [%d] = 0x%04x, want 0x%04x", i, h[i], want);
    RESET();
  }
  /* Only rank 0 passes a misaligned buffer: it names the buffer, every other rank fails too. */
  {
    const void *src = rank == 0 ? (const void *)((const char *)in + 1) : (const void *)in;
    hora_result_t got = hora_allreduce(ctx, src, out, N, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST);
    EXPECT(got != HORA_SUCCESS, "rank %d: a call where rank 0's sendbuf is misaligned succeeded", rank);
    if (rank == 0) EXPECT(strstr(hora_last_error(), "not aligned") != NULL, "message: %s", hora_last_error());
    CHECK_OUT();
  }
  /* count 0 with NULL buffers is fine */
  EXPECT_OK(hora_allreduce(ctx, NULL, NULL, 0, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST));

  /* broadcast */
  RESET();
  EXPECT_ERR(hora_broadcast(ctx, out, N, HORA_FLOAT32, size, HORA_DEVICE_HOST), HORA_ERR_INVALID_ARGUMENT, "root");
  EXPECT_ERR(hora_broadcast(ctx, out, N, HORA_FLOAT32, -1, HORA_DEVICE_HOST), HORA_ERR_INVALID_ARGUMENT, "root");
  EXPECT_ERR(hora_broadcast(ctx, NULL, N, HORA_FLOAT32, 0, HORA_DEVICE_HOST), HORA_ERR_INVALID_ARGUMENT, "buf");
  EXPECT_ERR(hora_broadcast(ctx, out, N, (hora_dtype_t)-1, 0, HORA_DEVICE_HOST), HORA_ERR_INVALID_ARGUMENT, "dtype");
  CHECK_OUT();

  /* allgather */
  EXPECT_ERR(hora_allgather(ctx, NULL, out, N, HORA_FLOAT32, HORA_DEVICE_HOST), HORA_ERR_INVALID_ARGUMENT, "sendbuf");
  EXPECT_ERR(hora_allgather(ctx, in, NULL, N, HORA_FLOAT32, HORA_DEVICE_HOST), HORA_ERR_INVALID_ARGUMENT, "recvbuf");
  EXPECT_ERR(hora_allgather(ctx, in, out, SIZE_MAX / 4 / S + 1, HORA_FLOAT32, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "overflow");
  CHECK_OUT();

  /* allgatherv: recvcounts that differ between ranks -> MISMATCH everywhere (np >= 2) */
  size_t *rc = malloc(S * sizeof *rc);
  for (int r = 0; r < size; r++) rc[r] = 4;
  if (size > 1 && rank == 0) rc[size - 1] = 5;
  RESET();
  hora_result_t got = hora_allgatherv(ctx, in, 4, out, rc, HORA_FLOAT32, HORA_DEVICE_HOST);
  if (size > 1) {
    EXPECT(got == HORA_ERR_MISMATCH, "allgatherv with different recvcounts: %s", hora_result_name(got));
    EXPECT(strstr(hora_last_error(), "recvcounts") != NULL, "message: %s", hora_last_error());
  } else {
    EXPECT(got == HORA_SUCCESS, "allgatherv np1: %s", hora_result_name(got));
    RESET();
  }
  CHECK_OUT();
  /* sendcount != recvcounts[rank] on one rank: every rank fails (the others learn it) */
  for (int r = 0; r < size; r++) rc[r] = 4;
  got = hora_allgatherv(ctx, in, rank == 0 ? 3 : 4, out, rc, HORA_FLOAT32, HORA_DEVICE_HOST);
  EXPECT(got == HORA_ERR_INVALID_ARGUMENT, "allgatherv bad sendcount: %s", hora_result_name(got));
  EXPECT(strstr(hora_last_error(), rank == 0 ? "sendcount" : "another rank") != NULL, "message: %s", hora_last_error());
  CHECK_OUT();
  EXPECT_ERR(hora_allgatherv(ctx, in, 4, out, NULL, HORA_FLOAT32, HORA_DEVICE_HOST), HORA_ERR_INVALID_ARGUMENT, "recvcounts");

  /* reducescatter */
  EXPECT_ERR(hora_reducescatter(ctx, NULL, out, N, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "sendbuf");
  EXPECT_ERR(hora_reducescatter(ctx, in, out, N, HORA_FLOAT32, (hora_op_t)9, 1.0, 1.0, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "op");
  EXPECT_ERR(hora_reducescatter(ctx, in, out, SIZE_MAX / 2, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "overflows");
  /* scale factors: floating point only, never NaN; no average of bool */
  EXPECT_ERR(hora_reducescatter(ctx, in, out, N, HORA_INT32, HORA_SUM, 2.0, 1.0, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "prescale (2) and postscale (1) must be 1.0 for integer dtype");
  EXPECT_ERR(hora_reducescatter(ctx, in, out, N, HORA_FLOAT32, HORA_SUM, 1.0, NAN, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "NaN");
  EXPECT_ERR(hora_reducescatter(ctx, in, out, N, HORA_BOOL, HORA_AVERAGE, 1.0, 1.0, HORA_DEVICE_HOST),
             HORA_ERR_INVALID_ARGUMENT, "HORA_AVERAGE is not defined for HORA_BOOL");
  {
    /* overlap that is not the in-place form */
    float *buf = malloc((N * S + 1) * sizeof *buf);
    for (size_t i = 0; i < N * S + 1; i++) buf[i] = 1;
    EXPECT_ERR(hora_reducescatter(ctx, buf, buf + (size_t)rank * N + 1, N, HORA_FLOAT32, HORA_SUM, 1.0, 1.0,
                                  HORA_DEVICE_HOST),
               HORA_ERR_INVALID_ARGUMENT, "overlaps");
    EXPECT(buf[(size_t)rank * N + 1] == 1, "reducescatter wrote on error");
    free(buf);
  }
  CHECK_OUT();

  /* alltoall / alltoallv */
  EXPECT_ERR(hora_alltoall(ctx, in, NULL, N, HORA_FLOAT32, HORA_DEVICE_HOST), HORA_ERR_INVALID_ARGUMENT, "recvbuf");
  EXPECT_ERR(hora_alltoall(ctx, in, in, N, HORA_FLOAT32, HORA_DEVICE_HOST), HORA_ERR_INVALID_ARGUMENT, "overlap");
  size_t *sc = malloc(S * sizeof *sc), *rcv = malloc(S * sizeof *rcv);
  for (int p = 0; p < size; p++) sc[p] = rcv[p] = 2;
  rcv[0] = 3; /* rank 0 sends 2 to everyone, everyone expects 3 from rank 0 */
  RESET();
  got = hora_alltoallv(ctx, in, sc, out, rcv, HORA_FLOAT32, HORA_DEVICE_HOST);
  EXPECT(got == HORA_ERR_MISMATCH, "alltoallv mismatched counts: %s", hora_result_name(got));
  EXPECT(strstr(hora_last_error(), "recvcounts") != NULL || strstr(hora_last_error(), "another rank") != NULL,
         "message: %s", hora_last_error());
  CHECK_OUT();
  EXPECT_ERR(hora_alltoallv(ctx, in, NULL, out, rcv, HORA_FLOAT32, HORA_DEVICE_HOST), HORA_ERR_INVALID_ARGUMENT, "sendcounts");

  /* The context still works after all those errors. */
  for (size_t i = 0; i < N; i++) in[i] = (float)(rank + 1);
  EXPECT_OK(hora_allreduce(ctx, in, out, N, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST));
  EXPECT(out[N - 1] == (float)(size * (size + 1) / 2), "allreduce after errors: %g", out[N - 1]);

  free(in);
  free(out);
  free(rc);
  free(sc);
  free(rcv);
  EXPECT_OK(hora_finalize(ctx));
  int ret = hora_test_finish_mpi("test_coll_errors");
  MPI_Finalize();
  return ret;
}
