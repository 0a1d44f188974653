/* Many named allreduces of random sizes and mixed dtypes/ops, submitted in a different random
 * order on every rank, repeated for several steps (the first step negotiates through rank 0, the
 * later ones take the response-cache path; with HORA_CACHE_CAPACITY below the tensor count the
 * cache evicts every step). Every result is checked element by element against the exact value.
 *   test_engine_random [tensors] [steps] [max_count]                                            */
#include <math.h>
#include <stdint.h>

#include "engine/engine.h"
#include "hora_kernels.h"
#include "hora_test.h"

typedef struct {
  char name[32];
  hora_dtype_t dtype;
  hora_op_t op;
  size_t count;
  double postscale;
  void *send, *recv;
  hora_handle_t *h;
} tensor_t;

static uint64_t rng(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Input of rank r, element i, step s: a small integer, exact in every dtype and any order. */
static int input(int r, size_t i, int s) { return (int)((r + 1) * ((i + (size_t)s) % 5 + 1)); }

static double get(const void *p, size_t i, hora_dtype_t d) {
  switch (d) {
    case HORA_UINT8: return ((const uint8_t *)p)[i];
    case HORA_INT8: return ((const int8_t *)p)[i];
    case HORA_INT16: return ((const int16_t *)p)[i];
    case HORA_INT32: return ((const int32_t *)p)[i];
    case HORA_INT64: return (double)((const int64_t *)p)[i];
    case HORA_FLOAT16: return hora__f16_to_f32(((const uint16_t *)p)[i]);
    case HORA_BFLOAT16: return hora__bf16_to_f32(((const uint16_t *)p)[i]);
    case HORA_FLOAT32: return ((const float *)p)[i];
    default: return ((const double *)p)[i];
  }
}

static void set(void *p, size_t i, hora_dtype_t d, double v) {
  switch (d) {
    case HORA_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case HORA_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
    case HORA_INT16: ((int16_t *)p)[i] = (int16_t)v; break;
    case HORA_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case HORA_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    case HORA_FLOAT16: ((uint16_t *)p)[i] = hora__f32_to_f16((float)v); break;
    case HORA_BFLOAT16: ((uint16_t *)p)[i] = hora__f32_to_bf16((float)v); break;
    case HORA_FLOAT32: ((float *)p)[i] = (float)v; break;
    default: ((double *)p)[i] = v; break;
  }
}

int main(int argc, char **argv) {
  int ntensors = argc > 1 ? atoi(argv[1]) : 1000;
  int steps = argc > 2 ? atoi(argv[2]) : 5;
  size_t max_count = argc > 3 ? (size_t)atol(argv[3]) : 3000;
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  int rank, size;
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);

  /* Tensor specs from a seed shared by all ranks. */
  uint64_t seed = 12345;
  tensor_t *t = calloc((size_t)ntensors, sizeof *t);
  for (int k = 0; k < ntensors; k++) {
    tensor_t *x = &t[k];
    snprintf(x->name, sizeof x->name, "grad/%d", k);
    /* Every dtype but bool (OR/AND, not arithmetic: tested in test_coll). */
    x->dtype = (hora_dtype_t)(rng(&seed) % (HORA_DTYPE_COUNT - 1));
    /* log-uniform sizes 1 .. max_count, some empty */
    double u = (double)(rng(&seed) % 10000) / 10000.0;
    x->count = k % 97 == 0 ? 0 : (size_t)exp(u * log((double)max_count));
    int is_float = x->dtype >= HORA_FLOAT16 && x->dtype <= HORA_FLOAT64;
    uint64_t o = rng(&seed) % 4;
    x->op = o == 0 ? HORA_MAX : o == 1 ? HORA_MIN : (o == 2 && is_float) ? HORA_AVERAGE : HORA_SUM;
    x->postscale = (is_float && rng(&seed) % 3 == 0) ? 0.5 : 1.0;
    size_t es;
    hora_dtype_size(x->dtype, &es);
    x->send = malloc(x->count * es + 1);
    x->recv = malloc(x->count * es + 1);
  }
  int *order = malloc((size_t)ntensors * sizeof *order);
  uint64_t oseed = 777 + (uint64_t)rank * 1000003;

  for (int s = 0; s < steps; s++) {
    for (int k = 0; k < ntensors; k++) {
      order[k] = k;
      for (size_t i = 0; i < t[k].count; i++) set(t[k].send, i, t[k].dtype, input(rank, i, s));
    }
    for (int k = ntensors - 1; k > 0; k--) { /* a different order on every rank and step */
      int j = (int)(rng(&oseed) % (uint64_t)(k + 1)), tmp = order[k];
      order[k] = order[j];
      order[j] = tmp;
    }
    for (int k = 0; k < ntensors; k++) {
      tensor_t *x = &t[order[k]];
      x->h = NULL; /* a failed submit creates no handle: never wait on last step's freed one */
      EXPECT_OK(hora_allreduce_async(ctx, x->name, x->send, x->recv, x->count, x->dtype, x->op, 1.0,
                                     x->postscale, HORA_DEVICE_HOST, &x->h));
    }
    for (int k = 0; k < ntensors; k++) {
      tensor_t *x = &t[k];
      if (!x->h) continue;
      EXPECT_OK(hora_wait(x->h));
      EXPECT_OK(hora_handle_free(x->h));
      x->h = NULL;
      for (size_t i = 0; i < x->count; i++) {
        double sum = 0, mn = 1e300, mx = -1e300;
        for (int r = 0; r < size; r++) {
          double v = input(r, i, s);
          sum += v;
          mn = v < mn ? v : mn;
          mx = v > mx ? v : mx;
        }
        double want = x->op == HORA_SUM ? sum : x->op == HORA_MIN ? mn : x->op == HORA_MAX ? mx : sum / size;
        want *= x->postscale;
        double got = get(x->recv, i, x->dtype), tol = x->op == HORA_AVERAGE ? fabs(want) * 1e-2 + 1e-6 : 0;
        if (x->op == HORA_AVERAGE && x->dtype >= HORA_FLOAT32) tol = fabs(want) * 1e-6;
        if (fabs(got - want) > tol) {
          EXPECT(0, "step %d tensor %s (%s, count %zu) [%zu] = %g, want %g", s, x->name,
                 x->dtype == HORA_FLOAT16 ? "f16" : "", x->count, i, got, want);
          break;
        }
      }
    }
  }
  /* The fast path must really be taken: with a cache that holds every name, each step after the
   * first finds all of them there (a hit per tensor and step), and rank-0 rounds stay few. With a
   * smaller cache (evictions), hits are fewer than that. Fusion must have grouped something. */
  uint64_t cycles, slow, hits, fused;
  EXPECT_OK(hora__engine_stats(ctx, &cycles, &slow, &hits, &fused));
  int64_t cap = hora__params()->cache_capacity;
  uint64_t full = (uint64_t)ntensors * (uint64_t)(steps - 1);
  if (cap >= ntensors) {
    EXPECT(hits >= full, "cache hits %llu, want >= %llu (%d tensors x %d later steps)", (unsigned long long)hits,
           (unsigned long long)full, ntensors, steps - 1);
    EXPECT(slow <= (uint64_t)steps + 20, "%llu rank-0 rounds in %llu cycles for %d steps: the cache is not used",
           (unsigned long long)slow, (unsigned long long)cycles, steps);
  } else {
    EXPECT(hits < full || steps == 1, "cache of %lld entries gave %llu hits for %d tensors", (long long)cap,
           (unsigned long long)hits, ntensors);
  }
  if (hora__params()->fusion_threshold > 0 && ntensors > 10)
    EXPECT(fused > 0, "no fused group in %llu cycles", (unsigned long long)cycles);
  if (rank == 0)
    printf("engine: %llu cycles, %llu with a rank-0 round, %llu cache hits, %llu fused groups\n",
           (unsigned long long)cycles, (unsigned long long)slow, (unsigned long long)hits, (unsigned long long)fused);
  for (int k = 0; k < ntensors; k++) {
    free(t[k].send);
    free(t[k].recv);
  }
  free(t);
  free(order);
  EXPECT_OK(hora_finalize(ctx));
  int rc = hora_test_finish_mpi("test_engine_random");
  MPI_Finalize();
  return rc;
}
