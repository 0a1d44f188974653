/* hora-bench: benchmarks that print ratios against a baseline measured in the same run.
 *   hora-bench allreduce|fusion|ckpt|records|launch [options]   (see docs/benchmarks.md)
 * Each subcommand lives in its own file (bench_<name>.c) and defines hora_bench_<name>(). */
#include <stdio.h>
#include <string.h>

#include "bench.h"

#define SUBCOMMANDS(X) X(allreduce) X(fusion) X(ckpt) X(records) X(launch)

#define X(n) int hora_bench_##n(int argc, char **argv) __attribute__((weak));
SUBCOMMANDS(X)
#undef X

static void usage(FILE *f) {
  fprintf(f, "usage: hora-bench <benchmark> [options]\nbenchmarks:");
#define X(n) \
  if (hora_bench_##n) fprintf(f, " " #n);
  SUBCOMMANDS(X)
#undef X
  fprintf(f, "\nrun `hora-bench <benchmark> --help` for its options\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
#define X(n) \
  if (strcmp(argv[1], #n) == 0 && hora_bench_##n) return hora_bench_##n(argc - 1, argv + 1);
  SUBCOMMANDS(X)
#undef X
  fprintf(stderr, "hora-bench: unknown benchmark '%s' (see hora-bench --help)\n", argv[1]);
  return 2;
}
