/* launch: options and modes. See docs/launch.md for the user's view.
 *
 *   step mode        inside an srun step (SLURM_STEP_ID and SLURM_PROCID set), or started by
 *                    launch's own mpirun (--mpirun-child): place this rank, export HORA_*, bind,
 *                    run the program.
 *   allocation mode  inside sbatch/salloc but not in a step: exec srun, which re-enters step mode.
 *   local mode       no Slurm (or --mpirun): exec mpirun, which re-enters step mode.
 * --dry-run prints the plan (one JSON object per rank) and starts nothing. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"

#ifndef LAUNCH_VERSION
#define LAUNCH_VERSION "0"
#endif
#define CPULIST_LEN 1024

static int g_rank = -1;

static void vmsg(const char *level, const char *fmt, va_list ap) {
  char buf[2048];
  vsnprintf(buf, sizeof buf, fmt, ap);
  if (g_rank >= 0)
    fprintf(stderr, "launch: %s: rank %d: %s\n", level, g_rank, buf);
  else
    fprintf(stderr, "launch: %s: %s\n", level, buf);
}
void launch_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vmsg("error", fmt, ap);
  va_end(ap);
}
void launch_warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vmsg("warning", fmt, ap);
  va_end(ap);
}
void launch_info(const launch_opts_t *o, const char *fmt, ...) {
  if (!o->verbose) return;
  va_list ap;
  va_start(ap, fmt);
  vmsg("info", fmt, ap);
  va_end(ap);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: launch [options] [--] program [args...]\n"
          "  inside srun:        srun --mpi=pmix launch [options] -- ./train\n"
          "  in a batch script:  launch -np 8 ./train        (runs srun itself)\n"
          "  without Slurm:      launch -np 4 ./train | launch -H host1:4,host2:4 ./train (runs mpirun)\n"
          "options:\n"
          "  -np, -n N                  number of ranks (allocation and local modes)\n"
          "  -H, --hosts h1:n1,h2:n2    hosts and slots (local mode)\n"
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
          "  -v, --verbose              print the plan of each rank on stderr\n"
          "  -h, --help, --version\n");
}

/* Option parsing: "--opt value" and "--opt=value"; the program starts at the first
 * non-option or after "--". Returns 0, 1 (exit 0: --help/--version) or -1. */
static int parse_opts(int argc, char **argv, launch_opts_t *o) {
  memset(o, 0, sizeof(*o));
  o->gpus_per_rank = -1;
  o->tag_output = 1;
  o->argv0 = argv;
  int i = 1;
  for (; i < argc; i++) {
    char *a = argv[i], *val = NULL, name[64];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] != '-') break;
    snprintf(name, sizeof name, "%s", a);
    char *eq = strchr(name, '=');
    if (eq && name[1] == '-') {
      *eq = 0;
      val = strchr(a, '=') + 1;
    }
#define FLAG(s) (strcmp(name, s) == 0)
#define VALUE()                                                                   \
  do {                                                                            \
    if (!val) {                                                                   \
      if (i + 1 >= argc) {                                                        \
        launch_error("option %s needs a value", name);                            \
        return -1;                                                                \
      }                                                                           \
      val = argv[++i];                                                            \
    }                                                                             \
  } while (0)
    if (FLAG("-h") || FLAG("--help")) {
      usage(stdout);
      return 1;
    } else if (FLAG("--version")) {
      printf("launch (hora) %s\n", LAUNCH_VERSION);
      return 1;
    } else if (FLAG("-np") || FLAG("-n") || FLAG("--np")) {
      VALUE();
      if (launch_parse_uint(val, 1 << 24, &o->np) != 0 || o->np < 1) {
        launch_error("-np '%s' is not a number of ranks >= 1", val);
        return -1;
      }
    } else if (FLAG("-H") || FLAG("--hosts")) {
      VALUE();
      o->hosts = val;
    } else if (FLAG("--gpus-per-rank")) {
      VALUE();
      if (launch_parse_uint(val, 1024, &o->gpus_per_rank) != 0) {
        launch_error("--gpus-per-rank '%s' is not a number >= 0", val);
        return -1;
      }
    } else if (FLAG("--bind")) {
      VALUE();
      if (strcmp(val, "none") == 0) o->bind = LAUNCH_BIND_NONE;
      else if (strcmp(val, "cores") == 0) o->bind = LAUNCH_BIND_CORES;
      else if (strcmp(val, "gpu") == 0) o->bind = LAUNCH_BIND_GPU;
      else {
        launch_error("--bind '%s': expected none, cores or gpu", val);
        return -1;
      }
    } else if (FLAG("--topology")) {
      VALUE();
      o->topology = val;
    } else if (FLAG("--gpus")) {
      VALUE();
      o->gpus = val;
    } else if (FLAG("--output-dir")) {
      VALUE();
      o->output_dir = val;
    } else if (FLAG("--child-tpn")) {
      VALUE();
      o->child_tpn = val;
    } else if (FLAG("--child-hosts")) {
      VALUE();
      o->child_hosts = val;
    } else if (FLAG("--allow-gpu-sharing")) {
      o->allow_gpu_sharing = 1;
    } else if (FLAG("--dry-run")) {
      o->dry_run = 1;
    } else if (FLAG("--no-tag-output")) {
      o->tag_output = 0;
    } else if (FLAG("--narrow-visible-devices")) {
      o->narrow_visible = 1;
    } else if (FLAG("--allow-no-pmi")) {
      o->allow_no_pmi = 1;
    } else if (FLAG("--mpirun")) {
      o->use_mpirun = 1;
    } else if (FLAG("--mpirun-child")) {
      o->mpirun_child = 1;
    } else if (FLAG("-v") || FLAG("--verbose")) {
      o->verbose = 1;
    } else {
      launch_error("unknown option '%s' (launch --help lists them; put the program after --)", a);
      return -1;
    }
#undef FLAG
#undef VALUE
  }
  o->prog = i < argc ? argv + i : NULL;
  if (o->mpirun_child && (!o->child_tpn || !o->child_hosts)) {
    launch_error("--mpirun-child is internal to launch's local mode");
    return -1;
  }
  return 0;
}

/* ---- JSON output (hand-written: a few fixed fields; strings are host names and CPU lists). */
static void json_str(FILE *f, const char *s) {
  if (!s) {
    fputs("null", f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static void print_plan_line(const launch_layout_t *l, int rank, int node, int local_rank, const char *host,
                            const launch_gpu_choice_t *c, const char *cpus) {
  printf("{\"rank\":%d,\"size\":%d,\"local_rank\":%d,\"local_size\":%d,\"node\":%d,\"nodes\":%d,\"hostname\":",
         rank, l->size, local_rank, l->tpn[node], node, l->nnodes);
  json_str(stdout, host);
  if (c->count > 0) printf(",\"gpu\":%d,\"gpu_ids\":", c->ordinal);
  else printf(",\"gpu\":null,\"gpu_ids\":");
  json_str(stdout, c->count > 0 ? c->ids : NULL);
  printf(",\"gpu_bus_id\":");
  json_str(stdout, c->bus_id[0] ? c->bus_id : NULL);
  printf(",\"cpuset\":");
  json_str(stdout, cpus);
  printf("}\n");
}

/* GPU choice and CPU set of every local rank of one node. */
typedef struct {
  int n;
  launch_gpu_choice_t *gpu;
  char **cpus;
} node_plan_t;

static void node_plan_free(node_plan_t *p) {
  if (p->cpus)
    for (int i = 0; i < p->n; i++) free(p->cpus[i]);
  free(p->cpus);
  free(p->gpu);
  memset(p, 0, sizeof(*p));
}

static int plan_node(const launch_opts_t *o, launch_topo_t *t, const launch_gpus_t *g, int local_size,
                     node_plan_t *p) {
  p->n = local_size;
  p->gpu = calloc((size_t)local_size, sizeof(*p->gpu));
  p->cpus = calloc((size_t)local_size, sizeof(char *));
  char **bus = calloc((size_t)local_size, sizeof(char *));
  int rc = -1;
  if (!p->gpu || !p->cpus || !bus) goto done;
  for (int i = 0; i < local_size; i++) {
    if (!(p->cpus[i] = calloc(1, CPULIST_LEN))) goto done;
    if (launch_gpu_choose(o, g, t, i, local_size, &p->gpu[i]) != 0) goto done;
    bus[i] = p->gpu[i].bus_id;
  }
  if (o->bind == LAUNCH_BIND_GPU) {
    int any = 0;
    for (int i = 0; i < local_size; i++) any |= p->gpu[i].count > 0;
    if (!any) {
      launch_error("--bind gpu but no rank of this node has a GPU (GPU list from %s is empty)", g->source);
      goto done;
    }
  }
  rc = launch_place(o, t, local_size, bus, p->cpus, CPULIST_LEN);
done:
  free(bus);
  return rc;
}

static void setenv_int(const char *name, long v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", v);
  setenv(name, buf, 1);
}

/* Runs `cmd` (NULL-terminated) and waits up to `timeout_s` seconds for it. */
#include <signal.h>
#include <sys/wait.h>
static void run_quiet(char **cmd, int timeout_s) {
  pid_t pid = fork();
  if (pid == 0) {
    execvp(cmd[0], cmd);
    _exit(127);
  }
  if (pid < 0) return;
  for (int i = 0; i < timeout_s * 10; i++) {
    if (waitpid(pid, NULL, WNOHANG) == pid) return;
    usleep(100000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* This rank: place, export, bind, run. `slurm_step` is 1 inside srun, 0 under mpirun. */
static int rank_mode(launch_opts_t *o, int slurm_step) {
  launch_layout_t l;
  if (slurm_step) {
    if (launch_layout_from_step(o, &l) != 0) return LAUNCH_EXIT_SETUP;
  } else if (launch_layout_from_mpirun(o, &l) != 0) {
    return LAUNCH_EXIT_SETUP;
  }
  g_rank = l.rank;
  int rc = LAUNCH_EXIT_SETUP;
  launch_topo_t *t = NULL;
  launch_gpus_t g;
  memset(&g, 0, sizeof g);
  node_plan_t p = {0};
  if (slurm_step && o->np && o->np != l.size) {
    launch_error("-np %d inside an srun step of %d tasks: srun decides the number of ranks here "
                 "(drop -np, or run `launch -np %d` from the batch script instead of under srun)",
                 o->np, l.size, o->np);
    goto done;
  }
  if (slurm_step && launch_check_pmi(o) != 0) goto done;
  if (!o->dry_run && (!o->prog || launch_check_program(o->prog[0]) != 0)) {
    if (!o->prog) launch_error("no program given: usage is launch [options] [--] program [args]");
    goto done;
  }
  if (launch_topo_load(o, &t) != 0) goto done;
  if (launch_gpus_detect(o, t, &g) != 0) goto done;
  g.self_local = l.local_rank;
  if (plan_node(o, t, &g, l.local_size, &p) != 0) goto done;
  const launch_gpu_choice_t *c = &p.gpu[l.local_rank];
  const char *cpus = p.cpus[l.local_rank];
  const char *host = l.hostname_env ? l.hostname_env : l.node_names[l.node];
  if (o->dry_run) {
    print_plan_line(&l, l.rank, l.node, l.local_rank, host, c, cpus);
    rc = 0;
    goto done;
  }
  launch_info(o, "node %d (%s) local rank %d/%d gpu %s (cuda %d, bus %s) cpus %s", l.node, host, l.local_rank,
              l.local_size, c->count ? c->ids : "none", c->ordinal, c->bus_id[0] ? c->bus_id : "?", cpus);
  setenv_int("HORA_RANK", l.rank);
  setenv_int("HORA_SIZE", l.size);
  setenv_int("HORA_LOCAL_RANK", l.local_rank);
  setenv_int("HORA_LOCAL_SIZE", l.local_size);
  setenv_int("HORA_CROSS_RANK", l.node);
  setenv_int("HORA_CROSS_SIZE", l.nnodes);
  if (c->count > 0) {
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
    if (o->narrow_visible) {
      /* The rank's own GPUs, named as CUDA_VISIBLE_DEVICES named them (or by Slurm's ids). */
      char vis[256] = "";
      size_t len = 0;
      int ord;
      const char *s = c->ordinals;
      while (*s && len < sizeof vis) {
        ord = atoi(s);
        const char *name = g.cvd_set && ord < (int)g.ncvd ? g.cvd[ord] : NULL;
        char num[16];
        if (!name) {
          snprintf(num, sizeof num, "%d", ord);
          name = num;
        }
        len += (size_t)snprintf(vis + len, sizeof vis - len, "%s%s", len ? "," : "", name);
        s = strchr(s, ',');
        if (!s) break;
        s++;
      }
      setenv("CUDA_VISIBLE_DEVICES", vis, 1);
      setenv_int("HORA_DEVICE", 0);
    } else {
      setenv_int("HORA_DEVICE", c->ordinal);
    }
  } else {
    setenv_int("HORA_DEVICE", -1);
  }
  if (o->bind != LAUNCH_BIND_NONE && launch_bind(t, cpus) != 0) goto done;
  launch_topo_free(t);
  t = NULL;
  launch_run_t r = {.rank = l.rank, .output_dir = o->output_dir, .tag_output = o->tag_output,
                    .forward_from_parent = !slurm_step};
  fflush(NULL);
  rc = launch_run(&r, o->prog);
  if (rc == LAUNCH_EXIT_REQUEUE && !r.signaled) {
    fprintf(stderr, "launch: rank %d (node %s): %s stopped for a requeue (status %d)\n", l.rank, host,
            o->prog[0], rc);
  } else if (rc != 0) {
    if (r.signaled)
      fprintf(stderr, "launch: rank %d (node %s): %s killed by signal %d (%s)\n", l.rank, host, o->prog[0],
              r.signaled, strsignal(r.signaled));
    else
      fprintf(stderr, "launch: rank %d (node %s): %s exited with status %d\n", l.rank, host, o->prog[0], rc);
    /* End the other ranks now rather than when their next collective times out. srun
     * --kill-on-bad-exit does the same; without it, cancel the step. */
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    if (slurm_step && l.size > 1 && job && step) {
      char id[64];
      snprintf(id, sizeof id, "%s.%s", job, step);
      /* SIGTERM (not scancel's default SIGKILL) so that this launch survives to report the
       * program's status; slurmstepd sends it to every process of the step. */
      char *cmd[] = {"scancel", "--quiet", "--signal=TERM", id, NULL};
      run_quiet(cmd, 5);
    }
  }
done:
  node_plan_free(&p);
  launch_gpus_free(&g);
  launch_topo_free(t);
  launch_layout_free(&l);
  return rc;
}

/* Prints the plan of every rank of a planned layout (allocation and local dry runs). All nodes
 * are assumed to look like this one (topology and GPU list). */
static int dry_run_all(launch_opts_t *o, launch_layout_t *l) {
  launch_topo_t *t = NULL;
  launch_gpus_t g;
  int rc = LAUNCH_EXIT_SETUP;
  if (launch_topo_load(o, &t) != 0) return rc;
  if (launch_gpus_detect(o, t, &g) != 0) goto done;
  int rank = 0;
  for (int n = 0; n < l->nnodes; n++) {
    node_plan_t p = {0};
    if (plan_node(o, t, &g, l->tpn[n], &p) != 0) {
      node_plan_free(&p);
      launch_gpus_free(&g);
      goto done;
    }
    for (int i = 0; i < l->tpn[n]; i++, rank++)
      print_plan_line(l, rank, n, i, l->node_names[n], &p.gpu[i], p.cpus[i]);
    node_plan_free(&p);
  }
  launch_gpus_free(&g);
  rc = 0;
done:
  launch_topo_free(t);
  return rc;
}

/* argv for re-running this launch (with the same placement options) under srun or mpirun. */
static int push(char ***v, int *n, const char *s) {
  char **nv = realloc(*v, (size_t)(*n + 2) * sizeof(char *));
  if (!nv) return -1;
  *v = nv;
  nv[(*n)++] = (char *)s;
  nv[*n] = NULL;
  return 0;
}

static void push_self_opts(char ***v, int *n, const launch_opts_t *o, char *buf, size_t buflen) {
  static char self[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k > 0) self[k] = 0;
  else snprintf(self, sizeof self, "%s", o->argv0[0]);
  push(v, n, self);
  if (o->gpus_per_rank >= 0) {
    snprintf(buf, buflen, "--gpus-per-rank=%d", o->gpus_per_rank);
    push(v, n, buf);
  }
  static const char *binds[] = {NULL, "--bind=none", "--bind=cores", "--bind=gpu"};
  if (binds[o->bind]) push(v, n, binds[o->bind]);
  if (o->allow_gpu_sharing) push(v, n, "--allow-gpu-sharing");
  if (o->gpus) push(v, n, "--gpus"), push(v, n, o->gpus);
  if (o->topology) push(v, n, "--topology"), push(v, n, o->topology);
  if (o->output_dir) push(v, n, "--output-dir"), push(v, n, o->output_dir);
  if (!o->tag_output) push(v, n, "--no-tag-output");
  if (o->narrow_visible) push(v, n, "--narrow-visible-devices");
  if (o->allow_no_pmi) push(v, n, "--allow-no-pmi");
  if (o->verbose) push(v, n, "-v");
}

static int allocation_mode(launch_opts_t *o) {
  char err[256];
  const char *nl = getenv("SLURM_JOB_NODELIST");
  if (!nl || !*nl) nl = getenv("SLURM_NODELIST");
  if (!nl || !*nl) {
    launch_error("SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not");
    return LAUNCH_EXIT_SETUP;
  }
  char **names;
  size_t nn;
  if (launch_hostlist_expand(nl, &names, &nn, err, sizeof err) != 0) {
    launch_error("SLURM_JOB_NODELIST is malformed: %s", err);
    return LAUNCH_EXIT_SETUP;
  }
  int ntasks = 0, np = o->np;
  const char *nt = getenv("SLURM_NTASKS");
  if (nt && *nt && launch_parse_uint(nt, 1 << 24, &ntasks) != 0) {
    launch_error("SLURM_NTASKS='%s' is not a number", nt);
    launch_strv_free(names, nn);
    return LAUNCH_EXIT_SETUP;
  }
  if (!np) np = ntasks;
  if (!np) {
    launch_error("give -np N: the allocation does not say how many tasks to start (SLURM_NTASKS is unset)");
    launch_strv_free(names, nn);
    return LAUNCH_EXIT_SETUP;
  }
  if (ntasks && np > ntasks) {
    launch_error("-np %d is more than the %d tasks of this allocation (SLURM_NTASKS): srun would "
                 "wait for resources that never come; ask sbatch for --ntasks=%d", np, ntasks, np);
    launch_strv_free(names, nn);
    return LAUNCH_EXIT_SETUP;
  }
  /* The allocation's own spread when it adds up to np, else an even spread. */
  int *tpn = NULL;
  size_t ntpn = 0;
  const char *ts = getenv("SLURM_TASKS_PER_NODE");
  if (ts && *ts) {
    if (launch_tasks_per_node_parse(ts, &tpn, &ntpn, err, sizeof err) != 0) {
      launch_error("SLURM_TASKS_PER_NODE is malformed: %s", err);
      launch_strv_free(names, nn);
      return LAUNCH_EXIT_SETUP;
    }
    long sum = 0;
    for (size_t i = 0; i < ntpn; i++) sum += tpn[i];
    if (ntpn != nn || sum != np) {
      free(tpn);
      tpn = NULL;
    }
  }
  launch_layout_t l;
  int rc = launch_layout_plan(np, names, nn, tpn, &l);
  free(tpn);
  launch_strv_free(names, nn);
  if (rc != 0) return LAUNCH_EXIT_SETUP;
  if (o->dry_run) {
    rc = dry_run_all(o, &l);
    launch_layout_free(&l);
    return rc;
  }
  if (!o->prog || launch_check_program(o->prog[0]) != 0) {
    if (!o->prog) launch_error("no program given: usage is launch [options] [--] program [args] (launch --help)");
    launch_layout_free(&l);
    return LAUNCH_EXIT_SETUP;
  }
  int uniform = 1;
  for (int i = 1; i < l.nnodes; i++) uniform &= l.tpn[i] == l.tpn[0];
  char **v = NULL;
  int n = 0;
  char a_n[32], a_nodes[32], a_tpn[48], a_gpr[32];
  snprintf(a_n, sizeof a_n, "--ntasks=%d", np);
  snprintf(a_nodes, sizeof a_nodes, "--nodes=%d", l.nnodes);
  snprintf(a_tpn, sizeof a_tpn, "--ntasks-per-node=%d", l.tpn[0]);
  push(&v, &n, "srun");
  push(&v, &n, "--mpi=pmix");
  /* No --kill-on-bad-exit: each task's launch cancels the step itself when its program fails,
   * and leaves it alone for HORA_EXIT_REQUEUE (3), which every rank returns after a collective
   * checkpoint flush; with the flag the first rank to exit 3 would get the others killed and the
   * step's status would no longer say "requeue". */
  push(&v, &n, "--cpu-bind=none");
  push(&v, &n, a_n);
  push(&v, &n, a_nodes);
  if (uniform) push(&v, &n, a_tpn);
  push_self_opts(&v, &n, o, a_gpr, sizeof a_gpr);
  push(&v, &n, "--");
  for (char **p = o->prog; *p; p++) push(&v, &n, *p);
  launch_layout_free(&l);
  if (o->verbose) {
    fprintf(stderr, "launch: info: running");
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", v[i]);
    fprintf(stderr, "\n");
  }
  fflush(NULL);
  /* srun exits with the highest status of all tasks (143 for the ones it terminated after the
   * first failure); the first failing rank's own status is in its launch's failure line. */
  launch_run_t r = {.rank = -1, .watch = 1, .forward_from_parent = 0};
  rc = launch_run(&r, v);
  free(v);
  if (rc != 0 && r.first_failure > 0) rc = r.first_failure;
  return rc;
}

static int local_mode(launch_opts_t *o) {
  char err[256];
  char **hosts = NULL;
  int *slots = NULL;
  size_t nh = 0;
  char host[256];
  if (o->hosts) {
    if (launch_hosts_parse(o->hosts, &hosts, &slots, &nh, err, sizeof err) != 0) {
      launch_error("-H: %s", err);
      return LAUNCH_EXIT_SETUP;
    }
  } else {
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    hosts = calloc(1, sizeof(char *));
    slots = calloc(1, sizeof(int));
    if (!hosts || !slots) return LAUNCH_EXIT_SETUP;
    hosts[0] = strdup(host);
    slots[0] = o->np ? o->np : 1;
    nh = 1;
  }
  long total = 0;
  for (size_t i = 0; i < nh; i++) total += slots[i];
  int np = o->np ? o->np : (int)total;
  /* Fill the hosts' slots in order; ranks beyond them go round-robin (oversubscribed). */
  int *tpn = calloc(nh, sizeof(int)), left = np;
  for (size_t i = 0; i < nh && left > 0; i++) {
    tpn[i] = slots[i] < left ? slots[i] : left;
    left -= tpn[i];
  }
  for (size_t i = 0; left > 0; i = (i + 1) % nh, left--) tpn[i]++;
  int oversubscribe = np > total || (!o->hosts && np > (int)sysconf(_SC_NPROCESSORS_ONLN));
  launch_layout_t l;
  int rc = launch_layout_plan(np, hosts, nh, tpn, &l);
  free(tpn);
  free(slots);
  launch_strv_free(hosts, nh);
  if (rc != 0) return LAUNCH_EXIT_SETUP;
  if (o->dry_run) {
    rc = dry_run_all(o, &l);
    launch_layout_free(&l);
    return rc;
  }
  if (!o->prog || launch_check_program(o->prog[0]) != 0) {
    if (!o->prog) launch_error("no program given: usage is launch [options] [--] program [args] (launch --help)");
    launch_layout_free(&l);
    return LAUNCH_EXIT_SETUP;
  }
  /* -H with the planned counts and --map-by slot: mpirun puts ranks exactly where the plan says. */
  size_t hl = 0, tl = 0, cl = 0, cap = 64;
  for (int i = 0; i < l.nnodes; i++) cap += strlen(l.node_names[i]) + 16;
  char *hs = malloc(cap), *ts = malloc(cap), *cs = malloc(cap);
  if (!hs || !ts || !cs) return LAUNCH_EXIT_SETUP;
  hs[0] = ts[0] = cs[0] = 0;
  for (int i = 0; i < l.nnodes; i++) {
    hl += (size_t)snprintf(hs + hl, cap - hl, "%s%s:%d", i ? "," : "", l.node_names[i], l.tpn[i]);
    tl += (size_t)snprintf(ts + tl, cap - tl, "%s%d", i ? "," : "", l.tpn[i]);
    cl += (size_t)snprintf(cs + cl, cap - cl, "%s%s", i ? "," : "", l.node_names[i]);
  }
  char a_np[32], a_gpr[32];
  snprintf(a_np, sizeof a_np, "%d", np);
  char **v = NULL;
  int n = 0;
  push(&v, &n, "mpirun");
  push(&v, &n, "-np");
  push(&v, &n, a_np);
  push(&v, &n, "-H");
  push(&v, &n, hs);
  push(&v, &n, "--map-by");
  push(&v, &n, "slot");
  push(&v, &n, "--bind-to");
  push(&v, &n, "none");
  if (oversubscribe) push(&v, &n, "--oversubscribe");
  /* Remote hosts get only what -x names. */
  static const char *fwd[] = {"PATH", "LD_LIBRARY_PATH", NULL};
  for (int i = 0; fwd[i]; i++)
    if (getenv(fwd[i])) push(&v, &n, "-x"), push(&v, &n, fwd[i]);
  extern char **environ;
  for (char **e = environ; *e; e++)
    if (strncmp(*e, "HORA_", 5) == 0) {
      char *name = strndup(*e, strcspn(*e, "="));
      push(&v, &n, "-x");
      push(&v, &n, name);
    }
  push_self_opts(&v, &n, o, a_gpr, sizeof a_gpr);
  push(&v, &n, "--mpirun-child");
  push(&v, &n, "--child-tpn");
  push(&v, &n, ts);
  push(&v, &n, "--child-hosts");
  push(&v, &n, cs);
  push(&v, &n, "--");
  for (char **p = o->prog; *p; p++) push(&v, &n, *p);
  launch_layout_free(&l);
  if (getuid() == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  if (o->verbose) {
    fprintf(stderr, "launch: info: running");
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", v[i]);
    fprintf(stderr, "\n");
  }
  fflush(NULL);
  execvp("mpirun", v);
  launch_error("cannot execute mpirun: %m");
  return LAUNCH_EXIT_SETUP;
}

int main(int argc, char **argv) {
  launch_opts_t o;
  int prc = parse_opts(argc, argv, &o);
  if (prc != 0) return prc > 0 ? 0 : LAUNCH_EXIT_SETUP;
  if (o.mpirun_child) return rank_mode(&o, 0);
  if (getenv("OMPI_COMM_WORLD_RANK")) {
    launch_error("launch was started by mpirun: run `launch -np N prog` instead (launch starts mpirun itself)");
    return LAUNCH_EXIT_SETUP;
  }
  int in_step = getenv("SLURM_STEP_ID") && getenv("SLURM_PROCID");
  if (in_step && !o.use_mpirun) return rank_mode(&o, 1);
  if (getenv("SLURM_JOB_ID") && !o.use_mpirun && !o.hosts) return allocation_mode(&o);
  return local_mode(&o);
}
