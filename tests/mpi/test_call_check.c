/* The cross-rank call check: every collective x every field x blocking and async x each host
 * allreduce algorithm. In each case the last rank disagrees with the others on one field; every
 * rank must get HORA_ERR_MISMATCH, a message naming the field and the values (the odd one on the
 * last rank), untouched send and receive buffers, and the ranks must still be in step (a checked
 * allreduce follows every case). One binary loops over the algorithms (hora_init/hora_finalize
 * with HORA_ALLREDUCE_ALGO set each time). --fake-nodes: two fake nodes, so the check takes its
 * multi-node path (MPI) instead of the shared window. --cuda: the blocking matrix on device
 * buffers (exit 77 without a GPU or a CUDA build). */
#include <stdint.h>

#include "hora_test.h"

static int rank, size, last;

enum { K_ALLREDUCE = 1, K_BROADCAST, K_ALLGATHER, K_ALLGATHERV, K_REDUCESCATTER, K_ALLTOALL, K_ALLTOALLV, K_BARRIER, K_N };
static const char *const knames[K_N] = {"", "hora_allreduce", "hora_broadcast", "hora_allgather", "hora_allgatherv",
                                        "hora_reducescatter", "hora_alltoall", "hora_alltoallv", "hora_barrier"};
enum { F_COUNT, F_DTYPE, F_OP, F_ROOT, F_SHAPE, F_DEVICE, F_PRESCALE, F_POSTSCALE, F_KIND, F_N };
static const char *const fnames[F_N] = {"count", "dtype", "op", "root", "shape", "device", "prescale", "postscale",
                                        "kind"};

typedef struct {
  int kind;
  size_t count;
  hora_dtype_t dtype;
  hora_op_t op;
  int root;
  hora_device_t device;
  uint64_t shape;
  double pre, post; /* allreduce, reducescatter */
} call_t;

#define A_COUNT 1000
#define B_COUNT 1200
/* Allreduce counts on both sides of the shm algorithm's flat form (HORA_SHM_FLAT_BYTES, 16 KiB):
 * the check is carried by the first barrier of either form, and ranks in different forms meet. */
#define BIG_COUNT 9000
#define BUF_BYTES ((size_t)BIG_COUNT * 8 * 4) /* the largest case: 9000 f64 x 3 ranks, rounded up */
static size_t a_count = A_COUNT, b_count = B_COUNT;
#define SEND_BYTE 0x11
#define RECV_BYTE 0x5a

static unsigned char *sendb, *recvb; /* host copies (or the host mirror of device buffers) */
static void *dsend, *drecv;          /* what the calls get: host buffers, or device buffers with --cuda */
static int on_device;

#ifdef HORA_TEST_CUDA
#include <cuda_runtime.h>
#endif

static void poison(void) {
  memset(sendb, SEND_BYTE, BUF_BYTES);
  memset(recvb, RECV_BYTE, BUF_BYTES);
#ifdef HORA_TEST_CUDA
  if (on_device) {
    cudaMemcpy(dsend, sendb, BUF_BYTES, cudaMemcpyHostToDevice);
    cudaMemcpy(drecv, recvb, BUF_BYTES, cudaMemcpyHostToDevice);
  }
#endif
}

/* 1 if both buffers still hold the poison. */
static int untouched(void) {
#ifdef HORA_TEST_CUDA
  if (on_device) {
    cudaMemcpy(sendb, dsend, BUF_BYTES, cudaMemcpyDeviceToHost);
    cudaMemcpy(recvb, drecv, BUF_BYTES, cudaMemcpyDeviceToHost);
  }
#endif
  for (size_t i = 0; i < BUF_BYTES; i++)
    if (sendb[i] != SEND_BYTE || recvb[i] != RECV_BYTE) return 0;
  return 1;
}

static hora_result_t run_blocking(hora_ctx_t *ctx, const call_t *c) {
  if (c->shape) hora_set_call_shape(ctx, c->shape);
  size_t counts[8];
  for (int r = 0; r < size; r++) counts[r] = c->count;
  switch (c->kind) {
    case K_ALLREDUCE: return hora_allreduce(ctx, dsend, drecv, c->count, c->dtype, c->op, c->pre, c->post, c->device);
    case K_BROADCAST: return hora_broadcast(ctx, drecv, c->count, c->dtype, c->root, c->device);
    case K_ALLGATHER: return hora_allgather(ctx, dsend, drecv, c->count, c->dtype, c->device);
    case K_ALLGATHERV: return hora_allgatherv(ctx, dsend, c->count, drecv, counts, c->dtype, c->device);
    case K_REDUCESCATTER:
      return hora_reducescatter(ctx, dsend, drecv, c->count, c->dtype, c->op, c->pre, c->post, c->device);
    case K_ALLTOALL: return hora_alltoall(ctx, dsend, drecv, c->count, c->dtype, c->device);
    case K_ALLTOALLV: return hora_alltoallv(ctx, dsend, counts, drecv, counts, c->dtype, c->device);
    default: return hora_barrier(ctx);
  }
}

static hora_result_t run_async(hora_ctx_t *ctx, const call_t *c, const char *name) {
  hora_handle_t *h = NULL;
  hora_result_t rc;
  switch (c->kind) {
    case K_ALLREDUCE:
      rc = hora_allreduce_async(ctx, name, dsend, drecv, c->count, c->dtype, c->op, c->pre, c->post, c->device, &h);
      break;
    case K_BROADCAST: rc = hora_broadcast_async(ctx, name, drecv, c->count, c->dtype, c->root, c->device, &h); break;
    case K_ALLGATHER: rc = hora_allgather_async(ctx, name, dsend, drecv, c->count, c->dtype, c->device, &h); break;
    case K_REDUCESCATTER:
      rc = hora_reducescatter_async(ctx, name, dsend, drecv, c->count, c->dtype, c->op, c->pre, c->post, c->device,
                                    &h);
      break;
    default: rc = hora_alltoall_async(ctx, name, dsend, drecv, c->count, c->dtype, c->device, &h); break;
  }
  if (rc != HORA_SUCCESS) return rc;
  rc = hora_wait(h);
  hora_handle_free(h);
  return rc;
}

static int applies(int kind, int field, int async) {
  switch (field) {
    case F_COUNT: return kind != K_BARRIER && kind != K_ALLTOALLV; /* alltoallv: pairwise, test_coll_errors */
    case F_DTYPE: return kind != K_BARRIER;
    case F_OP: return kind == K_ALLREDUCE || kind == K_REDUCESCATTER;
    case F_ROOT: return kind == K_BROADCAST;
    case F_SHAPE: return !async && kind != K_BARRIER;
    case F_DEVICE: return !async && kind != K_BARRIER && !on_device; /* host pointers passed as cuda */
    case F_PRESCALE:
    case F_POSTSCALE: return kind == K_ALLREDUCE || kind == K_REDUCESCATTER;
    default: return 1;
  }
}

/* The field's name in the message and the two values (majority, last rank) as printed. */
static void expected(const call_t *a, const call_t *b, int field, int async, const char **fname, char *va, char *vb) {
  static const char *dt[] = {"u8", "i8", "i32", "i64", "f16", "bf16", "f32", "f64", "i16", "bool"};
  static const char *op[] = {"sum", "avg", "min", "max", "prod"};
  switch (field) {
    case F_COUNT: {
      *fname = async ? "count" : a->kind == K_ALLGATHERV ? "the sum of recvcounts"
                               : a->kind == K_REDUCESCATTER ? "recvcount" : "count";
      size_t m = !async && a->kind == K_ALLGATHERV ? (size_t)size : 1;
      sprintf(va, "%zu", a->count * m);
      sprintf(vb, "%zu", b->count * m);
      return;
    }
    case F_DTYPE: *fname = "dtype"; strcpy(va, dt[a->dtype]); strcpy(vb, dt[b->dtype]); return;
    case F_OP: *fname = async ? "reduce op" : "op"; strcpy(va, op[a->op]); strcpy(vb, op[b->op]); return;
    case F_ROOT: *fname = "root"; sprintf(va, "%d", a->root); sprintf(vb, "%d", b->root); return;
    case F_SHAPE: *fname = "shape"; sprintf(va, "%#llx", (unsigned long long)a->shape);
      sprintf(vb, "%#llx", (unsigned long long)b->shape); return;
    case F_DEVICE: *fname = "device"; strcpy(va, "host"); strcpy(vb, "cuda"); return;
    case F_PRESCALE: *fname = "prescale"; sprintf(va, "%g", a->pre); sprintf(vb, "%g", b->pre); return;
    case F_POSTSCALE: *fname = "postscale"; sprintf(va, "%g", a->post); sprintf(vb, "%g", b->post); return;
    default:
      *fname = async ? "operation" : "the call sequence";
      strcpy(va, async ? "" : knames[a->kind]);
      strcpy(vb, async ? "" : knames[b->kind]);
  }
}

/* A checked allreduce: the ranks are still in step after a failed call. */
static void in_step(hora_ctx_t *ctx, const char *what) {
  int32_t v = rank + 1, out = 0;
  hora_result_t rc = hora_allreduce(ctx, &v, &out, 1, HORA_INT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST);
  EXPECT(rc == HORA_SUCCESS && out == size * (size + 1) / 2, "%s: allreduce after it: %s, %d", what,
         hora_result_name(rc), (int)out);
}

static int one_case(hora_ctx_t *ctx, const char *algo, int kind, int field, int async, int seq) {
  call_t a = {kind, a_count, HORA_FLOAT32, HORA_SUM, 0, on_device ? HORA_DEVICE_CUDA : HORA_DEVICE_HOST, 0, 1, 1};
  if (field == F_SHAPE) a.shape = 0x1111;
  call_t b = a;
  switch (field) {
    case F_COUNT: b.count = b_count; break;
    case F_DTYPE: b.dtype = HORA_FLOAT64; break;
    case F_OP: b.op = HORA_MAX; break;
    case F_ROOT: b.root = 1; break;
    case F_SHAPE: b.shape = 0x2222; break;
    case F_DEVICE: b.device = HORA_DEVICE_CUDA; break;
    case F_PRESCALE: b.pre = 2; break;
    case F_POSTSCALE: b.post = 0.25; break;
    default: b.kind = async ? (kind == K_ALLREDUCE ? K_BROADCAST : K_ALLREDUCE) : kind % (K_N - 1) + 1;
  }
  const call_t *mine = rank == last ? &b : &a;
  char what[160], name[64], va[64], vb[64], want[200];
  snprintf(what, sizeof what, "[%s %s %s field %s np %d]", algo, async ? "async" : "blocking", knames[kind],
           fnames[field], size);
  snprintf(name, sizeof name, "t%d", seq);
  poison();
  hora_result_t rc = async ? run_async(ctx, mine, name) : run_blocking(ctx, mine);
  const char *msg = hora_last_error(), *fname;
  EXPECT(rc == HORA_ERR_MISMATCH, "%s: returned %s (%s)", what, hora_result_name(rc), msg);
  expected(&a, &b, field, async, &fname, va, vb);
  snprintf(want, sizeof want, "ranks disagree on %s", fname);
  EXPECT(strstr(msg, want), "%s: message '%s' lacks '%s'", what, msg, want);
  snprintf(want, sizeof want, "%s on rank %d", vb, last);
  EXPECT(!*vb || strstr(msg, want), "%s: message '%s' lacks '%s'", what, msg, want);
  snprintf(want, sizeof want, "%s on rank", va);
  EXPECT(!*va || strstr(msg, want), "%s: message '%s' lacks '%s'", what, msg, want);
  if (async) {
    snprintf(want, sizeof want, "'%s'", name);
    EXPECT(strstr(msg, want), "%s: message '%s' does not name the tensor", what, msg);
  }
  EXPECT(untouched(), "%s: a buffer was written", what);
  in_step(ctx, what);
  return 1;
}

/* A rank whose peer (the last rank) refused the call: HORA_ERR_MISMATCH naming it as "invalid
 * arguments", instead of waiting for it. */
static void expect_named_invalid(const char *what, hora_result_t rc) {
  char want[64];
  const char *msg = hora_last_error();
  snprintf(want, sizeof want, "invalid arguments on rank %d", last);
  EXPECT(rc == HORA_ERR_MISMATCH && strstr(msg, want), "%s: returned %s (%s), want MISMATCH naming '%s'", what,
         hora_result_name(rc), msg, want);
}

/* The last rank's own arguments are invalid (an unknown dtype: no buffer is touched): it returns
 * HORA_ERR_INVALID_ARGUMENT, and every other rank HORA_ERR_MISMATCH naming it as "invalid
 * arguments" instead of waiting for it in the collective it left. */
static int bad_args_case(hora_ctx_t *ctx, const char *algo, int kind) {
  if (kind == K_BARRIER) return 0; /* no arguments */
  call_t a = {kind, A_COUNT, HORA_FLOAT32, HORA_SUM, 0, on_device ? HORA_DEVICE_CUDA : HORA_DEVICE_HOST, 0, 1, 1};
  call_t b = a;
  b.dtype = (hora_dtype_t)77;
  char what[160];
  snprintf(what, sizeof what, "[%s blocking %s, invalid arguments on rank %d np %d]", algo, knames[kind], last, size);
  poison();
  hora_result_t rc = run_blocking(ctx, rank == last ? &b : &a);
  const char *msg = hora_last_error();
  if (rank == last) {
    EXPECT(rc == HORA_ERR_INVALID_ARGUMENT && strstr(msg, "dtype 77"), "%s: returned %s (%s)", what,
           hora_result_name(rc), msg);
  } else {
    expect_named_invalid(what, rc);
  }
  EXPECT(untouched(), "%s: a buffer was written", what);
  in_step(ctx, what);
  return 1;
}

/* The last rank refuses the call (hora_refuse: a binding's own argument check failed): it gets
 * HORA_SUCCESS (delivered), every other rank HORA_ERR_MISMATCH naming it as "invalid arguments".
 * Then every rank refuses at once: HORA_SUCCESS everywhere. The ranks stay in step. */
static int refuse_case(hora_ctx_t *ctx, const char *algo, int kind) {
  call_t a = {kind, A_COUNT, HORA_FLOAT32, HORA_SUM, 0, on_device ? HORA_DEVICE_CUDA : HORA_DEVICE_HOST, 0, 1, 1};
  char what[160];
  snprintf(what, sizeof what, "[%s blocking %s, refused on rank %d np %d]", algo, knames[kind], last, size);
  EXPECT(hora_refuse(NULL) == HORA_ERR_NOT_INITIALIZED, "%s: hora_refuse(NULL) accepted", what);
  poison();
  hora_result_t rc = rank == last ? hora_refuse(ctx) : run_blocking(ctx, &a);
  const char *msg = hora_last_error();
  if (rank == last) {
    EXPECT(rc == HORA_SUCCESS, "%s: hora_refuse returned %s (%s)", what, hora_result_name(rc), msg);
  } else {
    expect_named_invalid(what, rc);
  }
  EXPECT(untouched(), "%s: a buffer was written", what);
  in_step(ctx, what);
  rc = hora_refuse(ctx);
  EXPECT(rc == HORA_SUCCESS, "%s: every rank refusing: %s (%s)", what, hora_result_name(rc), hora_last_error());
  in_step(ctx, what);
  return 1;
}

static int matrix(hora_ctx_t *ctx, const char *algo, int with_async) {
  int n = 0;
  /* blocking allreduce: counts in different forms of the shm algorithm, and both in pieces */
  const size_t pairs[][2] = {{A_COUNT, BIG_COUNT}, {BIG_COUNT, A_COUNT}, {BIG_COUNT, BIG_COUNT - 500}};
  for (int i = 0; i < 3; i++) {
    a_count = pairs[i][0], b_count = pairs[i][1];
    n += one_case(ctx, algo, K_ALLREDUCE, F_COUNT, 0, n);
    n += one_case(ctx, algo, K_ALLREDUCE, F_KIND, 0, n); /* the last rank in another collective */
  }
  a_count = A_COUNT, b_count = B_COUNT;
  for (int kind = K_ALLREDUCE; kind < K_N; kind++) n += bad_args_case(ctx, algo, kind);
  for (int kind = K_ALLREDUCE; kind < K_N; kind++) n += refuse_case(ctx, algo, kind);
  for (int async = 0; async <= with_async; async++)
    for (int kind = K_ALLREDUCE; kind < K_N; kind++) {
      if (async && (kind == K_ALLGATHERV || kind == K_ALLTOALLV || kind == K_BARRIER)) continue;
      for (int f = 0; f < F_N; f++)
        if (applies(kind, f, async)) n += one_case(ctx, algo, kind, f, async, n);
    }
  return n;
}

/* Ranks whose environment differs in a setting that every rank must share (here
 * HORA_ALLREDUCE_ALGO: mpi, and ring on the last rank; and HORA_SHM_FLAT_BYTES) would run
 * different algorithms or forms: hora_init returns HORA_ERR_INVALID_ARGUMENT on every rank,
 * naming the variable and the values. */
static int settings_case(const char *env, const char *mine, const char *last_value) {
  char *old = getenv(env) ? strdup(getenv(env)) : NULL;
  setenv(env, rank == last ? last_value : mine, 1);
  hora_ctx_t *ctx = NULL;
  hora_result_t rc = hora_init(&ctx);
  const char *msg = hora_last_error();
  char want[128];
  snprintf(want, sizeof want, "ranks disagree on %s: '%s' on rank(s) 0", env, mine);
  if (mine[0] >= '0' && mine[0] <= '9') snprintf(want, sizeof want, "ranks disagree on %s: ", env);
  EXPECT(rc == HORA_ERR_INVALID_ARGUMENT && strstr(msg, want), "hora_init with %s differing: returned %s (%s)", env,
         hora_result_name(rc), msg);
  snprintf(want, sizeof want, "on rank(s) %d", last);
  EXPECT(strstr(msg, want), "hora_init with %s differing: message '%s' lacks '%s'", env, msg, want);
  if (rc == HORA_SUCCESS) hora_finalize(ctx);
  if (old) setenv(env, old, 1);
  else unsetenv(env);
  free(old);
  return 1;
}

/* Ranks that run different libhora builds (HORA_TEST_BUILD_ID stands in for the version and git
 * commit; the last rank's differs): hora_init returns HORA_ERR_INVALID_ARGUMENT on every rank,
 * naming the builds and the ranks, before the settings are compared (their agreement may itself
 * differ between builds). */
static int build_case(void) {
  setenv("HORA_TEST_BUILD_ID", rank == last ? "0.1.0 bbbbbbbbbbbb" : "0.1.0 aaaaaaaaaaaa", 1);
  hora_ctx_t *ctx = NULL;
  hora_result_t rc = hora_init(&ctx);
  const char *msg = hora_last_error();
  char want[200];
  snprintf(want, sizeof want, "ranks disagree on the hora build (libhora's version and git commit): "
           "'0.1.0 aaaaaaaaaaaa' on rank(s) 0");
  EXPECT(rc == HORA_ERR_INVALID_ARGUMENT && strstr(msg, want), "hora_init with builds differing: returned %s (%s)",
         hora_result_name(rc), msg);
  snprintf(want, sizeof want, "; '0.1.0 bbbbbbbbbbbb' on rank(s) %d (every rank of a job must run the same libhora", last);
  EXPECT(strstr(msg, want), "hora_init with builds differing: message '%s' lacks '%s'", msg, want);
  if (rc == HORA_SUCCESS) hora_finalize(ctx);
  unsetenv("HORA_TEST_BUILD_ID");
  return 1;
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  last = size - 1;
  setenv("HORA_LOG", "NONE", 1);
  int fake_nodes = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--cuda")) on_device = 1;
    if (!strcmp(argv[i], "--fake-nodes")) fake_nodes = 1;
  }
  /* Two fake nodes (HORA_CROSS_RANK): the check then goes over MPI instead of the shared window. */
  if (fake_nodes) setenv("HORA_CROSS_RANK", rank < (size + 1) / 2 ? "0" : "1", 1);
  sendb = malloc(BUF_BYTES);
  recvb = malloc(BUF_BYTES);
  dsend = sendb;
  drecv = recvb;
  if (size < 2 || size > 4) {
    if (rank == 0) fprintf(stderr, "test_call_check: needs 2 to 4 ranks\n");
    MPI_Finalize();
    return HORA_TEST_SKIP;
  }
  if (on_device) {
#ifdef HORA_TEST_CUDA
    int ndev = 0, ok = cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all) {
      cudaSetDevice(rank % ndev);
      ok = cudaMalloc(&dsend, BUF_BYTES) == cudaSuccess && cudaMalloc(&drecv, BUF_BYTES) == cudaSuccess;
    }
    if (!all) {
#endif
      if (rank == 0) fprintf(stderr, "test_call_check --cuda: no GPU (or no CUDA build): skipped\n");
      MPI_Finalize();
      return HORA_TEST_SKIP;
#ifdef HORA_TEST_CUDA
    }
#endif
  }
  const char *algos[] = {"auto", "ring", "shm", "hier", "mpi"};
  int cases = 0;
  for (int i = 0; i < 5; i++) {
    setenv("HORA_ALLREDUCE_ALGO", algos[i], 1);
    hora_ctx_t *ctx = NULL;
    hora_result_t rc = hora_init(&ctx);
    EXPECT(rc == HORA_SUCCESS, "hora_init (%s): %s", algos[i], hora_last_error());
    if (rc != HORA_SUCCESS) break;
    cases += matrix(ctx, algos[i], !on_device);
    int cs = 0;
    hora_cross_size(ctx, &cs);
    EXPECT(cs == (fake_nodes ? 2 : 1), "cross size %d", cs);
    /* Two fake nodes hold (size + 1) / 2 and size / 2 ranks: homogeneous only for an even size,
     * and every rank says the same. */
    int homog = -1;
    EXPECT_OK(hora_is_homogeneous(ctx, &homog));
    EXPECT(homog == (!fake_nodes || size % 2 == 0), "hora_is_homogeneous %d (%d ranks, %s)", homog, size,
           fake_nodes ? "2 fake nodes" : "one node");
    EXPECT_OK(hora_finalize(ctx));
  }
  cases += settings_case("HORA_ALLREDUCE_ALGO", "mpi", "ring");
  cases += settings_case("HORA_SHM_FLAT_BYTES", "16384", "0");
  cases += build_case();
  if (rank == 0) printf("test_call_check: %d cases on %d ranks%s\n", cases, size, on_device ? " (device buffers)" : "");
#ifdef HORA_TEST_CUDA
  if (on_device) {
    cudaFree(dsend);
    cudaFree(drecv);
  }
#endif
  free(sendb);
  free(recvb);
  int rc = hora_test_finish_mpi("test_call_check");
  MPI_Finalize();
  return rc;
}
