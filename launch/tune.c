/* horovodrun's tuning options, so that `horovodrun -np 4 --fusion-threshold-mb 32 python train.py`
 * becomes `launch -np 4 --fusion-threshold-mb 32 python train.py` (docs/launch.md, "From
 * horovodrun"). horovodrun turns each into a HOROVOD_* variable for the ranks; launch sets the
 * HORA_* variable that libhora reads, in the units hora uses:
 *
 *   --fusion-threshold-mb MB                 HORA_FUSION_THRESHOLD=<MB>M (MiB, as horovodrun)
 *   --cycle-time-ms MS                       HORA_CYCLE_TIME_MS
 *   --cache-capacity N                       HORA_CACHE_CAPACITY
 *   --timeline-filename PATH                 HORA_TIMELINE (and HORA_TIMELINE_MARK_CYCLES=0 unless
 *                                            set: Horovod marks no cycles by default)
 *   --timeline-mark-cycles                   HORA_TIMELINE_MARK_CYCLES=1
 *   --no-stall-check                         HORA_STALL_WARNING_S=0 HORA_STALL_SHUTDOWN_S=0
 *   --stall-check-warning-time-seconds S     HORA_STALL_WARNING_S
 *   --stall-check-shutdown-time-seconds S    HORA_STALL_SHUTDOWN_S
 *   --log-level trace|debug|info|warning|error|fatal   HORA_LOG
 *   --start-timeout S                        HORA_INIT_TIMEOUT_S (how long hora_init waits for
 *                                            every rank)
 *   --mpi-args "ARGS"                        extra arguments of launch's mpirun (local mode; split at
 *                                            white space, no quoting); a warning in Slurm modes
 *
 * An option overrides the variable in the environment, as horovodrun's do. The settings are made
 * in launch's own environment before it starts anything (srun and mpirun pass it on to the ranks
 * on this node) and the options are passed on to the launch of every rank (mpirun's ranks on
 * other hosts, whose environment mpirun does not forward). --autotune is accepted with a warning
 * (hora has no autotuner); --hierarchical-allreduce, --hierarchical-allgather, their --no- forms,
 * --mpi and --disable-cache (horovodrun's cache of host checks) are accepted and change nothing (hora picks its hierarchical allreduce by layout and
 * always runs on MPI); --gloo is an error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "launch.h"

/* One HORA_* assignment; `value` points into argv, at a string constant or at text of whole(). */
static int add_set(launch_opts_t *o, const char *env, const char *value) {
  for (int i = 0; i < o->ntune; i++)
    if (strcmp(o->tune[i].env, env) == 0) {
      o->tune[i].value = value; /* a later option wins, as in horovodrun's argparse */
      return 0;
    }
  if (o->ntune >= LAUNCH_MAX_TUNE) {
    launch_error("too many tuning options");
    return -1;
  }
  o->tune[o->ntune].env = env;
  o->tune[o->ntune].value = value;
  o->ntune++;
  return 0;
}

/* A whole number in [0, max] for option `name`, as text with `suffix` (malloc'ed: it lives until
 * launch execs or exits). */
static const char *whole(const char *name, const char *val, int max, const char *suffix) {
  int v;
  if (!*val || strspn(val, "0123456789") != strlen(val)) {
    launch_error("option %s: '%s' is not a whole number (horovodrun's unit, no suffix)", name, val);
    return NULL;
  }
  if (launch_parse_uint(val, max, &v) != 0) { /* parse.c, as -np's */
    launch_error("option %s: %s is out of range (0..%d)", name, val, max);
    return NULL;
  }
  char *b = NULL;
  if (asprintf(&b, "%d%s", v, suffix) < 0) {
    launch_error("out of memory");
    return NULL;
  }
  return b;
}

int launch_tune_value(launch_opts_t *o, const char *name, const char *val) {
#define IS(s) (strcmp(name, s) == 0)
  const char *v;
  if (IS("--fusion-threshold-mb")) {
    /* MiB, as horovodrun (fusion_threshold_mb * 1024 * 1024); hora's bytes setting takes "M". */
    if (!(v = whole(name, val, 1 << 30, "M"))) return -1;
    return add_set(o, "HORA_FUSION_THRESHOLD", v) ? -1 : 1;
  }
  if (IS("--cache-capacity")) {
    if (!(v = whole(name, val, 10000000, ""))) return -1;
    return add_set(o, "HORA_CACHE_CAPACITY", v) ? -1 : 1;
  }
  if (IS("--start-timeout")) { /* horovodrun: all ranks must have started within this many seconds */
    if (!(v = whole(name, val, 1000000000, ""))) return -1;
    return add_set(o, "HORA_INIT_TIMEOUT_S", v) ? -1 : 1;
  }
  if (IS("--mpi-args")) {
    /* Split at white space; no shell quoting (a quote would be passed on literally: refuse it). */
    if (strpbrk(val, "'\"\\")) {
      launch_error("option --mpi-args: '%s' holds a quote or backslash; launch splits the value at white space "
                   "only, so give each mpirun argument without quotes", val);
      return -1;
    }
    o->mpi_args = val;
    return 1;
  }
  if (IS("--stall-check-warning-time-seconds") || IS("--stall-check-shutdown-time-seconds")) {
    if (!(v = whole(name, val, 1000000000, ""))) return -1;
    return add_set(o, IS("--stall-check-warning-time-seconds") ? "HORA_STALL_WARNING_S" : "HORA_STALL_SHUTDOWN_S", v)
               ? -1
               : 1;
  }
  if (IS("--cycle-time-ms")) {
    char *end;
    double ms = strtod(val, &end);
    if (end == val || *end || !isfinite(ms) || ms < 0 || ms > 1e6 || strspn(val, "0123456789.") != strlen(val)) {
      launch_error("option %s: '%s' is not a number of milliseconds in 0..1000000", name, val);
      return -1;
    }
    return add_set(o, "HORA_CYCLE_TIME_MS", val) ? -1 : 1;
  }
  if (IS("--timeline-filename")) {
    if (!*val) {
      launch_error("option %s: the value is empty", name);
      return -1;
    }
    o->tune_timeline = 1;
    return add_set(o, "HORA_TIMELINE", val) ? -1 : 1;
  }
  if (IS("--log-level")) {
    static const char *hv[] = {"trace", "debug", "info", "warning", "error", "fatal"};
    static const char *hl[] = {"TRACE", "TRACE", "INFO", "WARN", "WARN", "WARN"};
    for (size_t i = 0; i < sizeof hv / sizeof *hv; i++)
      if (strcasecmp(val, hv[i]) == 0) return add_set(o, "HORA_LOG", hl[i]) ? -1 : 1;
    launch_error("option %s: '%s' is not one of trace, debug, info, warning, error, fatal", name, val);
    return -1;
  }
#undef IS
  return 0;
}

int launch_tune_takes_value(const char *name) {
  static const char *names[] = {"--hora-set", "--start-timeout", "--mpi-args", "--fusion-threshold-mb", "--cycle-time-ms", "--cache-capacity",
                                "--timeline-filename", "--stall-check-warning-time-seconds",
                                "--stall-check-shutdown-time-seconds", "--log-level", NULL};
  for (int i = 0; names[i]; i++)
    if (strcmp(name, names[i]) == 0) return 1;
  return 0;
}

int launch_tune_flag(launch_opts_t *o, const char *name) {
#define IS(s) (strcmp(name, s) == 0)
  if (IS("--timeline-mark-cycles")) return add_set(o, "HORA_TIMELINE_MARK_CYCLES", "1") ? -1 : 1;
  if (IS("--no-stall-check"))
    return add_set(o, "HORA_STALL_WARNING_S", "0") || add_set(o, "HORA_STALL_SHUTDOWN_S", "0") ? -1 : 1;
  if (IS("--autotune")) {
    o->tune_autotune = 1;
    return 1;
  }
  if (IS("--hierarchical-allreduce") || IS("--no-hierarchical-allreduce") || IS("--hierarchical-allgather") ||
      IS("--no-hierarchical-allgather") || IS("--mpi") || IS("--disable-cache"))
    return 1;
  if (IS("--hora-timeline-default")) { /* internal: the parent had --timeline-filename */
    o->tune_timeline = 1;
    return 1;
  }
  if (IS("--gloo")) {
    launch_error("option --gloo: hora's controller and collectives run on MPI only; drop --gloo");
    return -1;
  }
#undef IS
  return 0;
}

void launch_tune_apply(const launch_opts_t *o) {
  for (int i = 0; i < o->ntune; i++) setenv(o->tune[i].env, o->tune[i].value, 1);
  if (o->tune_timeline) setenv("HORA_TIMELINE_MARK_CYCLES", "0", 0); /* Horovod's default, unless set */
  if (o->tune_autotune && !o->mpirun_child && !o->elastic_step) {
    const char *r = getenv("SLURM_PROCID");
    if (!r || strcmp(r, "0") == 0)
      launch_warn("--autotune: hora has no autotuner; the fusion threshold and cycle time stay as set "
                  "(--fusion-threshold-mb, --cycle-time-ms, or hora's defaults)");
  }
}

void launch_tune_forward(const launch_opts_t *o, void (*push)(void *, const char *), void *a) {
  /* One internal option per setting, "--hora-set NAME=VALUE": the children convert nothing. */
  for (int i = 0; i < o->ntune; i++) {
    char *kv = NULL;
    if (asprintf(&kv, "%s=%s", o->tune[i].env, o->tune[i].value) < 0) kv = NULL;
    push(a, "--hora-set");
    push(a, kv ? kv : "");  /* "" is refused by the child: the run stops with a message */
  }                          /* kv lives until launch execs or exits */
  if (o->tune_timeline) push(a, "--hora-timeline-default");
}

/* The internal options of launch_tune_forward, in a child launch: 1 when `name` is one. */
int launch_tune_internal(launch_opts_t *o, const char *name, const char *val) {
  if (strcmp(name, "--hora-set") != 0) return 0;
  static const char *known[] = {"HORA_FUSION_THRESHOLD", "HORA_CYCLE_TIME_MS", "HORA_CACHE_CAPACITY",
                                "HORA_TIMELINE", "HORA_TIMELINE_MARK_CYCLES", "HORA_STALL_WARNING_S",
                                "HORA_STALL_SHUTDOWN_S", "HORA_LOG", "HORA_INIT_TIMEOUT_S", NULL};
  size_t k = strcspn(val, "=");
  for (int i = 0; val[k] && known[i]; i++)
    if (strlen(known[i]) == k && strncmp(val, known[i], k) == 0) return add_set(o, known[i], val + k + 1) ? -1 : 1;
  launch_error("option --hora-set is internal to launch (got '%s')", val);
  return -1;
}
