/* CPU placement with hwloc.
 *
 * Rule (docs/launch.md): a rank with a GPU is bound to the cores local to the GPU's PCI device
 * (the CPU set of its first non-I/O ancestor: NUMA group or package) intersected with the CPUs
 * the job may use; the local ranks whose GPUs share that set split its cores evenly (rank j of m
 * takes cores [j*n/m, (j+1)*n/m), wrapping round-robin when there are fewer cores than ranks).
 * Ranks without a GPU (or whose GPU the topology does not show) split the allowed cores the same
 * way. --bind none leaves every rank on the whole allowed set.
 *
 * Every launch process of a node computes the plan of all local ranks of that node, so the
 * split is the same everywhere without any communication. The work is linear in the local
 * ranks: ranks are grouped by CPU set (one hwloc lookup per distinct GPU, a handful of groups),
 * and a rank's share is computed from its group's size and its index in the group. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

/* The units [*lo, *hi) of rank j of m ranks sharing n units: [j*n/m, (j+1)*n/m), or unit j%n
 * when n < m (ranks then share units). */
static void unit_slice(int j, int n, int m, int *lo, int *hi) {
  if (n >= m) {
    *lo = (int)((long)j * n / m);
    *hi = (int)((long)(j + 1) * n / m);
  } else {
    *lo = j % n;
    *hi = *lo + 1;
  }
}

#if HORA_HAVE_HWLOC
#include <hwloc.h>

struct launch_topo {
  hwloc_topology_t topo;
  hwloc_bitmap_t allowed;
  int this_system;
  hwloc_obj_t *gpus;
  int ngpus;
};

static int cmp_pci(const void *a, const void *b) {
  hwloc_obj_t x = *(const hwloc_obj_t *)a, y = *(const hwloc_obj_t *)b;
  const struct hwloc_pcidev_attr_s *p = &x->attr->pcidev, *q = &y->attr->pcidev;
  if (p->domain != q->domain) return p->domain < q->domain ? -1 : 1;
  if (p->bus != q->bus) return p->bus < q->bus ? -1 : 1;
  if (p->dev != q->dev) return p->dev < q->dev ? -1 : 1;
  return (int)p->func - (int)q->func;
}

int launch_topo_load(const launch_opts_t *o, launch_topo_t **out) {
  launch_topo_t *t = calloc(1, sizeof(*t));
  if (!t) {
    launch_error("out of memory");
    return -1;
  }
  if (hwloc_topology_init(&t->topo) != 0) {
    free(t);
    launch_error("hwloc_topology_init failed");
    return -1;
  }
  hwloc_topology_set_io_types_filter(t->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (o->topology) {
    int rc;
    if (strncmp(o->topology, "synthetic:", 10) == 0)
      rc = hwloc_topology_set_synthetic(t->topo, o->topology + 10);
    else
      rc = hwloc_topology_set_xml(t->topo, o->topology);
    if (rc != 0) {
      launch_error("--topology '%s': hwloc cannot read it (an hwloc XML file or synthetic:DESCRIPTION)",
                   o->topology);
      goto fail;
    }
  }
  if (hwloc_topology_load(t->topo) != 0) {
    launch_error("hwloc could not load the topology%s%s", o->topology ? " " : "", o->topology ? o->topology : "");
    goto fail;
  }
  t->this_system = hwloc_topology_is_thissystem(t->topo);
  t->allowed = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(t->topo));
  if (t->this_system) {
    hwloc_bitmap_t cur = hwloc_bitmap_alloc();
    if (hwloc_get_cpubind(t->topo, cur, HWLOC_CPUBIND_PROCESS) == 0 && !hwloc_bitmap_iszero(cur))
      hwloc_bitmap_and(t->allowed, t->allowed, cur);
    hwloc_bitmap_free(cur);
  }
  for (hwloc_obj_t p = NULL; (p = hwloc_get_next_pcidev(t->topo, p));) {
    if (p->attr->pcidev.vendor_id != 0x10de) continue;
    if (p->attr->pcidev.class_id != 0x0300 && p->attr->pcidev.class_id != 0x0302) continue;
    hwloc_obj_t *g = realloc(t->gpus, (size_t)(t->ngpus + 1) * sizeof(*g));
    if (!g) {
      launch_error("out of memory");
      goto fail;
    }
    t->gpus = g;
    t->gpus[t->ngpus++] = p;
  }
  if (t->ngpus > 1) qsort(t->gpus, (size_t)t->ngpus, sizeof(*t->gpus), cmp_pci);
  *out = t;
  return 0;
fail:
  launch_topo_free(t);
  return -1;
}

void launch_topo_free(launch_topo_t *t) {
  if (!t) return;
  if (t->allowed) hwloc_bitmap_free(t->allowed);
  hwloc_topology_destroy(t->topo);
  free(t->gpus);
  free(t);
}

int launch_topo_is_this_system(launch_topo_t *t) { return t->this_system; }
int launch_topo_gpu_count(launch_topo_t *t) { return t->ngpus; }

int launch_topo_gpu_bus_id(launch_topo_t *t, int k, char *out, size_t outlen) {
  if (k < 0 || k >= t->ngpus) return -1;
  const struct hwloc_pcidev_attr_s *p = &t->gpus[k]->attr->pcidev;
  snprintf(out, outlen, "%04x:%02x:%02x.%01x", p->domain, p->bus, p->dev, p->func);
  return 0;
}

/* A CPU group: the ranks placed in the same CPU set, which they split. `units` are the cores
 * (or PUs when the topology has no cores) that intersect the set, found on first use. */
typedef struct {
  hwloc_bitmap_t set;
  int count;
  hwloc_obj_t *units;
  int nunits;
} group_t;

/* A GPU bus id seen on this node and the group its ranks go to (looked up once per GPU, not
 * once per rank). */
typedef struct {
  char bus_id[32];
  int group;
} bus_t;

struct launch_place {
  launch_topo_t *t;
  launch_bind_t bind;
  group_t *groups;
  int ngroups;
  bus_t *buses;
  int nbuses;
};

int launch_place_new(const launch_opts_t *o, launch_topo_t *t, launch_place_t **out) {
  if (hwloc_bitmap_iszero(t->allowed)) {
    launch_error("the allowed CPU set is empty");
    return -1;
  }
  launch_place_t *p = calloc(1, sizeof(*p));
  if (!p) {
    launch_error("out of memory");
    return -1;
  }
  p->t = t;
  p->bind = o->bind;
  *out = p;
  return 0;
}

void launch_place_free(launch_place_t *p) {
  if (!p) return;
  for (int i = 0; i < p->ngroups; i++) {
    hwloc_bitmap_free(p->groups[i].set);
    free(p->groups[i].units);
  }
  free(p->groups);
  free(p->buses);
  free(p);
}

/* The group whose set equals `set` (a new one when none does); takes `set` over. */
static int group_of(launch_place_t *p, hwloc_bitmap_t set) {
  for (int i = 0; i < p->ngroups; i++)
    if (hwloc_bitmap_isequal(p->groups[i].set, set)) {
      hwloc_bitmap_free(set);
      return i;
    }
  group_t *g = realloc(p->groups, (size_t)(p->ngroups + 1) * sizeof(*g));
  if (!g) {
    hwloc_bitmap_free(set);
    launch_error("out of memory");
    return -1;
  }
  p->groups = g;
  g[p->ngroups] = (group_t){.set = set};
  return p->ngroups++;
}

/* The CPU set of a rank with the GPU `bus_id`: the cores near the GPU (its first non-I/O
 * ancestor) within the allowed set, else the allowed set. */
static int group_of_bus(launch_place_t *p, const char *bus_id, int local_rank) {
  launch_topo_t *t = p->t;
  for (int i = 0; i < p->nbuses; i++)
    if (strcmp(p->buses[i].bus_id, bus_id) == 0) return p->buses[i].group;
  hwloc_bitmap_t set = hwloc_bitmap_dup(t->allowed);
  if (!set) {
    launch_error("out of memory");
    return -1;
  }
  hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(t->topo, bus_id);
  hwloc_obj_t anc = dev ? hwloc_get_non_io_ancestor_obj(t->topo, dev) : NULL;
  if (anc && anc->cpuset && hwloc_bitmap_intersects(anc->cpuset, t->allowed))
    hwloc_bitmap_and(set, anc->cpuset, t->allowed);
  else if (!dev)
    launch_warn("GPU %s is not in the hwloc topology: local rank %d (and every other rank with it) is "
                "placed as if it had no GPU", bus_id, local_rank);
  int g = group_of(p, set);
  if (g < 0) return -1;
  bus_t *b = realloc(p->buses, (size_t)(p->nbuses + 1) * sizeof(*b));
  if (!b) {
    launch_error("out of memory");
    return -1;
  }
  p->buses = b;
  snprintf(b[p->nbuses].bus_id, sizeof b[p->nbuses].bus_id, "%s", bus_id);
  b[p->nbuses++].group = g;
  return g;
}

int launch_place_add(launch_place_t *p, int local_rank, const char *bus_id, int *group, int *index) {
  int g;
  if ((p->bind == LAUNCH_BIND_GPU || p->bind == LAUNCH_BIND_AUTO) && bus_id && bus_id[0]) {
    g = group_of_bus(p, bus_id, local_rank);
  } else {
    hwloc_bitmap_t set = hwloc_bitmap_dup(p->t->allowed);
    if (!set) {
      launch_error("out of memory");
      return -1;
    }
    g = group_of(p, set);
  }
  if (g < 0) return -1;
  *group = g;
  *index = p->groups[g].count++;
  return 0;
}

/* Fills g->units once: the cores (or PUs) that intersect the group's set. */
static int group_units(launch_topo_t *t, group_t *g) {
  if (g->units) return 0;
  hwloc_obj_type_t type = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  int total = hwloc_get_nbobjs_by_type(t->topo, type);
  if (total <= 0) return 0; /* no units: the caller reports it */
  if (!(g->units = calloc((size_t)total, sizeof(*g->units)))) {
    launch_error("out of memory");
    return -1;
  }
  for (int i = 0; i < total; i++) {
    hwloc_obj_t u = hwloc_get_obj_by_type(t->topo, type, (unsigned)i);
    if (u->cpuset && hwloc_bitmap_intersects(u->cpuset, g->set)) g->units[g->nunits++] = u;
  }
  return 0;
}

/* Rank j of the group's m ranks takes units [j*n/m, (j+1)*n/m), or unit j%n when n < m. */
int launch_place_cpus(launch_place_t *p, int group, int index, int local_rank, char *out, size_t outlen) {
  group_t *g = &p->groups[group];
  hwloc_bitmap_t res = hwloc_bitmap_alloc();
  int rc = -1;
  if (!res) {
    launch_error("out of memory");
    return -1;
  }
  if (p->bind == LAUNCH_BIND_NONE) {
    hwloc_bitmap_copy(res, g->set);
  } else {
    if (group_units(p->t, g) != 0) goto done;
    if (g->nunits == 0) {
      launch_error("no cores in the CPU set of local rank %d", local_rank);
      goto done;
    }
    int lo, hi;
    unit_slice(index, g->nunits, g->count, &lo, &hi);
    for (int i = lo; i < hi; i++) hwloc_bitmap_or(res, res, g->units[i]->cpuset);
    hwloc_bitmap_and(res, res, g->set);
  }
  if (hwloc_bitmap_list_snprintf(out, outlen, res) >= (int)outlen) {
    launch_error("CPU list of local rank %d is too long", local_rank);
    goto done;
  }
  rc = 0;
done:
  hwloc_bitmap_free(res);
  return rc;
}

int launch_bind(launch_topo_t *t, const char *cpulist) {
  if (!t->this_system) {
    launch_warn("not binding: the topology (--topology) is not this machine's");
    return 0;
  }
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  int rc = hwloc_bitmap_list_sscanf(set, cpulist);
  if (rc == 0) rc = hwloc_set_cpubind(t->topo, set, HWLOC_CPUBIND_PROCESS);
  hwloc_bitmap_free(set);
  if (rc != 0) launch_error("binding to CPUs %s failed", cpulist);
  return rc == 0 ? 0 : -1;
}

#else /* no hwloc: CPU numbers from sched_getaffinity, no GPU locality */

struct launch_topo {
  cpu_set_t allowed;
};

int launch_topo_load(const launch_opts_t *o, launch_topo_t **out) {
  if (o->topology) {
    launch_error("--topology needs hwloc, and this launch was built without it");
    return -1;
  }
  launch_topo_t *t = calloc(1, sizeof(*t));
  if (!t || sched_getaffinity(0, sizeof t->allowed, &t->allowed) != 0) {
    free(t);
    launch_error("sched_getaffinity failed");
    return -1;
  }
  *out = t;
  return 0;
}
void launch_topo_free(launch_topo_t *t) { free(t); }
int launch_topo_is_this_system(launch_topo_t *t) { return 1; }
int launch_topo_gpu_count(launch_topo_t *t) { return 0; }
int launch_topo_gpu_bus_id(launch_topo_t *t, int k, char *out, size_t outlen) { return -1; }

/* One group: every rank splits the allowed CPUs (no GPU locality without hwloc). */
struct launch_place {
  launch_bind_t bind;
  int cpus[CPU_SETSIZE], n;
  int count;
};

int launch_place_new(const launch_opts_t *o, launch_topo_t *t, launch_place_t **out) {
  launch_place_t *p = calloc(1, sizeof(*p));
  if (!p) {
    launch_error("out of memory");
    return -1;
  }
  p->bind = o->bind;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &t->allowed)) p->cpus[p->n++] = c;
  if (p->n == 0) {
    free(p);
    launch_error("the allowed CPU set is empty");
    return -1;
  }
  *out = p;
  return 0;
}

void launch_place_free(launch_place_t *p) { free(p); }

int launch_place_add(launch_place_t *p, int local_rank, const char *bus_id, int *group, int *index) {
  (void)local_rank;
  (void)bus_id;
  *group = 0;
  *index = p->count++;
  return 0;
}

int launch_place_cpus(launch_place_t *p, int group, int index, int local_rank, char *out, size_t outlen) {
  (void)group;
  int n = p->n, m = p->count, lo = 0, hi = n;
  if (p->bind != LAUNCH_BIND_NONE) unit_slice(index, n, m, &lo, &hi);
  size_t len = 0;
  out[0] = 0;
  for (int k = lo; k < hi; k++) {
    len += (size_t)snprintf(out + len, outlen - len, "%s%d", k > lo ? "," : "", p->cpus[k]);
    if (len >= outlen) {
      launch_error("CPU list of local rank %d is too long", local_rank);
      return -1;
    }
  }
  return 0;
}

int launch_bind(launch_topo_t *t, const char *cpulist) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const char *p = cpulist; *p;) {
    char *end;
    long c = strtol(p, &end, 10);
    if (end == p || c < 0 || c >= CPU_SETSIZE) break;
    CPU_SET((int)c, &set);
    p = *end == ',' ? end + 1 : end;
    if (*end != ',') break;
  }
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    launch_error("binding to CPUs %s failed", cpulist);
    return -1;
  }
  return 0;
}
#endif
