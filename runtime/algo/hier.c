/* Hierarchical allreduce for several nodes with the same number of ranks each.
 *
 *   node 0: ranks 0 1 | node 1: ranks 2 3        (L = 2 local ranks, C = 2 nodes)
 *
 *   1. intra-node reduce-scatter over shared memory (algo/shm.c): for each piece of the buffer,
 *      local rank l reduces slice l of the node's contributions
 *            node 0: r0 -> S0(r0+r1)   r1 -> S1(r0+r1)     node 1: r2 -> S0(r2+r3)  r3 -> S1(r2+r3)
 *   2. inter-node ring allreduce of slice l among the ranks with local rank l (ctx->cross):
 *            r0 <-> r2 on S0,  r1 <-> r3 on S1   (L rings run at the same time, one per local rank)
 *   3. intra-node allgather over shared memory: every local rank copies the other slices out.
 *
 * Cost model (N bytes, L local ranks, C nodes, network per-byte time b_net per rank): the network
 * carries 2(C-1)/C * N/L bytes per rank, i.e. the node as a whole sends 2(C-1)/C * N, the same as
 * a flat ring but with all L ranks' links in parallel and with no intra-node hop on the network;
 * intra-node traffic costs the shm algorithm's ~3N bytes of memory traffic per rank. Latency:
 * 2(C-1) ring steps per piece instead of 2(CL-1).
 *
 * Pieces are HORA_SHM_CHUNK_BYTES (the window's slot), so the inter-node ring runs once per
 * piece on chunk/L bytes: on real networks a larger HORA_SHM_CHUNK_BYTES amortizes its latency.
 * Its segments are 65024 bytes by default (state.c: under Open MPI's TCP eager limit, so no
 * segment waits for a rendezvous reply from a rank that is not running). 2 emulated nodes x 2
 * ranks at 1 Gbit/s, 16 MiB: with 1 MiB segments the inter-node ring took 75-95% of each call and
 * the link ran at 47-66% of its rate; with 65024-byte segments, up to 92% (docs/benchmarks.md).
 * Needs ctx->uniform_local_size (dispatch.c falls back to the ring otherwise). */
#include "algo/algo.h"

typedef struct {
  hora_ctx_t *ctx;
  hora_dtype_t dtype;
  hora_op_t op;
} hier_arg_t;

static hora_result_t cross_allreduce(void *arg, void *slice, size_t n) {
  hier_arg_t *a = arg;
  return hora__ring_allreduce(a->ctx, a->ctx->cross, slice, slice, n, a->dtype, a->op);
}

hora_result_t hora__hier_allreduce(hora_ctx_t *ctx, const void *src, void *dst, size_t count,
                                   hora_dtype_t dtype, hora_op_t op) {
  if (!ctx->uniform_local_size)
    return HORA_ERR(HORA_ERR_INTERNAL, "hier allreduce needs the same number of ranks on every node");
  hier_arg_t a = {ctx, dtype, op};
  return hora__shm_run(ctx, src, dst, count, dtype, op, ctx->cross_size > 1 ? cross_allreduce : NULL, &a);
}
