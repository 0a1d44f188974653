/* Host allreduce algorithms behind one entry point. Every algorithm reduces `count` elements of
 * dtype (already prescaled) across the context's world with a SUM/MIN/MAX/PRODUCT op (HORA_AVERAGE
 * arrives as HORA_SUM; the caller divides). Collective; every rank passes the same count, dtype,
 * op and algorithm (the algorithm is chosen from the count, the layout and the parameters, which
 * are the same everywhere when the environment is). Out of place (src != dst) or in place
 * (src == dst); no other overlap. Not thread-safe for one context: blocking collectives of a
 * context are serialized by the caller (see hora.h). */
#ifndef HORA_ALGO_H
#define HORA_ALGO_H

#include "algo/state.h"

typedef enum {
  HORA_ALGO_AUTO = 0,
  HORA_ALGO_RING = 1, /* algo/ring.c: reduce-scatter + allgather over MPI point-to-point */
  HORA_ALGO_SHM = 2,  /* algo/shm.c: MPI-3 shared windows, one node */
  HORA_ALGO_HIER = 3, /* algo/hier.c: intra-node reduce-scatter, inter-node ring, allgather */
  HORA_ALGO_MPI = 4   /* algo/mpi.c: MPI_Allreduce with a user op (the baseline) */
} hora_algo_t;
#define HORA_ALGO_COUNT 5

/* Parse "auto|ring|shm|hier|mpi". HORA_ERR_INVALID_ARGUMENT for anything else. */
hora_result_t hora__algo_parse(const char *name, hora_algo_t *out);
const char *hora__algo_name(hora_algo_t algo);

/* The algorithm that `algo` resolves to for `count` elements of `dtype` on this context's layout:
 * HORA_ALGO_AUTO picks by size and layout (dispatch.c); an algorithm that cannot run on the layout
 * (shm across nodes, hier with uneven nodes) falls back to one that can. Never returns AUTO. */
hora_algo_t hora__algo_resolve(hora_ctx_t *ctx, size_t count, hora_dtype_t dtype, hora_algo_t algo);

/* In-place host allreduce with an explicit algorithm (HORA_ALGO_AUTO picks). */
hora_result_t hora__allreduce_host(hora_ctx_t *ctx, void *buf, size_t count, hora_dtype_t dtype,
                                   hora_op_t op, hora_algo_t algo);
/* Out-of-place form: dst = OP over ranks of src (src == dst is in place). */
hora_result_t hora__allreduce_host_oop(hora_ctx_t *ctx, const void *src, void *dst, size_t count,
                                       hora_dtype_t dtype, hora_op_t op, hora_algo_t algo);

/* ---- the algorithms (same contract as above; size of the group > 1, count > 0) ---- */

/* algo/mpi.c: MPI_Allreduce in INT_MAX-element pieces over `comm`, in place on buf. */
hora_result_t hora__allreduce_mpi(hora_ctx_t *ctx, MPI_Comm comm, void *buf, size_t count,
                                  hora_dtype_t dtype, hora_op_t op);
/* MPI datatype and user op for a hora dtype/op (created once, freed at finalize of MPI). */
hora_result_t hora__mpi_dtype_op(hora_dtype_t dtype, hora_op_t op, MPI_Datatype *type, MPI_Op *mop);

/* algo/ring.c: ring allreduce among the ranks of `comm` (ctx->world, or ctx->cross for hier). */
hora_result_t hora__ring_allreduce(hora_ctx_t *ctx, MPI_Comm comm, const void *src, void *dst,
                                   size_t count, hora_dtype_t dtype, hora_op_t op);
/* algo/ring.c: ring reduce-scatter over ctx->world: src holds size blocks of `count` elements;
 * dst (count elements) receives the reduction of block `rank`. dst may be src's block `rank`
 * (in place); no other overlap. */
hora_result_t hora__ring_reducescatter(hora_ctx_t *ctx, const void *src, void *dst, size_t count,
                                       hora_dtype_t dtype, hora_op_t op);

/* algo/shm.c: shared-memory allreduce; needs ctx->cross_size == 1 (local == world). */
hora_result_t hora__shm_allreduce(hora_ctx_t *ctx, const void *src, void *dst, size_t count,
                                  hora_dtype_t dtype, hora_op_t op);
/* algo/shm.c, the engine shared with hier.c: like hora__shm_allreduce over ctx->local, calling
 * hook(arg, slice, n) on this rank's reduced slice (n elements, reduced over the node, in this
 * rank's region of the shared window) before the node and this rank copy it to their recv
 * buffers; hier.c allreduces the slice across nodes there. */
typedef hora_result_t (*hora_shm_hook_fn)(void *arg, void *slice, size_t n);
hora_result_t hora__shm_run(hora_ctx_t *ctx, const void *src, void *dst, size_t count,
                            hora_dtype_t dtype, hora_op_t op, hora_shm_hook_fn hook, void *arg);
/* One segment of a scatter-gather allreduce: `count` elements read from src, results to dst
 * (src == dst is in place; no other overlap, also not between segments). */
typedef struct {
  const void *src;
  void *dst;
  size_t count;
} hora_seg_t;
/* algo/shm.c: the same allreduce over the virtual buffer formed by seg[0..nseg) in order (the
 * engine's fused tensors, read and written where they are: no fusion buffer). Every local rank
 * passes the same segment counts in the same order (its own addresses). The hook is called once
 * per run of this rank's slice that lies within one segment (the whole slice when nseg == 1).
 * Empty segments are allowed (their pointers are never used). Needs ctx->cross_size == 1 unless
 * a hook reduces across nodes. hora__shm_run is this with one segment. */
hora_result_t hora__shm_run_segs(hora_ctx_t *ctx, const hora_seg_t *seg, size_t nseg, hora_dtype_t dtype,
                                 hora_op_t op, hora_shm_hook_fn hook, void *arg);
/* The general form of the two above (algo/shm.c). hook_local: the hook is elementwise and needs
 * no other rank, so the flat form (messages up to HORA_SHM_FLAT_BYTES: every rank reduces the whole
 * message) may run it on every rank's whole result; a hook that communicates (hier.c) leaves it 0.
 * desc: this rank's call descriptor (HORA_SHM_WORDS words, callcheck.c) carried by the call's
 * first barrier and compared there, before anything is written to a recv buffer (NULL: no
 * check); then HORA_ERR_MISMATCH (hora__call_compare's message, as `fn`) on every local rank on
 * a disagreement, HORA_ERR_TIMEOUT when a live rank has not come within HORA_STALL_SHUTDOWN_S. With
 * desc, count 0 is allowed and still meets the other ranks. Collective over ctx->local.
 * fuse_f32: the dtype is float32, the op HORA_SUM, and the hook (which the pieces form then does
 * not call; the flat form still does) multiplies by `scale` as hora__scale_host does: the pieces
 * form sums, scales and stores its slice in one pass (hora__sum_scale2_f32_host), the same bits. */
typedef struct {
  hora_shm_hook_fn hook;
  void *arg;
  int hook_local;
  const uint64_t *desc;
  const char *fn;
  int fuse_f32;
  double scale;
} hora_shm_opts_t;
hora_result_t hora__shm_run_opts(hora_ctx_t *ctx, const hora_seg_t *seg, size_t nseg, hora_dtype_t dtype,
                                 hora_op_t op, const hora_shm_opts_t *o);
/* algo/shm.c: the threads a rank takes by default (HORA_SHM_THREADS=0): its fair share of the
 * node's CPUs, node_cpus (the union of the local ranks' affinity masks) / local_size, at least 1
 * and at most 8, and at most own_cpus, the CPUs its own mask allows (at least 1). So one core per
 * rank (Open MPI's binding for up to 2 ranks, launch's with as many ranks as cores) gives 1, and
 * launch's split of 16 cores among 2 ranks gives 8. */
int hora__shm_auto_threads(int node_cpus, int local_size, int own_cpus);
/* algo/pool.c: helper threads for a fork-join per piece of the shm allreduce. A run calls
 * fn(arg, part, nparts) exactly once for every part in [0, nparts), each on the caller or on a
 * helper thread, whichever claims it first (a helper the scheduler has not run yet takes none),
 * and returns when all are done; what they wrote is then visible to the caller. nparts is capped
 * at 255; a NULL pool runs every part on the caller. n: threads, the caller included (>= 2; n - 1
 * helper threads). spin: helpers and caller spin up to 20 us before sleeping (the caller's CPUs
 * are its own; 0 when cores are shared). hora__pool_create: HORA_ERR_INVALID_ARGUMENT for n < 2,
 * HORA_ERR_NO_MEMORY. fn returns its errors through arg: a message recorded with HORA_ERR stays
 * in the thread that ran the part (hora_last_error is per thread). One caller at a time per pool;
 * hora__pool_free joins the helpers (NULL is a no-op). */
typedef struct hora_pool hora_pool_t;
typedef void (*hora_pool_fn)(void *arg, int part, int nparts);
hora_result_t hora__pool_create(int n, int spin, hora_pool_t **out);
void hora__pool_run(hora_pool_t *p, int nparts, hora_pool_fn fn, void *arg);
void hora__pool_free(hora_pool_t *p);

/* algo/callcheck.c: compare every local rank's call descriptor (all: local size x HORA_SHM_WORDS
 * words, in local-rank order; one node): HORA_SUCCESS, or HORA_ERR_MISMATCH with the message
 * naming the fields, values and ranks (as `fn`). */
hora_result_t hora__call_compare(hora_ctx_t *ctx, const char *fn, const uint64_t *all);
/* algo/adasum.c: Adasum allreduce (hora.h's HORA_ADASUM) of float32/float64 host buffers over
 * ctx->world, dst = adasum over ranks of prescale * src, times postscale (src == dst in place).
 * HORA_ERR_INVALID_ARGUMENT when the world size is not a power of two (on every rank). */
hora_result_t hora__adasum_host(hora_ctx_t *ctx, const void *src, void *dst, size_t count,
                                hora_dtype_t dtype, double prescale, double postscale);
/* algo/adasum.c: HORA_ADASUM of device buffers staged in host memory (buf, count elements, in
 * place), as Horovod 0.28's GPU Adasum: postscale / local size * Adasum over nodes of the sum over
 * each node's ranks of prescale * buf. The node layout was checked with the arguments
 * (hora__check_allreduce); HORA_ERR_INTERNAL should another reach it. */
hora_result_t hora__adasum_nodes_host(hora_ctx_t *ctx, void *buf, size_t count, hora_dtype_t dtype,
                                      double prescale, double postscale);
/* algo/hier.c: needs ctx->uniform_local_size. */
hora_result_t hora__hier_allreduce(hora_ctx_t *ctx, const void *src, void *dst, size_t count,
                                   hora_dtype_t dtype, hora_op_t op);

/* algo/shm.c, for the call check (callcheck.c) on one node: every local rank publishes
 * HORA_SHM_WORDS words and gets all of them (all: local size x HORA_SHM_WORDS, in local-rank
 * order) after one barrier of the shared window (created on first use, collective over
 * ctx->local). Collective over ctx->local. Errors: HORA_ERR_REMOTE (the heartbeat's verdict);
 * HORA_ERR_TIMEOUT when a live rank has not come within HORA_STALL_SHUTDOWN_S (named in the
 * message, as `fn`; after HORA_STALL_WARNING_S a warning names it). */
#define HORA_SHM_WORDS 5
hora_result_t hora__shm_exchange_words(hora_ctx_t *ctx, const uint64_t *mine, uint64_t *all, const char *fn);

/* shm.c: free the window (collective over ctx->local; called by the state's finalizer). */
hora_result_t hora__shm_free(hora_ctx_t *ctx, struct hora_shm *shm);

#endif
