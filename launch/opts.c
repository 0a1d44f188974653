/* launch's command line: "--opt value" and "--opt=value"; the program starts at the first
 * argument that is not an option, or after "--". Every mistake is one error line (exit 2). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

#ifndef LAUNCH_VERSION
#define LAUNCH_VERSION "0"
#endif

static void usage(FILE *f) {
  fprintf(f,
          "usage: launch [options] [--] program [args...]\n"
          "  inside srun:        srun --mpi=pmix launch [options] -- ./train\n"
          "  in a batch script:  launch -np 8 ./train        (runs srun itself)\n"
          "  without Slurm:      launch -np 4 ./train | launch -H host1:4,host2:4 ./train (runs mpirun)\n"
          "options:\n"
          "  -np, -n N                  number of ranks, 1..%d (allocation and local modes)\n"
          "  -H, --hosts h1:n1,h2:n2    hosts and slots (local mode)\n"
          "  -hostfile, --hostfile FILE  the same from a file of \"host slots=N\" lines\n"
          "  --gpus-per-rank N          GPUs per rank (default 1 when the node has GPUs, else 0)\n"
          "  --allow-gpu-sharing        let more ranks than GPUs share them round-robin\n"
          "  --bind none|cores|gpu      CPU binding (default gpu with GPUs, else cores)\n"
          "  --gpus LIST                the node's GPU list, instead of SLURM_*GPUS/CUDA_VISIBLE_DEVICES\n"
          "  --narrow-visible-devices   set CUDA_VISIBLE_DEVICES to the rank's own GPUs (off: breaks CUDA IPC)\n"
          "  --topology FILE|synthetic:DESC  plan with this hwloc topology (tests; binds nothing)\n"
          "  --dry-run                  print the plan as one JSON object per rank, start nothing\n"
          "  --output-dir DIR           append each rank's output to DIR/rank.<rank>.log\n"
          "  --no-tag-output            do not prefix output lines with \"[rank] \"\n"
          "  --allow-no-pmi             start the program even when the srun step has no PMI\n"
          "  --mpirun                   use mpirun even inside a Slurm allocation\n"
          "  --kill-after S             when a rank fails in an srun step: SIGTERM to the step, SIGKILL\n"
          "                             S seconds later if it still runs (default %d, 0..3600)\n"
          "  --elastic                  (in a batch script) run the program as an elastic job: a new srun\n"
          "                             step on the usable nodes after a rank or node is lost, and when\n"
          "                             nodes come back (docs/elastic.md)\n"
          "  --min-nodes N, --max-nodes N  bounds of an elastic job's node count (default 1 and all)\n"
          "  --max-restarts N           new steps an elastic job may start (default %d)\n"
          "  --elastic-wait S           wait this long for --min-nodes usable nodes (default %d s)\n"
          "  -v, --verbose              print the plan of each rank on stderr\n"
          "  -h, --help, --version\n"
          "horovodrun's tuning options (they set hora's HORA_* variables for every rank):\n"
          "  --fusion-threshold-mb MB, --cycle-time-ms MS, --cache-capacity N,\n"
          "  --timeline-filename PATH, --timeline-mark-cycles, --no-stall-check,\n"
          "  --stall-check-warning-time-seconds S, --stall-check-shutdown-time-seconds S,\n"
          "  --log-level trace|debug|info|warning|error|fatal, --start-timeout S,\n"
          "  --mpi-args \"ARGS\" (local mode's mpirun); accepted without effect: --autotune (warns),\n"
          "  --[no-]hierarchical-allreduce, --[no-]hierarchical-allgather, --mpi, --disable-cache\n",
          LAUNCH_MAX_RANKS, LAUNCH_KILL_AFTER_S, LAUNCH_ELASTIC_RESTARTS, LAUNCH_ELASTIC_WAIT_S);
}

/* A decimal number in [min, max] for option `name`; one error line when it is not. */
static int opt_number(const char *name, const char *val, int min, int max, int *out) {
  size_t n = strlen(val);
  if (n == 0 || strspn(val, "0123456789") != n) {
    launch_error("option %s: '%s' is not a number", name, val);
    return -1;
  }
  if (launch_parse_uint(val, max, out) != 0 || *out < min) {
    launch_error("option %s: %s is out of range (%d..%d)", name, val, min, max);
    return -1;
  }
  return 0;
}

/* Options without a value. */
static int opt_flag(launch_opts_t *o, const char *name) {
  static const struct {
    const char *name;
    size_t off;
    int val;
  } flags[] = {
      {"--allow-gpu-sharing", offsetof(launch_opts_t, allow_gpu_sharing), 1},
      {"--dry-run", offsetof(launch_opts_t, dry_run), 1},
      {"--no-tag-output", offsetof(launch_opts_t, tag_output), 0},
      {"--narrow-visible-devices", offsetof(launch_opts_t, narrow_visible), 1},
      {"--allow-no-pmi", offsetof(launch_opts_t, allow_no_pmi), 1},
      {"--mpirun", offsetof(launch_opts_t, use_mpirun), 1},
      {"--mpirun-child", offsetof(launch_opts_t, mpirun_child), 1},
      {"--elastic", offsetof(launch_opts_t, elastic), 1},
      {"--elastic-step", offsetof(launch_opts_t, elastic_step), 1},
      {"-v", offsetof(launch_opts_t, verbose), 1},
      {"--verbose", offsetof(launch_opts_t, verbose), 1},
  };
  for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
    if (strcmp(name, flags[i].name) == 0) {
      *(int *)((char *)o + flags[i].off) = flags[i].val;
      return 1;
    }
  return 0;
}

/* -hostfile FILE (horovodrun) / --hostfile FILE (Open MPI): the hosts of -H, from a file. */
static int hostfile(launch_opts_t *o, const char *name, const char *path) {
  if (o->hosts || o->hostfile) {
    launch_error("option %s: give the hosts once (-H or one host file)", name);
    return -1;
  }
  FILE *f = fopen(path, "r");
  if (!f) {
    launch_error("option %s: cannot open '%s': %s", name, path, strerror(errno));
    return -1;
  }
  char *text = NULL;
  size_t cap = 0, n = 0, k;
  char buf[4096];
  while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
    if (n + k + 1 > cap) {
      cap = (n + k + 1) * 2;
      char *t = n + k < (64u << 20) ? realloc(text, cap) : NULL; /* 64 MiB: no host file is larger */
      if (!t) {
        free(text);
        fclose(f);
        launch_error("option %s: '%s' is too large", name, path);
        return -1;
      }
      text = t;
    }
    memcpy(text + n, buf, k);
    n += k;
  }
  int rerr = ferror(f);
  fclose(f);
  if (rerr || !text) {
    free(text);
    launch_error("option %s: '%s' %s", name, path, rerr ? "could not be read" : "is empty");
    return -1;
  }
  text[n] = 0;
  char err[256], *hosts = NULL;
  int rc = launch_hostfile_parse(text, &hosts, err, sizeof err);
  free(text);
  if (rc != 0) {
    launch_error("option %s: %s: %s", name, path, err);
    return -1;
  }
  o->hosts = o->hostfile = hosts; /* freed at exit */
  return 0;
}

/* Options with a value: 1 when `name` is one (and val was good), 0 when it is not, -1 on error. */
static int opt_value(launch_opts_t *o, const char *name, const char *val) {
#define IS(s) (strcmp(name, s) == 0)
  if (IS("-np") || IS("-n") || IS("--np")) return opt_number(name, val, 1, LAUNCH_MAX_RANKS, &o->np) ? -1 : 1;
  if (IS("--gpus-per-rank")) return opt_number(name, val, 0, 1024, &o->gpus_per_rank) ? -1 : 1;
  if (IS("--kill-after")) return opt_number(name, val, 0, 3600, &o->kill_after_s) ? -1 : 1;
  if (IS("--min-nodes")) return opt_number(name, val, 1, LAUNCH_MAX_NAMES, &o->min_nodes) ? -1 : 1;
  if (IS("--max-nodes")) return opt_number(name, val, 1, LAUNCH_MAX_NAMES, &o->max_nodes) ? -1 : 1;
  if (IS("--max-restarts")) return opt_number(name, val, 0, 1000, &o->max_restarts) ? -1 : 1;
  if (IS("--elastic-wait")) return opt_number(name, val, 0, 86400, &o->elastic_wait_s) ? -1 : 1;
  if (IS("--bind")) {
    if (strcmp(val, "none") == 0) o->bind = LAUNCH_BIND_NONE;
    else if (strcmp(val, "cores") == 0) o->bind = LAUNCH_BIND_CORES;
    else if (strcmp(val, "gpu") == 0) o->bind = LAUNCH_BIND_GPU;
    else {
      launch_error("option --bind: '%s' is not none, cores or gpu", val);
      return -1;
    }
    return 1;
  }
  if (IS("-hostfile") || IS("--hostfile")) return hostfile(o, name, val) ? -1 : 1;
  const char **dst = IS("-H") || IS("--hosts") ? &o->hosts
                     : IS("--topology")        ? &o->topology
                     : IS("--gpus")            ? &o->gpus
                     : IS("--output-dir")      ? &o->output_dir
                     : IS("--child-tpn")       ? &o->child_tpn
                     : IS("--child-hosts")     ? &o->child_hosts
                                               : NULL;
#undef IS
  if (!dst) return 0;
  if (dst == &o->hosts && o->hostfile) {
    launch_error("option %s: give the hosts once (-H or one host file)", name);
    return -1;
  }
  if (!*val) {
    launch_error("option %s: the value is empty", name);
    return -1;
  }
  *dst = val;
  return 1;
}

static int takes_value(const char *name) {
  static const char *names[] = {"-np", "-n", "--np", "--gpus-per-rank", "--kill-after", "--bind", "-H", "--hosts",
                                "-hostfile", "--hostfile",
                                "--topology", "--gpus", "--output-dir", "--child-tpn", "--child-hosts",
                                "--min-nodes", "--max-nodes", "--max-restarts", "--elastic-wait", NULL};
  for (int i = 0; names[i]; i++)
    if (strcmp(name, names[i]) == 0) return 1;
  return 0;
}

/* One option at argv[*i] (advanced past its value). Returns 0, 1 (exit 0) or -1. */
static int one_opt(int argc, char **argv, int *i, launch_opts_t *o) {
  const char *a = argv[*i], *val = NULL;
  char name[64];
  size_t nl = strcspn(a, "=");
  if (a[1] == '-' && a[nl] == '=') val = a + nl + 1; /* --opt=value */
  else nl = strlen(a);
  snprintf(name, sizeof name, "%.*s", (int)(nl < sizeof name ? nl : sizeof name - 1), a);
  if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0 || strcmp(name, "--version") == 0) {
    if (strcmp(name, "--version") == 0) printf("launch (hora) %s\n", LAUNCH_VERSION);
    else usage(stdout);
    return 1;
  }
  if (!takes_value(name) && !launch_tune_takes_value(name)) {
    int t = launch_tune_flag(o, name);
    if (t < 0) return -1;
    if (!t && !opt_flag(o, name)) {
      launch_error("unknown option '%s' (launch --help lists them; put the program after --)", a);
      return -1;
    }
    if (val) {
      launch_error("option %s takes no value (got '%s')", name, a);
      return -1;
    }
    return 0;
  }
  if (!val) {
    if (*i + 1 >= argc) {
      launch_error("option %s needs a value", name);
      return -1;
    }
    val = argv[++*i];
    /* "-H --dry-run": the option's value is missing, not "--dry-run" ("-np -1" reads as a bad
     * number below). */
    if (val[0] == '-' && val[1] && !(val[1] >= '0' && val[1] <= '9')) {
      const char *lng = name[1] == '-' ? name : name[1] == 'H' ? "--hosts" : "--np";
      launch_error("option %s needs a value, but '%s' follows it (write %s=VALUE for a value that starts with '-')",
                   name, val, lng);
      return -1;
    }
  }
  int t = launch_tune_value(o, name, val);
  if (t == 0) t = launch_tune_internal(o, name, val);
  if (t != 0) return t < 0 ? -1 : 0;
  return opt_value(o, name, val) < 0 ? -1 : 0;
}

int launch_opts_parse(int argc, char **argv, launch_opts_t *o) {
  memset(o, 0, sizeof(*o));
  o->gpus_per_rank = -1;
  o->tag_output = 1;
  o->kill_after_s = LAUNCH_KILL_AFTER_S;
  o->max_restarts = LAUNCH_ELASTIC_RESTARTS;
  o->elastic_wait_s = LAUNCH_ELASTIC_WAIT_S;
  o->argv0 = argv;
  int i = 1;
  for (; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      i++;
      break;
    }
    if (argv[i][0] != '-' || !argv[i][1]) break;
    int rc = one_opt(argc, argv, &i, o);
    if (rc != 0) return rc;
  }
  o->prog = i < argc ? argv + i : NULL;
  if (o->min_nodes && o->max_nodes && o->min_nodes > o->max_nodes) {
    launch_error("--min-nodes %d is above --max-nodes %d", o->min_nodes, o->max_nodes);
    return -1;
  }
  if (o->mpirun_child && (!o->child_tpn || !o->child_hosts)) {
    launch_error("--mpirun-child is internal to launch's local mode");
    return -1;
  }
  return 0;
}
