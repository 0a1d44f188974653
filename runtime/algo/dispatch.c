/* Algorithm choice for the host allreduce. */
#include <string.h>
#include <strings.h>

#include "algo/algo.h"

static const char *const names[] = {"auto", "ring", "shm", "hier", "mpi"};

hora_result_t hora__algo_parse(const char *name, hora_algo_t *out) {
  for (int i = 0; i < 5; i++)
    if (name && strcasecmp(name, names[i]) == 0) {
      *out = (hora_algo_t)i;
      return HORA_SUCCESS;
    }
  return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "unknown allreduce algorithm '%s' (auto|ring|shm|hier|mpi)",
                  name ? name : "(null)");
}

const char *hora__algo_name(hora_algo_t algo) {
  return (unsigned)algo < 5 ? names[algo] : "unknown";
}

hora_result_t hora__allreduce_host(hora_ctx_t *ctx, void *buf, size_t count, hora_dtype_t dtype,
                                   hora_op_t op, hora_algo_t algo) {
  if (ctx->size == 1 || count == 0) return HORA_SUCCESS;
  (void)algo; /* ring, shm and hier are added in algo/ring.c, algo/shm.c, algo/hier.c */
  return hora__allreduce_mpi(ctx, ctx->world, buf, count, dtype, op);
}
