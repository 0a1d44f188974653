/* hora-bench allreduce: host allreduce bandwidth of hora's algorithms against MPI_Allreduce on the
 * same buffers in the same run, in the style of nccl-tests (algbw = bytes / time, busbw = algbw *
 * 2(n-1)/n, GB = 1e9 bytes). Run it under mpirun; rank 0 prints. See docs/benchmarks.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "algo/coll.h"
#include "bench.h"
#include "hora_kernels.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpirun -np N hora-bench allreduce [options]\n"
          "  --min-bytes B    smallest message (default 4; K/M/G suffixes)\n"
          "  --max-bytes B    largest message (default 256M); sizes double from min to max\n"
          "  --algo LIST      comma-separated of ring,shm,hier,auto,mpi (default all of them;\n"
          "                   mpi is MPI_Allreduce itself, the baseline; hmpi, not in the\n"
          "                   default, is hora's polled MPI_Iallreduce, HORA_ALLREDUCE_ALGO=mpi\n"
          "                   and the GPU naive path's host leg); NAME+check (e.g.\n"
          "                   auto+check) runs NAME behind hora_allreduce's argument checks and\n"
          "                   cross-rank call check, as the public call does (HORA_CHECK=1)\n"
          "  --dtype T        u8,i8,i32,i64,f16,bf16,f32,f64 (default f32)\n"
          "  --op O           sum,avg,min,max,prod (default sum)\n"
          "  --iters N        timed iterations per size and algorithm (default: about 0.2 s worth,\n"
          "                   5 .. 1000)\n"
          "  --warmup N       untimed iterations first (default 3)\n"
          "  --repeat R       measure every (size, algorithm) R times, interleaved, and report the\n"
          "                   median (default 1)\n"
          "  --best           report the fastest of the repeats instead of the median (a machine\n"
          "                   shared with other jobs: the least disturbed run)\n"
          "  --json FILE      also write one JSON object per line per (size, algorithm)\n"
          "  --device D       host (default) or cuda: the GPU path's kernels, staged vs naive and\n"
          "                   NCCL overhead (see `hora-bench allreduce --device cuda --help`)\n");
}

/* bench_allreduce_cuda.c */
int hora__bench_allreduce_cuda(int argc, char **argv);

static const char *const dnames[] = {"u8", "i8", "i32", "i64", "f16", "bf16", "f32", "f64"};
static const char *const tnames[] = {"uint8", "int8", "int32", "int64", "half", "bfloat16", "float", "double"};
static const char *const onames[] = {"sum", "avg", "min", "max", "prod"};

#define MAX_ALGOS 8
typedef struct {
  const char *name;
  int is_mpi;
  hora_algo_t algo;
  int check; /* NAME+check: the public call's checks first */
} algo_sel_t;

/* Small integer inputs: every reduction is exact, so #wrong counts real errors. */
static double input(int r, size_t i) { return (double)((i * 13 + (size_t)r * 7) % 11); }


static double expect(hora_dtype_t d, hora_op_t op, int n, size_t i) {
  double acc = input(0, i);
  for (int r = 1; r < n; r++) {
    double v = input(r, i);
    if (op == HORA_SUM || op == HORA_AVERAGE) acc += v;
    else if (op == HORA_PRODUCT) acc *= v;
    else if (op == HORA_MIN) acc = v < acc ? v : acc;
    else acc = v > acc ? v : acc;
  }
  if (op == HORA_AVERAGE) acc = d >= HORA_FLOAT16 ? acc / n : trunc(acc / n);
  char tmp[8];
  hora__elem_store(tmp, d, 0, acc);
  return hora__elem_load(tmp, d, 0);
}

/* MPI's own datatype/op where it has one (the real baseline); hora's user op otherwise. */
static int mpi_native(hora_dtype_t d, hora_op_t op, MPI_Datatype *t, MPI_Op *o) {
  MPI_Datatype types[8] = {MPI_UINT8_T, MPI_INT8_T, MPI_INT32_T, MPI_INT64_T, MPI_DATATYPE_NULL,
                           MPI_DATATYPE_NULL, MPI_FLOAT, MPI_DOUBLE};
  MPI_Op ops[5] = {MPI_SUM, MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
  if (types[d] == MPI_DATATYPE_NULL) return 0;
  *t = types[d];
  *o = ops[op];
  return 1;
}

static hora_result_t run_once(hora_ctx_t *ctx, const algo_sel_t *a, const void *send, void *recv,
                              size_t count, hora_dtype_t d, hora_op_t op) {
  if (a->check) { /* hora_allreduce's path, with the algorithm of this column */
    hora_call_desc_t desc = {HORA_CALL_ALLREDUCE, count, d, op, 0, HORA_DEVICE_HOST, 0, 0, 1.0, 1.0};
    HORA_CHECK(hora__check_allreduce(ctx, "hora_allreduce", send, recv, count, d, op, 1.0, 1.0, HORA_DEVICE_HOST));
    return hora__allreduce_checked(ctx, "hora_allreduce", &desc, send, recv, count, d, op, 1.0, 1.0, a->algo);
  }
  if (!a->is_mpi) return hora__allreduce_host_full(ctx, send, recv, count, d, op, 1.0, 1.0, a->algo);
  MPI_Datatype t;
  MPI_Op o;
  if (mpi_native(d, op, &t, &o) && count <= (size_t)INT32_MAX) {
    if (MPI_Allreduce(send, recv, (int)count, t, o, ctx->world) != MPI_SUCCESS) return HORA_ERR_MPI;
    if (op == HORA_AVERAGE) return hora__scale_and_average(ctx, recv, count, d, op, 1.0);
    return HORA_SUCCESS;
  }
  memcpy(recv, send, count * hora__dtype_size(d));
  HORA_CHECK(hora__allreduce_mpi(ctx, ctx->world, recv, count, d, op == HORA_AVERAGE ? HORA_SUM : op));
  return op == HORA_AVERAGE ? hora__scale_and_average(ctx, recv, count, d, op, 1.0) : HORA_SUCCESS;
}

/* One more call of the algorithm, its output checked element by element: the number of wrong
 * elements over all ranks. A call that fails returns no data: that is said, not counted as wrong. */
static long check_result(hora_ctx_t *ctx, const algo_sel_t *a, const void *send, void *recv, size_t count,
                         hora_dtype_t dt, hora_op_t op) {
  memset(recv, 0, count * hora__dtype_size(dt));
  if (run_once(ctx, a, send, recv, count, dt, op) != HORA_SUCCESS) {
    fprintf(stderr, "rank %d: %s failed (the call whose result is checked): %s\n", ctx->rank, a->name,
            hora_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  long bad = 0, all = 0;
  for (size_t i = 0; i < count; i++) bad += hora__elem_load(recv, dt, i) != expect(dt, op, ctx->size, i);
  MPI_Allreduce(&bad, &all, 1, MPI_LONG, MPI_SUM, ctx->world);
  return all;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The --algo list: "mpi" is MPI_Allreduce itself, the others hora's algorithms. Returns how many,
 * or -1 after a message for an unknown name. */
static int parse_algos(const char *algos, algo_sel_t *sel) {
  int nsel = 0;
  char list[256];
  snprintf(list, sizeof list, "%s", algos);
  for (char *save = NULL, *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
    if (nsel == MAX_ALGOS) break;
    algo_sel_t s = {strdup(a), 0, HORA_ALGO_AUTO, 0};
    char *plus = strstr(a, "+check");
    if (plus && !plus[6]) {
      *plus = 0;
      s.check = 1;
    }
    if (!strcmp(a, "mpi")) s.is_mpi = 1;
    else if (!strcmp(a, "hmpi")) s.algo = HORA_ALGO_MPI; /* hora's polled MPI_Iallreduce (algo/mpi.c) */
    else if (hora__algo_parse(a, &s.algo) != HORA_SUCCESS || s.algo == HORA_ALGO_MPI) {
      fprintf(stderr, "hora-bench allreduce: unknown algorithm '%s' (ring,shm,hier,auto,mpi,hmpi, each +check)\n", a);
      return -1;
    }
    sel[nsel++] = s;
  }
  return nsel;
}

/* One timed run of algorithm `a` on `count` elements: warmup calls, then `iters` calls (0: as many
 * as fit in about 0.2 s, 5 to 1000). The max over ranks of the mean time per call, in seconds. */
static double time_algo(hora_ctx_t *ctx, const algo_sel_t *a, const void *send, void *recv, size_t count,
                        hora_dtype_t dt, hora_op_t op, int warmup, int iters) {
  for (int w = 0; w < warmup; w++) run_once(ctx, a, send, recv, count, dt, op);
  int it = iters;
  if (it == 0) {
    MPI_Barrier(ctx->world);
    double t0 = bench_now_s();
    run_once(ctx, a, send, recv, count, dt, op);
    double one = bench_now_s() - t0, mx;
    MPI_Allreduce(&one, &mx, 1, MPI_DOUBLE, MPI_MAX, ctx->world);
    it = (int)(0.2 / (mx > 1e-7 ? mx : 1e-7));
    it = it < 5 ? 5 : it > 1000 ? 1000 : it;
  }
  MPI_Barrier(ctx->world);
  double t0 = bench_now_s();
  hora_result_t hr = HORA_SUCCESS;
  for (int j = 0; j < it && hr == HORA_SUCCESS; j++) hr = run_once(ctx, a, send, recv, count, dt, op);
  double per = (bench_now_s() - t0) / it, mx;
  MPI_Allreduce(&per, &mx, 1, MPI_DOUBLE, MPI_MAX, ctx->world);
  if (hr != HORA_SUCCESS) {
    fprintf(stderr, "rank %d: %s failed: %s\n", ctx->rank, a->name, hora_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return mx;
}

/* Rank 0's table header. */
static void print_header(hora_ctx_t *ctx, int d, int op, int repeat, int best) {
  char chunk_txt[64];
  if (hora__params()->shm_chunk_bytes)
    snprintf(chunk_txt, sizeof chunk_txt, "%llu B", (unsigned long long)hora__params()->shm_chunk_bytes);
  else /* algo/shm.c shm_create's default */
    snprintf(chunk_txt, sizeof chunk_txt, "auto (%s)", ctx->local_size > ctx->local_cpus ? "4 MiB" : "1 MiB per shm thread");
  char thr_txt[64];
  if (hora__params()->shm_threads)
    snprintf(thr_txt, sizeof thr_txt, "%lld", (long long)hora__params()->shm_threads);
  else
    snprintf(thr_txt, sizeof thr_txt, "0 (one per CPU of the rank's share)");
  char seg_txt[64];
  if (hora__params()->ring_segment_bytes)
    snprintf(seg_txt, sizeof seg_txt, "%llu B", (unsigned long long)hora__params()->ring_segment_bytes);
  else
    snprintf(seg_txt, sizeof seg_txt, "auto (%s)", ctx->cross_size > 1 ? "65024 B" : "1 MiB");
  if (ctx->rank != 0) return;
  printf("# hora-bench allreduce: %d ranks on %d node(s), local size %d, dtype %s, op %s, "
         "segment %s, shm chunk %s, shm threads %s\n", ctx->size, ctx->cross_size, ctx->local_size, dnames[d],
         onames[op], seg_txt, chunk_txt, thr_txt);
  printf("# busbw = algbw * 2(n-1)/n, GB = 1e9 B; time = max over ranks of the mean over iters%s\n",
         repeat > 1 ? (best ? ", fastest of the repeats" : ", median of the repeats") : "");
  printf("%12s %12s %9s %6s %6s %11s %9s %9s %7s\n", "size(B)", "count", "type", "redop", "algo",
         "time(us)", "algbw", "busbw", "#wrong");
}

/* The send buffer (this rank's input values) and a zeroed recv buffer of maxcount elements. */
static char *bench_buffers(int rank, hora_dtype_t dt, size_t maxcount, char **recv) {
  size_t es = hora__dtype_size(dt);
  char *send = NULL;
  if (posix_memalign((void **)&send, 64, maxcount * es + 64) || posix_memalign((void **)recv, 64, maxcount * es + 64)) {
    fprintf(stderr, "hora-bench allreduce: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (size_t i = 0; i < maxcount; i++) hora__elem_store(send, dt, i, input(rank, i));
  memset(*recv, 0, maxcount * es);
  return send;
}

/* Rank 0's table of the call check's cost per size: NAME against NAME+check (the first such pair). */
static void print_check_cost(const algo_sel_t *sel, int nsel, const double *bytes, const double *t, int nsum) {
  int plain = -1, checked = -1;
  for (int k = 0; k < nsel && checked < 0; k++)
    for (int j = 0; j < nsel; j++)
      if (sel[k].check && !sel[j].check && sel[k].algo == sel[j].algo && sel[k].is_mpi == sel[j].is_mpi)
        plain = j, checked = k;
  if (checked < 0) return;
  printf("\n# call check cost: %s vs %s+check (hora_allreduce's checks), time per call\n", sel[plain].name,
         sel[plain].name);
  printf("%12s %11s %11s %10s %8s\n", "size(B)", "plain(us)", "check(us)", "delta(us)", "delta%");
  for (int s = 0; s < nsum; s++) {
    double a = t[s * MAX_ALGOS + plain], b = t[s * MAX_ALGOS + checked];
    printf("%12.0f %11.2f %11.2f %10.2f %7.1f%%\n", bytes[s], a * 1e6, b * 1e6, (b - a) * 1e6, a > 0 ? (b - a) / a * 100 : 0.0);
  }
}

/* Rank 0's closing table: auto against MPI_Allreduce per size, when both ran. */
static void print_summary(const algo_sel_t *sel, int nsel, const double *sum_bytes, const double *sum_auto,
                          const double *sum_mpi, const char *const *sum_pick, int nsum) {
  int have_auto = 0, have_mpi = 0;
  for (int k = 0; k < nsel; k++) {
    have_auto |= !strcmp(sel[k].name, "auto");
    have_mpi |= sel[k].is_mpi;
  }
  if (!have_auto || !have_mpi) return;
  printf("\n# hora(auto) / MPI_Allreduce busbw per size (auto picks the algorithm named)\n");
  printf("%12s %10s %10s %7s %6s\n", "size(B)", "auto", "mpi", "ratio", "pick");
  for (int s = 0; s < nsum; s++)
    printf("%12.0f %10.3f %10.3f %7.2f %6s\n", sum_bytes[s], sum_auto[s], sum_mpi[s],
           sum_mpi[s] > 0 ? sum_auto[s] / sum_mpi[s] : 0.0, sum_pick[s]);
}

int hora_bench_allreduce(int argc, char **argv) {
  int64_t minb = 4, maxb = 256ll << 20;
  const char *algos = "ring,shm,hier,auto,mpi", *json = NULL, *dname = "f32", *oname = "sum";
  int iters = 0, warmup = 3, repeat = 1, best = 0;
  const char *P = "hora-bench allreduce", *device = "host";
  uint64_t minu = (uint64_t)minb, maxu = (uint64_t)maxb;
  /* --device cuda takes other options (--only, ...): hand the whole command line over first. */
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--device") && !strcmp(argv[i + 1], "cuda")) return hora__bench_allreduce_cuda(argc, argv);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int rc = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--min-bytes")) rc = opt_bytes(P, argc, argv, &i, 1, BENCH_MAX_BYTES, &minu);
    else if (!strcmp(a, "--max-bytes")) rc = opt_bytes(P, argc, argv, &i, 1, BENCH_MAX_BYTES, &maxu);
    else if (!strcmp(a, "--algo")) rc = (algos = opt_value(P, argc, argv, &i)) ? 0 : OPT_USAGE;
    else if (!strcmp(a, "--dtype")) rc = opt_choice(P, argc, argv, &i, "u8|i8|i32|i64|f16|bf16|f32|f64", &dname);
    else if (!strcmp(a, "--op")) rc = opt_choice(P, argc, argv, &i, "sum|avg|min|max|prod", &oname);
    else if (!strcmp(a, "--iters")) rc = opt_int(P, argc, argv, &i, 0, 100000000, &iters);
    else if (!strcmp(a, "--warmup")) rc = opt_int(P, argc, argv, &i, 0, 1000000, &warmup);
    else if (!strcmp(a, "--repeat")) rc = opt_int(P, argc, argv, &i, 1, 1000000, &repeat);
    else if (!strcmp(a, "--best")) best = 1;
    else if (!strcmp(a, "--json")) rc = (json = opt_value(P, argc, argv, &i)) ? 0 : OPT_USAGE;
    else if (!strcmp(a, "--device")) rc = opt_choice(P, argc, argv, &i, "host|cuda", &device);
    else rc = opt_unknown(P, a);
    if (rc) return rc;
  }
  if (!strcmp(device, "cuda")) return hora__bench_allreduce_cuda(argc, argv);
  minb = (int64_t)minu, maxb = (int64_t)maxu;
  if (maxb < minb) return opt_error(P, "--max-bytes is below --min-bytes");
  int d = -1, op = -1;
  for (int k = 0; k < 8; k++)
    if (!strcmp(dname, dnames[k])) d = k;
  for (int k = 0; k < 5; k++)
    if (!strcmp(oname, onames[k])) op = k;
  algo_sel_t sel[MAX_ALGOS];
  int nsel = parse_algos(algos, sel);
  if (nsel < 0) return 2;

  hora_ctx_t *ctx;
  hora_result_t hr = hora_init(&ctx);
  if (hr != HORA_SUCCESS) {
    fprintf(stderr, "hora-bench allreduce: hora_init: %s\n", hora_last_error());
    return 1;
  }
  int rank = ctx->rank, n = ctx->size;
  hora_dtype_t dt = (hora_dtype_t)d;
  size_t es = hora__dtype_size(dt), maxcount = (size_t)maxb / es;
  char *recv = NULL;
  char *send = bench_buffers(rank, dt, maxcount, &recv);
  FILE *jf = NULL;
  if (json && rank == 0 && !(jf = fopen(json, "w"))) {
    fprintf(stderr, "hora-bench allreduce: cannot write %s\n", json);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  print_header(ctx, d, op, repeat, best);
  double bw_factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  /* Summary: auto vs mpi per size. */
  double sum_bytes[64], sum_auto[64], sum_mpi[64], sum_t[64 * MAX_ALGOS];
  const char *sum_pick[64];
  int nsum = 0;
  double *samples = malloc((size_t)repeat * MAX_ALGOS * sizeof *samples);
  long wrong_total = 0;

  for (size_t bytes = (size_t)minb; bytes <= (size_t)maxb; bytes *= 2) {
    size_t count = bytes / es;
    if (count == 0) continue;
    for (int rep = 0; rep < repeat; rep++)
      for (int k = 0; k < nsel; k++)
        samples[k * repeat + rep] = time_algo(ctx, &sel[k], send, recv, count, dt, (hora_op_t)op, warmup, iters);
    /* The check runs on the output of the last timed call of each algorithm; re-run once per
     * algorithm so each one's own output is checked. */
    for (int k = 0; k < nsel; k++) {
      long all = check_result(ctx, &sel[k], send, recv, count, dt, (hora_op_t)op);
      wrong_total += all;
      qsort(samples + k * repeat, (size_t)repeat, sizeof *samples, cmp_double);
      double t = samples[k * repeat + (best ? 0 : repeat / 2)];
      double algbw = (double)bytes / t / 1e9, busbw = algbw * bw_factor;
      if (rank == 0) {
        printf("%12zu %12zu %9s %6s %6s %11.2f %9.3f %9.3f %7ld\n", bytes, count, tnames[d], onames[op],
               sel[k].name, t * 1e6, algbw, busbw, all);
        if (jf)
          fprintf(jf,
                  "{\"bytes\":%zu,\"count\":%zu,\"dtype\":\"%s\",\"op\":\"%s\",\"algo\":\"%s\",\"time_us\":%.3f,"
                  "\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f,\"wrong\":%ld}\n",
                  bytes, count, dnames[d], onames[op], sel[k].name, t * 1e6, algbw, busbw, all);
      }
      if (nsum < 64) {
        sum_t[nsum * MAX_ALGOS + k] = t;
        if (!strcmp(sel[k].name, "auto") && !sel[k].check) sum_auto[nsum] = busbw;
        if (sel[k].is_mpi) sum_mpi[nsum] = busbw;
      }
    }
    if (nsum < 64) {
      sum_bytes[nsum] = (double)bytes;
      sum_pick[nsum] = hora__algo_name(hora__algo_resolve(ctx, count, dt, HORA_ALGO_AUTO));
      nsum++;
    }
    if (rank == 0) fflush(stdout);
  }
  if (rank == 0) print_summary(sel, nsel, sum_bytes, sum_auto, sum_mpi, sum_pick, nsum);
  if (rank == 0) print_check_cost(sel, nsel, sum_bytes, sum_t, nsum);
  if (rank == 0) printf("# #wrong total: %ld\n", wrong_total);
  if (jf) fclose(jf);
  free(samples);
  free(send);
  free(recv);
  hora_finalize(ctx);
  return wrong_total ? 1 : 0;
}
