/* The host allreduce's one entry for the rest of hora: algorithm choice, the in-place and
 * out-of-place runs, prescale/average/postscale around them (hora__allreduce_host_full), and the
 * segmented form that the engine's fused groups use (hora__allreduce_segs: when the group's size
 * resolves to shared memory on one node, the tensors are reduced where they are).
 *
 * `auto` (docs/design.md, "Host collectives"; figures in docs/benchmarks.md):
 *   one node      : MPI_Allreduce below AUTO_SHM_MIN_BYTES (one MPI call has the lowest latency
 *                   for a few cache lines; AUTO_SHM_MIN_BYTES_OVERSUBSCRIBED when the node has
 *                   more ranks than CPUs, and no MPI at all there for a context whose
 *                   collectives overlap compute), shared memory from there on; shared memory
 *                   also below it, up to HORA_SHM_FLAT_BYTES, when every local rank has a CPU
 *                   or the call check is on (its flat form is one barrier, which also carries
 *                   the check, where MPI would need one more).
 *   several nodes : hierarchical at every size when every node has the same number of ranks
 *                   (> 1); else MPI_Allreduce below AUTO_NET_MIN_BYTES and the flat ring above.
 * A forced algorithm that cannot run on the layout falls back: shm across nodes -> hier (or ring),
 * hier with uneven nodes -> ring. The fallback is logged once at INFO. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "algo/coll.h"
#include "hora_kernels.h"

/* Crossovers measured with `hora-bench allreduce` on one node (2 and 4 ranks): below these sizes
 * MPI_Allreduce's latency wins; above, hora's algorithms win. */
#define AUTO_SHM_MIN_BYTES ((size_t)2048)
/* With more local ranks than CPUs the shared-memory algorithm's per-step waits for every local
 * rank cost a scheduler time slice each; MPI_Allreduce stays ahead up to about 256 KiB (4 ranks
 * on 2 cores) and shared memory wins again from 512 KiB on. */
#define AUTO_SHM_MIN_BYTES_OVERSUBSCRIBED ((size_t)512 * 1024)
/* Across nodes with one rank per node (or uneven nodes): MPI_Allreduce's latency below this. With
 * several ranks per node hier wins at every size: on emulated nodes (tests/multinode, 2 nodes x 2
 * ranks, 1 Gbit/s links) MPI_Allreduce of 4 .. 8 KiB took 7-20x as long as hier in every run,
 * since all four ranks poll and cross the link, where hier sleeps inside the node and only the
 * leaders' ring crosses it (docs/benchmarks.md, "Across emulated nodes"). */
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
        /* The shm algorithm's flat form (one barrier) beats MPI_Allreduce at every size up to
         * HORA_SHM_FLAT_BYTES when the ranks can spin (2 ranks: 0.15-0.37 us from 4 B to 1 KiB
         * against 0.25-0.48 us; docs/benchmarks.md, "Call check"), and it carries the blocking
         * calls' check in that barrier, where the MPI path needs a barrier of its own first
         * (hora__allreduce_checked); with more ranks than CPUs only the latter holds. */
        if (bytes <= hora__params()->shm_flat_bytes && (ctx->local_size <= ctx->local_cpus || hora__call_check_on()))
          min = 0;
        return bytes < min ? HORA_ALGO_MPI : HORA_ALGO_SHM;
      }
      if (hier_possible(ctx)) return HORA_ALGO_HIER;
      return bytes < AUTO_NET_MIN_BYTES ? HORA_ALGO_MPI : HORA_ALGO_RING;
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

/* ---- scaling and averaging, and the full allreduce ---- */

/* The factor a floating result is multiplied by: postscale, divided by the size for an average. */
static double float_factor(const hora_ctx_t *ctx, hora_op_t op, double postscale) {
  return op == HORA_AVERAGE ? postscale / (double)ctx->size : postscale;
}

hora_result_t hora__scale_and_average(hora_ctx_t *ctx, void *buf, size_t count,
                                      hora_dtype_t dtype, hora_op_t op, double postscale) {
  int is_float = dtype == HORA_FLOAT16 || dtype == HORA_BFLOAT16 || dtype == HORA_FLOAT32 ||
                 dtype == HORA_FLOAT64;
  if (op == HORA_AVERAGE && !is_float) {
    /* Integers: exact truncating division (a double multiply by 1/n could give 1.999... -> 1). */
    int64_t n = ctx->size;
    switch (dtype) {
#define DIV(T)                                            \
  {                                                       \
    T *p = buf;                                           \
    for (size_t i = 0; i < count; i++) p[i] = (T)(p[i] / n); \
  }                                                       \
  break;
      case HORA_UINT8: DIV(uint8_t)
      case HORA_INT8: DIV(int8_t)
      case HORA_INT16: DIV(int16_t)
      case HORA_INT32: DIV(int32_t)
      case HORA_INT64: DIV(int64_t)
      default: break;
#undef DIV
    }
    return HORA_SUCCESS;
  }
  double f = float_factor(ctx, op, postscale);
  if (f != 1.0) HORA_CHECK(hora__scale_host(buf, buf, count, dtype, f, NULL));
  return HORA_SUCCESS;
}


hora_result_t hora__allreduce_host_full(hora_ctx_t *ctx, const void *sendbuf, void *recvbuf,
                                        size_t count, hora_dtype_t dtype, hora_op_t op,
                                        double prescale, double postscale, hora_algo_t algo) {
  if (op == HORA_ADASUM) return hora__adasum_host(ctx, sendbuf, recvbuf, count, dtype, prescale, postscale);
  if (count == 0) return HORA_SUCCESS;
  if (prescale == 1.0) {
    /* The algorithms read sendbuf and write recvbuf directly: no extra copy. */
    HORA_CHECK(hora__allreduce_host_oop(ctx, sendbuf, recvbuf, count, dtype, op, algo));
  } else {
    HORA_CHECK(hora__scale_host(recvbuf, sendbuf, count, dtype, prescale, NULL));
    HORA_CHECK(hora__allreduce_host(ctx, recvbuf, count, dtype, op, algo));
  }
  return hora__scale_and_average(ctx, recvbuf, count, dtype, op, postscale);
}

/* ---- segmented allreduce ---- */

int hora__allreduce_segs_direct(hora_ctx_t *ctx, size_t count, hora_dtype_t dtype, double prescale,
                                hora_algo_t algo) {
  return ctx->cross_size == 1 && ctx->size > 1 && prescale == 1.0 &&
         hora__algo_resolve(ctx, count, dtype, algo) == HORA_ALGO_SHM;
}

/* Average and postscale, applied by the shm algorithm's hook to each run of this rank's slice right
 * after its reduce and before it is published: one rank scales each element, so every rank gets
 * the same bits, and no separate pass over the results is needed. */
typedef struct {
  hora_ctx_t *ctx;
  hora_dtype_t dtype;
  hora_op_t op;
  double postscale;
} post_arg_t;

static hora_result_t post_hook(void *arg, void *run, size_t n) {
  post_arg_t *a = arg;
  return hora__scale_and_average(a->ctx, run, n, a->dtype, a->op, a->postscale);
}

/* The options of an allreduce with average/postscale applied by post_hook; for a float32 sum
 * the factor hora__scale_and_average would apply is also given, for the shm algorithm's fused
 * pass (algo.h, fuse_f32). */
static hora_shm_opts_t post_opts(post_arg_t *pa, const uint64_t *desc, const char *fn) {
  int post = pa->op == HORA_AVERAGE || pa->postscale != 1.0;
  hora_shm_opts_t o = {post ? post_hook : NULL, pa, 1, desc, fn, 0, 1.0};
  if (pa->dtype == HORA_FLOAT32 && (pa->op == HORA_SUM || pa->op == HORA_AVERAGE)) {
    o.fuse_f32 = 1;
    o.scale = float_factor(pa->ctx, pa->op, pa->postscale);
  }
  return o;
}

/* The public blocking allreduce on host buffers, call check included (coll.c). On one node, when
 * the algorithm is the shared-memory one, the descriptor rides in its first barrier (no extra
 * round trip, and nothing reaches recvbuf before the comparison: a prescale goes to a scratch
 * copy); otherwise the check runs first (hora__call_agree). The resolved algorithm is part of the
 * descriptor, so ranks whose HORA_ALLREDUCE_ALGO differ get HORA_ERR_MISMATCH, not a hang; every
 * rank resolves the same way for the same size, whichever way it then checks. */
hora_result_t hora__allreduce_checked(hora_ctx_t *ctx, const char *fn, hora_call_desc_t *d, const void *sendbuf,
                                      void *recvbuf, size_t count, hora_dtype_t dtype, hora_op_t op,
                                      double prescale, double postscale, hora_algo_t algo) {
  int adasum = op == HORA_ADASUM;
  hora_algo_t res = adasum || ctx->size == 1 ? HORA_ALGO_AUTO : hora__algo_resolve(ctx, count, dtype, algo);
  d->algo = (int)res;
  if (!hora__call_check_on() || ctx->size == 1 || ctx->cross_size != 1 || res != HORA_ALGO_SHM) {
    HORA_CHECK(hora__call_agree(ctx, fn, d));
    return hora__allreduce_host_full(ctx, sendbuf, recvbuf, count, dtype, op, prescale, postscale, algo);
  }
  uint64_t words[HORA_SHM_WORDS];
  hora__call_pack(d, words);
  size_t es = hora__dtype_size(dtype);
  void *scratch = NULL;
  if (prescale != 1.0 && count) {
    if (!(scratch = malloc(count * es))) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory for the prescaled copy", fn);
    hora_result_t rc = hora__scale_host(scratch, sendbuf, count, dtype, prescale, NULL);
    if (rc != HORA_SUCCESS) {
      free(scratch);
      return rc;
    }
  }
  hora_seg_t one = {scratch ? scratch : sendbuf, recvbuf, count};
  post_arg_t pa = {ctx, dtype, op, postscale};
  hora_shm_opts_t o = post_opts(&pa, words, fn);
  hora_result_t rc = hora__shm_run_opts(ctx, &one, 1, dtype, op == HORA_AVERAGE ? HORA_SUM : op, &o);
  free(scratch);
  return rc;
}

hora_result_t hora__allreduce_segs(hora_ctx_t *ctx, const hora_seg_t *seg, size_t nseg, hora_dtype_t dtype,
                                   hora_op_t op, double postscale) {
  post_arg_t pa = {ctx, dtype, op, postscale};
  hora_shm_opts_t o = post_opts(&pa, NULL, NULL);
  return hora__shm_run_opts(ctx, seg, nseg, dtype, op == HORA_AVERAGE ? HORA_SUM : op, &o);
}
