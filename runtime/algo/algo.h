/* Host allreduce algorithms behind one entry point. Every algorithm reduces `buf` (count elements
 * of dtype, already prescaled) IN PLACE across the context's world with a SUM/MIN/MAX/PRODUCT op
 * (HORA_AVERAGE arrives as HORA_SUM; the caller divides). Collective; same count on every rank. */
#ifndef HORA_ALGO_H
#define HORA_ALGO_H

#include "core/ctx.h"

typedef enum {
  HORA_ALGO_AUTO = 0,
  HORA_ALGO_RING = 1, /* algo/ring.c: reduce-scatter + allgather over MPI point-to-point */
  HORA_ALGO_SHM = 2,  /* algo/shm.c: MPI-3 shared windows, one node */
  HORA_ALGO_HIER = 3, /* algo/hier.c: intra-node reduce-scatter, inter-node ring, allgather */
  HORA_ALGO_MPI = 4   /* algo/mpi.c: MPI_Allreduce with a user op (the baseline) */
} hora_algo_t;

/* Parse "auto|ring|shm|hier|mpi". HORA_ERR_INVALID_ARGUMENT for anything else. */
hora_result_t hora__algo_parse(const char *name, hora_algo_t *out);
const char *hora__algo_name(hora_algo_t algo);

/* In-place host allreduce with an explicit algorithm (HORA_ALGO_AUTO picks). */
hora_result_t hora__allreduce_host(hora_ctx_t *ctx, void *buf, size_t count, hora_dtype_t dtype,
                                   hora_op_t op, hora_algo_t algo);

hora_result_t hora__allreduce_mpi(hora_ctx_t *ctx, MPI_Comm comm, void *buf, size_t count,
                                  hora_dtype_t dtype, hora_op_t op);

/* MPI datatype and user op for a hora dtype/op (created once, freed at finalize of MPI). */
hora_result_t hora__mpi_dtype_op(hora_dtype_t dtype, hora_op_t op, MPI_Datatype *type, MPI_Op *mop);

#endif
