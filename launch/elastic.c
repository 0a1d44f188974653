/* launch --elastic: the driver of an elastic job, run once in the batch script (docs/elastic.md).
 *
 *   loop:  usable = the allocation's nodes that sinfo calls idle/alloc/mix/comp
 *          k = min(usable, --max-nodes); fewer than --min-nodes: wait for nodes (--elastic-wait)
 *          write k to the hosts file (HORA_ELASTIC_HOSTS_FILE), log the step
 *          srun --nodes=k --nodelist=<usable> --ntasks=k*tpn ... launch --elastic-step -- prog
 *          while it runs: once a second, when more nodes are usable than the step has, write
 *            the new count to the hosts file (the program re-forms at its next
 *            hora_elastic_hosts_changed, usually an epoch boundary)
 *          a rank lost (its launch's line on srun's stderr, which the driver copies through) or a
 *            node of the step no longer usable: start the next step at once (srun --overlap),
 *            leaving this one to end; "<hosts file>.prev" exists until it has, and the new
 *            step's hora_elastic_sync waits for that before it looks for commits
 *          exit 0: done;  3 (requeue): return 3;  anything else: a new step (--max-restarts)
 *          a signal to the driver (scancel, --signal=B:USR1@T) goes to srun; then no new step
 *
 * A rank that dies leaves its peers to notice (HORA_ERR_REMOTE within HORA_PEER_TIMEOUT_S), save
 * their last commit and exit with status 4: in an --elastic-step, launch does not end the step
 * at a rank's failure (step.c), it only arms a late SIGKILL in case the survivors hang. The next
 * step's processes start (Python, imports, hora_init) while the survivors wait out the peer
 * timeout, so a restart costs about max(peer timeout, program start-up), not their sum. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"

/* The srun of the running step, for the signal handler; a signal stops further restarts. */
static volatile pid_t g_srun = 0;
static volatile sig_atomic_t g_signaled = 0;

/* SIGTERM/SIGINT/SIGHUP/SIGUSR1/SIGUSR2 sent to the driver (scancel, `--signal=B:USR1@T`) go to
 * srun, which passes them to every task; the driver then starts no new step. */
static pid_t g_prev_pid(void);
static void forward(int sig) {
  g_signaled = sig;
  if (g_srun > 0) kill(g_srun, sig);
  if (g_prev_pid() > 0) kill(g_prev_pid(), sig);
}

typedef struct {
  char **all; /* the allocation's nodes */
  int nall, tpn;
  const launch_opts_t *o;
  char hosts_file[512];
} el_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int usable_state(const char *st) {
  static const char *ok[] = {"idle", "alloc", "mix", "comp", "completing", "allocated", "mixed", NULL};
  for (int i = 0; ok[i]; i++)
    if (strcmp(st, ok[i]) == 0) return 1;
  return 0;
}

/* usable[i] = 1 for the nodes Slurm may run a step on now; returns their count, -1 when sinfo
 * could not be asked (then every node counts as usable: the step's failure will tell). */
static int query_usable(const el_t *e, int *usable) {
  char cmd[8192] = "sinfo -h -N -o '%N %t' -n ";
  for (int i = 0; i < e->nall; i++) {
    if (strspn(e->all[i], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") != strlen(e->all[i]))
      return -1; /* never put an odd name into a shell command */
    strncat(cmd, e->all[i], sizeof cmd - strlen(cmd) - 2);
    if (i + 1 < e->nall) strncat(cmd, ",", sizeof cmd - strlen(cmd) - 1);
  }
  strncat(cmd, " 2>/dev/null", sizeof cmd - strlen(cmd) - 1);
  FILE *f = popen(cmd, "r");
  if (!f) return -1;
  for (int i = 0; i < e->nall; i++) usable[i] = 0;
  char name[256], st[64];
  int lines = 0;
  while (fscanf(f, "%255s %63s", name, st) == 2) {
    lines++;
    for (int i = 0; i < e->nall; i++)
      if (strcmp(name, e->all[i]) == 0) usable[i] = usable_state(st);
  }
  if (pclose(f) != 0 || lines == 0) {
    for (int i = 0; i < e->nall; i++) usable[i] = 1;
    return -1;
  }
  int n = 0;
  for (int i = 0; i < e->nall; i++) n += usable[i];
  return n;
}

static void write_hosts(const el_t *e, int k) {
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp", e->hosts_file);
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "%d\n", k) < 0 || fclose(f) != 0 || rename(tmp, e->hosts_file) != 0)
    launch_warn("elastic: cannot write %s: %m (the job will not grow back)", e->hosts_file);
}

/* The program's rank 0 writes "<hosts file>.commit" after its sync (runtime/ckpt/elastic_sync.c):
 * print it once per step. */
static void log_resumed(const el_t *e, int step, int *logged) {
  char path[600], line[256];
  snprintf(path, sizeof path, "%s.commit", e->hosts_file);
  FILE *f = *logged ? NULL : fopen(path, "r");
  if (!f) return;
  if (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    fprintf(stderr, "launch: elastic: step %d resumed %s\n", step, line);
    *logged = 1;
  }
  fclose(f);
}

/* srun's stderr comes through a pipe: the driver copies it to its own stderr at once and watches
 * its lines for a rank's death, which the failed rank's launch reports there (step.c: "the other
 * ranks re-form the job"). */
typedef struct {
  pid_t pid;
  int fd; /* read end of srun's stderr; -1 once closed */
  char line[4096];
  size_t len;
  int lost; /* a rank-lost line was seen */
} el_srun_t;

static int start_srun(char **argv, el_srun_t *r) {
  int p[2];
  if (pipe(p) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]), close(p[1]);
    return -1;
  }
  if (pid == 0) {
    static const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], SIG_DFL);
    dup2(p[1], 2);
    close(p[0]), close(p[1]);
    execvp(argv[0], argv);
    launch_error("elastic: cannot execute %s: %m", argv[0]);
    _exit(127);
  }
  close(p[1]);
  fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
  *r = (el_srun_t){.pid = pid, .fd = p[0]};
  return 0;
}

/* Copies what srun wrote to stderr (waiting up to wait_ms for it) and scans the whole lines. */
static void relay(el_srun_t *r, int wait_ms) {
  if (r->fd < 0) {
    if (wait_ms > 0) usleep((useconds_t)wait_ms * 1000);
    return;
  }
  struct pollfd pfd = {.fd = r->fd, .events = POLLIN};
  if (poll(&pfd, 1, wait_ms) <= 0) return;
  char buf[8192];
  ssize_t n;
  while ((n = read(r->fd, buf, sizeof buf)) > 0) {
    for (ssize_t off = 0; off < n;) {
      ssize_t w = write(2, buf + off, (size_t)(n - off));
      if (w <= 0) break;
      off += w;
    }
    for (ssize_t i = 0; i < n; i++) {
      if (buf[i] != '\n') {
        if (r->len + 1 < sizeof r->line) r->line[r->len++] = buf[i];
        continue;
      }
      r->line[r->len] = 0;
      if (strstr(r->line, "the other ranks re-form the job")) r->lost = 1;
      r->len = 0;
    }
  }
  if (n == 0) close(r->fd), r->fd = -1; /* EOF: srun and everything it started closed stderr */
}

/* Exit status of a reaped srun (128+signal when killed). */
static int srun_status(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

/* The previous step, still ending after the driver started the next one: reaped here. */
static el_srun_t g_prev = {.pid = 0, .fd = -1};
static int g_prev_step = -1;
static pid_t g_prev_pid(void) { return g_prev.pid; }

static void reap_prev(const el_t *e, int block) {
  if (g_prev.pid <= 0) return;
  int st = 0;
  while (block && g_prev.fd >= 0) relay(&g_prev, 100);
  relay(&g_prev, 0);
  pid_t w = waitpid(g_prev.pid, &st, block ? 0 : WNOHANG);
  if (w != g_prev.pid && !(w < 0 && errno != EINTR)) return;
  while (g_prev.fd >= 0) relay(&g_prev, 100);
  char prev[600];
  snprintf(prev, sizeof prev, "%s.prev", e->hosts_file);
  unlink(prev);
  fprintf(stderr, "launch: elastic: step %d ended: status %d (its survivors have saved their commit)\n", g_prev_step,
          w == g_prev.pid ? srun_status(st) : -1);
  g_prev.pid = 0;
}

/* Runs one srun step; while it runs, reports more usable nodes through the hosts file. Returns
 * srun's exit status (128+signal when killed), or EL_LOST when may_restart and a rank or node of
 * the step was lost while it runs: srun is then left to end in g_prev (its survivors save their
 * commit meanwhile) and the next step can start at once. */
#define EL_LOST (-2)
static int run_step(const el_t *e, char **argv, int k, int step, int may_restart, int *grew) {
  char commit_file[600];
  snprintf(commit_file, sizeof commit_file, "%s.commit", e->hosts_file);
  unlink(commit_file);
  int logged = 0;
  el_srun_t r;
  if (start_srun(argv, &r) != 0) {
    launch_error("elastic: cannot start srun: %m");
    return LAUNCH_EXIT_SETUP;
  }
  g_srun = r.pid;
  int *usable = calloc((size_t)e->nall, sizeof(int)), st = 0, lost = 0;
  double next = now_s() + 1;
  *grew = 0;
  for (;;) {
    relay(&r, 100);
    pid_t w = waitpid(r.pid, &st, WNOHANG);
    if (w == r.pid || (w < 0 && errno != EINTR)) break;
    reap_prev(e, 0);
    if (r.lost && may_restart && !g_signaled) {
      lost = 1;
      break;
    }
    if (now_s() < next || !usable) continue;
    log_resumed(e, step, &logged);
    next = now_s() + 1;
    int n = query_usable(e, usable), cap = e->o->max_nodes ? e->o->max_nodes : e->nall;
    if (n >= 0 && n < k && may_restart && !g_signaled) { /* a node of this step is drained or down */
      lost = 1;
      break;
    }
    if (n > k && k < cap && !*grew) {
      *grew = n < cap ? n : cap;
      launch_info(1, "elastic: %d nodes usable, the step runs on %d: asking the program to re-form", *grew, k);
      write_hosts(e, *grew);
    }
  }
  log_resumed(e, step, &logged);
  unlink(commit_file);
  free(usable);
  if (lost) {
    reap_prev(e, 1); /* at most one step ending at a time */
    g_prev = r;
    g_prev_step = step;
    g_srun = 0;
    char prev[600];
    snprintf(prev, sizeof prev, "%s.prev", e->hosts_file);
    FILE *f = fopen(prev, "w");
    if (!f || fprintf(f, "%d\n", (int)r.pid) < 0 || fclose(f) != 0)
      launch_warn("elastic: cannot write %s: %m (the next step may not wait for the survivors' commit)", prev);
    return EL_LOST;
  }
  while (r.fd >= 0) relay(&r, 100);
  g_srun = 0;
  return srun_status(st);
}

/* The nodes of the next step: the first min(usable, max) usable ones, as a comma list in `list`;
 * waits up to --elastic-wait seconds for --min-nodes. Returns k, or -1 after an error line. */
static int pick_nodes(const el_t *e, char *list, size_t cap) {
  int *usable = calloc((size_t)e->nall, sizeof(int));
  if (!usable) return -1;
  int maxn = e->o->max_nodes ? e->o->max_nodes : e->nall, minn = e->o->min_nodes ? e->o->min_nodes : 1, n = 0;
  double until = now_s() + e->o->elastic_wait_s;
  for (;;) {
    n = query_usable(e, usable);
    if (n < 0) n = e->nall;
    if (n >= minn || now_s() >= until) break;
    reap_prev(e, 0); /* keep copying an ending step's stderr (a full pipe would block its ranks) */
    usleep(500000);
  }
  int k = 0;
  list[0] = 0;
  for (int i = 0; i < e->nall && k < maxn; i++)
    if (usable[i]) {
      size_t len = strlen(list);
      snprintf(list + len, cap - len, "%s%s", k ? "," : "", e->all[i]);
      k++;
    }
  free(usable);
  if (k < minn) {
    launch_error("elastic: %d usable nodes of the allocation, fewer than --min-nodes %d after waiting %d s", k, minn,
                 e->o->elastic_wait_s);
    return -1;
  }
  return k;
}

int launch_elastic_run(const launch_opts_t *o, const launch_layout_t *l, char **tail) {
  for (int i = 1; i < l->nnodes; i++)
    if (l->tpn[i] != l->tpn[0]) {
      launch_error("--elastic needs the same number of tasks on every node (SLURM_TASKS_PER_NODE)");
      return LAUNCH_EXIT_SETUP;
    }
  el_t e = {.all = l->node_names, .nall = l->nnodes, .tpn = l->tpn[0], .o = o};
  const char *job = getenv("SLURM_JOB_ID"), *tmp = getenv("TMPDIR");
  snprintf(e.hosts_file, sizeof e.hosts_file, "%s/hora-elastic-hosts-%s", tmp && *tmp ? tmp : "/tmp", job ? job : "0");
  setenv("HORA_ELASTIC_HOSTS_FILE", e.hosts_file, 1);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = forward;
  static const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, NULL);
  int prev = 0, rc = 0, grew = 0;
  const char *reason = "start";
  char why[160] = "", list[4096];
  for (int restart = 0;; restart++) {
    int k = pick_nodes(&e, list, sizeof list);
    if (k < 0) {
      reap_prev(&e, 1);
      unlink(e.hosts_file);
      return LAUNCH_EXIT_SETUP;
    }
    write_hosts(&e, k);
    char a_n[32], a_nodes[32], a_tpn[48], a_list[4200];
    snprintf(a_n, sizeof a_n, "--ntasks=%d", k * e.tpn);
    snprintf(a_nodes, sizeof a_nodes, "--nodes=%d", k);
    snprintf(a_tpn, sizeof a_tpn, "--ntasks-per-node=%d", e.tpn);
    snprintf(a_list, sizeof a_list, "--nodelist=%s", list);
    size_t nt = 0;
    while (tail[nt]) nt++;
    char **argv = calloc(nt + 9, sizeof(char *));
    if (!argv) {
      reap_prev(&e, 1);
      unlink(e.hosts_file);
      return LAUNCH_EXIT_SETUP;
    }
    /* --overlap: the previous step's survivors still hold their CPUs while they save */
    char *head[] = {"srun", "--mpi=pmix", "--cpu-bind=none", a_n, a_nodes, a_tpn, a_list, "--overlap"};
    const size_t nh = g_prev.pid > 0 ? 8 : 7;
    memcpy(argv, head, nh * sizeof(char *));
    memcpy(argv + nh, tail, nt * sizeof(char *));
    fprintf(stderr, "launch: elastic: step %d (%s): %d nodes (%s), world size %d (was %d)\n", restart, reason, k, list,
            k * e.tpn, prev);
    fflush(NULL);
    rc = run_step(&e, argv, k, restart, restart < o->max_restarts, &grew);
    free(argv);
    prev = k * e.tpn;
    if (rc == EL_LOST) {
      snprintf(why, sizeof why, "a rank or node was lost; step %d still ending", restart);
      reason = why;
      fprintf(stderr, "launch: elastic: step %d lost a rank or node: the next step starts now, its sync waits for "
              "the survivors' commit\n", restart);
      continue;
    }
    reap_prev(&e, 1);
    if (rc == 0 || rc == LAUNCH_EXIT_REQUEUE || restart >= o->max_restarts || g_signaled) {
      if (g_signaled)
        fprintf(stderr, "launch: elastic: step %d exited with status %d after signal %d to the driver: no new step\n",
                restart, rc, (int)g_signaled);
      else if (rc != 0 && rc != LAUNCH_EXIT_REQUEUE)
        fprintf(stderr, "launch: elastic: step %d exited with status %d; --max-restarts %d reached\n", restart, rc,
                o->max_restarts);
      unlink(e.hosts_file);
      return rc;
    }
    if (grew) snprintf(why, sizeof why, "%d nodes usable again, step exited with status %d", grew, rc);
    else snprintf(why, sizeof why, "step exited with status %d (a rank or node was lost)", rc);
    reason = why;
    fprintf(stderr, "launch: elastic: step %d ended: %s\n", restart, why);
  }
}
