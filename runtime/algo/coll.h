/* The algorithm layer's door: what the rest of hora (the async engine, the GPU path in
 * runtime/comm) uses of runtime/algo. Argument checks (check.c), the host bodies of every
 * collective (coll.c), the allreduce entries (dispatch.c) and the device hooks table. */
#ifndef HORA_ALGO_COLL_H
#define HORA_ALGO_COLL_H

#include <stdint.h>

#include "algo/algo.h"

/* ---- argument checks (check.c) ----
 * Shared by the blocking calls and the engine's async ones so both follow hora.h's rules (the
 * in-place forms, "any other overlap is an error"). Local unless said otherwise: nothing is
 * communicated. *bytes (may be NULL) gets the per-rank block size in bytes. */
hora_result_t hora__check_buf(const char *fn, const char *what, const void *buf, size_t count,
                              hora_dtype_t dtype, size_t *bytes);
hora_result_t hora__check_common(hora_ctx_t *ctx, const char *fn, hora_dtype_t dtype,
                                 hora_device_t device);
hora_result_t hora__check_allreduce(hora_ctx_t *ctx, const char *fn, const void *sendbuf,
                                    void *recvbuf, size_t count, hora_dtype_t dtype, hora_op_t op,
                                    double prescale, double postscale, hora_device_t device);
hora_result_t hora__check_broadcast(hora_ctx_t *ctx, const char *fn, void *buf, size_t count,
                                    hora_dtype_t dtype, int root, hora_device_t device, size_t *bytes);
hora_result_t hora__check_allgather(hora_ctx_t *ctx, const char *fn, const void *sendbuf, void *recvbuf,
                                    size_t count, hora_dtype_t dtype, hora_device_t device, size_t *bytes);
hora_result_t hora__check_reducescatter(hora_ctx_t *ctx, const char *fn, const void *sendbuf,
                                        void *recvbuf, size_t recvcount, hora_dtype_t dtype, hora_op_t op,
                                        double prescale, double postscale, hora_device_t device);
hora_result_t hora__check_alltoall(hora_ctx_t *ctx, const char *fn, const void *sendbuf, void *recvbuf,
                                   size_t count, hora_dtype_t dtype, hora_device_t device);
/* allgatherv's local checks (recvcounts not NULL is the caller's): the sum of recvcounts in
 * *total (may be NULL). */
hora_result_t hora__check_allgatherv_local(hora_ctx_t *ctx, const char *fn, const void *sendbuf, size_t sendcount,
                                           const void *recvbuf, const size_t *recvcounts, hora_dtype_t dtype,
                                           size_t *total);
/* The blocking v-collectives' checks. Collective over ctx->world: every rank gets the same result
 * (HORA_ERR_MISMATCH when the ranks' counts disagree). device_ok: the build has the device form. */
hora_result_t hora__check_allgatherv(hora_ctx_t *ctx, const char *fn, const void *sendbuf, size_t sendcount,
                                     const void *recvbuf, const size_t *recvcounts, hora_dtype_t dtype,
                                     hora_device_t device, int device_ok);
hora_result_t hora__check_alltoallv(hora_ctx_t *ctx, const char *fn, const void *sendbuf, const size_t *sendcounts,
                                    const void *recvbuf, const size_t *recvcounts, hora_dtype_t dtype,
                                    hora_device_t device, int device_ok);
/* HORA_ERR_NOT_SUPPORTED for device buffers in a build without CUDA, naming fn. */
hora_result_t hora__device_unsupported(const char *fn);
/* Every rank returns an error if any rank's `mine` is an error (MPI_MAX of the codes). */
hora_result_t hora__agree(hora_ctx_t *ctx, const char *fn, hora_result_t mine);

/* ---- the cross-rank call check (callcheck.c) ----
 * What a blocking collective agrees on before it moves data. Fields that do not apply to the
 * collective are 0. count: the per-rank count of hora.h (allgatherv: the sum of recvcounts;
 * alltoallv: 0, its counts are checked pairwise by hora__check_alltoallv). */
enum {
  HORA_CALL_ALLREDUCE = 1,
  HORA_CALL_BROADCAST,
  HORA_CALL_ALLGATHER,
  HORA_CALL_ALLGATHERV,
  HORA_CALL_REDUCESCATTER,
  HORA_CALL_ALLTOALL,
  HORA_CALL_ALLTOALLV,
  HORA_CALL_BARRIER,
  HORA_CALL_INVALID /* this rank's own arguments failed the local checks (coll.c) */
};
typedef struct {
  int kind;
  uint64_t count;
  int dtype, op, root, device;
  uint64_t shape; /* hora_set_call_shape's fingerprint, 0: unchecked */
  int algo;       /* allreduce: the algorithm it resolved to (hora_algo_t); 0 otherwise */
  double prescale, postscale; /* allreduce, reducescatter; 0 otherwise */
} hora_call_desc_t;
/* The HORA_SHM_WORDS words that carry a descriptor. */
void hora__call_pack(const hora_call_desc_t *d, uint64_t w[HORA_SHM_WORDS]);
/* Collective over ctx->world, the first communication of every blocking call: HORA_SUCCESS when
 * every rank's descriptor agrees (or HORA_CHECK=0), else HORA_ERR_MISMATCH on every rank with a
 * message naming the collective, the fields, their values and the ranks holding each. */
hora_result_t hora__call_agree(hora_ctx_t *ctx, const char *fn, const hora_call_desc_t *d);
/* The fingerprint hora_set_call_shape left for this thread's next call on ctx (0: none); clears it,
 * and the tags of hora_set_call_group and hora_set_call_ready too. */
uint64_t hora__call_shape_take(const hora_ctx_t *ctx);
/* hora_set_call_group's tag for this thread's next call on ctx (0, 0: none), cleared. */
void hora__call_group_take(const hora_ctx_t *ctx, uint64_t *key, uint32_t *size);
/* hora_set_call_ready's CUDA event for this thread's next call on ctx (NULL: none), cleared. */
void *hora__call_ready_take(const hora_ctx_t *ctx);
/* HORA_CHECK != 0. */
int hora__call_check_on(void);
/* algo/coll.c: the blocking call in progress on ctx ended alike on every rank (it succeeded, or
 * the call check or a decision all ranks shared ended it), so the call counts that the heartbeat
 * reads mark it done: a peer's hora_finalize after it is not taken for one that skipped it. */
void hora__call_ended_everywhere(hora_ctx_t *ctx);
const char *hora__call_kind_name(int kind);

/* ---- allreduce (dispatch.c) ---- */
/* prescale copy -> allreduce -> average/postscale, on host buffers (sendbuf == recvbuf in place). */
hora_result_t hora__allreduce_host_full(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t count, hora_dtype_t dtype, hora_op_t op,
                                        double prescale, double postscale, hora_algo_t algo);
/* hora_allreduce's body on host buffers after the local argument checks: the call check (d, with
 * d->algo filled in here) and the allreduce, the check carried by the shm algorithm's first
 * barrier where it runs (dispatch.c). Collective over ctx->world. Errors: hora__call_agree's and
 * the algorithm's. */
hora_result_t hora__allreduce_checked(hora_ctx_t *ctx, const char *fn, hora_call_desc_t *d, const void *sendbuf,
                                      void *recvbuf, size_t count, hora_dtype_t dtype, hora_op_t op,
                                      double prescale, double postscale, hora_algo_t algo);
/* Apply HORA_AVERAGE's division and the postscale factor to a reduced buffer (host). */
hora_result_t hora__scale_and_average(hora_ctx_t *ctx, void *buf, size_t count,
                                      hora_dtype_t dtype, hora_op_t op, double postscale);
/* Whether an allreduce of `count` elements in all, given as segments, runs on the segments where
 * they are (hora__allreduce_segs): one node, more than one rank, no prescale, and `algo` resolves
 * to shared memory for that size. Otherwise the caller packs the segments into one buffer. */
int hora__allreduce_segs_direct(hora_ctx_t *ctx, size_t count, hora_dtype_t dtype, double prescale,
                                hora_algo_t algo);
/* The segmented allreduce (with average and postscale applied before results are published).
 * Collective over the node; only where hora__allreduce_segs_direct said so. */
hora_result_t hora__allreduce_segs(hora_ctx_t *ctx, const hora_seg_t *seg, size_t nseg, hora_dtype_t dtype,
                                   hora_op_t op, double postscale);

/* ---- host bodies of the other collectives (coll.c) ----
 * Checked arguments; collective over ctx->world; blocking. Byte counts are per rank's block. */
hora_result_t hora__broadcast_host(hora_ctx_t *ctx, void *buf, size_t bytes, int root);
/* recvbuf holds size blocks of `bytes`; sendbuf may be this rank's block (in place). */
hora_result_t hora__allgather_host(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t bytes);
/* recvcounts[i] elements of es bytes from rank i, in rank order; this rank sends recvcounts[rank]. */
hora_result_t hora__allgatherv_host(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                    const size_t *recvcounts, size_t es);
hora_result_t hora__alltoall_host(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf, size_t bytes);
hora_result_t hora__alltoallv_host(hora_ctx_t *ctx, const void *sendbuf, const size_t *sendcounts,
                                   void *recvbuf, const size_t *recvcounts, size_t es);
/* prescale (into a copy of sendbuf's size x recvcount elements, never into sendbuf) -> the ring's
 * reduce-scatter -> average and postscale on recvbuf, as hora__allreduce_host_full. */
hora_result_t hora__reducescatter_host(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                       size_t recvcount, hora_dtype_t dtype, hora_op_t op,
                                       double prescale, double postscale);

/* Device-buffer collectives, defined by runtime/comm/gpu.c (NULL entries in builds without CUDA).
 * The arguments are already validated; they are blocking like the public calls. */
typedef struct {
  hora_result_t (*allreduce)(hora_ctx_t *, const void *, void *, size_t, hora_dtype_t, hora_op_t,
                             double, double);
  hora_result_t (*broadcast)(hora_ctx_t *, void *, size_t, hora_dtype_t, int);
  hora_result_t (*allgather)(hora_ctx_t *, const void *, void *, size_t, hora_dtype_t);
  hora_result_t (*allgatherv)(hora_ctx_t *, const void *, size_t, void *, const size_t *, hora_dtype_t);
  hora_result_t (*reducescatter)(hora_ctx_t *, const void *, void *, size_t, hora_dtype_t, hora_op_t, double,
                                 double);
  hora_result_t (*alltoall)(hora_ctx_t *, const void *, void *, size_t, hora_dtype_t);
  hora_result_t (*alltoallv)(hora_ctx_t *, const void *, const size_t *, void *, const size_t *, hora_dtype_t);
  /* A rank that called hora_join, in the others' device allreduce of `count` elements: zeros in
   * from a device buffer of its own, the result discarded (the async engine's run_device). */
  hora_result_t (*allreduce_zeros)(hora_ctx_t *, size_t, hora_dtype_t, hora_op_t, double, double);
  /* The async engine's fused group of device allreduces (one dtype, op and scale factors): the
   * segments reduced as one buffer, in order. A NULL src adds zeros (a rank that has joined), a
   * NULL dst discards that segment's result. Collective like allreduce of the segments' total. */
  hora_result_t (*allreduce_segs)(hora_ctx_t *, const hora_seg_t *, size_t, hora_dtype_t, hora_op_t, double,
                                  double);
  /* Wait on this thread until the CUDA event `event` (hora_set_call_ready) has completed, polling,
   * as hora__gpu_wait polls a stream: HORA_ERR_CUDA when the event reports an error,
   * HORA_ERR_TIMEOUT after HORA_PEER_TIMEOUT_S, the context's verdict once it has failed. Local:
   * needs no GPU state. `what` names the request in messages. */
  hora_result_t (*wait_event)(hora_ctx_t *, void *event, const char *what);
} hora_gpu_hooks_t;
extern hora_gpu_hooks_t hora__gpu_hooks;

#endif
