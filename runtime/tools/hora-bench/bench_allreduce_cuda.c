/* hora-bench allreduce --device cuda: the GPU path against baselines measured in the same run.
 *
 *   1. kernels (rank 0's GPU): reduce, scale, cast and batched copy throughput against
 *      cudaMemcpyAsync device-to-device, counting bytes read plus bytes written (a copy of B bytes
 *      moves 2B, reduce of two B-byte inputs moves 3B). Target in docs/gpu.md: reduce >= 0.8 x copy.
 *   2. device allreduce paths: staged (pipelined ring through pinned memory) against naive (whole
 *      buffer D2H, MPI_Allreduce, H2D), and NCCL where it can run, algbw/busbw as nccl-tests
 *      (busbw = algbw * 2(n-1)/n). Target: staged >= 2x naive at >= 16 MiB.
 *   3. per-call overhead: hora_allreduce on the NCCL path against a direct loop of ncclAllReduce +
 *      cudaStreamSynchronize on a communicator of its own (same blocking semantics). Target: hora
 *      adds <= 5 us per call.
 * Run under mpirun (several ranks may share one GPU: then NCCL rows are skipped). Rank 0 prints. */
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "bench.h"

#if !HORA_HAVE_CUDA

int hora__bench_allreduce_cuda(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "hora-bench allreduce: --device cuda needs a CUDA build of hora\n");
  return 2;
}

#else

#include <cuda_runtime.h>

#include "algo/coll.h"
#include "comm/gpu.h"
#include "hora_kernels.h"

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "hora-bench allreduce: %s: %s\n", #call, cudaGetErrorString(e_));            \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                \
    }                                                                                              \
  } while (0)

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpirun -np N hora-bench allreduce --device cuda [options]\n"
          "  --min-bytes B   smallest message of the path and kernel tables (default 1M)\n"
          "  --max-bytes B   largest (default 256M); sizes double\n"
          "  --iters N       timed iterations per point (default 20; the overhead table uses 20x)\n"
          "  --repeat R      repeat each point R times, interleaved, report the median (default 3)\n"
          "  --only LIST     comma-separated of kernels,paths,overhead (default all)\n");
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

/* ---- 1. kernels ---- */

typedef enum { K_COPY, K_REDUCE, K_SCALE, K_CAST, K_BATCHED, K_COUNT } kern_t;
static const char *const knames[] = {"memcpyD2D", "reduce", "scale", "cast16", "batched64"};

/* Bytes read + written by one call on B bytes of float32 input. */
static double kbytes(kern_t k, size_t b) {
  switch (k) {
    case K_COPY: return 2.0 * b;
    case K_REDUCE: return 3.0 * b;
    case K_SCALE: return 2.0 * b;
    case K_CAST: return 1.5 * b;
    default: return 2.0 * b;
  }
}

static void run_kernel(kern_t k, char *dst, char *a, char *b, size_t bytes, cudaStream_t s) {
  size_t n = bytes / 4;
  hora_copy_desc_t descs[64];
  switch (k) {
    case K_COPY: CK(cudaMemcpyAsync(dst, a, bytes, cudaMemcpyDeviceToDevice, s)); break;
    case K_REDUCE: hora__reduce_cuda(dst, a, b, n, HORA_FLOAT32, HORA_SUM, s); break;
    case K_SCALE: hora__scale_cuda(dst, a, n, HORA_FLOAT32, 0.5, s); break;
    case K_CAST: hora__cast_f32_to_f16_cuda(dst, (const float *)a, n, s); break;
    default: {
      size_t per = bytes / 64 / 16 * 16;
      for (int i = 0; i < 64; i++) descs[i] = (hora_copy_desc_t){dst + per * i, a + per * i, per};
      descs[63].bytes = bytes - per * 63;
      hora__batched_copy_cuda(descs, 64, s);
    }
  }
}

static void bench_kernels(size_t minb, size_t maxb, int iters, int repeat) {
  char *a, *b, *d;
  CK(cudaMalloc((void **)&a, maxb));
  CK(cudaMalloc((void **)&b, maxb));
  CK(cudaMalloc((void **)&d, maxb));
  CK(cudaMemset(a, 0, maxb));
  CK(cudaMemset(b, 0, maxb));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  printf("\n# kernels: GB/s counting bytes read + written (1 GB = 1e9 B), float32 input, median of %d\n", repeat);
  printf("%12s", "size(B)");
  for (int k = 0; k < K_COUNT; k++) printf(" %10s", knames[k]);
  printf(" %13s\n", "reduce/copy");
  double *samp = malloc(sizeof(double) * (size_t)repeat * K_COUNT);
  for (size_t bytes = minb; bytes <= maxb; bytes *= 2) {
    for (int r = 0; r < repeat; r++)
      for (int k = 0; k < K_COUNT; k++) {
        for (int w = 0; w < 3; w++) run_kernel((kern_t)k, d, a, b, bytes, s);
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < iters; i++) run_kernel((kern_t)k, d, a, b, bytes, s);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaGetLastError());
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        samp[k * repeat + r] = kbytes((kern_t)k, bytes) * iters / (ms * 1e-3) / 1e9;
      }
    double gbs[K_COUNT];
    printf("%12zu", bytes);
    for (int k = 0; k < K_COUNT; k++) printf(" %10.1f", gbs[k] = median(samp + k * repeat, repeat));
    printf(" %13.2f\n", gbs[K_REDUCE] / gbs[K_COPY]);
  }
  free(samp);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  cudaFree(a);
  cudaFree(b);
  cudaFree(d);
}

/* ---- 2. paths ---- */

static double time_allreduce(hora_ctx_t *ctx, void *buf, size_t count, int iters, long *wrong) {
  MPI_Barrier(ctx->world);
  double t0 = bench_now_s();
  for (int i = 0; i < iters; i++)
    if (hora_allreduce(ctx, buf, buf, count, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA) != HORA_SUCCESS) {
      fprintf(stderr, "rank %d: hora_allreduce: %s\n", ctx->rank, hora_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  double per = (bench_now_s() - t0) / iters, mx;
  MPI_Allreduce(&per, &mx, 1, MPI_DOUBLE, MPI_MAX, ctx->world);
  (void)wrong;
  return mx;
}

/* One checked call: every rank contributes rank+1 at every element; the sum is n(n+1)/2. */
static long check_once(hora_ctx_t *ctx, float *dbuf, float *hbuf, size_t count) {
  for (size_t i = 0; i < count; i++) hbuf[i] = (float)(ctx->rank + 1);
  CK(cudaMemcpy(dbuf, hbuf, count * 4, cudaMemcpyHostToDevice));
  hora_allreduce(ctx, dbuf, dbuf, count, HORA_FLOAT32, HORA_SUM, 1.0, 1.0, HORA_DEVICE_CUDA);
  CK(cudaMemcpy(hbuf, dbuf, count * 4, cudaMemcpyDeviceToHost));
  float want = (float)ctx->size * (float)(ctx->size + 1) / 2.0f;
  long bad = 0, all = 0;
  for (size_t i = 0; i < count; i++) bad += hbuf[i] != want;
  MPI_Allreduce(&bad, &all, 1, MPI_LONG, MPI_SUM, ctx->world);
  return all;
}

static long bench_paths(hora_ctx_t *ctx, hora_gpu_t *g, size_t minb, size_t maxb, int iters, int repeat) {
  int n = ctx->size;
  static const char *const pnames[] = {"nccl", "staged", "naive"};
  int use[3] = {HORA_HAVE_NCCL && !g->shared_gpu, n > 1, n > 1};
  float *dbuf, *hbuf = malloc(maxb);
  CK(cudaMalloc((void **)&dbuf, maxb));
  double bwf = 2.0 * (n - 1) / n; /* nccl-tests: busbw is 0 on one rank (nothing crosses a link) */
  long wrong = 0;
  hora_gpu_path_t orig = g->path;
  if (ctx->rank == 0) {
    printf("\n# device allreduce paths: %d ranks, %s GPU, staged chunk %llu B; time = max over ranks, median of %d\n", n,
           g->shared_gpu ? "shared" : "one per rank", (unsigned long long)hora__params()->staged_chunk_bytes, repeat);
    printf("%12s %7s %11s %9s %9s %7s\n", "size(B)", "path", "time(us)", "algbw", "busbw", "#wrong");
  }
  double *samp = malloc(sizeof(double) * (size_t)repeat * 3);
  for (size_t bytes = minb; bytes <= maxb; bytes *= 2) {
    size_t count = bytes / 4;
    double t[3] = {0, 0, 0};
    for (int r = 0; r < repeat; r++)
      for (int p = 0; p < 3; p++) {
        if (!use[p]) continue;
        g->path = (hora_gpu_path_t)p;
        time_allreduce(ctx, dbuf, count, 2, NULL);
        samp[p * repeat + r] = time_allreduce(ctx, dbuf, count, iters, NULL);
      }
    for (int p = 0; p < 3; p++) {
      if (!use[p]) continue;
      g->path = (hora_gpu_path_t)p;
      long bad = check_once(ctx, dbuf, hbuf, count);
      wrong += bad;
      t[p] = median(samp + p * repeat, repeat);
      if (ctx->rank == 0)
        printf("%12zu %7s %11.1f %9.3f %9.3f %7ld\n", bytes, pnames[p], t[p] * 1e6, bytes / t[p] / 1e9,
               bytes / t[p] / 1e9 * bwf, bad);
    }
    if (ctx->rank == 0 && use[1] && use[2]) printf("%12zu %7s %11.2f   (staged speedup over naive)\n", bytes, "ratio", t[2] / t[1]);
  }
  g->path = orig;
  free(samp);
  free(hbuf);
  cudaFree(dbuf);
  return wrong;
}

/* ---- 3. per-call overhead against ncclAllReduce ---- */

#if HORA_HAVE_NCCL
static void bench_overhead(hora_ctx_t *ctx, hora_gpu_t *g, int iters, int repeat) {
  if (g->shared_gpu) {
    if (ctx->rank == 0) printf("\n# overhead vs ncclAllReduce: skipped (ranks share a GPU; NCCL refuses that)\n");
    return;
  }
  ncclUniqueId id;
  if (ctx->rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, ctx->world);
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, ctx->size, id, ctx->rank) != ncclSuccess) {
    fprintf(stderr, "hora-bench allreduce: ncclCommInitRank failed\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *dbuf;
  CK(cudaMalloc((void **)&dbuf, 1 << 20));
  CK(cudaMemset(dbuf, 0, 1 << 20));
  hora_gpu_path_t orig = g->path;
  g->path = HORA_GPU_PATH_NCCL;
  int it = iters * 20;
  if (ctx->rank == 0) {
    printf("\n# per-call time: hora_allreduce (NCCL path) vs ncclAllReduce + cudaStreamSynchronize, %d ranks, "
           "median of %d x %d calls\n", ctx->size, repeat, it);
    printf("%12s %12s %12s %12s\n", "size(B)", "nccl(us)", "hora(us)", "added(us)");
  }
  double *sh = malloc(sizeof(double) * (size_t)repeat * 2), *sn = sh + repeat;
  for (size_t bytes = 4; bytes <= (1 << 20); bytes *= 4) {
    size_t count = bytes / 4;
    for (int r = 0; r < repeat; r++) {
      for (int w = 0; w < 5; w++) {
        ncclAllReduce(dbuf, dbuf, count, ncclFloat32, ncclSum, comm, s);
        cudaStreamSynchronize(s);
      }
      MPI_Barrier(ctx->world);
      double t0 = bench_now_s();
      for (int i = 0; i < it; i++) {
        ncclAllReduce(dbuf, dbuf, count, ncclFloat32, ncclSum, comm, s);
        cudaStreamSynchronize(s);
      }
      double per = (bench_now_s() - t0) / it;
      MPI_Allreduce(&per, &sn[r], 1, MPI_DOUBLE, MPI_MAX, ctx->world);
      time_allreduce(ctx, dbuf, count, 5, NULL);
      sh[r] = time_allreduce(ctx, dbuf, count, it, NULL);
    }
    double tn = median(sn, repeat), th = median(sh, repeat);
    if (ctx->rank == 0) printf("%12zu %12.2f %12.2f %12.2f\n", bytes, tn * 1e6, th * 1e6, (th - tn) * 1e6);
  }
  g->path = orig;
  free(sh);
  cudaFree(dbuf);
  cudaStreamDestroy(s);
  ncclCommDestroy(comm);
}
#endif

int hora__bench_allreduce_cuda(int argc, char **argv) {
  int64_t minb = 1 << 20, maxb = 256ll << 20;
  int iters = 20, repeat = 3;
  const char *only = "kernels,paths,overhead";
  const char *P = "hora-bench allreduce --device cuda", *dev;
  uint64_t minu = (uint64_t)minb, maxu = (uint64_t)maxb;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int rc = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--device")) rc = opt_choice(P, argc, argv, &i, "cuda", &dev);
    else if (!strcmp(a, "--min-bytes")) rc = opt_bytes(P, argc, argv, &i, 16, BENCH_MAX_BYTES, &minu);
    else if (!strcmp(a, "--max-bytes")) rc = opt_bytes(P, argc, argv, &i, 16, BENCH_MAX_BYTES, &maxu);
    else if (!strcmp(a, "--iters")) rc = opt_int(P, argc, argv, &i, 1, 100000000, &iters);
    else if (!strcmp(a, "--repeat")) rc = opt_int(P, argc, argv, &i, 1, 1000000, &repeat);
    else if (!strcmp(a, "--only")) rc = (only = opt_value(P, argc, argv, &i)) ? 0 : OPT_USAGE;
    else rc = opt_unknown(P, a);
    if (rc) return rc;
  }
  minb = (int64_t)minu, maxb = (int64_t)maxu;
  if (maxb < minb) return opt_error(P, "--max-bytes is below --min-bytes");
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora-bench allreduce: hora_init: %s\n", hora_last_error());
    return 1;
  }
  /* The first device collective creates the GPU state (and fails cleanly without a GPU). */
  float *probe = NULL;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) cudaMalloc((void **)&probe, 64);
  hora_result_t hr = hora_allreduce(ctx, probe, probe, probe ? 16 : 0, HORA_FLOAT32, HORA_SUM, 1.0, 1.0,
                                    probe ? HORA_DEVICE_CUDA : HORA_DEVICE_HOST);
  hora_gpu_t *g = ctx->gpu;
  if (hr != HORA_SUCCESS || !g) {
    if (ctx->rank == 0)
      fprintf(stderr, "hora-bench allreduce --device cuda: no usable GPU on some rank: %s\n",
              hr != HORA_SUCCESS ? hora_last_error() : "no GPU visible");
    hora_finalize(ctx);
    return 1;
  }
  cudaFree(probe);
  if (ctx->rank == 0) {
    struct cudaDeviceProp prop;
    int drv = 0, rt = 0;
    cudaGetDeviceProperties(&prop, g->device);
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    printf("# hora-bench allreduce --device cuda: %d ranks, GPU %s (sm_%d%d, %d SMs), driver %d, runtime %d\n", ctx->size,
           prop.name, prop.major, prop.minor, prop.multiProcessorCount, drv, rt);
  }
  long wrong = 0;
  if (strstr(only, "kernels") && ctx->rank == 0) bench_kernels((size_t)minb, (size_t)maxb, iters, repeat);
  MPI_Barrier(ctx->world);
  if (strstr(only, "paths")) wrong += bench_paths(ctx, g, (size_t)minb, (size_t)maxb, iters, repeat);
#if HORA_HAVE_NCCL
  if (strstr(only, "overhead")) bench_overhead(ctx, g, iters, repeat);
#endif
  if (ctx->rank == 0) printf("# #wrong total: %ld\n", wrong);
  hora_finalize(ctx);
  return wrong ? 1 : 0;
}

#endif
