/* Algorithm choice for the host allreduce, and the module's per-context state.
 *
 * `auto` (docs/design.md, "Host collectives"; figures in docs/benchmarks.md):
 *   one node      : MPI_Allreduce below AUTO_SHM_MIN_BYTES (one MPI call has the lowest latency
 *                   for a few cache lines; AUTO_SHM_MIN_BYTES_OVERSUBSCRIBED when the node has
 *                   more ranks than CPUs, and no MPI at all there for a context whose
 *                   collectives overlap compute), shared memory from there on.
 *   several nodes : MPI_Allreduce below AUTO_NET_MIN_BYTES; hierarchical when every node has the
 *                   same number of ranks (> 1), else the flat ring.
 * A forced algorithm that cannot run on the layout falls back: shm across nodes -> hier (or ring),
 * hier with uneven nodes -> ring. The fallback is logged once at INFO. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "algo/algo.h"

/* Crossovers measured with `hora-bench allreduce` on one node (2 and 4 ranks): below these sizes
 * MPI_Allreduce's latency wins; above, hora's algorithms win. */
#define AUTO_SHM_MIN_BYTES ((size_t)2048)
/* With more local ranks than CPUs the shared-memory algorithm's per-step waits for every local
 * rank cost a scheduler time slice each; MPI_Allreduce stays ahead up to about 256 KiB (4 ranks
 * on 2 cores) and shared memory wins again from 512 KiB on. */
#define AUTO_SHM_MIN_BYTES_OVERSUBSCRIBED ((size_t)512 * 1024)
#define AUTO_NET_MIN_BYTES ((size_t)16384)

static const char *const names[HORA_ALGO_COUNT] = {"auto", "ring", "shm", "hier", "mpi"};

hora_result_t hora__algo_parse(const char *name, hora_algo_t *out) {
  for (int i = 0; i < HORA_ALGO_COUNT; i++)
    if (name && strcasecmp(name, names[i]) == 0) {
      *out = (hora_algo_t)i;
      return HORA_SUCCESS;
    }
  return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                  "unknown allreduce algorithm '%s' (HORA_ALLREDUCE_ALGO: auto|ring|shm|hier|mpi)",
                  name ? name : "(null)");
}

const char *hora__algo_name(hora_algo_t algo) {
  return (unsigned)algo < HORA_ALGO_COUNT ? names[algo] : "unknown";
}

static int hier_possible(const hora_ctx_t *ctx) {
  return ctx->uniform_local_size && ctx->local_size > 1 && ctx->cross_size > 1;
}

hora_algo_t hora__algo_resolve(hora_ctx_t *ctx, size_t count, hora_dtype_t dtype, hora_algo_t algo) {
  size_t bytes = count * hora__dtype_size(dtype);
  int one_node = ctx->cross_size == 1;
  hora_algo_t want = algo;
  switch (algo) {
    case HORA_ALGO_AUTO:
      if (one_node) {
        size_t min = AUTO_SHM_MIN_BYTES;
        /* With more ranks than CPUs, MPI_Allreduce is the faster choice up to 256 KiB for
         * back-to-back allreduces; but MPI waits by polling, so where collectives run while the
         * ranks compute (the engine) it takes the cores of the ranks still computing, and the
         * shared-memory algorithm, which sleeps, is used at every size (examples/mnist, 4 ranks
         * on 2 cores: 2,560 images/s with MPI up to 256 KiB, 4,920 with shm). */
        if (ctx->local_size > ctx->local_cpus) min = ctx->overlaps_compute ? 0 : AUTO_SHM_MIN_BYTES_OVERSUBSCRIBED;
        return bytes < min ? HORA_ALGO_MPI : HORA_ALGO_SHM;
      }
      if (bytes < AUTO_NET_MIN_BYTES) return HORA_ALGO_MPI;
      return hier_possible(ctx) ? HORA_ALGO_HIER : HORA_ALGO_RING;
    case HORA_ALGO_SHM:
      if (one_node) return algo;
      algo = hier_possible(ctx) ? HORA_ALGO_HIER : HORA_ALGO_RING;
      break;
    case HORA_ALGO_HIER:
      if (one_node) return HORA_ALGO_SHM; /* hier on one node is exactly shm */
      if (ctx->local_size == 1) return HORA_ALGO_RING; /* ... and with one rank per node, a ring */
      if (ctx->uniform_local_size) return algo;
      algo = HORA_ALGO_RING;
      break;
    default:
      return algo;
  }
  static _Atomic int logged;
  if (!logged) {
    logged = 1;
    HORA_INFO(RING, "allreduce algorithm %s cannot run on %d nodes with local size %d%s: using %s",
              names[want], ctx->cross_size, ctx->local_size,
              ctx->uniform_local_size ? "" : " (uneven)", names[algo]);
  }
  return algo;
}

hora_result_t hora__allreduce_host_oop(hora_ctx_t *ctx, const void *src, void *dst, size_t count,
                                       hora_dtype_t dtype, hora_op_t op, hora_algo_t algo) {
  if (count == 0) return HORA_SUCCESS;
  size_t es = hora__dtype_size(dtype);
  if (ctx->size == 1) {
    if (src != dst) memmove(dst, src, count * es);
    return HORA_SUCCESS;
  }
  if (op == HORA_AVERAGE) op = HORA_SUM;
  switch (hora__algo_resolve(ctx, count, dtype, algo)) {
    case HORA_ALGO_RING: return hora__ring_allreduce(ctx, ctx->world, src, dst, count, dtype, op);
    case HORA_ALGO_SHM: return hora__shm_allreduce(ctx, src, dst, count, dtype, op);
    case HORA_ALGO_HIER: return hora__hier_allreduce(ctx, src, dst, count, dtype, op);
    default:
      if (src != dst) memcpy(dst, src, count * es);
      return hora__allreduce_mpi(ctx, ctx->world, dst, count, dtype, op);
  }
}

hora_result_t hora__allreduce_host(hora_ctx_t *ctx, void *buf, size_t count, hora_dtype_t dtype,
                                   hora_op_t op, hora_algo_t algo) {
  return hora__allreduce_host_oop(ctx, buf, buf, count, dtype, op, algo);
}

size_t hora__ring_segment_elems(size_t es) {
  uint64_t b = hora__params()->ring_segment_bytes;
  if (b > ((uint64_t)1 << 30)) b = (uint64_t)1 << 30;
  size_t n = (size_t)b / es;
  return n ? n : 1;
}

/* ---- state ---- */

static hora_result_t state_finalize(hora_ctx_t *ctx, void *arg) {
  hora_algo_state_t *st = arg;
  hora_result_t rc = HORA_SUCCESS;
  /* Freeing the window waits for every local rank: after a failure (ctx->failed) leak it. */
  if (st->shm && !__atomic_load_n(&ctx->failed, __ATOMIC_ACQUIRE)) rc = hora__shm_free(ctx, st->shm);
  free(st->scratch);
  pthread_mutex_lock(&ctx->lock);
  if (ctx->algo == st) ctx->algo = NULL;
  pthread_mutex_unlock(&ctx->lock);
  free(st);
  return rc;
}

hora_result_t hora__algo_state(hora_ctx_t *ctx, hora_algo_state_t **out) {
  pthread_mutex_lock(&ctx->lock);
  hora_algo_state_t *st = ctx->algo;
  pthread_mutex_unlock(&ctx->lock);
  if (st) {
    *out = st;
    return HORA_SUCCESS;
  }
  /* First use: create it, then publish it unless another thread was faster. */
  hora_algo_state_t *mine = calloc(1, sizeof *mine);
  if (!mine) return HORA_ERR(HORA_ERR_NO_MEMORY, "allreduce: out of memory for the algorithm state");
  pthread_mutex_lock(&ctx->lock);
  if (!ctx->algo) ctx->algo = mine;
  st = ctx->algo;
  pthread_mutex_unlock(&ctx->lock);
  if (st != mine) {
    free(mine);
  } else {
    hora_result_t rc = hora__ctx_add_finalizer(ctx, state_finalize, st);
    if (rc != HORA_SUCCESS) {
      pthread_mutex_lock(&ctx->lock);
      ctx->algo = NULL;
      pthread_mutex_unlock(&ctx->lock);
      free(mine);
      return rc;
    }
  }
  *out = st;
  return HORA_SUCCESS;
}

hora_result_t hora__algo_scratch(hora_ctx_t *ctx, size_t bytes, void **out) {
  hora_algo_state_t *st = NULL;
  HORA_CHECK(hora__algo_state(ctx, &st));
  if (st->scratch_bytes < bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
      return HORA_ERR(HORA_ERR_NO_MEMORY, "allreduce: out of memory (%zu bytes of scratch)", bytes);
    free(st->scratch);
    st->scratch = p;
    st->scratch_bytes = bytes;
  }
  *out = st->scratch;
  return HORA_SUCCESS;
}
