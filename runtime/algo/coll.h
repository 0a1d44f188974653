/* Internal pieces of the collectives shared with the engine and the GPU path. */
#ifndef HORA_ALGO_COLL_H
#define HORA_ALGO_COLL_H

#include "algo/algo.h"

hora_result_t hora__check_buf(const char *fn, const char *what, const void *buf, size_t count,
                              hora_dtype_t dtype, size_t *bytes);
hora_result_t hora__check_common(hora_ctx_t *ctx, const char *fn, hora_dtype_t dtype,
                                 hora_device_t device);
hora_result_t hora__check_allreduce(hora_ctx_t *ctx, const char *fn, const void *sendbuf,
                                    void *recvbuf, size_t count, hora_dtype_t dtype, hora_op_t op,
                                    double prescale, double postscale, hora_device_t device);
/* Argument checks of the other collectives, shared by the blocking calls and the engine's async
 * ones so both follow hora.h's rules (the in-place forms, "any other overlap is an error").
 * Local: nothing is communicated. *bytes (may be NULL) gets the per-rank block size in bytes. */
hora_result_t hora__check_broadcast(hora_ctx_t *ctx, const char *fn, void *buf, size_t count,
                                    hora_dtype_t dtype, int root, hora_device_t device, size_t *bytes);
hora_result_t hora__check_allgather(hora_ctx_t *ctx, const char *fn, const void *sendbuf, void *recvbuf,
                                    size_t count, hora_dtype_t dtype, hora_device_t device, size_t *bytes);
hora_result_t hora__check_reducescatter(hora_ctx_t *ctx, const char *fn, const void *sendbuf,
                                        void *recvbuf, size_t recvcount, hora_dtype_t dtype, hora_op_t op,
                                        hora_device_t device);
hora_result_t hora__check_alltoall(hora_ctx_t *ctx, const char *fn, const void *sendbuf, void *recvbuf,
                                   size_t count, hora_dtype_t dtype, hora_device_t device);
/* prescale copy -> in-place allreduce -> average/postscale, on host buffers. */
hora_result_t hora__allreduce_host_full(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t count, hora_dtype_t dtype, hora_op_t op,
                                        double prescale, double postscale, hora_algo_t algo);
/* Apply HORA_AVERAGE's division and the postscale factor to a reduced buffer (host). */
hora_result_t hora__scale_and_average(hora_ctx_t *ctx, void *buf, size_t count,
                                      hora_dtype_t dtype, hora_op_t op, double postscale);
hora_result_t hora__broadcast_host(hora_ctx_t *ctx, void *buf, size_t bytes, int root);
hora_result_t hora__reducescatter_host(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                       size_t recvcount, hora_dtype_t dtype, hora_op_t op);
/* Every rank returns an error if any rank's `mine` is an error (MPI_MAX of the codes). */
hora_result_t hora__agree(hora_ctx_t *ctx, const char *fn, hora_result_t mine);

/* Device-buffer collectives, defined by runtime/comm/gpu.c (NULL entries in builds without CUDA).
 * The arguments are already validated; they are blocking like the public calls. */
typedef struct {
  hora_result_t (*allreduce)(hora_ctx_t *, const void *, void *, size_t, hora_dtype_t, hora_op_t,
                             double, double);
  hora_result_t (*broadcast)(hora_ctx_t *, void *, size_t, hora_dtype_t, int);
  hora_result_t (*allgather)(hora_ctx_t *, const void *, void *, size_t, hora_dtype_t);
  hora_result_t (*allgatherv)(hora_ctx_t *, const void *, size_t, void *, const size_t *, hora_dtype_t);
  hora_result_t (*reducescatter)(hora_ctx_t *, const void *, void *, size_t, hora_dtype_t, hora_op_t);
  hora_result_t (*alltoall)(hora_ctx_t *, const void *, void *, size_t, hora_dtype_t);
  hora_result_t (*alltoallv)(hora_ctx_t *, const void *, const size_t *, void *, const size_t *, hora_dtype_t);
} hora_gpu_hooks_t;
extern hora_gpu_hooks_t hora__gpu_hooks;

#endif
