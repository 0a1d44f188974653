/* hora-bench fusion: the step time of a list of gradient tensors averaged across ranks, done five
 * ways in the same run (interleaved step by step, median over the steps):
 *   mpi_per_tensor  one blocking MPI_Allreduce per tensor (what a naive loop does)
 *   mpi_concat      one MPI_Allreduce of all tensors already concatenated
 *   hora_concat     one blocking hora_allreduce of the concatenated buffer: the ideal for fusion
 *                   (no copies, one call), the baseline the ratios are printed against
 *   hora_fused      every tensor through hora_allreduce_async, backward order, then wait all
 *                   (the async engine with fusion on: HORA_FUSION_THRESHOLD as set, default 128M)
 *   hora_unfused    the same with HORA_FUSION_THRESHOLD=0 (a second context)
 * Workloads: resnet50 = the 161 parameter tensors of torchvision's ResNet-50 (25,557,032 fp32,
 * 102.2 MB; 107 of them under 16 KiB) in backward order; small200 = 200 fp32 tensors with sizes
 * log-uniform in 256 B .. 4 MiB (fixed seed). Run under mpirun; rank 0 prints. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "bench.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpirun -np N hora-bench fusion [options]\n"
          "  --workload W   resnet50 | small200 (default resnet50)\n"
          "  --steps N      timed steps per variant (default 10), interleaved across variants\n"
          "  --warmup N     untimed steps per variant first (default 2)\n"
          "  --json FILE    also write {workload, variant, ranks, step_ms} lines\n");
}

/* torchvision resnet50().parameters() sizes, forward order. */
static size_t resnet50(size_t *out) {
  size_t n = 0;
  out[n++] = 64 * 3 * 7 * 7;
  out[n++] = 64;
  out[n++] = 64;
  const int width[4] = {64, 128, 256, 512}, blocks[4] = {3, 4, 6, 3};
  size_t in = 64;
  for (int l = 0; l < 4; l++) {
    size_t w = (size_t)width[l];
    for (int b = 0; b < blocks[l]; b++) {
      out[n++] = w * in, out[n++] = w, out[n++] = w;          /* conv1 1x1, bn1 */
      out[n++] = w * w * 9, out[n++] = w, out[n++] = w;       /* conv2 3x3, bn2 */
      out[n++] = 4 * w * w, out[n++] = 4 * w, out[n++] = 4 * w; /* conv3 1x1, bn3 */
      if (b == 0) out[n++] = 4 * w * in, out[n++] = 4 * w, out[n++] = 4 * w; /* downsample */
      in = 4 * w;
    }
  }
  out[n++] = 1000 * 2048;
  out[n++] = 1000;
  return n;
}

static size_t small200(size_t *out) {
  uint64_t s = 42;
  for (int i = 0; i < 200; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(s >> 11) / 9007199254740992.0;
    double bytes = exp(log(256.0) + u * (log(4194304.0) - log(256.0)));
    out[i] = (size_t)(bytes / 4);
    if (!out[i]) out[i] = 1;
  }
  return 200;
}

enum { V_MPI_PER, V_MPI_CONCAT, V_HORA_CONCAT, V_FUSED, V_UNFUSED, V_N };
static const char *const vname[V_N] = {"mpi_per_tensor", "mpi_concat", "hora_concat", "hora_fused", "hora_unfused"};

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* One step of variant v over the workload's n tensors (offsets off[] into send/recv, counts[]):
 * returns the number of failed calls. */
static long run_variant(int v, hora_ctx_t *cf, hora_ctx_t *cu, const float *send, float *recv, const size_t *counts,
                        const size_t *off, size_t n, size_t total, char (*names)[32], hora_handle_t **h) {
  long errors = 0;
  switch (v) {
    case V_MPI_PER:
      for (size_t k = n; k-- > 0;)
        MPI_Allreduce(send + off[k], recv + off[k], (int)counts[k], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case V_MPI_CONCAT:
      MPI_Allreduce(send, recv, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case V_HORA_CONCAT:
      if (hora_allreduce(cf, send, recv, total, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST)) errors++;
      break;
    default: {
      hora_ctx_t *c = v == V_FUSED ? cf : cu;
      for (size_t k = n; k-- > 0;) /* backward order: the last layer's gradients are ready first */
        if (hora_allreduce_async(c, names[k], send + off[k], recv + off[k], counts[k], HORA_FLOAT32, HORA_SUM,
                                 1, 1, HORA_DEVICE_HOST, &h[k]))
          errors++, h[k] = NULL;
      for (size_t k = n; k-- > 0;)
        if (h[k]) {
          if (hora_wait(h[k])) errors++;
          hora_handle_free(h[k]);
        }
    }
  }
  return errors;
}

/* Rank 0's table (median step time of each variant) and the JSON lines when asked for. */
static void report(double **t, int steps, const char *workload, size_t n, size_t under16k, size_t total, int size,
                   const char *json, long allerr) {
  double med[V_N];
  for (int v = 0; v < V_N; v++) {
    qsort(t[v], (size_t)steps, sizeof(double), cmpd);
    med[v] = steps % 2 ? t[v][steps / 2] : (t[v][steps / 2 - 1] + t[v][steps / 2]) / 2;
  }
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (json && !jf) fprintf(stderr, "hora-bench fusion: cannot write %s\n", json);
  printf("# hora-bench fusion: workload %s, %zu tensors (%zu under 16 KiB), %.1f MB fp32, %d ranks, "
         "median of %d steps\n", workload, n, under16k, (double)total * 4 / 1e6, size, steps);
  printf("%-16s %10s %14s\n", "variant", "step_ms", "vs_hora_concat");
  for (int v = 0; v < V_N; v++) {
    printf("%-16s %10.2f %13.2fx\n", vname[v], med[v] * 1e3, med[v] / med[V_HORA_CONCAT]);
    if (jf) fprintf(jf, "{\"workload\":\"%s\",\"variant\":\"%s\",\"ranks\":%d,\"step_ms\":%.4f}\n", workload,
                    vname[v], size, med[v] * 1e3);
  }
  printf("# hora_fused / hora_concat = %.2f (target <= 1.2)\n", med[V_FUSED] / med[V_HORA_CONCAT]);
  printf("# mpi_per_tensor / hora_fused = %.2f%s\n", med[V_MPI_PER] / med[V_FUSED],
         strcmp(workload, "small200") ? "" : " (target >= 3)");
  if (allerr) printf("# %ld WRONG RESULTS or errors\n", allerr);
  if (jf) fclose(jf);
}

int hora_bench_fusion(int argc, char **argv) {
  const char *workload = "resnet50", *json = NULL;
  int steps = 10, warmup = 2;
  const char *P = "hora-bench fusion";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int rc = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--workload")) rc = opt_choice(P, argc, argv, &i, "resnet50|small200", &workload);
    else if (!strcmp(a, "--steps")) rc = opt_int(P, argc, argv, &i, 1, 1000000, &steps);
    else if (!strcmp(a, "--warmup")) rc = opt_int(P, argc, argv, &i, 0, 1000000, &warmup);
    else if (!strcmp(a, "--json")) rc = (json = opt_value(P, argc, argv, &i)) ? 0 : OPT_USAGE;
    else rc = opt_unknown(P, a);
    if (rc) return rc;
  }
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  /* Two contexts: the default one (fusion as configured) and one with fusion off. */
  hora_ctx_t *cf, *cu;
  hora_result_t hr = hora_init(&cf);
  if (hr == HORA_SUCCESS) {
    const char *old = getenv("HORA_FUSION_THRESHOLD");
    char *saved = old ? strdup(old) : NULL;
    setenv("HORA_FUSION_THRESHOLD", "0", 1);
    hr = hora_init(&cu);
    if (saved) setenv("HORA_FUSION_THRESHOLD", saved, 1);
    else unsetenv("HORA_FUSION_THRESHOLD");
    free(saved);
  }
  if (hr != HORA_SUCCESS) {
    fprintf(stderr, "hora-bench fusion: hora_init: %s\n", hora_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rank, size;
  hora_rank(cf, &rank);
  hora_size(cf, &size);

  size_t counts[256];
  size_t n = !strcmp(workload, "resnet50") ? resnet50(counts) : small200(counts);
  size_t total = 0, under16k = 0;
  for (size_t i = 0; i < n; i++) total += counts[i], under16k += counts[i] * 4 < 16384;
  float *send = malloc(total * sizeof(float)), *recv = malloc(total * sizeof(float));
  size_t *off = malloc(n * sizeof *off);
  char (*names)[32] = malloc(n * sizeof *names);
  hora_handle_t **h = malloc(n * sizeof *h);
  double *t[V_N];
  for (int v = 0; v < V_N; v++) t[v] = malloc((size_t)steps * sizeof(double));
  if (!send || !recv || !off || !names || !h) {
    fprintf(stderr, "hora-bench fusion: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (size_t i = 0, o = 0; i < n; i++) {
    off[i] = o;
    o += counts[i];
    snprintf(names[i], sizeof names[i], "%s/%zu", workload, i);
  }
  for (size_t i = 0; i < total; i++) send[i] = (float)((i + (size_t)rank) % 7);

  long errors = 0;
  for (int s = -warmup; s < steps; s++) {
    for (int v = 0; v < V_N; v++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = bench_now_s();
      errors += run_variant(v, cf, cu, send, recv, counts, off, n, total, names, h);
      double dt = bench_now_s() - t0, mx;
      MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (s >= 0) t[v][s] = mx;
      /* spot-check the result: sum over ranks of (i + r) % 7 */
      size_t i = total / 2;
      double want = 0;
      for (int r = 0; r < size; r++) want += (double)((i + (size_t)r) % 7);
      if (recv[i] != (float)want) errors++;
      memset(recv, 0, sizeof(float) * 16);
    }
  }
  long allerr = 0;
  MPI_Allreduce(&errors, &allerr, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) report(t, steps, workload, n, under16k, total, size, json, allerr);
  for (int v = 0; v < V_N; v++) free(t[v]);
  free(send), free(recv), free(off), free(names), free(h);
  hora_finalize(cu);
  hora_finalize(cf);
  MPI_Finalize();
  return allerr ? 1 : 0;
}
