/* hora-bench records: read throughput of the record reader against two baselines measured in
 * the same run on the same images:
 *   plain  - read() of the same shard files in 1 MiB chunks, nothing else (`cat > /dev/null`)
 *   small  - the same images as one file each (the many-small-files layout), open/read/close
 *   reader - hora_records_reader (prefetch thread, CRC checks), every record touched
 * Each rank reads its shard (by file, as the reader shards them); with several ranks (mpirun)
 * the bytes are summed over the time from the first start to the last end. "cold" runs evict the files from the
 * page cache first (posix_fadvise DONTNEED; a VM's host may still cache them), "warm" runs read
 * them from the page cache.
 * The many-small-files layout holds the first --small-files images (default 20000: creating and
 * reading hundreds of thousands of files takes minutes); its rate is bytes per second all the same.
 *   hora-bench records [--dir DIR] [--records N] [--record-bytes B] [--shards S] [--repeat R]
 *                      [--small-files N]
 *                      [--shuffle K] [--cache warm|cold|both] [--json]
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "hora.h"

typedef struct {
  const char *dir;
  long records, record_bytes, shards, repeat, small; /* small: images kept as single files */
  size_t shuffle;
  int json, warm, cold;
} args_t;

static void small_path(const args_t *a, long i, char *out, size_t n) {
  snprintf(out, n, "%s/small/%03ld/%07ld.bin", a->dir, i / 1000, i);
}
static void shard_path(const args_t *a, long s, char *out, size_t n) {
  snprintf(out, n, "%s/shard-%05ld-of-%05ld.tfrecord", a->dir, s, a->shards);
}

static void fill(unsigned char *buf, long i, long n) {
  uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + 1;
  for (long k = 0; k < n; k++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    buf[k] = (unsigned char)x;
  }
}

/* Rank 0 writes the data set unless a marker says it is there with the same parameters. */
static int make_data(const args_t *a) {
  char marker[4096], want[256], have[256] = "";
  snprintf(marker, sizeof marker, "%s/params", a->dir);
  snprintf(want, sizeof want, "%ld %ld %ld %ld\n", a->records, a->record_bytes, a->shards, a->small);
  FILE *f = fopen(marker, "r");
  if (f) {
    if (!fgets(have, sizeof have, f)) have[0] = 0;
    fclose(f);
    if (strcmp(have, want) == 0) return 0;
  }
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s/small'", a->dir, a->dir);
  if (system(cmd) != 0) return -1;
  unsigned char *buf = malloc((size_t)a->record_bytes);
  if (!buf) return -1;
  double t0 = bench_now_s();
  for (long s = 0; s < a->shards; s++) {
    char p[4200];
    shard_path(a, s, p, sizeof p);
    hora_records_writer_t *w;
    if (hora_records_writer_open(p, &w) != HORA_SUCCESS) return -1;
    for (long i = a->records * s / a->shards; i < a->records * (s + 1) / a->shards; i++) {
      fill(buf, i, a->record_bytes);
      if (hora_records_writer_write(w, buf, (size_t)a->record_bytes) != HORA_SUCCESS) return -1;
    }
    if (hora_records_writer_close(w) != HORA_SUCCESS) return -1;
  }
  for (long i = 0; i < a->small; i++) {
    char p[4200];
    small_path(a, i, p, sizeof p);
    if (i % 1000 == 0) {
      char d[4200];
      snprintf(d, sizeof d, "%s/small/%03ld", a->dir, i / 1000);
      mkdir(d, 0755);
    }
    fill(buf, i, a->record_bytes);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, buf, (size_t)a->record_bytes) != a->record_bytes) return -1;
    close(fd);
  }
  free(buf);
  sync();
  f = fopen(marker, "w");
  if (!f) return -1;
  fputs(want, f);
  fclose(f);
  fprintf(stderr, "hora-bench records: wrote the data set to %s in %.1f s\n", a->dir, bench_now_s() - t0);
  return 0;
}

static void evict(const char *p) {
  int fd = open(p, O_RDONLY);
  if (fd < 0) return;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

static void evict_mine(const args_t *a, int rank, int size) {
  char p[4200];
  for (long s = rank; s < a->shards; s += size) {
    shard_path(a, s, p, sizeof p);
    evict(p);
  }
  for (long i = rank; i < a->small; i += size) {
    small_path(a, i, p, sizeof p);
    evict(p);
  }
}

/* Each measure returns bytes read by this rank, or -1 on error. */
static long long run_plain(const args_t *a, int rank, int size) {
  static unsigned char buf[1 << 20];
  long long bytes = 0;
  for (long s = rank; s < a->shards; s += size) {
    char p[4200];
    shard_path(a, s, p, sizeof p);
    int fd = open(p, O_RDONLY);
    if (fd < 0) return -1;
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) bytes += n;
    close(fd);
    if (n < 0) return -1;
  }
  return bytes;
}

static long long run_small(const args_t *a, int rank, int size) {
  unsigned char *buf = malloc((size_t)a->record_bytes);
  long long bytes = 0;
  unsigned sum = 0;
  for (long i = rank; i < a->small; i += size) {
    char p[4200];
    small_path(a, i, p, sizeof p);
    int fd = open(p, O_RDONLY);
    if (fd < 0) {
      free(buf);
      return -1;
    }
    ssize_t n = read(fd, buf, (size_t)a->record_bytes);
    close(fd);
    if (n != a->record_bytes) {
      free(buf);
      return -1;
    }
    sum += buf[0];
    bytes += n + 16; /* counted like a framed record, so both layouts move the same "bytes" */
  }
  free(buf);
  if (sum == 0xFFFFFFFFu) fprintf(stderr, " ");
  return bytes;
}

static long long run_reader(const args_t *a, int rank, int size) {
  char pat[4200];
  snprintf(pat, sizeof pat, "%s/shard-*.tfrecord", a->dir);
  const char *pp = pat;
  hora_records_reader_opts_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.patterns = &pp;
  o.pattern_count = 1;
  o.rank = rank;
  o.world_size = size;
  o.shuffle_buffer = a->shuffle;
  o.seed = 1;
  hora_records_reader_t *r;
  if (hora_records_reader_open(&o, &r) != HORA_SUCCESS) return -1;
  long long bytes = 0;
  unsigned sum = 0;
  for (;;) {
    const void *d;
    size_t len;
    int eof;
    if (hora_records_next(r, &d, &len, &eof) != HORA_SUCCESS) {
      hora_records_reader_close(r);
      return -1;
    }
    if (eof) break;
    sum += ((const unsigned char *)d)[len - 1];
    bytes += (long long)len + 16;
  }
  hora_records_reader_close(r);
  if (sum == 0xFFFFFFFFu) fprintf(stderr, " ");
  return bytes;
}

typedef long long (*measure_fn)(const args_t *, int, int);

/* GB/s of one run of fn: all ranks' bytes over the time from the first rank's start to the last
 * rank's end (CLOCK_MONOTONIC is one clock for the processes of a node). Across nodes the
 * slowest rank's own time is used instead. The span matters when ranks share cores: each rank's
 * own time then leaves out the slices it spent waiting for a core, and a run of 4 ranks on 2
 * cores would seem to read at twice the speed two cores can copy. */
static double run_once(hora_ctx_t *ctx, const args_t *a, measure_fn fn, int cold, int rank, int size,
                       int one_node) {
  if (cold) evict_mine(a, rank, size);
  hora_barrier(ctx);
  double t0 = bench_now_s();
  long long b = fn(a, rank, size);
  double t1 = bench_now_s(), dt = t1 - t0, tmax = 0;
  long long btot = 0;
  if (b < 0) {
    fprintf(stderr, "hora-bench records: rank %d: read failed: %s\n", rank, hora_last_error());
    b = 0;
  }
  if (one_node) {
    double se[2] = {-t0, t1}, g[2];
    MPI_Allreduce(se, g, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    tmax = g[1] + g[0]; /* last end - first start */
  } else {
    MPI_Allreduce(&dt, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  }
  MPI_Allreduce(&b, &btot, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return btot / tmax / 1e9;
}

static double median_of(double *v, long n) {
  for (long i = 1; i < n; i++)
    for (long j = i; j > 0 && v[j] < v[j - 1]; j--) {
      double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  return v[n / 2];
}

/* Median GB/s of each of the nm modes over a->repeat rounds; every round runs the modes one
 * after the other, so a disk whose speed drifts (a VM's burst budget, other jobs) affects all
 * of them alike instead of whichever mode ran last. */
static void measure(hora_ctx_t *ctx, const args_t *a, const measure_fn *fns, int nm, int cold, int rank, int size,
                    double *out) {
  MPI_Comm node;
  int node_size = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  int one_node = node_size == size;
  double rates[3][32];
  long rep = a->repeat < 32 ? a->repeat : 32;
  if (!cold)
    for (int m = 0; m < nm; m++) fns[m](a, rank, size); /* warm the page cache */
  for (long k = 0; k < rep; k++)
    for (int m = 0; m < nm; m++) rates[m][k] = run_once(ctx, a, fns[m], cold, rank, size, one_node);
  for (int m = 0; m < nm; m++) out[m] = median_of(rates[m], rep);
}

int hora_bench_records(int argc, char **argv) {
  args_t a = {.records = 65536, .record_bytes = 785, .shards = 8, .repeat = 3, .warm = 1, .cold = 1};
  char defdir[4096];
  const char *tmp = getenv("TMPDIR");
  snprintf(defdir, sizeof defdir, "%s/hora-bench-records", tmp && *tmp ? tmp : "/tmp");
  a.dir = defdir;
  const char *P = "hora-bench records", *cache = "both";
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    int rc = 0;
    if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
      printf("usage: hora-bench records [--dir DIR] [--records N] [--record-bytes B] [--shards S]\n"
             "                          [--small-files N (default min(records, 20000))]\n"
             "                          [--repeat R] [--shuffle K] [--cache warm|cold|both] [--json]\n"
             "  run under mpirun -np P for P ranks reading disjoint shards; S <= N <= 100000000,\n"
             "  N x B <= 64 GiB\n");
      return 0;
    }
    if (!strcmp(o, "--dir")) rc = (a.dir = opt_value(P, argc, argv, &i)) ? 0 : OPT_USAGE;
    else if (!strcmp(o, "--records")) rc = opt_long(P, argc, argv, &i, 1, 100000000, &a.records);
    else if (!strcmp(o, "--record-bytes")) rc = opt_long(P, argc, argv, &i, 1, 1L << 30, &a.record_bytes);
    else if (!strcmp(o, "--shards")) rc = opt_long(P, argc, argv, &i, 1, 99999, &a.shards);
    else if (!strcmp(o, "--small-files")) rc = opt_long(P, argc, argv, &i, 0, 1000000, &a.small);
    else if (!strcmp(o, "--repeat")) rc = opt_long(P, argc, argv, &i, 1, 32, &a.repeat);
    else if (!strcmp(o, "--shuffle")) {
      uint64_t v = 0;
      rc = opt_u64(P, argc, argv, &i, 0, 100000000, &v);
      a.shuffle = (size_t)v;
    } else if (!strcmp(o, "--json")) a.json = 1;
    else if (!strcmp(o, "--cache")) rc = opt_choice(P, argc, argv, &i, "warm|cold|both", &cache);
    else rc = opt_unknown(P, o);
    if (rc) return rc;
  }
  a.warm = !strcmp(cache, "warm") || !strcmp(cache, "both");
  a.cold = !strcmp(cache, "cold") || !strcmp(cache, "both");
  if (a.small == 0) a.small = a.records < 20000 ? a.records : 20000;
  if (a.small > a.records) a.small = a.records;
  if (a.shards > a.records)
    return opt_error(P, "--shards %ld is more than --records %ld (every shard needs a record)", a.shards,
                     a.records);
  if ((uint64_t)a.records * (uint64_t)a.record_bytes > BENCH_MAX_BYTES)
    return opt_error(P, "--records %ld x --record-bytes %ld is more than 64 GiB", a.records, a.record_bytes);
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora-bench records: hora_init: %s\n", hora_last_error());
    return 1;
  }
  int rank, size;
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);
  int bad = 0;
  if (rank == 0) bad = make_data(&a) != 0;
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (bad) {
    if (rank == 0) fprintf(stderr, "hora-bench records: cannot write the data set in %s\n", a.dir);
    hora_finalize(ctx);
    return 1;
  }
  struct {
    const char *name;
    measure_fn fn;
  } modes[] = {{"plain", run_plain}, {"reader", run_reader}, {"small", run_small}};
  double gbps[2][3] = {{0}};
  int want[2] = {a.warm, a.cold}, first = 1;
  const measure_fn fns[3] = {modes[0].fn, modes[1].fn, modes[2].fn};
  for (int cold = 0; cold < 2; cold++)
    if (want[cold]) measure(ctx, &a, fns, 3, cold, rank, size, gbps[cold]);
  if (rank == 0) {
    double mb = a.records * (double)(a.record_bytes + 16) / 1e6;
    if (a.json) {
      printf("{\"benchmark\":\"records\",\"ranks\":%d,\"small_files\":%ld,\"records\":%ld,\"record_bytes\":%ld,\"shards\":%ld,"
             "\"shuffle\":%zu,\"repeat\":%ld,\"results\":[",
             size, a.small, a.records, a.record_bytes, a.shards, a.shuffle, a.repeat);
      for (int cold = 0; cold < 2; cold++)
        for (int m = 0; m < 3 && want[cold]; m++, first = 0)
          printf("%s{\"cache\":\"%s\",\"mode\":\"%s\",\"GBps\":%.4f,\"vs_plain\":%.4f}", first ? "" : ",",
                 cold ? "cold" : "warm", modes[m].name, gbps[cold][m], gbps[cold][m] / gbps[cold][0]);
      printf("]}\n");
    } else {
      printf("# hora-bench records: %d rank%s, %ld records x %ld B (%.1f MB) in %ld shards (%ld as single files), shuffle %zu, median of %ld\n",
             size, size == 1 ? "" : "s", a.records, a.record_bytes, mb, a.shards, a.small, a.shuffle, a.repeat);
      printf("%-6s %-8s %10s %10s\n", "cache", "mode", "GB/s", "vs plain");
      for (int cold = 0; cold < 2; cold++)
        for (int m = 0; m < 3 && want[cold]; m++)
          printf("%-6s %-8s %10.3f %9.2fx\n", cold ? "cold" : "warm", modes[m].name, gbps[cold][m],
                 gbps[cold][m] / gbps[cold][0]);
    }
  }
  hora_finalize(ctx);
  return 0;
}
