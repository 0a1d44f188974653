/* Where this rank sits: read from an srun step or from mpirun, or planned block-wise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"

static int env_int(const char *name, int required, int max, int *out) {
  const char *v = getenv(name);
  if (!v || !*v) {
    if (required) launch_error("%s is not set: is this an srun step?", name);
    return required ? -1 : 1;
  }
  if (launch_parse_uint(v, max, out) != 0) {
    launch_error("%s='%s' is not a non-negative integer", name, v);
    return -1;
  }
  return 0;
}

static const char *env_first(const char **names, const char **which) {
  for (; *names; names++) {
    const char *v = getenv(*names);
    if (v && *v) {
      *which = *names;
      return v;
    }
  }
  return NULL;
}

void launch_layout_free(launch_layout_t *l) {
  launch_strv_free(l->node_names, (size_t)l->nnodes);
  free(l->tpn);
  memset(l, 0, sizeof(*l));
}

void launch_layout_locate(const launch_layout_t *l, int rank, int *node, int *local_rank) {
  int first = 0;
  for (int i = 0; i < l->nnodes; i++) {
    if (rank < first + l->tpn[i]) {
      *node = i;
      *local_rank = rank - first;
      return;
    }
    first += l->tpn[i];
  }
  *node = -1;
  *local_rank = -1;
}

int launch_layout_plan(int np, char **names, size_t nnodes, const int *tpn, launch_layout_t *l) {
  memset(l, 0, sizeof(*l));
  if (np < 1 || nnodes < 1) {
    launch_error("cannot place %d rank(s) on %zu node(s)", np, nnodes);
    return -1;
  }
  l->node_names = calloc(nnodes, sizeof(char *));
  l->tpn = calloc(nnodes, sizeof(int));
  if (!l->node_names || !l->tpn) {
    launch_error("out of memory");
    launch_layout_free(l);
    return -1;
  }
  int placed = 0, n = 0;
  for (size_t i = 0; i < nnodes && placed < np; i++) {
    int k = tpn ? tpn[i] : np / (int)nnodes + ((int)i < np % (int)nnodes);
    if (k > np - placed) k = np - placed;
    if (k <= 0) continue;
    l->node_names[n] = strdup(names[i]);
    l->tpn[n] = k;
    n++;
    placed += k;
  }
  l->nnodes = n;
  if (placed < np) {
    launch_error("cannot place %d ranks: the nodes hold only %d task slots", np, placed);
    launch_layout_free(l);
    return -1;
  }
  l->size = np;
  return 0;
}

/* Node names and tasks-per-node of a step, cross-checked. */
static int read_step_nodes(launch_layout_t *l) {
  static const char *list_vars[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", NULL};
  static const char *tpn_vars[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", NULL};
  const char *lv = NULL, *tv = NULL, *list, *tpns;
  char err[256];
  if (!(list = env_first(list_vars, &lv))) {
    launch_error("none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST is set");
    return -1;
  }
  if (!(tpns = env_first(tpn_vars, &tv))) {
    launch_error("none of SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE is set");
    return -1;
  }
  char **names;
  size_t nn, nt;
  int *tpn;
  if (launch_hostlist_expand(list, &names, &nn, err, sizeof err) != 0) {
    launch_error("%s is malformed: %s", lv, err);
    return -1;
  }
  if (launch_tasks_per_node_parse(tpns, &tpn, &nt, err, sizeof err) != 0) {
    launch_strv_free(names, nn);
    launch_error("%s is malformed: %s", tv, err);
    return -1;
  }
  if (nn != nt) {
    launch_error("%s='%s' names %zu node(s) but %s='%s' gives task counts for %zu", lv, list, nn, tv,
                 tpns, nt);
    launch_strv_free(names, nn);
    free(tpn);
    return -1;
  }
  l->node_names = names;
  l->tpn = tpn;
  l->nnodes = (int)nn;
  return 0;
}

int launch_layout_from_step(const launch_opts_t *o, launch_layout_t *l) {
  memset(l, 0, sizeof(*l));
  (void)o;
  int size = 0;
  if (env_int("SLURM_PROCID", 1, 1 << 24, &l->rank) != 0) return -1;
  int rc = env_int("SLURM_STEP_NUM_TASKS", 0, 1 << 24, &size);
  if (rc < 0) return -1;
  if (rc > 0 && env_int("SLURM_NTASKS", 1, 1 << 24, &size) != 0) return -1;
  l->size = size;
  if (env_int("SLURM_LOCALID", 1, 1 << 24, &l->local_rank) != 0) return -1;
  if (env_int("SLURM_NODEID", 1, 1 << 24, &l->node) != 0) return -1;
  if (read_step_nodes(l) != 0) return -1;
  long total = 0;
  for (int i = 0; i < l->nnodes; i++) total += l->tpn[i];
  if (total != l->size) {
    launch_error("the step's tasks per node add up to %ld but it has %d tasks (SLURM_STEP_NUM_TASKS/SLURM_NTASKS)",
                 total, l->size);
    goto bad;
  }
  if (l->rank >= l->size) {
    launch_error("SLURM_PROCID=%d is not below the step's %d tasks", l->rank, l->size);
    goto bad;
  }
  if (l->node >= l->nnodes) {
    launch_error("SLURM_NODEID=%d is not below the step's %d node(s)", l->node, l->nnodes);
    goto bad;
  }
  l->local_size = l->tpn[l->node];
  const char *gtids = getenv("SLURM_GTIDS");
  if (gtids && *gtids) {
    int n = 1;
    for (const char *p = gtids; *p; p++) n += (*p == ',');
    if (n != l->local_size) {
      launch_error("SLURM_GTIDS='%s' lists %d task(s) on this node but the tasks-per-node string gives %d",
                   gtids, n, l->local_size);
      goto bad;
    }
  }
  if (l->local_rank >= l->local_size) {
    launch_error("SLURM_LOCALID=%d is not below the %d task(s) of this node", l->local_rank, l->local_size);
    goto bad;
  }
  l->hostname_env = getenv("SLURMD_NODENAME");
  if (l->hostname_env && strcmp(l->hostname_env, l->node_names[l->node]) != 0)
    launch_warn("SLURMD_NODENAME=%s but node %d of the step's node list is %s", l->hostname_env,
                l->node, l->node_names[l->node]);
  return 0;
bad:
  launch_layout_free(l);
  return -1;
}

int launch_layout_from_mpirun(const launch_opts_t *o, launch_layout_t *l) {
  memset(l, 0, sizeof(*l));
  int rank, size;
  char err[256];
  if (env_int("OMPI_COMM_WORLD_RANK", 1, 1 << 24, &rank) != 0) return -1;
  if (env_int("OMPI_COMM_WORLD_SIZE", 1, 1 << 24, &size) != 0) return -1;
  char **names;
  size_t nn, nt;
  int *tpn;
  if (launch_hostlist_expand(o->child_hosts, &names, &nn, err, sizeof err) != 0) {
    launch_error("internal host list: %s", err);
    return -1;
  }
  if (launch_tasks_per_node_parse(o->child_tpn, &tpn, &nt, err, sizeof err) != 0 || nt != nn) {
    launch_error("internal tasks-per-host list '%s' does not match the hosts", o->child_tpn);
    launch_strv_free(names, nn);
    return -1;
  }
  int rc = launch_layout_plan(size, names, nn, tpn, l);
  launch_strv_free(names, nn);
  free(tpn);
  if (rc != 0) return -1;
  l->rank = rank;
  launch_layout_locate(l, rank, &l->node, &l->local_rank);
  if (l->node < 0) {
    launch_error("OMPI_COMM_WORLD_RANK=%d is outside the planned %d ranks", rank, size);
    launch_layout_free(l);
    return -1;
  }
  l->local_size = l->tpn[l->node];
  return 0;
}

int launch_check_pmi(const launch_opts_t *o) {
  static const char *pmi_vars[] = {"PMIX_RANK", "PMIX_NAMESPACE", "PMI_RANK", "PMI_FD", "PMI_SIZE", NULL};
  const char *which;
  if (o->allow_no_pmi || env_first(pmi_vars, &which)) return 0;
  const char *mt = getenv("SLURM_MPI_TYPE");
  launch_error("this srun step has no PMI (SLURM_MPI_TYPE=%s and no PMIX_*/PMI_* variables): MPI "
               "could not join the %s tasks into one world. Use `srun --mpi=pmix ...` (or set "
               "SLURM_MPI_TYPE=pmix), or run `launch -np N prog` from the batch script so that launch "
               "starts srun itself. The program was not started.",
               mt && *mt ? mt : "(unset)", getenv("SLURM_NTASKS") ? getenv("SLURM_NTASKS") : "step's");
  return -1;
}

int launch_layout_from_alloc(const launch_opts_t *o, launch_layout_t *l) {
  memset(l, 0, sizeof(*l));
  char err[256];
  const char *nl = getenv("SLURM_JOB_NODELIST");
  if (!nl || !*nl) nl = getenv("SLURM_NODELIST");
  if (!nl || !*nl) {
    launch_error("SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not");
    return -1;
  }
  char **names = NULL;
  size_t nn = 0, ntpn = 0;
  int *tpn = NULL, ntasks = 0, np = o->np, rc = -1;
  if (launch_hostlist_expand(nl, &names, &nn, err, sizeof err) != 0) {
    launch_error("SLURM_JOB_NODELIST is malformed: %s", err);
    return -1;
  }
  const char *nt = getenv("SLURM_NTASKS"), *ts = getenv("SLURM_TASKS_PER_NODE");
  if (nt && *nt && launch_parse_uint(nt, LAUNCH_MAX_RANKS, &ntasks) != 0) {
    launch_error("SLURM_NTASKS='%s' is not a number of tasks (0..%d)", nt, LAUNCH_MAX_RANKS);
    goto done;
  }
  if (!np) np = ntasks;
  if (!np) {
    launch_error("give -np N: the allocation does not say how many tasks to start (SLURM_NTASKS is unset)");
    goto done;
  }
  if (ntasks && np > ntasks) {
    launch_error("-np %d is more than the %d tasks of this allocation (SLURM_NTASKS): srun would "
                 "wait for resources that never come; ask sbatch for --ntasks=%d", np, ntasks, np);
    goto done;
  }
  /* The allocation's own spread when it adds up to np, else an even spread. */
  if (ts && *ts) {
    if (launch_tasks_per_node_parse(ts, &tpn, &ntpn, err, sizeof err) != 0) {
      launch_error("SLURM_TASKS_PER_NODE is malformed: %s", err);
      goto done;
    }
    long sum = 0;
    for (size_t i = 0; i < ntpn; i++) sum += tpn[i];
    if (ntpn != nn || sum != np) {
      free(tpn);
      tpn = NULL;
    }
  }
  rc = launch_layout_plan(np, names, nn, tpn, l);
done:
  free(tpn);
  launch_strv_free(names, nn);
  return rc;
}

/* Local mode: -H's hosts and slots, else this host with one slot per rank. The ranks fill the
 * slots in order; ranks beyond them go round-robin (oversubscribed). */
int launch_layout_from_hosts(const launch_opts_t *o, launch_layout_t *l) {
  memset(l, 0, sizeof(*l));
  char err[256], host[256];
  char **hosts = NULL;
  int *slots = NULL, *tpn = NULL, rc = -1;
  size_t nh = 0;
  if (o->hosts) {
    if (launch_hosts_parse(o->hosts, &hosts, &slots, &nh, err, sizeof err) != 0) {
      launch_error("-H: %s", err);
      return -1;
    }
  } else {
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    nh = 1;
    hosts = calloc(1, sizeof(char *));
    slots = calloc(1, sizeof(int));
    if (hosts && (hosts[0] = strdup(host)) && slots) slots[0] = o->np ? o->np : 1;
  }
  if (hosts && hosts[0] && slots) tpn = calloc(nh, sizeof(int));
  if (!tpn) {
    launch_error("out of memory");
    goto done;
  }
  long total = 0;
  for (size_t i = 0; i < nh; i++) total += slots[i];
  if (!o->np && total > LAUNCH_MAX_RANKS) {
    launch_error("-H offers %ld slots, more than the %d ranks launch starts at most: give -np N", total,
                 LAUNCH_MAX_RANKS);
    goto done;
  }
  int np = o->np ? o->np : (int)total, left = np;
  for (size_t i = 0; i < nh && left > 0; i++) {
    tpn[i] = slots[i] < left ? slots[i] : left;
    left -= tpn[i];
  }
  for (size_t i = 0; left > 0; i = (i + 1) % nh, left--) tpn[i]++;
  rc = launch_layout_plan(np, hosts, nh, tpn, l);
  l->slots = total;
done:
  free(tpn);
  free(slots);
  launch_strv_free(hosts, nh);
  return rc;
}
