/* The node's GPU list, this rank's GPUs, and their PCI bus ids.
 *
 * Which list: --gpus, else SLURM_STEP_GPUS (the step's GPUs on this node, or only this task's
 * when srun bound GPUs per task), else SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES, else
 * SLURM_GPUS_ON_NODE (a count: 0..n-1), else (outside Slurm) every NVIDIA GPU the node shows.
 *
 * CUDA ordinal (HORA_DEVICE): with CUDA_VISIBLE_DEVICES set, the chosen GPU's position in it
 * (matched by id; when cgroups renumbered the devices, Slurm's list and CUDA_VISIBLE_DEVICES have
 * the same length and are matched by position); without it, the id itself, which with
 * CUDA_DEVICE_ORDER=PCI_BUS_ID is the GPU's index in PCI bus order.
 *
 * PCI bus id: NVML (loaded with dlopen, so launch runs where there is no driver) by index in PCI
 * order or by UUID; without NVML, the k-th NVIDIA GPU of the hwloc topology in bus-id order.
 * With --topology, only the topology is used (NVML describes this machine, not the file). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

/* ---- NVML through dlopen. The structure layout is nvmlPciInfo_t of NVML's public API. */
typedef struct {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
} nvml_pci_info_t;

static struct {
  int tried, ok;
  unsigned count;
  int (*by_index)(unsigned, void **);
  int (*by_uuid)(const char *, void **);
  int (*pci_info)(void *, nvml_pci_info_t *);
} nvml;

static int nvml_load(void) {
  if (nvml.tried) return nvml.ok;
  nvml.tried = 1;
  void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return 0;
  int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
  int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
  nvml.by_index = (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
  nvml.by_uuid = (int (*)(const char *, void **))dlsym(h, "nvmlDeviceGetHandleByUUID");
  nvml.pci_info = (int (*)(void *, nvml_pci_info_t *))dlsym(h, "nvmlDeviceGetPciInfo_v3");
  if (!init || !count || !nvml.by_index || !nvml.by_uuid || !nvml.pci_info) return 0;
  if (init() != 0 || count(&nvml.count) != 0) return 0;
  nvml.ok = 1;
  return 1;
}

/* NVML answers by ioctl: a plan of many ranks asks about the same few GPUs again and again, so
 * the answers (and failures) are kept per key. */
#define NVML_CACHE 64
static struct {
  char key[64], bus_id[32];
  int rc;
} nvml_cache[NVML_CACHE];
static int nvml_ncache;

static int nvml_bus_id_uncached(const char *key, char *out, size_t outlen);

static int nvml_bus_id(const char *key, char *out, size_t outlen) {
  for (int i = 0; i < nvml_ncache; i++)
    if (strcmp(nvml_cache[i].key, key) == 0) {
      if (nvml_cache[i].rc == 0) snprintf(out, outlen, "%s", nvml_cache[i].bus_id);
      return nvml_cache[i].rc;
    }
  int rc = nvml_bus_id_uncached(key, out, outlen);
  if (nvml_ncache < NVML_CACHE && strlen(key) < sizeof nvml_cache[0].key) {
    snprintf(nvml_cache[nvml_ncache].key, sizeof nvml_cache[0].key, "%s", key);
    if (rc == 0) snprintf(nvml_cache[nvml_ncache].bus_id, sizeof nvml_cache[0].bus_id, "%s", out);
    nvml_cache[nvml_ncache++].rc = rc;
  }
  return rc;
}

static int nvml_bus_id_uncached(const char *key, char *out, size_t outlen) {
  void *dev = NULL;
  int k;
  if (launch_parse_uint(key, 1 << 16, &k) == 0) {
    if ((unsigned)k >= nvml.count || nvml.by_index((unsigned)k, &dev) != 0) return -1;
  } else if (nvml.by_uuid(key, &dev) != 0) {
    return -1;
  }
  nvml_pci_info_t pi;
  memset(&pi, 0, sizeof pi);
  if (nvml.pci_info(dev, &pi) != 0) return -1;
  snprintf(out, outlen, "%04x:%02x:%02x.0", pi.domain, pi.bus, pi.device);
  return 0;
}

void launch_gpus_free(launch_gpus_t *g) {
  launch_strv_free(g->ids, g->n);
  launch_strv_free(g->cvd, g->ncvd);
  launch_strv_free(g->full, g->nfull);
  memset(g, 0, sizeof(*g));
}

static int parse_list(const char *var, const char *val, char ***ids, size_t *n) {
  char err[256];
  if (launch_gpu_list_parse(val, ids, n, err, sizeof err) != 0) {
    launch_error("%s is malformed: %s", var, err);
    return -1;
  }
  return 0;
}

/* Number of GPUs this node shows (NVML, else topology); -1 when nothing can tell. */
static int node_gpu_count(const launch_opts_t *o, launch_topo_t *t) {
  if (!o->topology && nvml_load()) return (int)nvml.count;
  int n = t ? launch_topo_gpu_count(t) : 0;
  return n > 0 ? n : -1;
}

int launch_gpus_detect(const launch_opts_t *o, launch_topo_t *t, launch_gpus_t *g) {
  memset(g, 0, sizeof(*g));
  g->self_local = -1;
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  if (cvd && strcmp(cvd, "NoDevFiles") == 0) cvd = "";
  if (cvd) {
    g->cvd_set = 1;
    if (parse_list("CUDA_VISIBLE_DEVICES", cvd, &g->cvd, &g->ncvd) != 0) return -1;
  }
  static const char *vars[] = {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", NULL};
  if (o->gpus) {
    g->source = "--gpus";
    if (parse_list("--gpus", o->gpus, &g->ids, &g->n) != 0) return -1;
  } else {
    for (int i = 0; vars[i] && !g->source; i++) {
      const char *v = getenv(vars[i]);
      if (v && (*v || i == 2)) {
        if (i == 2) v = cvd;
        g->source = vars[i];
        if (parse_list(vars[i], v, &g->ids, &g->n) != 0) return -1;
      }
    }
  }
  const char *gon = getenv("SLURM_GPUS_ON_NODE");
  int on_node = -1;
  if (gon && *gon && launch_parse_uint(gon, 1 << 16, &on_node) != 0) {
    launch_error("SLURM_GPUS_ON_NODE='%s' is not a count", gon);
    return -1;
  }
  if (!g->source && on_node > 0) {
    g->source = "SLURM_GPUS_ON_NODE";
    char buf[32];
    snprintf(buf, sizeof buf, "0-%d", on_node - 1);
    if (parse_list("SLURM_GPUS_ON_NODE", buf, &g->ids, &g->n) != 0) return -1;
  }
  if (!g->source && !getenv("SLURM_JOB_ID")) {
    int n = node_gpu_count(o, t);
    if (n > 0) {
      char buf[32];
      snprintf(buf, sizeof buf, "0-%d", n - 1);
      g->source = o->topology ? "the topology" : "this node's GPUs";
      if (parse_list(g->source, buf, &g->ids, &g->n) != 0) return -1;
    }
  }
  if (!g->source) g->source = "(no GPU variable)";
  /* srun --gpus-per-task (or --gpu-bind=single) hands each task its own GPUs: the task's list
   * is shorter than the node's count. */
  if (!o->gpus && on_node > 0 && g->n > 0 && (int)g->n < on_node &&
      (strcmp(g->source, "SLURM_STEP_GPUS") == 0 || strcmp(g->source, "CUDA_VISIBLE_DEVICES") == 0))
    g->per_task = 1;
  if (g->per_task) {
    const char *jg = getenv("SLURM_JOB_GPUS");
    char buf[32];
    snprintf(buf, sizeof buf, "0-%d", on_node - 1);
    if (!jg || launch_gpu_list_parse(jg, &g->full, &g->nfull, NULL, 0) != 0 || (int)g->nfull != on_node) {
      launch_strv_free(g->full, g->nfull);
      g->full = NULL;
      if (parse_list("SLURM_GPUS_ON_NODE", buf, &g->full, &g->nfull) != 0) return -1;
    }
  }
  return 0;
}

static int ordinal_of(const launch_gpus_t *g, size_t idx, int *ord) {
  const char *id = g->ids[idx];
  if (g->cvd_set) {
    for (size_t i = 0; i < g->ncvd; i++)
      if (strcmp(g->cvd[i], id) == 0) {
        *ord = (int)i;
        return 0;
      }
    if (g->ncvd == g->n) { /* renumbered by a device cgroup: same order, other names */
      *ord = (int)idx;
      return 0;
    }
    launch_error("GPU %s (from %s) is not visible: CUDA_VISIBLE_DEVICES lists only %zu other GPU(s)", id,
                 g->source, g->ncvd);
    return -1;
  }
  if (launch_parse_uint(id, 1 << 16, ord) == 0) return 0;
  *ord = (int)idx;
  return 0;
}

int launch_gpu_choose(const launch_opts_t *o, const launch_gpus_t *g, launch_topo_t *t,
                      int local_rank, int local_size, launch_gpu_choice_t *c) {
  memset(c, 0, sizeof(*c));
  c->ordinal = -1;
  int gpr = o->gpus_per_rank >= 0 ? o->gpus_per_rank : (g->n > 0 ? 1 : 0);
  if (gpr == 0) return 0;
  if (g->n == 0) {
    launch_error("--gpus-per-rank %d asks for GPUs but this node has none: no SLURM_STEP_GPUS, "
                 "SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES or SLURM_GPUS_ON_NODE (request them with "
                 "--gres=gpu:N or --gpus-per-node=N)", gpr);
    return -1;
  }
  size_t first;
  if (g->per_task && g->self_local >= 0 && local_rank != g->self_local && g->nfull > 0) {
    /* Another task's GPUs: not visible from here; assume Slurm's order (local rank i holds the
     * i-th GPU of the node), which is only used to split the cores fairly. */
    int k;
    const char *id = g->full[((size_t)local_rank * (size_t)gpr) % g->nfull];
    snprintf(c->ids, sizeof c->ids, "%s", id);
    c->count = gpr;
    c->ordinal = -1;
    if (!o->topology && nvml_load()) {
      if (nvml_bus_id(id, c->bus_id, sizeof c->bus_id) != 0) c->bus_id[0] = 0;
    } else if (t && launch_parse_uint(id, 1 << 16, &k) == 0 && k < launch_topo_gpu_count(t)) {
      launch_topo_gpu_bus_id(t, k, c->bus_id, sizeof c->bus_id);
    }
    return 0;
  }
  if (g->per_task) {
    if ((int)g->n < gpr) {
      launch_error("--gpus-per-rank %d but Slurm gave this task only %zu GPU(s) (%s)", gpr, g->n, g->source);
      return -1;
    }
    first = 0;
  } else {
    long need = (long)local_size * gpr;
    if (need > (long)g->n && !o->allow_gpu_sharing) {
      launch_error("%d rank(s) on this node with %d GPU(s) each need %ld GPUs, but the node's list "
                   "(%s) has %zu: start fewer ranks per node, request more GPUs, or pass "
                   "--allow-gpu-sharing to let ranks share GPUs",
                   local_size, gpr, need, g->source, g->n);
      return -1;
    }
    if (gpr > (int)g->n) {
      launch_error("--gpus-per-rank %d but the node's list (%s) has only %zu GPU(s)", gpr, g->source, g->n);
      return -1;
    }
    first = ((size_t)local_rank * (size_t)gpr) % g->n;
  }
  int count = node_gpu_count(o, t);
  size_t il = 0, ol = 0;
  for (int j = 0; j < gpr; j++) {
    size_t idx = (first + (size_t)j) % g->n;
    int ord;
    if (ordinal_of(g, idx, &ord) != 0) return -1;
    const char *key = g->cvd_set && ord < (int)g->ncvd ? g->cvd[ord] : g->ids[idx];
    int k;
    if (count >= 0 && launch_parse_uint(key, 1 << 16, &k) == 0 && k >= count) {
      launch_error("GPU %s (from %s) is not on this node: it shows only %d GPU(s)", key, g->source, count);
      return -1;
    }
    if (j == 0) {
      c->ordinal = ord;
      if (!o->topology && nvml_load()) {
        if (nvml_bus_id(key, c->bus_id, sizeof c->bus_id) != 0) {
          launch_error("NVML does not know GPU %s (from %s)", key, g->source);
          return -1;
        }
      } else if (t && launch_parse_uint(key, 1 << 16, &k) == 0 && k < launch_topo_gpu_count(t)) {
        launch_topo_gpu_bus_id(t, k, c->bus_id, sizeof c->bus_id);
      }
    }
    il += (size_t)snprintf(c->ids + il, sizeof c->ids - il, "%s%s", j ? "," : "", g->ids[idx]);
    ol += (size_t)snprintf(c->ordinals + ol, sizeof c->ordinals - ol, "%s%d", j ? "," : "", ord);
    if (il >= sizeof c->ids || ol >= sizeof c->ordinals) {
      launch_error("--gpus-per-rank %d: too many GPUs per rank", gpr);
      return -1;
    }
  }
  c->count = gpr;
  return 0;
}
