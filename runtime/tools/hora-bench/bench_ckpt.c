/* hora-bench ckpt: what a checkpoint costs the training loop, against baselines measured in the
 * same run on the same disk with the same bytes:
 *   async_stall_ms  time hora_ckpt_save blocks the caller (the snapshot copy into staging)
 *   sync_write_ms   baseline: write() of the same bytes to a file in the same directory + fsync
 *                   (what a training loop that saves synchronously waits for)
 *   copier_gbs      the copier's throughput local_dir -> persist_dir (read, CRC32C, write, fsync,
 *                   read back and verify, rename, manifest)
 *   cp_gbs          baseline: `cp SRC DST && sync DST` of the same file between the same dirs
 * Each figure is the median of --reps repetitions; the baselines alternate with hora's runs, and
 * each copy (hora's and cp's) starts after a sync and a 0.5 s pause, so both see a quiet disk.
 *   hora-bench ckpt [--state-mib N] [--tensors K] [--dir DIR] [--persist-dir DIR] [--reps R]
 *                   [--json FILE]
 * Targets (docs/benchmarks.md): async_stall_ms / sync_write_ms <= 0.1, copier_gbs / cp_gbs >= 0.9. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

#include "bench.h"
#include "ckpt/ckpt.h"
#include "hora.h"

/* free() of each pointer of a list (the result arrays of the run, released on every exit). */
static void free_list(void *const *p, size_t n) {
  for (size_t i = 0; i < n; i++) free(p[i]);
}
#define FREE_ALL(...) free_list((void *const[]){__VA_ARGS__}, sizeof((void *[]){__VA_ARGS__}) / sizeof(void *))

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* write() + fsync of the tensors' bytes to a new file; seconds. */
static double sync_write(const char *path, void **bufs, const size_t *bytes, int k) {
  double t0 = bench_now_s();
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  for (int i = 0; i < k; i++)
    if (hora__ck_write_all(fd, bufs[i], bytes[i], path) != HORA_SUCCESS) {
      close(fd);
      return -1;
    }
  if (fsync(fd) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  double dt = bench_now_s() - t0;
  unlink(path);
  return dt;
}

/* Bytes that do not compress, every page touched (xorshift64 from a per-tensor seed). */
static void fill_random(unsigned char *c, size_t n, uint64_t seed) {
  uint64_t x = 0x9E3779B97F4A7C15ull + seed;
  for (size_t j = 0; j < n; j++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c[j] = (unsigned char)x;
  }
}

/* The medians the benchmark reports. */
typedef struct {
  double s_ms, w_ms, bg_ms, copier_gbs, cp_gbs, pair_ratio;
  uint64_t file_bytes;
} results_t;

/* The table on stdout, and the JSON line when asked for. Non-zero when the JSON file fails. */
static int report(const results_t *x, size_t total, long mib, long k, long reps, const char *L, const char *P,
                  const char *json) {
  char sz[32];
  printf("hora-bench ckpt: %s of state in %ld tensors, local_dir %s, persist_dir %s, median of %ld\n",
         bench_fmt_size(total, sz, sizeof sz), k, L, P, reps);
  printf("  %-44s %10.1f ms\n", "sync write + fsync (baseline)", x->w_ms);
  printf("  %-44s %10.1f ms   ratio %.3f (target <= 0.1)\n", "hora_ckpt_save stall (async_stall_ms)", x->s_ms,
         x->s_ms / x->w_ms);
  printf("  %-44s %10.1f ms\n", "background write + fsync + verify", x->bg_ms);
  printf("  %-44s %10.3f GB/s\n", "cp + sync (baseline)", x->cp_gbs);
  printf("  %-44s %10.3f GB/s ratio %.3f (target >= 0.9)\n", "copier (copier_gbs)", x->copier_gbs,
         x->copier_gbs / x->cp_gbs);
  printf("  %-44s %10.3f\n", "median of the per-repetition copy ratios", x->pair_ratio);
  if (!json) return 0;
  FILE *f = fopen(json, "w");
  if (!f) {
    fprintf(stderr, "hora-bench ckpt: cannot write %s: %s\n", json, strerror(errno));
    return 1;
  }
  fprintf(f, "{\"benchmark\":\"ckpt\",\"state_mib\":%ld,\"tensors\":%ld,\"reps\":%ld,\"file_bytes\":%" PRIu64
          ",\"async_stall_ms\":%.3f,\"sync_write_ms\":%.3f,\"stall_ratio\":%.4f,\"background_write_ms\":%.3f,"
          "\"copier_gbs\":%.4f,\"cp_gbs\":%.4f,\"copy_ratio\":%.4f,\"copy_ratio_paired\":%.4f}\n", mib, k, reps,
          x->file_bytes, x->s_ms, x->w_ms, x->s_ms / x->w_ms, x->bg_ms, x->copier_gbs, x->cp_gbs,
          x->copier_gbs / x->cp_gbs, x->pair_ratio);
  fclose(f);
  return 0;
}

/* One repetition's copy comparison: hora's copier (flush, collective; timed inside the copier)
 * and, on rank 0, cp + sync of the same committed file. Both start from the same state: the local
 * write is committed, everything dirty is written back (sync) and the disk had a moment to settle.
 * Which goes first alternates with r, so neither always follows the other's writeback. Sets
 * *failed when the collective flush fails (the same on every rank), *local_failed when rank 0's
 * cp fails. */
static void copy_pair(hora_ckpt_t *ck, int rank, long r, const char *L, const char *P, double *wr, double *cop,
                      double *cp, uint64_t *file_bytes, int *failed, int *local_failed) {
  if (rank == 0) hora__ck_wait_written(ck);
  char cmd[14000], src[4400], dst[4400];
  snprintf(src, sizeof src, "%s/step-%ld/%s", L, r + 1, CK_DATA);
  snprintf(dst, sizeof dst, "%s/cp-baseline.safetensors", P);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s' && sync '%s'", src, dst, dst);
  for (int phase = 0; phase < 2; phase++) {
    sync();
    usleep(500 * 1000);
    if ((phase == 0) == (r % 2 == 0)) {
      if (hora_ckpt_flush(ck) != HORA_SUCCESS) *failed = 1;
      if (rank == 0) hora__ck_stats(ck, NULL, wr, cop, file_bytes);
    } else if (rank == 0) {
      double t0 = bench_now_s();
      if (system(cmd) != 0) *local_failed = 1;
      *cp = bench_now_s() - t0;
      unlink(dst);
    }
  }
}

/* cp / copier time of each repetition (the two ran back to back), then the median. */
static double paired_ratio(const double *cp, const double *cop, long reps) {
  double *pair = calloc((size_t)reps, sizeof(double));
  if (!pair) return 0;
  for (long r = 0; r < reps; r++) pair[r] = cp[r] / cop[r];
  double m = median(pair, (int)reps);
  free(pair);
  return m;
}

/* The command line. 0, or the exit status (0 for --help after the usage, 2 after a message). */
typedef struct {
  long mib, k, reps;
  const char *dir, *pdir, *json;
} args_t;

static int parse_args(int argc, char **argv, args_t *o, int *done) {
  const char *PROG = "hora-bench ckpt";
  *done = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int rc = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      printf("usage: hora-bench ckpt [--state-mib N (256)] [--tensors K (8)] [--dir DIR] [--persist-dir DIR]\n"
             "                       [--reps R (3)] [--json FILE]\n"
             "  DIR: local_dir (default $TMPDIR or /tmp, hora-bench-ckpt-PID/local); persist-dir defaults to\n"
             "  a sibling on the same disk. N <= 65536 (64 GiB), K <= 100000 and K <= N MiB.\n"
             "  Rank 0 checkpoints (hora_ckpt_save is rank 0's); under mpirun the other ranks wait.\n");
      *done = 1;
      return 0;
    }
    if (!strcmp(a, "--state-mib")) rc = opt_long(PROG, argc, argv, &i, 1, 65536, &o->mib);
    else if (!strcmp(a, "--tensors")) rc = opt_long(PROG, argc, argv, &i, 1, 100000, &o->k);
    else if (!strcmp(a, "--reps")) rc = opt_long(PROG, argc, argv, &i, 1, 1000, &o->reps);
    else if (!strcmp(a, "--dir")) rc = (o->dir = opt_value(PROG, argc, argv, &i)) ? 0 : OPT_USAGE;
    else if (!strcmp(a, "--persist-dir")) rc = (o->pdir = opt_value(PROG, argc, argv, &i)) ? 0 : OPT_USAGE;
    else if (!strcmp(a, "--json")) rc = (o->json = opt_value(PROG, argc, argv, &i)) ? 0 : OPT_USAGE;
    else rc = opt_unknown(PROG, a);
    if (rc) return rc;
  }
  if ((uint64_t)o->k > ((uint64_t)o->mib << 20))
    return opt_error(PROG, "--tensors %ld is more than the bytes of --state-mib %ld", o->k, o->mib);
  return 0;
}

int hora_bench_ckpt(int argc, char **argv) {
  args_t a = {256, 8, 3, NULL, NULL, NULL};
  int done = 0, prc = parse_args(argc, argv, &a, &done);
  if (prc || done) return prc;
  long mib = a.mib, k = a.k, reps = a.reps;
  const char *dir = a.dir, *pdir = a.pdir, *json = a.json;
  char base[4096], L[4200], P[4200], syncf[4300];
  const char *tmp = getenv("TMPDIR");
  snprintf(base, sizeof base, "%s/hora-bench-ckpt-%ld", tmp && *tmp ? tmp : "/tmp", (long)getpid());
  snprintf(L, sizeof L, "%s/local", dir ? dir : base);
  snprintf(P, sizeof P, "%s", pdir ? pdir : "");
  if (!pdir) snprintf(P, sizeof P, "%s/persist", dir ? dir : base);
  snprintf(syncf, sizeof syncf, "%s/sync-baseline.bin", L);

  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora-bench ckpt: hora_init: %s\n", hora_last_error());
    return 1;
  }
  /* hora_ckpt_* are collective and only rank 0's tensors and directories are used: rank 0 holds
   * the state, runs the baselines and prints; the other ranks make the same collective calls
   * with no tensors, so the benchmark runs at any rank count (mpirun -np N). */
  int rank = 0;
  hora_rank(ctx, &rank);
  size_t total = (size_t)mib << 20;
  if (rank != 0) k = 0;
  void **bufs = calloc((size_t)k + 1, sizeof *bufs);
  size_t *bytes = calloc((size_t)k + 1, sizeof *bytes);
  hora_tensor_t *t = calloc((size_t)k + 1, sizeof *t);
  char (*names)[32] = calloc((size_t)k + 1, sizeof *names);
  int oom = !bufs || !bytes || !t || !names;
  for (long i = 0; i < k && !oom; i++) {
    bytes[i] = total / (size_t)k + (i == k - 1 ? total % (size_t)k : 0);
    bufs[i] = malloc(bytes[i]);
    if (!bufs[i]) {
      oom = 1;
      break;
    }
    fill_random(bufs[i], bytes[i], (uint64_t)i);
    snprintf(names[i], sizeof names[i], "layer%ld/w", i);
    t[i] = (hora_tensor_t){names[i], bufs[i], bytes[i], HORA_UINT8, HORA_DEVICE_HOST, 0, NULL};
  }
  /* Every rank learns whether rank 0 has the memory before the first collective call. */
  int any_oom = 0;
  MPI_Allreduce(&oom, &any_oom, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_oom) {
    if (oom) fprintf(stderr, "hora-bench ckpt: out of memory for %ld MiB of state in %ld tensors\n", mib, k);
    hora_finalize(ctx);
    return 1;
  }
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = L;
  o.persist_dir = P;
  o.copy_interval_s = 1e9; /* copies only when flushed: the phases are timed one at a time */
  hora_ckpt_t *ck;
  if (hora_ckpt_open(ctx, &o, &ck) != HORA_SUCCESS) {
    fprintf(stderr, "hora-bench ckpt: %s\n", hora_last_error());
    return 1;
  }
  double *stall = calloc((size_t)reps, sizeof(double)), *syncw = calloc((size_t)reps, sizeof(double));
  double *wr = calloc((size_t)reps, sizeof(double)), *cop = calloc((size_t)reps, sizeof(double));
  double *cp = calloc((size_t)reps, sizeof(double));
  uint64_t file_bytes = 0;
  int failed = 0, local_failed = 0; /* failed: a collective call failed (the same on every rank) */
  /* Warm-up save: the staging buffer is allocated once and reused by later saves. */
  if (hora_ckpt_save(ck, 0, t, (size_t)k, NULL, 0) != HORA_SUCCESS || hora_ckpt_flush(ck) != HORA_SUCCESS) {
    fprintf(stderr, "hora-bench ckpt: %s\n", hora_last_error());
    return 1;
  }
  for (long r = 0; r < reps && !failed; r++) {
    /* The baseline alternates between before and after hora's save, so that neither always
     * follows the other's deletes and writeback on a shared disk. */
    if (r % 2 == 0 && rank == 0) syncw[r] = sync_write(syncf, bufs, bytes, (int)k);
    double t0 = bench_now_s();
    if (hora_ckpt_save(ck, r + 1, t, (size_t)k, NULL, 0) != HORA_SUCCESS) failed = 1;
    stall[r] = bench_now_s() - t0;
    copy_pair(ck, rank, r, L, P, &wr[r], &cop[r], &cp[r], &file_bytes, &failed, &local_failed);
    if (r % 2 == 1 && rank == 0) syncw[r] = sync_write(syncf, bufs, bytes, (int)k);
    if (syncw[r] < 0) local_failed = 1;
    if (rank == 0 && !failed && !local_failed && cop[r] > 0 && cp[r] > 0)
      printf("  rep %ld: copier %.3f GB/s, cp %.3f GB/s (%s first)\n", r + 1, (double)file_bytes / cop[r] / 1e9,
             (double)file_bytes / cp[r] / 1e9, r % 2 == 0 ? "copier" : "cp");
  }
  int any_local = 0;
  MPI_Allreduce(&local_failed, &any_local, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed || any_local) {
    if (rank == 0) fprintf(stderr, "hora-bench ckpt: a step failed: %s\n", failed ? hora_last_error() : "a baseline (cp or write) failed");
    hora_ckpt_close(ck);
    hora_finalize(ctx);
    return 1;
  }
  if (rank != 0) {
    hora_ckpt_close(ck);
    hora_finalize(ctx);
    FREE_ALL(bufs, bytes, t, names, stall, syncw, wr, cop, cp);
    return 0;
  }
  results_t res = {median(stall, (int)reps) * 1e3, median(syncw, (int)reps) * 1e3, median(wr, (int)reps) * 1e3,
                   0, 0, paired_ratio(cp, cop, reps), file_bytes};
  res.copier_gbs = (double)file_bytes / median(cop, (int)reps) / 1e9;
  res.cp_gbs = (double)file_bytes / median(cp, (int)reps) / 1e9;
  if (report(&res, total, mib, k, reps, L, P, json) != 0) return 1;
  hora_ckpt_close(ck);
  hora_finalize(ctx);
  if (!dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd) != 0) fprintf(stderr, "hora-bench ckpt: could not remove %s\n", base);
  }
  for (long i = 0; i < k; i++) free(bufs[i]);
  FREE_ALL(bufs, bytes, t, names, stall, syncw, wr, cop, cp);
  return 0;
}
