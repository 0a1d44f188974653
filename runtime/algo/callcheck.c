/* The cross-rank call check of the blocking collectives: before a blocking collective moves any
 * data, every rank's call descriptor (which collective, count, dtype, op, root, device and the
 * caller's shape fingerprint, the scale factors of allreduce and reducescatter, and for allreduce the
 * algorithm it resolved to, packed in HORA_SHM_WORDS uint64 words, W below) is agreed:
 *
 *   one node   : each rank writes its words into its header of the shared-memory window
 *                (algo/shm.c) and passes one of the window's barriers; every rank then reads all
 *                of them (no MPI call; a waiter spins briefly, or sleeps on an oversubscribed node).
 *                A host allreduce that runs the shm algorithm (every size with the check on)
 *                writes its words before its first copy-in and compares them after that first
 *                barrier (hora__shm_run_opts, hora__allreduce_checked): no barrier of its own
 *   several    : one MPI_Allreduce (MPI_MAX) of 2W words, the descriptor and its bitwise
 *   nodes        complement (max of ~v = ~min of v), so every rank learns the minimum and maximum
 *                of each word; only when they differ (the rare path) an MPI_Allgather of the
 *                descriptors follows so that every rank can name which ranks hold which value
 *
 * (cost: docs/benchmarks.md, "Call check"). Every rank then returns HORA_ERR_MISMATCH with the
 * same message, and nothing has been written to any buffer. Because the agreement is
 * the first communication of every blocking call and has the same shape in all of them, a rank
 * that calls another collective meets the same allreduce and the difference is reported as a
 * disagreement in call sequence, never paired with a later call. HORA_CHECK=0 turns it off.
 *
 * The shape fingerprint is a per-thread "next call" tag set by hora_set_call_shape (the Python
 * bindings pass a hash of the tensor's shape); 0 means unchecked and matches any value. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/coll.h"

#define W HORA_SHM_WORDS

static _Thread_local struct {
  const hora_ctx_t *ctx;
  uint64_t shape;
  const hora_ctx_t *gctx; /* hora_set_call_group's tag, taken by the async calls (engine/api.c) */
  uint64_t gkey;
  uint32_t gsize;
  const hora_ctx_t *rctx; /* hora_set_call_ready's event, taken by the async calls */
  void *ready;
} next_shape;

HORA_EXPORT hora_result_t hora_set_call_shape(hora_ctx_t *ctx, uint64_t fingerprint) {
  HORA_CHECK(hora__ctx_check(ctx, "hora_set_call_shape"));
  next_shape.ctx = ctx;
  next_shape.shape = fingerprint;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_set_call_group(hora_ctx_t *ctx, uint64_t key, uint32_t size) {
  HORA_CHECK(hora__ctx_check(ctx, "hora_set_call_group"));
  if (key != 0 && size == 0)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_set_call_group: size is 0 for group key %#llx",
                    (unsigned long long)key);
  next_shape.gctx = ctx;
  next_shape.gkey = key;
  next_shape.gsize = key ? size : 0;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_set_call_ready(hora_ctx_t *ctx, void *cuda_event) {
  HORA_CHECK(hora__ctx_check(ctx, "hora_set_call_ready"));
  if (cuda_event && !HORA_HAVE_CUDA)
    return HORA_ERR(HORA_ERR_NOT_SUPPORTED, "hora_set_call_ready: a CUDA event needs a CUDA build of hora");
  next_shape.rctx = cuda_event ? ctx : NULL;
  next_shape.ready = cuda_event;
  return HORA_SUCCESS;
}

void *hora__call_ready_take(const hora_ctx_t *ctx) {
  void *e = next_shape.rctx == ctx ? next_shape.ready : NULL;
  next_shape.rctx = NULL;
  next_shape.ready = NULL;
  return e;
}

void hora__call_group_take(const hora_ctx_t *ctx, uint64_t *key, uint32_t *size) {
  int mine = next_shape.gctx == ctx;
  *key = mine ? next_shape.gkey : 0;
  *size = mine ? next_shape.gsize : 0;
  next_shape.gctx = NULL;
  next_shape.gkey = 0;
  next_shape.gsize = 0;
}

/* Every collective takes this (blocking and async), so a group tag is cleared by the next
 * collective too (the async calls take it first: hora__call_group_take). */
uint64_t hora__call_shape_take(const hora_ctx_t *ctx) {
  uint64_t s = next_shape.ctx == ctx ? next_shape.shape : 0;
  next_shape.ctx = NULL;
  next_shape.shape = 0;
  next_shape.gctx = NULL;
  next_shape.gkey = 0;
  next_shape.gsize = 0;
  next_shape.rctx = NULL;
  next_shape.ready = NULL;
  return s;
}

int hora__call_check_on(void) { return hora__params()->check != 0; }

static const char *const kind_names[] = {"none",          "hora_allreduce", "hora_broadcast",
                                         "hora_allgather", "hora_allgatherv", "hora_reducescatter",
                                         "hora_alltoall",  "hora_alltoallv",  "hora_barrier",
                                         "invalid arguments"};

const char *hora__call_kind_name(int kind) {
  return kind > 0 && kind < (int)(sizeof kind_names / sizeof kind_names[0]) ? kind_names[kind] : "unknown";
}

/* word 0: kind | dtype | op | device | algorithm | root (bits 56.., 48.., 40.., 36.., 32.., 0..31) */
static uint64_t pack0(const hora_call_desc_t *d) {
  return (uint64_t)(d->kind & 0xff) << 56 | (uint64_t)(d->dtype & 0xff) << 48 | (uint64_t)(d->op & 0xff) << 40 |
         (uint64_t)(d->device & 0xf) << 36 | (uint64_t)(d->algo & 0xf) << 32 | (uint32_t)d->root;
}

/* The scale factors travel as their IEEE-754 bits: equal bits, equal factors (a NaN is refused
 * before, by the local checks). */
static uint64_t dbits(double v) {
  uint64_t b;
  memcpy(&b, &v, sizeof b);
  return b;
}

static double bits_to_double(uint64_t b) {
  double v;
  memcpy(&v, &b, sizeof v);
  return v;
}

void hora__call_pack(const hora_call_desc_t *d, uint64_t w[HORA_SHM_WORDS]) {
  w[0] = pack0(d), w[1] = d->count, w[2] = d->shape, w[3] = dbits(d->prescale), w[4] = dbits(d->postscale);
}

enum { F_KIND, F_COUNT, F_DTYPE, F_OP, F_ROOT, F_DEVICE, F_ALGO, F_PRESCALE, F_POSTSCALE, F_SHAPE, F_N };
static const char *const field_names[F_N] = {"collective", "count", "dtype", "op", "root", "device",
                                             "allreduce algorithm (HORA_ALLREDUCE_ALGO)", "prescale",
                                             "postscale", "shape"};

static uint64_t field_of(const uint64_t *w, int f) {
  switch (f) {
    case F_KIND: return w[0] >> 56;
    case F_COUNT: return w[1];
    case F_DTYPE: return (w[0] >> 48) & 0xff;
    case F_OP: return (w[0] >> 40) & 0xff;
    case F_ROOT: return (uint32_t)w[0];
    case F_DEVICE: return (w[0] >> 36) & 0xf;
    case F_ALGO: return (w[0] >> 32) & 0xf;
    case F_PRESCALE: return w[3];
    case F_POSTSCALE: return w[4];
    default: return w[2];
  }
}

static void format_value(char *out, size_t n, int f, uint64_t v) {
  switch (f) {
    case F_KIND: snprintf(out, n, "%s", hora__call_kind_name((int)v)); break;
    case F_DTYPE: snprintf(out, n, "%s", hora__dtype_name((hora_dtype_t)v)); break;
    case F_OP: snprintf(out, n, "%s", hora__op_name((hora_op_t)v)); break;
    case F_ROOT: snprintf(out, n, "%d", (int)(uint32_t)v); break;
    case F_DEVICE: snprintf(out, n, "%s", v == HORA_DEVICE_CUDA ? "cuda" : "host"); break;
    case F_ALGO: snprintf(out, n, "%s", hora__algo_name((hora_algo_t)v)); break;
    case F_SHAPE: snprintf(out, n, v ? "%#llx" : "unchecked", (unsigned long long)v); break;
    case F_PRESCALE:
    case F_POSTSCALE: snprintf(out, n, "%.17g", bits_to_double(v)); break;
    default: snprintf(out, n, "%llu", (unsigned long long)v);
  }
}

/* Appends "value on ranks a,b; value on rank c" for field f of the gathered descriptors. */
static size_t describe_field(char *msg, size_t cap, size_t len, const uint64_t *all, int size, int f) {
  for (int r = 0; r < size && len < cap; r++) {
    uint64_t v = field_of(all + W * (size_t)r, f);
    int first = 1, count = 0;
    for (int q = 0; q < r && first; q++) first = field_of(all + W * (size_t)q, f) != v;
    if (!first) continue;
    for (int q = r; q < size; q++) count += field_of(all + W * (size_t)q, f) == v;
    char val[64];
    format_value(val, sizeof val, f, v);
    len += (size_t)snprintf(msg + len, cap - len, "%s%s on rank%s", len && msg[len - 1] != ' ' ? "; " : "",
                            val, count > 1 ? "s " : " ");
    for (int q = r, k = 0; q < size && len < cap; q++)
      if (field_of(all + W * (size_t)q, f) == v)
        len += (size_t)snprintf(msg + len, cap - len, k++ ? ",%d" : "%d", q);
  }
  return len < cap ? len : cap - 1;
}

/* Whether field f differs between any two ranks' descriptors (`all`: W words per rank). For the
 * shape, 0 (unchecked) matches anything: only the non-zero values are compared. */
static int field_differs(const uint64_t *all, int size, int f) {
  uint64_t first = 0;
  int have = 0;
  for (int r = 0; r < size; r++) {
    uint64_t v = field_of(all + W * (size_t)r, f);
    if (f == F_SHAPE && v == 0) continue;
    if (have && v != first) return 1;
    first = v, have = 1;
  }
  return 0;
}

/* The message of a disagreement, from every rank's descriptor (`all`: W words per rank, in rank
 * order; the same on every rank, apart from the leading function name, which is this rank's own
 * call). */
static hora_result_t report(const hora_ctx_t *ctx, const char *fn, const uint64_t *all) {
  char msg[900];
  size_t len = 0;
  if (field_differs(all, ctx->size, F_KIND)) {
    len = (size_t)snprintf(msg, sizeof msg, "ranks disagree on the call sequence (collective): ");
    len = describe_field(msg, sizeof msg, len, all, ctx->size, F_KIND);
  } else {
    /* auto's choice of algorithm follows from the message size: named only when that agrees */
    int size_differs = field_differs(all, ctx->size, F_COUNT) || field_differs(all, ctx->size, F_DTYPE);
    for (int f = F_COUNT; f < F_N && len < sizeof msg; f++) {
      if (!field_differs(all, ctx->size, f) || (f == F_ALGO && size_differs)) continue;
      int kind = (int)field_of(all, F_KIND);
      const char *name = f != F_COUNT ? field_names[f]
                         : kind == HORA_CALL_ALLGATHERV ? "the sum of recvcounts"
                         : kind == HORA_CALL_REDUCESCATTER ? "recvcount" : "count";
      len += (size_t)snprintf(msg + len, sizeof msg - len, "%sranks disagree on %s: ", len ? " | " : "", name);
      if (len < sizeof msg) len = describe_field(msg, sizeof msg, len, all, ctx->size, f);
    }
  }
  return HORA_ERR(HORA_ERR_MISMATCH, "%s: %s", fn, msg);
}

/* The rare path across nodes: gather every rank's descriptor to name who holds what. */
static hora_result_t gather_and_report(hora_ctx_t *ctx, const char *fn, const uint64_t mine[W]) {
  uint64_t *all = malloc(W * (size_t)ctx->size * sizeof *all);
  if (!all) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory reporting a mismatch", fn);
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Iallgather(mine, W, MPI_UINT64_T, all, W, MPI_UINT64_T, ctx->world, &req);
  hora_result_t r = rc == MPI_SUCCESS ? hora__algo_wait(ctx, 1, &req, fn)
                                      : hora__mpi_error(rc, "MPI_Iallgather(call descriptors)", __FILE__, __LINE__);
  /* After HORA_ERR_REMOTE MPI may still write `all`: leaked, as the ring's buffers (ctx.h). */
  if (r == HORA_SUCCESS) r = report(ctx, fn, all);
  else if (hora__ctx_failed(ctx)) return r;
  free(all);
  return r;
}

/* One node: every local rank's descriptor, already exchanged (through the shared window's header
 * and one of its barriers, hora__shm_exchange_words, or carried by the shm allreduce's first
 * barrier). Local ranks are world ranks in order on one node (core/ctx.c). */
hora_result_t hora__call_compare(hora_ctx_t *ctx, const char *fn, const uint64_t *all) {
  uint64_t shape = 0; /* the first checked shape; an unchecked one (0) matches anything */
  for (int j = 0; j < ctx->size; j++) {
    const uint64_t *w = all + W * (size_t)j;
    if (w[0] != all[0] || w[1] != all[1] || w[3] != all[3] || w[4] != all[4] || (w[2] && shape && w[2] != shape))
      return report(ctx, fn, all);
    if (w[2]) shape = w[2];
  }
  return HORA_SUCCESS;
}

static hora_result_t agree_node(hora_ctx_t *ctx, const char *fn, const uint64_t mine[W]) {
  uint64_t stack[W * 16], *all = ctx->size <= 16 ? stack : malloc(W * (size_t)ctx->size * sizeof *all);
  if (!all) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory for the call check", fn);
  hora_result_t r = hora__shm_exchange_words(ctx, mine, all, fn);
  if (r == HORA_SUCCESS) r = hora__call_compare(ctx, fn, all);
  if (all != stack) free(all);
  return r;
}

hora_result_t hora__call_agree(hora_ctx_t *ctx, const char *fn, const hora_call_desc_t *d) {
  if (!hora__call_check_on() || ctx->size == 1) return HORA_SUCCESS;
  uint64_t mine[W];
  hora__call_pack(d, mine);
  if (ctx->cross_size == 1) return agree_node(ctx, fn, mine);
  /* Max of the values and of their complements; an unchecked shape (0) takes no part in the min. */
  /* Non-blocking and waited on with the heartbeat's verdict watched: a dead or stopped peer ends
   * the check with HORA_ERR_REMOTE like any other wait (algo/state.c). w lives in a static
   * per-thread buffer, not on the stack, so that MPI may still write it after such an abandon. */
  static _Thread_local uint64_t w[2 * W];
  for (int i = 0; i < W; i++) w[i] = mine[i], w[W + i] = ~mine[i];
  w[W + 2] = d->shape ? ~d->shape : 0;
  MPI_Request req = MPI_REQUEST_NULL;
  HORA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, w, 2 * W, MPI_UINT64_T, MPI_MAX, ctx->world, &req));
  HORA_CHECK(hora__algo_wait_call(ctx, 1, &req, fn)); /* with the stall inspection */
  int same = 1;
  for (int i = 0; i < W; i++) {
    uint64_t mx = w[i], mn = i == 2 ? (w[W + i] ? ~w[W + i] : 0) : ~w[W + i];
    if (i == 2 ? mn != 0 && mn != mx : mn != mx) same = 0;
  }
  if (same) return HORA_SUCCESS;
  return gather_and_report(ctx, fn, mine);
}
