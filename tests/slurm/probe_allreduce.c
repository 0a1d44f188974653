/* A 2-node allreduce through hora under launch: checks that hora_init's layout matches what
 * launch exported (HORA_*), that the nodes are told apart although they share a host name, and
 * that an allreduce of rank-dependent integers gives the exact sum on every rank. */
#include <stdlib.h>

#include "hora_test.h"

static int env_int(const char *name) {
  const char *v = getenv(name);
  return v ? atoi(v) : -100;
}

int main(void) {
  hora_ctx_t *ctx = NULL;
  hora_result_t rc = hora_init(&ctx);
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "hora_init failed: %s\n", hora_last_error());
    return 1;
  }
  int r = -1, s = -1, lr = -1, ls = -1, cr = -1, cs = -1;
  EXPECT_OK(hora_rank(ctx, &r));
  EXPECT_OK(hora_size(ctx, &s));
  EXPECT_OK(hora_local_rank(ctx, &lr));
  EXPECT_OK(hora_local_size(ctx, &ls));
  EXPECT_OK(hora_cross_rank(ctx, &cr));
  EXPECT_OK(hora_cross_size(ctx, &cs));
  EXPECT(r == env_int("HORA_RANK") && s == env_int("HORA_SIZE"), "rank %d/%d vs HORA_RANK/SIZE", r, s);
  EXPECT(lr == env_int("HORA_LOCAL_RANK") && ls == env_int("HORA_LOCAL_SIZE"), "local %d/%d vs HORA_LOCAL_*", lr, ls);
  EXPECT(cr == env_int("HORA_CROSS_RANK") && cs == env_int("HORA_CROSS_SIZE"), "cross %d/%d vs HORA_CROSS_*", cr, cs);
  enum { N = 1000 };
  int32_t *buf = malloc(N * sizeof(int32_t));
  for (int i = 0; i < N; i++) buf[i] = (r + 1) * (i % 7 + 1);
  EXPECT_OK(hora_allreduce(ctx, buf, buf, N, HORA_INT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST));
  long tri = (long)s * (s + 1) / 2;
  int bad = 0;
  for (int i = 0; i < N; i++) bad += buf[i] != tri * (i % 7 + 1);
  EXPECT(bad == 0, "%d of %d allreduce results wrong (buf[0]=%d, want %ld)", bad, N, buf[0], tri);
  free(buf);
  printf("ALLREDUCE rank=%d size=%d local=%d/%d cross=%d/%d errors=%ld\n", r, s, lr, ls, cr, cs, hora_test_errors);
  int code = hora_test_finish_mpi("probe_allreduce");
  hora_finalize(ctx);
  return code;
}
