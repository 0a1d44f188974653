/* Uses only the installed public header and library: init, one allreduce, finalize. Prints
 * "consumer ok <size> <sum>" when every rank got the exact sum 1 + 2 + ... + size. */
#include <hora.h>
#include <stdio.h>

int main(void) {
  hora_ctx_t *ctx = NULL;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  int rank = -1, size = 0;
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);
  double v = rank + 1, sum = 0;
  hora_result_t rc = hora_allreduce(ctx, &v, &sum, 1, HORA_FLOAT64, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST);
  int ok = rc == HORA_SUCCESS && sum == size * (size + 1) / 2.0;
  if (!ok) fprintf(stderr, "rank %d: allreduce gave %g (%s)\n", rank, sum, hora_result_name(rc));
  if (rank == 0 && ok) printf("consumer ok %d %g\n", size, sum);
  hora_finalize(ctx);
  return ok ? 0 : 1;
}
