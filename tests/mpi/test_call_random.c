/* Random call sequences for the cross-rank call check: every rank draws the same sequence of
 * blocking collectives (kind, count, dtype, op, root) from one seed (printed; argv[1] replays it),
 * and in about a third of the calls one random rank changes one field or calls another
 * collective. Agreeing calls must give exact results; disagreeing ones HORA_ERR_MISMATCH on every
 * rank with both buffers as they were. A hang is caught by alarm() (and the ctest timeout). The
 * allreduce algorithm is drawn from the seed too. Arguments: [seed] [--fake-nodes] (two fake nodes:
 * the check's multi-node path). */
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "hora_test.h"

#define ITERS 400
#define MAX_COUNT 3000

static int rank, size;
static uint64_t rng;

static uint32_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}

enum { K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_ALLGATHERV, K_REDUCESCATTER, K_ALLTOALL, K_BARRIER, K_N };
static const hora_dtype_t dtypes[] = {HORA_INT32, HORA_INT64, HORA_FLOAT32, HORA_FLOAT64, HORA_UINT8};
static const hora_op_t ops[] = {HORA_SUM, HORA_MIN, HORA_MAX};

typedef struct {
  int kind;
  size_t count;
  int dt, op, root;
} call_t;

static double val(int r, size_t j) { return (r + 1) * 3 + (double)(j % 7); }

static void put(void *buf, hora_dtype_t dt, size_t i, double v) {
  switch (dt) {
    case HORA_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case HORA_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case HORA_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case HORA_FLOAT64: ((double *)buf)[i] = v; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)v;
  }
}

static double get(const void *buf, hora_dtype_t dt, size_t i) {
  switch (dt) {
    case HORA_INT32: return ((const int32_t *)buf)[i];
    case HORA_INT64: return (double)((const int64_t *)buf)[i];
    case HORA_FLOAT32: return ((const float *)buf)[i];
    case HORA_FLOAT64: return ((const double *)buf)[i];
    default: return ((const uint8_t *)buf)[i];
  }
}

static double reduce(int op, size_t j) { /* over ranks of val(r, j) */
  double a = val(0, j);
  for (int r = 1; r < size; r++) {
    double v = val(r, j);
    a = ops[op] == HORA_SUM ? a + v : ops[op] == HORA_MIN ? (v < a ? v : a) : (v > a ? v : a);
  }
  return a;
}

static size_t vcount(const call_t *c, int r) { return c->count + (size_t)r; }

static hora_result_t call(hora_ctx_t *ctx, const call_t *c, void *send, void *recv) {
  hora_dtype_t dt = dtypes[c->dt];
  size_t counts[8];
  for (int r = 0; r < size; r++) counts[r] = vcount(c, r);
  switch (c->kind) {
    case K_ALLREDUCE: return hora_allreduce(ctx, send, recv, c->count, dt, ops[c->op], 1, 1, HORA_DEVICE_HOST);
    case K_BROADCAST: return hora_broadcast(ctx, recv, c->count, dt, c->root, HORA_DEVICE_HOST);
    case K_ALLGATHER: return hora_allgather(ctx, send, recv, c->count, dt, HORA_DEVICE_HOST);
    case K_ALLGATHERV: return hora_allgatherv(ctx, send, counts[rank], recv, counts, dt, HORA_DEVICE_HOST);
    case K_REDUCESCATTER: return hora_reducescatter(ctx, send, recv, c->count, dt, ops[c->op], 1.0, 1.0, HORA_DEVICE_HOST);
    case K_ALLTOALL: return hora_alltoall(ctx, send, recv, c->count, dt, HORA_DEVICE_HOST);
    default: return hora_barrier(ctx);
  }
}

/* Wrong elements of an agreeing call's result. */
static long verify(const call_t *c, const void *recv) {
  hora_dtype_t dt = dtypes[c->dt];
  long bad = 0;
  size_t n = c->count, S = (size_t)size, off = 0;
  switch (c->kind) {
    case K_ALLREDUCE:
      for (size_t j = 0; j < n; j++) bad += get(recv, dt, j) != reduce(c->op, j);
      break;
    case K_BROADCAST:
      for (size_t j = 0; j < n; j++) bad += get(recv, dt, j) != val(c->root, j);
      break;
    case K_ALLGATHER:
      for (size_t k = 0; k < n * S; k++) bad += get(recv, dt, k) != val((int)(k / (n ? n : 1)), k % (n ? n : 1));
      break;
    case K_ALLGATHERV:
      for (int r = 0; r < size; r++)
        for (size_t j = 0; j < vcount(c, r); j++) bad += get(recv, dt, off++) != val(r, j);
      break;
    case K_REDUCESCATTER:
      for (size_t j = 0; j < n; j++) bad += get(recv, dt, j) != reduce(c->op, (size_t)rank * n + j);
      break;
    case K_ALLTOALL:
      for (size_t k = 0; k < n * S; k++) bad += get(recv, dt, k) != val((int)(k / n), (size_t)rank * n + k % n);
      break;
  }
  return bad;
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 8) return HORA_TEST_SKIP;
  int fake_nodes = argc > 1 && !strcmp(argv[argc - 1], "--fake-nodes");
  if (fake_nodes) setenv("HORA_CROSS_RANK", rank < (size + 1) / 2 ? "0" : "1", 1);
  unsigned long long seed = argc > 1 + fake_nodes ? strtoull(argv[1], NULL, 0) : (unsigned long long)time(NULL);
  MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  rng = seed * 0x9E3779B97F4A7C15ull + 1;
  const char *algos[] = {"auto", "ring", "shm", "hier", "mpi"};
  const char *algo = algos[next() % 5];
  if (rank == 0)
    printf("test_call_random: seed %llu, HORA_ALLREDUCE_ALGO=%s, %d ranks%s\n", seed, algo, size,
           fake_nodes ? " on two fake nodes" : "");
  fflush(stdout);
  setenv("HORA_ALLREDUCE_ALGO", algo, 1);
  setenv("HORA_LOG", "NONE", 1);
  hora_ctx_t *ctx = NULL;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  alarm(90); /* a hang is a failure, not a ctest timeout without a message */
  size_t bytes = (size_t)(MAX_COUNT + 8) * 8 * (size_t)size;
  unsigned char *send = malloc(bytes), *recv = malloc(bytes), *s0 = malloc(bytes), *r0 = malloc(bytes);
  long wrong = 0, missed = 0, disagreements = 0;
  for (int it = 0; it < ITERS; it++) {
    call_t c = {(int)(next() % K_N), next() % 4 == 0 ? next() % 4 : next() % MAX_COUNT, (int)(next() % 5),
                (int)(next() % 3), (int)(next() % (uint32_t)size)};
    call_t mine = c;
    int odd = -1;
    if (next() % 3 == 0) {
      odd = (int)(next() % (uint32_t)size);
      int field = c.kind == K_BARRIER ? 4 : (int)(next() % 5);
      if (field == 2 && c.kind != K_ALLREDUCE && c.kind != K_REDUCESCATTER) field = 0;
      if (field == 3 && c.kind != K_BROADCAST) field = 1;
      call_t dummy = c, *m = rank == odd ? &mine : &dummy; /* every rank draws the same numbers */
      switch (field) {
        case 0: m->count = c.count + 1 + next() % 5; break;
        case 1: m->dt = (c.dt + 1 + (int)(next() % 4)) % 5; break;
        case 2: m->op = (c.op + 1 + (int)(next() % 2)) % 3; break;
        case 3: m->root = (c.root + 1) % size; break;
        default: m->kind = (c.kind + 1 + (int)(next() % (K_N - 1))) % K_N;
      }
      disagreements++;
    }
    hora_dtype_t dt = dtypes[mine.dt];
    size_t n = mine.kind == K_REDUCESCATTER || mine.kind == K_ALLTOALL ? mine.count * (size_t)size
               : mine.kind == K_ALLGATHERV ? vcount(&mine, rank) : mine.count;
    for (size_t k = 0; k < n; k++) put(send, dt, k, val(rank, k));
    memset(recv, 0xA5, bytes);
    if (mine.kind == K_BROADCAST)
      for (size_t k = 0; k < mine.count; k++) put(recv, dt, k, val(rank, k));
    memcpy(s0, send, bytes);
    memcpy(r0, recv, bytes);
    hora_result_t rc = call(ctx, &mine, send, recv);
    if (odd >= 0) {
      if (rc != HORA_ERR_MISMATCH) missed++;
      if (rc != HORA_ERR_MISMATCH && missed < 5)
        fprintf(stderr, "rank %d it %d: disagreement (rank %d) not reported: %s\n", rank, it, odd, hora_result_name(rc));
      if (memcmp(send, s0, bytes) || memcmp(recv, r0, bytes)) wrong++;
    } else {
      long bad = rc == HORA_SUCCESS ? verify(&c, recv) : 1;
      if (bad && wrong < 5)
        fprintf(stderr, "rank %d it %d kind %d count %zu: %s, %ld wrong elements\n", rank, it, c.kind, c.count,
                hora_result_name(rc), bad);
      wrong += bad != 0;
    }
  }
  alarm(0);
  EXPECT(wrong == 0, "%ld calls with wrong results or written buffers", wrong);
  EXPECT(missed == 0, "%ld of %ld disagreements not reported", missed, disagreements);
  if (rank == 0) printf("test_call_random: %d calls, %ld disagreements\n", ITERS, disagreements);
  EXPECT_OK(hora_finalize(ctx));
  free(send);
  free(recv);
  free(s0);
  free(r0);
  int rc = hora_test_finish_mpi("test_call_random");
  MPI_Finalize();
  return rc;
}
