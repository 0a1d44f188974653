/* hora-bench launch: how long `srun ... launch -- prog` takes until every rank is past hora_init,
 * against the baseline of srun starting a bare MPI program (MPI_Init) on the same layout.
 *
 *   hora-bench launch [--reps N] [--nodes N] [--tasks-per-node N] [--launch PATH]
 *
 * Runs srun itself (inside an allocation each run is a step; outside, srun also allocates, which
 * adds the same allocation time to both). For each repetition it runs both variants, interleaved:
 *   mpi:  srun --mpi=pmix -N n --ntasks-per-node=t hora-bench launch --probe mpi
 *   hora: srun --mpi=pmix -N n --ntasks-per-node=t launch -- hora-bench launch --probe hora
 * The probe's rank 0 prints the wall-clock time right after a barrier that follows MPI_Init /
 * hora_init, so "ready" is the time from starting srun until all ranks are past init; "total"
 * is until srun exits. Medians over the repetitions; ratios are against the mpi baseline. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "hora.h"

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int probe(const char *kind) {
  int rank = 0;
  if (strcmp(kind, "mpi") == 0) {
    MPI_Init(NULL, NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) printf("PROBE_READY %.6f\n", wall_s());
    fflush(stdout);
    MPI_Finalize();
    return 0;
  }
  hora_ctx_t *ctx = NULL;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  hora_barrier(ctx);
  hora_rank(ctx, &rank);
  if (rank == 0) printf("PROBE_READY %.6f\n", wall_s());
  fflush(stdout);
  hora_finalize(ctx);
  return 0;
}

/* Runs argv, returns 0 and the ready/total seconds since t0. */
static int timed_run(char **argv, double *ready, double *total) {
  int fd[2];
  if (pipe(fd) != 0) return -1;
  double t0 = wall_s();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(fd[1]);
  FILE *f = fdopen(fd[0], "r");
  char line[512];
  *ready = -1;
  while (f && fgets(line, sizeof line, f)) {
    char *p = strstr(line, "PROBE_READY ");
    if (p) *ready = atof(p + 12) - t0;
  }
  if (f) fclose(f);
  int st = 0;
  waitpid(pid, &st, 0);
  *total = wall_s() - t0;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 && *ready > 0 ? 0 : -1;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int hora_bench_launch(int argc, char **argv) {
  int reps = 10, nodes = 2, tpn = 2;
  char self[4096], launch[4096];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k <= 0) return 1;
  self[k] = 0;
  snprintf(launch, sizeof launch, "%.*s/launch", (int)(strrchr(self, '/') - self), self);
  const char *P = "hora-bench launch";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    int rc = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      printf("usage: hora-bench launch [--reps N (10)] [--nodes N (2)] [--tasks-per-node N (2)] [--launch PATH]\n"
             "  inside a Slurm allocation: srun startup with and without launch and hora_init\n");
      return 0;
    }
    if (!strcmp(a, "--probe")) {
      if (!(v = opt_value(P, argc, argv, &i))) return OPT_USAGE;
      return probe(v);
    }
    if (!strcmp(a, "--reps")) rc = opt_int(P, argc, argv, &i, 1, 1000, &reps);
    else if (!strcmp(a, "--nodes")) rc = opt_int(P, argc, argv, &i, 1, 100000, &nodes);
    else if (!strcmp(a, "--tasks-per-node")) rc = opt_int(P, argc, argv, &i, 1, 4096, &tpn);
    else if (!strcmp(a, "--launch")) {
      if (!(v = opt_value(P, argc, argv, &i))) return OPT_USAGE;
      snprintf(launch, sizeof launch, "%s", v);
    } else rc = opt_unknown(P, a);
    if (rc) return rc;
  }
  char a_n[32], a_t[48];
  snprintf(a_n, sizeof a_n, "--nodes=%d", nodes);
  snprintf(a_t, sizeof a_t, "--ntasks-per-node=%d", tpn);
  char *mpi_cmd[] = {"srun", "--mpi=pmix", a_n, a_t, self, "launch", "--probe", "mpi", NULL};
  char *lmpi_cmd[] = {"srun", "--mpi=pmix", a_n, a_t, launch, "--", self, "launch", "--probe", "mpi", NULL};
  char *hora_cmd[] = {"srun", "--mpi=pmix", a_n, a_t, launch, "--", self, "launch", "--probe", "hora", NULL};
  char **cmds[3] = {mpi_cmd, lmpi_cmd, hora_cmd};
  const char *names[3] = {"srun + MPI_Init (baseline)", "srun + launch + MPI_Init", "srun + launch + hora_init"};
  double *r[3], *t[3];
  for (int v = 0; v < 3; v++) {
    r[v] = calloc((size_t)reps, sizeof(double));
    t[v] = calloc((size_t)reps, sizeof(double));
  }
  printf("launch startup: %d node(s) x %d task(s), %d repetitions, %s\n", nodes, tpn, reps,
         getenv("SLURM_JOB_ID") ? "steps inside an allocation" : "srun allocating each run");
  for (int i = 0; i < reps; i++) {
    for (int v = 0; v < 3; v++) {
      if (timed_run(cmds[v], &r[v][i], &t[v][i]) != 0) {
        fprintf(stderr, "hora-bench launch: the run '%s' failed\n", names[v]);
        return 1;
      }
    }
  }
  printf("%-30s %10s %10s %14s\n", "variant", "ready (s)", "total (s)", "ready ratio");
  for (int v = 0; v < 3; v++) {
    double mr = median(r[v], reps), mt = median(t[v], reps);
    static double base = 0;
    if (v == 0) base = mr;
    printf("%-30s %10.3f %10.3f %13.2fx\n", names[v], mr, mt, mr / base);
  }
  for (int v = 0; v < 3; v++) {
    free(r[v]);
    free(t[v]);
  }
  return 0;
}
