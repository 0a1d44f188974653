/* Step mode's run: export the HORA_* layout, bind, run the program, and when the program fails
 * end the whole step on every node.
 *
 * Ending the step: when this rank's program exits with a status other than 0 and 3 (3 is
 * HORA_EXIT_REQUEUE: every rank stops together after a checkpoint, nothing to end), or dies by a
 * signal, the other ranks would otherwise wait in their next collective until a timeout (or
 * forever, if they are stuck). launch prints one line naming the rank, node and status or
 * signal, and asks Slurm to signal every process of the step: SIGTERM at once (programs may
 * flush their logs), SIGKILL kill_after_s seconds later if the step still exists. The SIGKILL
 * comes from a small child process (the reaper) because this launch must exit for the step to
 * end: the reaper ignores the SIGTERM, checks twice a second whether the step is gone (then it
 * exits), and is killed with the step where Slurm tracks processes by cgroup. When Slurm itself sent this launch a
 * SIGTERM before the program died (preemption, scancel, another rank's launch ending the step),
 * the step is already being ended and launch adds nothing. In a step of `launch --elastic`
 * (--elastic-step) the step is not ended: the surviving ranks save their commit and exit with
 * status 4 (HORA_EXIT_ELASTIC) on their own; only a late SIGKILL is armed. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch.h"

static void setenv_int(const char *name, long v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", v);
  setenv(name, buf, 1);
}

/* CUDA_VISIBLE_DEVICES for --narrow-visible-devices: the rank's own GPUs, named as
 * CUDA_VISIBLE_DEVICES named them (or by their ordinals). */
static void narrow_visible(const launch_rank_plan_t *p) {
  char vis[256] = "";
  size_t len = 0;
  for (const char *s = p->gpu.ordinals; *s && len < sizeof vis;) {
    int ord = atoi(s);
    const char *name = p->gpus.cvd_set && ord < (int)p->gpus.ncvd ? p->gpus.cvd[ord] : NULL;
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
}

static void export_layout(const launch_opts_t *o, const launch_layout_t *l, const launch_rank_plan_t *p) {
  setenv_int("HORA_RANK", l->rank);
  setenv_int("HORA_SIZE", l->size);
  setenv_int("HORA_LOCAL_RANK", l->local_rank);
  setenv_int("HORA_LOCAL_SIZE", l->local_size);
  setenv_int("HORA_CROSS_RANK", l->node);
  setenv_int("HORA_CROSS_SIZE", l->nnodes);
  if (p->gpu.count <= 0) {
    setenv_int("HORA_DEVICE", -1);
    return;
  }
  setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
  if (o->narrow_visible) {
    narrow_visible(p);
    setenv_int("HORA_DEVICE", 0);
  } else {
    setenv_int("HORA_DEVICE", p->gpu.ordinal);
  }
}

/* Runs `cmd` (NULL-terminated) with its output discarded and waits up to `timeout_s` seconds;
 * returns its exit status, or -1 when it could not run or was killed at the timeout. */
static int run_quiet(char **cmd, int timeout_s) {
  pid_t pid = fork();
  if (pid == 0) {
    /* scancel runs inside the step it signals: it must outlive the SIGTERM it asks for. */
    signal(SIGTERM, SIG_IGN);
    int fd = open("/dev/null", O_RDWR);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
    execvp(cmd[0], cmd);
    _exit(127);
  }
  if (pid < 0) return -1;
  int st = 0;
  for (int i = 0; i < timeout_s * 10; i++) {
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    usleep(100000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

/* The reaper (see the top of this file); returns in the parent only. */
static void start_reaper(const char *id, int kill_after_s) {
  pid_t pid = fork();
  if (pid < 0) launch_warn("fork: cannot arm the SIGKILL of step %s: %m", id);
  if (pid != 0) return;
  static const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], SIG_IGN);
  setsid();
  int fd = open("/dev/null", O_RDWR);
  if (fd >= 0) dup2(fd, 0), dup2(fd, 1), dup2(fd, 2);
  char *show[] = {"scontrol", "-o", "show", "step", (char *)id, NULL};
  for (int t = 0; t < 2 * kill_after_s; t++) {
    usleep(500000);
    if (run_quiet(show, 10) != 0) _exit(0); /* the step is gone */
  }
  char *kill9[] = {"scancel", "--quiet", "--signal=KILL", (char *)id, NULL};
  run_quiet(kill9, 10);
  _exit(0);
}

/* One line for a failed program; in a multi-rank srun step, ends the step on every node. */
static void report_failure(const launch_opts_t *o, const launch_layout_t *l, const char *host,
                           const launch_run_t *r, int rc, int slurm_step) {
  const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
  char what[96], id[64] = "", end[160] = "";
  if (r->signaled) snprintf(what, sizeof what, "killed by signal %d (%s)", r->signaled, strsignal(r->signaled));
  else snprintf(what, sizeof what, "exited with status %d", rc);
  int end_step = slurm_step && l->size > 1 && job && step && r->parent_signal != SIGTERM;
  if (end_step) {
    snprintf(id, sizeof id, "%s.%s", job, step);
    snprintf(end, sizeof end, "; ending step %s on every node (SIGTERM, then SIGKILL after %d s)", id,
             o->kill_after_s);
  }
  if (end_step && o->elastic_step) {
    /* The survivors learn of this within HORA_PEER_TIMEOUT_S, save their commit and exit 4; a
     * late SIGKILL covers survivors that hang. */
    const char *pt = getenv("HORA_PEER_TIMEOUT_S");
    int grace = (pt && atof(pt) > 0 ? (int)atof(pt) : 30) + 30;
    snprintf(end, sizeof end, "; the other ranks re-form the job (step %s gets SIGKILL in %d s if still running)", id,
             grace);
    fprintf(stderr, "launch: rank %d (node %s): %s %s%s\n", l->rank, host, o->prog[0], what, end);
    fflush(NULL);
    start_reaper(id, grace);
    return;
  }
  fprintf(stderr, "launch: rank %d (node %s): %s %s%s\n", l->rank, host, o->prog[0], what, end);
  if (!end_step) return;
  fflush(NULL);
  if (o->kill_after_s == 0) {
    char *kill9[] = {"scancel", "--quiet", "--signal=KILL", id, NULL};
    if (run_quiet(kill9, 10) != 0) launch_warn("scancel --signal=KILL %s failed: the other ranks may keep running", id);
    return;
  }
  start_reaper(id, o->kill_after_s);
  /* SIGTERM (not SIGKILL) first so that this launch survives to return the program's status;
   * slurmstepd sends it to every process of the step, on every node. */
  char *term[] = {"scancel", "--quiet", "--signal=TERM", id, NULL};
  if (run_quiet(term, 10) != 0) launch_warn("scancel --signal=TERM %s failed: the other ranks may keep running", id);
}

int launch_step_run(const launch_opts_t *o, const launch_layout_t *l, launch_rank_plan_t *p, int slurm_step) {
  const launch_gpu_choice_t *c = &p->gpu;
  const char *host = l->hostname_env ? l->hostname_env : l->node_names[l->node];
  launch_info(o->verbose, "node %d (%s) local rank %d/%d gpu %s (cuda %d, bus %s) cpus %s", l->node, host,
              l->local_rank, l->local_size, c->count ? c->ids : "none", c->ordinal, c->bus_id[0] ? c->bus_id : "?",
              p->cpus);
  export_layout(o, l, p);
  if (o->bind != LAUNCH_BIND_NONE && launch_bind(p->topo, p->cpus) != 0) return LAUNCH_EXIT_SETUP;
  launch_topo_free(p->topo);
  p->topo = NULL;
  launch_run_t r = {.rank = l->rank, .output_dir = o->output_dir, .tag_output = o->tag_output,
                    .forward_from_parent = !slurm_step};
  fflush(NULL);
  int rc = launch_run(&r, o->prog);
  if (rc < 0) return LAUNCH_EXIT_SETUP; /* the program did not start; launch_run said why */
  if (rc == LAUNCH_EXIT_REQUEUE && !r.signaled)
    fprintf(stderr, "launch: rank %d (node %s): %s stopped for a requeue (status %d)\n", l->rank, host, o->prog[0],
            rc);
  else if (rc == LAUNCH_EXIT_ELASTIC && o->elastic_step && !r.signaled)
    fprintf(stderr, "launch: rank %d (node %s): %s stopped for the job to re-form (status %d)\n", l->rank, host,
            o->prog[0], rc);
  else if (rc != 0)
    report_failure(o, l, host, &r, rc, slurm_step);
  return rc;
}
