/* launch: the three modes. See docs/launch.md for the user's view.
 *
 *   step mode        inside an srun step (SLURM_STEP_ID and SLURM_PROCID set), or started by
 *                    launch's own mpirun (--mpirun-child): place this rank, export HORA_*, bind,
 *                    run the program.
 *   allocation mode  inside sbatch/salloc but not in a step: run srun, which re-enters step mode.
 *   local mode       no Slurm (or --mpirun): exec mpirun, which re-enters step mode.
 *
 * Every mode goes through run_mode: layout (mode's own) -> check the program (unless --dry-run)
 * -> plan this rank (step mode) -> dry run (print the plan, start nothing) or start (mode's own).
 * --dry-run prints the plan (one JSON object per rank) and starts nothing. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"

typedef struct {
  /* Where the ranks go (and the mode's own checks); 0, or -1 after an error line with l empty. */
  int (*layout)(const launch_opts_t *o, launch_layout_t *l);
  int per_rank; /* this process is one rank: plan it (dry run: its own line); else plan all */
  /* Starts the program (or srun/mpirun); returns launch's exit status. */
  int (*start)(const launch_opts_t *o, const launch_layout_t *l, launch_rank_plan_t *p);
} launch_mode_t;

static int check_program(const launch_opts_t *o) {
  if (!o->prog) {
    launch_error("no program given: usage is launch [options] [--] program [args] (launch --help)");
    return -1;
  }
  return launch_check_program(o->prog[0]);
}

static int run_mode(const launch_opts_t *o, const launch_mode_t *m) {
  launch_layout_t l;
  launch_rank_plan_t p;
  memset(&p, 0, sizeof p);
  if (m->layout(o, &l) != 0) return LAUNCH_EXIT_SETUP;
  int rc = LAUNCH_EXIT_SETUP;
  if (!o->dry_run && check_program(o) != 0) goto done;
  if (m->per_rank && launch_plan_rank(o, &l, &p) != 0) goto done;
  if (!o->dry_run) {
    rc = m->start(o, &l, &p);
  } else if (m->per_rank) {
    launch_plan_print_rank(&l, &p);
    rc = 0;
  } else if (launch_plan_print_all(o, &l) == 0) {
    rc = 0;
  }
done:
  launch_rank_plan_free(&p);
  launch_layout_free(&l);
  return rc;
}

/* ---- step mode */
static int step_layout(const launch_opts_t *o, launch_layout_t *l) {
  if (launch_layout_from_step(o, l) != 0) return -1;
  launch_log_set_rank(l->rank);
  if (o->np && o->np != l->size) {
    launch_error("-np %d inside an srun step of %d tasks: srun decides the number of ranks here "
                 "(drop -np, or run `launch -np %d` from the batch script instead of under srun)",
                 o->np, l->size, o->np);
    launch_layout_free(l);
    return -1;
  }
  if (launch_check_pmi(o) != 0) {
    launch_layout_free(l);
    return -1;
  }
  return 0;
}

static int child_layout(const launch_opts_t *o, launch_layout_t *l) {
  if (launch_layout_from_mpirun(o, l) != 0) return -1;
  launch_log_set_rank(l->rank);
  return 0;
}

static int step_start(const launch_opts_t *o, const launch_layout_t *l, launch_rank_plan_t *p) {
  return launch_step_run(o, l, p, 1);
}

static int child_start(const launch_opts_t *o, const launch_layout_t *l, launch_rank_plan_t *p) {
  return launch_step_run(o, l, p, 0);
}

/* ---- argv of srun / mpirun, which re-run this launch with the same placement options */
typedef struct {
  char **v;
  int n, oom;
} argv_t;

static void push(argv_t *a, const char *s) {
  char **nv = a->oom ? NULL : realloc(a->v, (size_t)(a->n + 2) * sizeof(char *));
  if (!nv) {
    a->oom = 1;
    return;
  }
  a->v = nv;
  nv[a->n++] = (char *)s;
  nv[a->n] = NULL;
}

static void push_cb(void *a, const char *s) { push(a, s); }

static void push_self_opts(argv_t *a, const launch_opts_t *o) {
  static char self[PATH_MAX], gpr[32], kill_after[32];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k > 0) self[k] = 0;
  else snprintf(self, sizeof self, "%s", o->argv0[0]);
  push(a, self);
  if (o->gpus_per_rank >= 0) {
    snprintf(gpr, sizeof gpr, "--gpus-per-rank=%d", o->gpus_per_rank);
    push(a, gpr);
  }
  static const char *binds[] = {NULL, "--bind=none", "--bind=cores", "--bind=gpu"};
  if (binds[o->bind]) push(a, binds[o->bind]);
  if (o->allow_gpu_sharing) push(a, "--allow-gpu-sharing");
  if (o->gpus) push(a, "--gpus"), push(a, o->gpus);
  if (o->topology) push(a, "--topology"), push(a, o->topology);
  if (o->output_dir) push(a, "--output-dir"), push(a, o->output_dir);
  if (!o->tag_output) push(a, "--no-tag-output");
  if (o->narrow_visible) push(a, "--narrow-visible-devices");
  if (o->allow_no_pmi) push(a, "--allow-no-pmi");
  if (o->kill_after_s != LAUNCH_KILL_AFTER_S) {
    snprintf(kill_after, sizeof kill_after, "--kill-after=%d", o->kill_after_s);
    push(a, kill_after);
  }
  if (o->verbose) push(a, "-v");
  if (o->elastic || o->elastic_step) push(a, "--elastic-step");
  launch_tune_forward(o, push_cb, a);
}

/* Ends the argv with "-- prog args"; -1 after an error line when memory ran out. */
static int finish_argv(argv_t *a, const launch_opts_t *o) {
  push(a, "--");
  for (char **p = o->prog; *p; p++) push(a, *p);
  if (a->oom) {
    launch_error("out of memory building the %s command line", a->v ? a->v[0] : "srun/mpirun");
    return -1;
  }
  if (o->verbose) {
    fprintf(stderr, "launch: info: running");
    for (int i = 0; i < a->n; i++) fprintf(stderr, " %s", a->v[i]);
    fprintf(stderr, "\n");
  }
  fflush(NULL);
  return 0;
}

/* ---- allocation mode */
static int alloc_layout(const launch_opts_t *o, launch_layout_t *l) { return launch_layout_from_alloc(o, l); }

/* --elastic: the driver runs the steps (elastic.c) with this launch's options as their tail. */
static int elastic_start(const launch_opts_t *o, const launch_layout_t *l) {
  argv_t a = {0};
  push_self_opts(&a, o);
  int rc = finish_argv(&a, o) == 0 ? launch_elastic_run(o, l, a.v) : LAUNCH_EXIT_SETUP;
  free(a.v);
  return rc;
}

static int alloc_start(const launch_opts_t *o, const launch_layout_t *l, launch_rank_plan_t *p) {
  (void)p;
  if (o->elastic) return elastic_start(o, l);
  int uniform = 1;
  for (int i = 1; i < l->nnodes; i++) uniform &= l->tpn[i] == l->tpn[0];
  argv_t a = {0};
  char a_n[32], a_nodes[32], a_tpn[48];
  snprintf(a_n, sizeof a_n, "--ntasks=%d", l->size);
  snprintf(a_nodes, sizeof a_nodes, "--nodes=%d", l->nnodes);
  snprintf(a_tpn, sizeof a_tpn, "--ntasks-per-node=%d", l->tpn[0]);
  push(&a, "srun");
  push(&a, "--mpi=pmix");
  /* No --kill-on-bad-exit: each task's launch ends the step itself when its program fails, and
   * leaves it alone for HORA_EXIT_REQUEUE (3), which every rank returns after a collective
   * checkpoint flush; with the flag the first rank to exit 3 would get the others killed and the
   * step's status would no longer say "requeue". */
  push(&a, "--cpu-bind=none");
  push(&a, a_n);
  push(&a, a_nodes);
  if (uniform) push(&a, a_tpn);
  push_self_opts(&a, o);
  int rc = LAUNCH_EXIT_SETUP;
  if (finish_argv(&a, o) == 0) {
    /* srun exits with the highest status of all tasks (143 for the ones ended after the first
     * failure); the first failing rank's own status is in its launch's failure line. */
    launch_run_t r = {.rank = -1, .watch = 1, .forward_from_parent = 0};
    rc = launch_run(&r, a.v);
    if (rc < 0) rc = LAUNCH_EXIT_SETUP;
    else if (rc != 0 && r.first_failure > 0) rc = r.first_failure;
  }
  free(a.v);
  return rc;
}

/* ---- local mode */
static int local_layout(const launch_opts_t *o, launch_layout_t *l) { return launch_layout_from_hosts(o, l); }

/* "h1:k1,h2:k2" (names and counts), "h1,h2" (names) or "k1,k2" (counts) of a layout. */
static char *layout_list(const launch_layout_t *l, int names, int counts) {
  size_t cap = 16, len = 0;
  for (int i = 0; i < l->nnodes; i++) cap += strlen(l->node_names[i]) + 16;
  char *s = malloc(cap);
  if (!s) return NULL;
  s[0] = 0;
  for (int i = 0; i < l->nnodes; i++) {
    len += (size_t)snprintf(s + len, cap - len, "%s", i ? "," : "");
    if (names) len += (size_t)snprintf(s + len, cap - len, "%s%s", l->node_names[i], counts ? ":" : "");
    if (counts) len += (size_t)snprintf(s + len, cap - len, "%d", l->tpn[i]);
  }
  return s;
}

static int local_start(const launch_opts_t *o, const launch_layout_t *l, launch_rank_plan_t *p) {
  (void)p;
  /* -H with the planned counts and --map-by slot: mpirun puts ranks exactly where the plan says. */
  char *hs = layout_list(l, 1, 1), *ts = layout_list(l, 0, 1), *cs = layout_list(l, 1, 0), a_np[32];
  argv_t a = {.oom = !hs || !ts || !cs};
  snprintf(a_np, sizeof a_np, "%d", l->size);
  push(&a, "mpirun");
  push(&a, "-np");
  push(&a, a_np);
  push(&a, "-H");
  push(&a, hs);
  push(&a, "--map-by");
  push(&a, "slot");
  push(&a, "--bind-to");
  push(&a, "none");
  if (l->size > l->slots || (!o->hosts && l->size > (int)sysconf(_SC_NPROCESSORS_ONLN)))
    push(&a, "--oversubscribe");
  /* Remote hosts get only what -x names: hora's settings and Horovod's (which hora.torch reads),
   * so that every rank runs with the same ones. */
  static const char *fwd[] = {"PATH", "LD_LIBRARY_PATH", NULL};
  for (int i = 0; fwd[i]; i++)
    if (getenv(fwd[i])) push(&a, "-x"), push(&a, fwd[i]);
  extern char **environ;
  for (char **e = environ; *e; e++)
    if (strncmp(*e, "HORA_", 5) == 0 || strncmp(*e, "HOROVOD_", 8) == 0) {
      char *name = strndup(*e, strcspn(*e, "="));
      if (!name) a.oom = 1;
      push(&a, "-x");
      push(&a, name);
    }
  /* --mpi-args (horovodrun's): white-space separated, before the program (launch itself). */
  char *extra = o->mpi_args ? strdup(o->mpi_args) : NULL, *save = NULL;
  if (o->mpi_args && !extra) a.oom = 1;
  for (char *w = extra ? strtok_r(extra, " \t\n", &save) : NULL; w; w = strtok_r(NULL, " \t\n", &save)) push(&a, w);
  push_self_opts(&a, o);
  push(&a, "--mpirun-child");
  push(&a, "--child-tpn");
  push(&a, ts);
  push(&a, "--child-hosts");
  push(&a, cs);
  if (getuid() == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  if (finish_argv(&a, o) == 0) {
    execvp("mpirun", a.v);
    launch_error("cannot execute mpirun: %m (is Open MPI installed and in PATH?)");
  }
  free(a.v);
  free(extra);
  free(hs);
  free(ts);
  free(cs);
  return LAUNCH_EXIT_SETUP;
}

static const launch_mode_t step_mode = {step_layout, 1, step_start};
static const launch_mode_t child_mode = {child_layout, 1, child_start};
static const launch_mode_t alloc_mode = {alloc_layout, 0, alloc_start};
static const launch_mode_t local_mode = {local_layout, 0, local_start};

int main(int argc, char **argv) {
  launch_opts_t o;
  int rc = launch_opts_parse(argc, argv, &o);
  if (rc != 0) return rc > 0 ? 0 : LAUNCH_EXIT_SETUP;
  launch_tune_apply(&o); /* horovodrun's tuning options, before anything is started */
  if (o.mpirun_child) return run_mode(&o, &child_mode);
  if (getenv("OMPI_COMM_WORLD_RANK")) {
    launch_error("launch was started by mpirun: run `launch -np N prog` instead (launch starts mpirun itself)");
    return LAUNCH_EXIT_SETUP;
  }
  int in_step = getenv("SLURM_STEP_ID") && getenv("SLURM_PROCID");
  if (o.elastic && (in_step || o.use_mpirun || o.hosts || !getenv("SLURM_JOB_ID"))) {
    launch_error("--elastic runs in a batch script of a Slurm allocation (it starts the srun steps itself), "
                 "not inside srun, with --mpirun or -H");
    return LAUNCH_EXIT_SETUP;
  }
  const launch_mode_t *mode = in_step && !o.use_mpirun                        ? &step_mode
                              : getenv("SLURM_JOB_ID") && !o.use_mpirun && !o.hosts ? &alloc_mode
                                                                                 : &local_mode;
  if (o.mpi_args && mode != &local_mode)
    launch_warn("--mpi-args is ignored: launch starts the ranks with srun here (it passes them to mpirun in local "
                "mode: without Slurm, with -H, or with --mpirun)");
  return run_mode(&o, mode);
}
