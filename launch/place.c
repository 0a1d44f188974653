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
 * split is the same everywhere without any communication. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

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
  if (!t) return -1;
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
    if (!g) goto fail;
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

/* The cores (or PUs when the topology has no cores) that intersect `set`, each cut to `set`. */
static int split_set(launch_topo_t *t, hwloc_const_bitmap_t set, int j, int m, hwloc_bitmap_t out) {
  hwloc_obj_type_t type = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  int n = 0, total = hwloc_get_nbobjs_by_type(t->topo, type);
  if (total <= 0) return -1;
  hwloc_obj_t *units = calloc((size_t)total, sizeof(*units));
  if (!units) return -1;
  for (int i = 0; i < total; i++) {
    hwloc_obj_t u = hwloc_get_obj_by_type(t->topo, type, (unsigned)i);
    if (u->cpuset && hwloc_bitmap_intersects(u->cpuset, set)) units[n++] = u;
  }
  hwloc_bitmap_zero(out);
  if (n == 0) {
    free(units);
    return -1;
  }
  int lo, hi;
  if (n >= m) {
    lo = (int)((long)j * n / m);
    hi = (int)((long)(j + 1) * n / m);
  } else {
    lo = j % n;
    hi = lo + 1;
  }
  for (int i = lo; i < hi; i++) hwloc_bitmap_or(out, out, units[i]->cpuset);
  hwloc_bitmap_and(out, out, set);
  free(units);
  return 0;
}

int launch_place(const launch_opts_t *o, launch_topo_t *t, int local_size, char **bus_ids, char **out,
                 size_t outlen) {
  hwloc_bitmap_t *sets = calloc((size_t)local_size, sizeof(*sets));
  hwloc_bitmap_t res = hwloc_bitmap_alloc();
  int rc = -1;
  if (!sets || !res) goto done;
  if (hwloc_bitmap_iszero(t->allowed)) {
    launch_error("the allowed CPU set is empty");
    goto done;
  }
  launch_bind_t mode = o->bind;
  if (mode == LAUNCH_BIND_AUTO) {
    mode = LAUNCH_BIND_CORES;
    for (int i = 0; i < local_size; i++)
      if (bus_ids[i] && bus_ids[i][0]) mode = LAUNCH_BIND_GPU;
  }
  for (int i = 0; i < local_size; i++) {
    sets[i] = hwloc_bitmap_dup(t->allowed);
    if (mode == LAUNCH_BIND_GPU && bus_ids[i] && bus_ids[i][0]) {
      hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(t->topo, bus_ids[i]);
      hwloc_obj_t anc = dev ? hwloc_get_non_io_ancestor_obj(t->topo, dev) : NULL;
      if (anc && anc->cpuset && hwloc_bitmap_intersects(anc->cpuset, t->allowed))
        hwloc_bitmap_and(sets[i], anc->cpuset, t->allowed);
      else if (!dev)
        launch_warn("GPU %s is not in the hwloc topology: local rank %d is placed as if it had no GPU",
                    bus_ids[i], i);
    }
  }
  for (int i = 0; i < local_size; i++) {
    if (mode == LAUNCH_BIND_NONE) {
      hwloc_bitmap_copy(res, sets[i]);
    } else {
      int j = 0, m = 0;
      for (int k = 0; k < local_size; k++) {
        if (hwloc_bitmap_isequal(sets[k], sets[i])) {
          if (k < i) j++;
          m++;
        }
      }
      if (split_set(t, sets[i], j, m, res) != 0) {
        launch_error("no cores in the CPU set of local rank %d", i);
        goto done;
      }
    }
    if (hwloc_bitmap_list_snprintf(out[i], outlen, res) >= (int)outlen) {
      launch_error("CPU list of local rank %d is too long", i);
      goto done;
    }
  }
  rc = 0;
done:
  if (sets)
    for (int i = 0; i < local_size; i++)
      if (sets[i]) hwloc_bitmap_free(sets[i]);
  free(sets);
  if (res) hwloc_bitmap_free(res);
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

int launch_place(const launch_opts_t *o, launch_topo_t *t, int local_size, char **bus_ids, char **out,
                 size_t outlen) {
  int cpus[CPU_SETSIZE], n = 0;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &t->allowed)) cpus[n++] = c;
  if (n == 0) return -1;
  for (int i = 0; i < local_size; i++) {
    int lo = 0, hi = n;
    if (o->bind != LAUNCH_BIND_NONE) {
      if (n >= local_size) {
        lo = (int)((long)i * n / local_size);
        hi = (int)((long)(i + 1) * n / local_size);
      } else {
        lo = i % n;
        hi = lo + 1;
      }
    }
    size_t len = 0;
    for (int k = lo; k < hi && len < outlen; k++)
      len += (size_t)snprintf(out[i] + len, outlen - len, "%s%d", k > lo ? "," : "", cpus[k]);
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
