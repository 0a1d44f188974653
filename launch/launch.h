/* launch: start a hora program with the right layout, GPU and CPU binding (docs/launch.md).
 *
 * Modules, each using only those above it:
 *   log.c     messages ("launch: error: ..."); includes nothing of launch's
 *   parse.c   text formats (hostlist, tasks-per-node, GPU lists, -H, numbers); pure
 *   layout.c  where this rank sits: from an srun step's SLURM_* variables, from mpirun's
 *             OMPI_COMM_WORLD_* variables, or planned (dry run / allocation / local mode)
 *   gpu.c     the node's GPU list, this rank's GPU, PCI bus ids (NVML through dlopen, else hwloc)
 *   place.c   the CPU set of every local rank (hwloc), and binding
 *   run.c     fork/exec of the program, output tagging, signal forwarding, exit status
 *   plan.c    a node's plan (GPU + CPU set of its local ranks, linear in ranks), dry-run lines
 *   opts.c    the command line
 *   step.c    step mode's run: export HORA_*, bind, run, end the step when the program fails
 *   main.c    the three modes (step, allocation, local) through one plan -> dry-run -> check ->
 *             run path
 *
 * Errors: every function that can fail returns -1 after printing one "launch: error: ..." line
 * (launch_error) that names the bad input and what to do; main then exits with status 2 (usage
 * and set-up errors) before the program is started. */
#ifndef LAUNCH_H
#define LAUNCH_H
#include <stddef.h>

#include "log.h"
#include "parse.h"

#define LAUNCH_EXIT_SETUP 2 /* launch itself failed before the program started */
/* HORA_EXIT_REQUEUE (hora.h): the program checkpointed after a preemption signal and stops for
 * a requeue. Every rank decided that together (hora_should_stop), so it is no failure: launch
 * does not cancel the step, which would kill ranks still flushing their checkpoint. */
#define LAUNCH_EXIT_REQUEUE 3
/* Upper bound of -np (documented in docs/launch.md): the same as a hostlist's names. */
#define LAUNCH_MAX_RANKS LAUNCH_MAX_NAMES
/* Default of --kill-after: seconds between ending a failed step with SIGTERM and with SIGKILL. */
#define LAUNCH_KILL_AFTER_S 10
/* Exit status of a rank whose step must be re-formed (HORA_EXIT_ELASTIC), and the driver's
 * defaults. */
#define LAUNCH_EXIT_ELASTIC 4
#define LAUNCH_ELASTIC_RESTARTS 5
#define LAUNCH_ELASTIC_WAIT_S 60

#define LAUNCH_MAX_TUNE 16 /* HORA_* settings from horovodrun's options (tune.c) */

typedef enum { LAUNCH_BIND_AUTO = 0, LAUNCH_BIND_NONE, LAUNCH_BIND_CORES, LAUNCH_BIND_GPU } launch_bind_t;

typedef struct {
  int np;                 /* -np N; 0: not given */
  const char *hosts;      /* -H host:slots,... (local mode), or made from the host file */
  char *hostfile;         /* -hostfile/--hostfile: the -H form of the file (malloc'ed), NULL without */
  int gpus_per_rank;      /* --gpus-per-rank; -1: not given (1 when the node has GPUs) */
  int allow_gpu_sharing;  /* --allow-gpu-sharing */
  launch_bind_t bind;     /* --bind */
  const char *topology;   /* --topology FILE.xml | synthetic:DESC */
  const char *gpus;       /* --gpus LIST: the node's GPU list, overriding Slurm/CUDA variables */
  int dry_run;            /* --dry-run */
  const char *output_dir; /* --output-dir */
  int tag_output;         /* 1 unless --no-tag-output */
  int narrow_visible;     /* --narrow-visible-devices */
  int allow_no_pmi;       /* --allow-no-pmi */
  int use_mpirun;         /* --mpirun: local mode even inside a Slurm allocation */
  int kill_after_s;       /* --kill-after: SIGTERM to SIGKILL when a rank fails (step mode) */
  int verbose;            /* -v */
  int mpirun_child;       /* internal: started by launch's own mpirun */
  const char *child_tpn;  /* internal: tasks per host of that mpirun */
  const char *child_hosts;/* internal: host names of that mpirun */
  int elastic;            /* --elastic: the driver of an elastic job (allocation mode, elastic.c) */
  int elastic_step;       /* internal: a step started by the driver (a failed rank does not end it) */
  int min_nodes, max_nodes; /* --min-nodes, --max-nodes (0: 1, and every node of the allocation) */
  int max_restarts;       /* --max-restarts (default LAUNCH_ELASTIC_RESTARTS) */
  int elastic_wait_s;     /* --elastic-wait: how long to wait for --min-nodes usable nodes */
  /* horovodrun's tuning options as HORA_* settings (tune.c) */
  struct {
    const char *env, *value;
  } tune[LAUNCH_MAX_TUNE];
  int ntune;
  int tune_timeline;      /* --timeline-filename given: HORA_TIMELINE_MARK_CYCLES defaults to 0 */
  int tune_autotune;      /* --autotune: warned about, nothing else */
  const char *mpi_args;   /* --mpi-args: extra arguments of local mode's mpirun (split at white space) */
  char **prog;            /* the program and its arguments */
  char **argv0;           /* launch's own argv (to re-run itself) */
} launch_opts_t;

/* tune.c: horovodrun's tuning options (--fusion-threshold-mb, --cycle-time-ms, ...). The first
 * three return 1 when `name` is such an option (and was good), 0 when it is not, -1 after an
 * error line. */
int launch_tune_value(launch_opts_t *o, const char *name, const char *val);
int launch_tune_flag(launch_opts_t *o, const char *name);
int launch_tune_internal(launch_opts_t *o, const char *name, const char *val);
int launch_tune_takes_value(const char *name);
/* Set the HORA_* variables in this process (before anything is started); warns about --autotune. */
void launch_tune_apply(const launch_opts_t *o);
/* Append the options that carry the settings to a child launch's argv. */
void launch_tune_forward(const launch_opts_t *o, void (*push)(void *, const char *), void *a);

/* Where every rank of the job sits. Ranks are placed block-wise over nodes in the planned
 * modes; in an srun step this rank's own values come from Slurm (any distribution). */
typedef struct {
  int rank, size;
  int local_rank, local_size;
  int node, nnodes;
  char **node_names; /* nnodes names (Slurm node names, or -H hosts) */
  int *tpn;          /* nnodes task counts */
  const char *hostname_env; /* this rank's node name as Slurm says it (SLURMD_NODENAME) */
  long slots;        /* local mode: the task slots the hosts offer (more ranks: oversubscribed) */
} launch_layout_t;

/* opts.c: parses argv into o. Returns 0, 1 when launch should exit 0 (--help, --version
 * printed), or -1 after printing one error line (exit 2). */
int launch_opts_parse(int argc, char **argv, launch_opts_t *o);

/* layout.c */
int launch_layout_from_step(const launch_opts_t *o, launch_layout_t *l);
int launch_layout_from_mpirun(const launch_opts_t *o, launch_layout_t *l);
/* Allocation mode: -np (else SLURM_NTASKS) ranks over SLURM_JOB_NODELIST, following
 * SLURM_TASKS_PER_NODE when it adds up to them. */
int launch_layout_from_alloc(const launch_opts_t *o, launch_layout_t *l);
/* Local mode: -H's hosts and slots, else this host. */
int launch_layout_from_hosts(const launch_opts_t *o, launch_layout_t *l);
/* Block layout of `np` ranks over the given nodes (tpn may be NULL: spread evenly, earlier
 * nodes take the remainder). */
int launch_layout_plan(int np, char **names, size_t nnodes, const int *tpn, launch_layout_t *l);
/* Position of `rank` in a block layout. */
void launch_layout_locate(const launch_layout_t *l, int rank, int *node, int *local_rank);
void launch_layout_free(launch_layout_t *l);
/* Fails when an srun step has no PMI: MPI_Init would abort or every task would be alone. */
int launch_check_pmi(const launch_opts_t *o);

/* gpu.c */
typedef struct {
  char **ids;      /* the node's GPU list as Slurm/CUDA name them */
  size_t n;
  const char *source; /* the variable (or option) it came from */
  int per_task;    /* Slurm bound GPUs per task: this task's list is its own */
  char **full;     /* per_task: the node's whole list (SLURM_JOB_GPUS, else 0..SLURM_GPUS_ON_NODE-1),
                      used to plan the other local ranks */
  size_t nfull;
  int self_local;  /* local rank of this process (per_task planning), -1 when planning a node */
  char **cvd;      /* CUDA_VISIBLE_DEVICES entries (NULL when unset) */
  size_t ncvd;
  int cvd_set;
} launch_gpus_t;

typedef struct {
  int count;            /* GPUs this rank uses (0: none) */
  char ids[256];        /* "1" or "2,3": ids from the node's list */
  int ordinal;          /* CUDA ordinal of the first one (HORA_DEVICE), -1 when none */
  char ordinals[256];   /* all CUDA ordinals, comma-separated (for --narrow-visible-devices) */
  char bus_id[32];      /* PCI bus id "0000:07:00.0" of the first one, "" when unknown */
} launch_gpu_choice_t;

struct launch_topo;
int launch_gpus_detect(const launch_opts_t *o, struct launch_topo *t, launch_gpus_t *g);
void launch_gpus_free(launch_gpus_t *g);
/* Chooses the GPUs of local rank `local_rank` of `local_size`. */
int launch_gpu_choose(const launch_opts_t *o, const launch_gpus_t *g, struct launch_topo *t,
                      int local_rank, int local_size, launch_gpu_choice_t *c);

/* place.c: the hardware topology (hwloc), loaded once. */
typedef struct launch_topo launch_topo_t;
int launch_topo_load(const launch_opts_t *o, launch_topo_t **t);
void launch_topo_free(launch_topo_t *t);
/* Number of NVIDIA GPUs the topology shows and the bus id of the k-th in PCI order. */
int launch_topo_gpu_count(launch_topo_t *t);
int launch_topo_gpu_bus_id(launch_topo_t *t, int k, char *out, size_t outlen);
int launch_topo_is_this_system(launch_topo_t *t);
/* CPU sets of the local ranks of one node, in time and memory linear in the ranks:
 *   launch_place_new, then launch_place_add for local ranks 0, 1, ... in order (each with its
 *   GPU's bus id, "" or NULL for none: *group and *index say which CPU group the rank joined
 *   and its position in it), then launch_place_cpus for any rank, once every rank was added:
 *   its CPU list as an hwloc list string ("0-3,8") in out (outlen bytes). */
typedef struct launch_place launch_place_t;
int launch_place_new(const launch_opts_t *o, launch_topo_t *t, launch_place_t **p);
int launch_place_add(launch_place_t *p, int local_rank, const char *bus_id, int *group, int *index);
int launch_place_cpus(launch_place_t *p, int group, int index, int local_rank, char *out, size_t outlen);
void launch_place_free(launch_place_t *p);
/* Binds the calling process to the CPU list (before exec). */
int launch_bind(launch_topo_t *t, const char *cpulist);

/* run.c */
typedef struct {
  int rank;
  const char *output_dir;
  int tag_output;
  int forward_from_parent; /* forward signals that come from our parent too */
  int watch;               /* allocation mode: stdout passes through, stderr is relayed as is
                              and scanned for the ranks' failure lines */
  int first_failure;       /* out (watch): status in the first "launch: rank R ... exited with
                              status S" or "killed by signal K" line (128+K), -1 when none */
  int signaled;            /* out: the signal that killed the program, 0 when it exited */
  int parent_signal;       /* out: the last forwardable signal launch's parent sent it, 0: none */
} launch_run_t;
/* Runs prog (already bound, environment set), forwards SIGTERM/SIGUSR1/SIGUSR2/SIGINT/SIGHUP/
 * SIGQUIT, tags or redirects its output, and returns its exit status (128+signal when killed),
 * or -1 after an error line when the program could not be started (output file, pipe, fork). */
int launch_run(launch_run_t *r, char **prog);
/* Checks that prog exists and is executable (in PATH when it has no '/'); returns -1 with a
 * message when it is not. */
int launch_check_program(const char *prog);

/* plan.c: this rank's plan (step mode), kept for the run: topology, GPU list, choice, CPUs. */
#define LAUNCH_CPULIST_LEN 1024
typedef struct {
  launch_topo_t *topo;
  launch_gpus_t gpus;
  launch_gpu_choice_t gpu;
  char cpus[LAUNCH_CPULIST_LEN];
} launch_rank_plan_t;
/* Plans local rank l->local_rank of l's node (every local rank of the node is planned to split
 * the CPUs). On error p holds nothing to free. */
int launch_plan_rank(const launch_opts_t *o, const launch_layout_t *l, launch_rank_plan_t *p);
void launch_rank_plan_free(launch_rank_plan_t *p);
/* Prints the dry-run line of this rank (step mode), or of every rank of a planned layout
 * (allocation and local modes, every node assumed to look like this one). */
void launch_plan_print_rank(const launch_layout_t *l, const launch_rank_plan_t *p);
int launch_plan_print_all(const launch_opts_t *o, const launch_layout_t *l);

/* step.c: runs the program of this rank (step mode) with p's GPU and CPUs; returns launch's
 * exit status. `slurm_step`: 1 inside srun, 0 under launch's own mpirun. */
int launch_step_run(const launch_opts_t *o, const launch_layout_t *l, launch_rank_plan_t *p, int slurm_step);

/* elastic.c: the --elastic driver (allocation mode). `tail` is launch's own command line for the
 * steps ("launch [opts] --elastic-step -- prog args", NULL-terminated); runs steps until one
 * exits 0 or 3, or --max-restarts; returns the last step's status. */
int launch_elastic_run(const launch_opts_t *o, const launch_layout_t *l, char **tail);
#endif
