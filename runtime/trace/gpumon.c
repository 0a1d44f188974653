/* GPU monitor: a background thread samples NVML every period into a CSV file shaped like
 * `nvidia-smi dmon -o DT` and, when a TensorBoard writer is attached, into scalars.
 *
 * NVML is loaded with dlopen (HORA_NVML_LIBRARY), so hora builds and runs without it; we declare
 * the few NVML types and entry points we call ourselves (their C ABI has been stable since NVML's
 * first release: handles are pointers, results are ints, the structs below are NVML's
 * nvmlUtilization_t and nvmlMemory_t).
 *
 * Ownership: start() owns everything until it returns; then the thread reads the device list and
 * writes the CSV/TensorBoard; stop() signals and joins the thread before freeing. The attached
 * hora_tb_t stays the caller's and must outlive the monitor. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <unistd.h>

#include "core/ctx.h"
#include "core/fatal.h"
#include "core/safefs.h"
#include "trace/trace.h"

typedef int nvml_ret;
typedef void *nvml_dev;
typedef struct {
  unsigned int gpu, memory; /* percent of the last sample period */
} nvml_util;
typedef struct {
  unsigned long long total, free, used; /* bytes */
} nvml_mem;
#define NVML_TEMPERATURE_GPU 0
#define NVML_CLOCK_SM 1
#define MAX_GPUS 64

typedef struct {
  void *lib;
  nvml_ret (*init)(void);
  nvml_ret (*shutdown)(void);
  nvml_ret (*count)(unsigned int *);
  nvml_ret (*by_index)(unsigned int, nvml_dev *);
  nvml_ret (*by_uuid)(const char *, nvml_dev *);
  nvml_ret (*index)(nvml_dev, unsigned int *);
  nvml_ret (*util)(nvml_dev, nvml_util *);
  nvml_ret (*mem)(nvml_dev, nvml_mem *);
  nvml_ret (*power)(nvml_dev, unsigned int *);       /* milliwatts */
  nvml_ret (*temp)(nvml_dev, int, unsigned int *);   /* degrees C */
  nvml_ret (*clock)(nvml_dev, int, unsigned int *);  /* MHz */
  const char *(*errstr)(nvml_ret);
} nvml_api;

struct hora_gpumon {
  nvml_api nv;
  nvml_dev devs[MAX_GPUS];
  unsigned int labels[MAX_GPUS]; /* NVML index shown in the gpu column */
  int ndev;
  int rank;
  double period_s;
  FILE *csv;
  char *csv_path;
  hora_tb_t *tb;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int stop;
  uint64_t samples;
  unsigned fork_gen; /* hora__fork_watch() at start: the sampling thread exists only there */
};

static const char *nvml_err(const nvml_api *nv, nvml_ret r) {
  static char buf[32];
  if (nv->errstr) return nv->errstr(r);
  snprintf(buf, sizeof buf, "NVML error %d", r);
  return buf;
}

/* dlopen and resolve. Returns 0 with *why set when NVML is unusable. */
static int nvml_load(nvml_api *nv, const char *libname, char *why, size_t why_n) {
  memset(nv, 0, sizeof *nv);
  nv->lib = dlopen(libname, RTLD_NOW | RTLD_LOCAL);
  if (!nv->lib) {
    snprintf(why, why_n, "cannot load %s (%s)", libname, dlerror());
    return 0;
  }
#define SYM(field, name, required)                                          \
  do {                                                                      \
    *(void **)&nv->field = dlsym(nv->lib, name);                            \
    if (!nv->field && required) {                                           \
      snprintf(why, why_n, "%s lacks %s", libname, name);                   \
      dlclose(nv->lib);                                                     \
      nv->lib = NULL;                                                       \
      return 0;                                                             \
    }                                                                       \
  } while (0)
  SYM(init, "nvmlInit_v2", 1);
  SYM(shutdown, "nvmlShutdown", 1);
  SYM(count, "nvmlDeviceGetCount_v2", 1);
  SYM(by_index, "nvmlDeviceGetHandleByIndex_v2", 1);
  SYM(by_uuid, "nvmlDeviceGetHandleByUUID", 0);
  SYM(index, "nvmlDeviceGetIndex", 0);
  SYM(util, "nvmlDeviceGetUtilizationRates", 1);
  SYM(mem, "nvmlDeviceGetMemoryInfo", 1);
  SYM(power, "nvmlDeviceGetPowerUsage", 1);
  SYM(temp, "nvmlDeviceGetTemperature", 1);
  SYM(clock, "nvmlDeviceGetClockInfo", 1);
  SYM(errstr, "nvmlErrorString", 0);
#undef SYM
  nvml_ret r = nv->init();
  if (r != 0) {
    snprintf(why, why_n, "nvmlInit failed: %s", nvml_err(nv, r));
    dlclose(nv->lib);
    nv->lib = NULL;
    return 0;
  }
  return 1;
}

static void nvml_unload(nvml_api *nv) {
  if (!nv->lib) return;
  nv->shutdown();
  dlclose(nv->lib);
  nv->lib = NULL;
}

/* Add the NVML device behind one CUDA_VISIBLE_DEVICES entry (an index or a GPU-UUID). */
static int add_visible(hora_gpumon_t *m, const char *entry, char *why, size_t why_n) {
  nvml_dev d;
  unsigned int label = 0;
  char *end;
  long idx = strtol(entry, &end, 10);
  if (end != entry && *end == 0 && idx >= 0) {
    if (m->nv.by_index((unsigned)idx, &d) != 0) {
      snprintf(why, why_n, "NVML has no GPU %ld", idx);
      return 0;
    }
    label = (unsigned)idx;
  } else {
    if (!m->nv.by_uuid || m->nv.by_uuid(entry, &d) != 0) {
      snprintf(why, why_n, "NVML does not know GPU %s", entry);
      return 0;
    }
    if (m->nv.index) m->nv.index(d, &label);
  }
  if (m->ndev < MAX_GPUS) {
    m->devs[m->ndev] = d;
    m->labels[m->ndev++] = label;
  }
  return 1;
}

/* Fill m->devs: CUDA ordinal `device` (or every GPU when device < 0). */
static int pick_devices(hora_gpumon_t *m, int device, char *why, size_t why_n) {
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  if (cvd) {
    char *copy = strdup(cvd), *save = NULL;
    if (!copy) return 0;
    int ord = 0, ok = 1;
    for (char *t = strtok_r(copy, ",", &save); t && ok; t = strtok_r(NULL, ",", &save), ord++) {
      while (*t == ' ') t++;
      if (device < 0 || ord == device) ok = add_visible(m, t, why, why_n);
    }
    free(copy);
    if (ok && m->ndev == 0) snprintf(why, why_n, "CUDA_VISIBLE_DEVICES='%s' has no GPU %d", cvd, device);
    return ok && m->ndev > 0;
  }
  unsigned int n = 0;
  nvml_ret r = m->nv.count(&n);
  if (r != 0) {
    snprintf(why, why_n, "nvmlDeviceGetCount: %s", nvml_err(&m->nv, r));
    return 0;
  }
  for (unsigned int i = 0; i < n && m->ndev < MAX_GPUS; i++) {
    if (device >= 0 && (unsigned)device != i) continue;
    if (m->nv.by_index(i, &m->devs[m->ndev]) == 0) m->labels[m->ndev++] = i;
  }
  if (m->ndev == 0) snprintf(why, why_n, "NVML shows %u GPU%s, none is GPU %d", n, n == 1 ? "" : "s", device);
  return m->ndev > 0;
}

static void tb_put(hora_gpumon_t *m, unsigned int gpu, const char *metric, double v) {
  char tag[64];
  snprintf(tag, sizeof tag, "gpu%u/%s", gpu, metric);
  /* a failed TensorBoard write is logged once by hora_tb_scalar; sampling goes on */
  (void)hora_tb_scalar(m->tb, tag, (int64_t)m->samples, v);
}

/* One sampling round: a CSV row per GPU, "-" for a metric NVML could not give (as dmon does). */
static void sample(hora_gpumon_t *m) {
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
  char date[16], tod[16];
  strftime(date, sizeof date, "%Y%m%d", &tm);
  strftime(tod, sizeof tod, "%H:%M:%S", &tm);
  for (int i = 0; i < m->ndev; i++) {
    nvml_dev d = m->devs[i];
    nvml_util u;
    nvml_mem mem;
    unsigned int mw, temp, clk;
    int ok_u = m->nv.util(d, &u) == 0, ok_m = m->nv.mem(d, &mem) == 0, ok_p = m->nv.power(d, &mw) == 0;
    int ok_t = m->nv.temp(d, NVML_TEMPERATURE_GPU, &temp) == 0, ok_c = m->nv.clock(d, NVML_CLOCK_SM, &clk) == 0;
    char f[6][24];
    snprintf(f[0], 24, ok_p ? "%.1f" : "-", mw / 1000.0);
    snprintf(f[1], 24, ok_t ? "%u" : "-", temp);
    snprintf(f[2], 24, ok_u ? "%u" : "-", u.gpu);
    snprintf(f[3], 24, ok_u ? "%u" : "-", u.memory);
    snprintf(f[4], 24, ok_m ? "%llu" : "-", mem.used >> 20);
    snprintf(f[5], 24, ok_c ? "%u" : "-", clk);
    if (m->csv)
      fprintf(m->csv, "%s,%s,%d,%u,%s,%s,%s,%s,%s,%s\n", date, tod, m->rank, m->labels[i], f[0], f[1], f[2], f[3],
              f[4], f[5]);
    if (m->tb) {
      if (ok_u) tb_put(m, m->labels[i], "sm_util_pct", u.gpu);
      if (ok_u) tb_put(m, m->labels[i], "mem_util_pct", u.memory);
      if (ok_m) tb_put(m, m->labels[i], "fb_used_mib", (double)(mem.used >> 20));
      if (ok_p) tb_put(m, m->labels[i], "power_w", mw / 1000.0);
      if (ok_t) tb_put(m, m->labels[i], "temp_c", temp);
      if (ok_c) tb_put(m, m->labels[i], "sm_clock_mhz", clk);
    }
  }
  if (m->csv) fflush(m->csv);
  pthread_mutex_lock(&m->lock);
  m->samples++;
  pthread_mutex_unlock(&m->lock);
}

static void *monitor_thread(void *arg) {
  hora__thread_name("hora-gpumon");
  hora_gpumon_t *m = arg;
  struct timespec next;
  clock_gettime(CLOCK_MONOTONIC, &next);
  pthread_mutex_lock(&m->lock);
  for (;;) {
    double t = next.tv_sec + next.tv_nsec * 1e-9 + m->period_s;
    next.tv_sec = (time_t)t;
    next.tv_nsec = (long)((t - (double)next.tv_sec) * 1e9);
    while (!m->stop) {
      if (pthread_cond_timedwait(&m->cond, &m->lock, &next) == ETIMEDOUT) break;
    }
    if (m->stop) break;
    pthread_mutex_unlock(&m->lock);
    sample(m);
    pthread_mutex_lock(&m->lock);
  }
  pthread_mutex_unlock(&m->lock);
  return NULL;
}

static void gpumon_free(hora_gpumon_t *m) {
  if (m->csv) fclose(m->csv);
  nvml_unload(&m->nv);
  free(m->csv_path);
  free(m);
}

HORA_EXPORT hora_result_t hora_gpumon_start(const hora_gpumon_opts_t *o, hora_gpumon_t **out) {
  if (!o || !out)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_gpumon_start: %s is NULL", !o ? "opts" : "mon");
  if (o->size < offsetof(hora_gpumon_opts_t, all_gpus) + sizeof(int))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                    "hora_gpumon_start: opts->size=%zu is too small: set it to sizeof(hora_gpumon_opts_t)", o->size);
  if (!(o->period_s >= 0) || o->device < 0)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_gpumon_start: %s is negative",
                    o->device < 0 ? "device" : "period_s");
  const hora_params_t *p = hora__params();
  int rank = 0, device = o->device;
  if (o->ctx) {
    HORA_CHECK(hora__ctx_check(o->ctx, "hora_gpumon_start"));
    rank = o->ctx->rank;
    device = o->ctx->device; /* -1 when the rank has no GPU: watch them all */
  }
  if (o->all_gpus) device = -1;
  hora_gpumon_t *m = calloc(1, sizeof *m);
  if (!m) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  m->rank = rank;
  m->tb = o->tb;
  m->period_s = o->period_s > 0 ? o->period_s : p->gpu_monitor_s > 0 ? p->gpu_monitor_s : 1.0;
  char why[512] = "";
  if (!nvml_load(&m->nv, p->nvml_library, why, sizeof why) || !pick_devices(m, device, why, sizeof why)) {
    HORA_INFO(TRACE, "GPU monitor off: %s", why);
    gpumon_free(m);
    return HORA_ERR(HORA_ERR_NOT_SUPPORTED, "hora_gpumon_start: GPU monitor off: %s", why);
  }
  const char *csv = o->csv_path && *o->csv_path ? o->csv_path : p->gpu_monitor_csv;
  char def[64];
  if (!csv || !*csv) {
    snprintf(def, sizeof def, "hora-gpu-%d.csv", rank);
    csv = def;
  }
  m->csv_path = strdup(csv);
  if (!m->csv_path) {
    gpumon_free(m);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  }
  /* The CSV is read while it grows, so it is written under its final name; its directory is
   * checked first and the file opened on the directory's fd (core/safefs.h). */
  char dir[4096], base[256];
  int dfd = -1, fd = -1;
  hora_result_t rc = hora__path_split(csv, dir, sizeof dir, base, sizeof base);
  if (rc == HORA_SUCCESS) rc = hora__dir_open(dir, 0, &dfd);
  if (rc == HORA_SUCCESS) rc = hora__file_open_log(dfd, dir, base, &fd);
  if (dfd >= 0) close(dfd);
  if (rc == HORA_SUCCESS && !(m->csv = fdopen(fd, "w"))) {
    rc = HORA_ERR(HORA_ERR_IO, "hora_gpumon_start: fdopen %s: %s", csv, strerror(errno));
    close(fd);
  }
  if (rc != HORA_SUCCESS) {
    if (rc == HORA_ERR_NOT_FOUND || rc == HORA_ERR_INVALID_ARGUMENT) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", hora_last_error());
      rc = HORA_ERR(HORA_ERR_IO, "hora_gpumon_start: cannot create %s: %s", csv, msg);
    }
    gpumon_free(m);
    return rc;
  }
  fprintf(m->csv, "date,time,rank,gpu,pwr_w,gtemp_c,sm_pct,mem_pct,fb_used_mib,sclk_mhz\n");
  pthread_mutex_init(&m->lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&m->cond, &ca);
  pthread_condattr_destroy(&ca);
  sample(m);
  /* The thread blocks every signal so that process-directed signals (Slurm's SIGUSR1/SIGTERM)
   * go to the application's threads. */
  sigset_t blocked, old;
  sigfillset(&blocked);
  pthread_sigmask(SIG_SETMASK, &blocked, &old);
  m->fork_gen = hora__fork_watch();
  int prc = pthread_create(&m->thread, NULL, monitor_thread, m);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (prc != 0) {
    pthread_mutex_destroy(&m->lock);
    pthread_cond_destroy(&m->cond);
    gpumon_free(m);
    return HORA_ERR(HORA_ERR_IO, "hora_gpumon_start: cannot start the monitor thread: %s", strerror(prc));
  }
  HORA_INFO(TRACE, "GPU monitor: %d GPU%s every %g s into %s%s", m->ndev, m->ndev == 1 ? "" : "s", m->period_s,
            m->csv_path, m->tb ? " and TensorBoard" : "");
  *out = m;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_gpumon_stop(hora_gpumon_t *m) {
  if (!m) return HORA_SUCCESS;
  HORA_CHECK(hora__fork_check(m->fork_gen, "hora_gpumon_stop", "the GPU monitor", "stop it in the parent"));
  pthread_mutex_lock(&m->lock);
  m->stop = 1;
  pthread_cond_broadcast(&m->cond);
  pthread_mutex_unlock(&m->lock);
  pthread_join(m->thread, NULL);
  pthread_mutex_destroy(&m->lock);
  pthread_cond_destroy(&m->cond);
  gpumon_free(m);
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_gpumon_samples(hora_gpumon_t *m, uint64_t *count) {
  if (!m || !count) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_gpumon_samples: NULL argument");
  HORA_CHECK(hora__fork_check(m->fork_gen, "hora_gpumon_samples", "the GPU monitor", "ask the parent"));
  pthread_mutex_lock(&m->lock);
  *count = m->samples;
  pthread_mutex_unlock(&m->lock);
  return HORA_SUCCESS;
}

/* ---- started by hora_init when HORA_GPU_MONITOR_S > 0 ---- */

static hora_result_t gpumon_finalizer(hora_ctx_t *ctx, void *arg) {
  pthread_mutex_lock(&ctx->lock);
  if (ctx->trace == arg) ctx->trace = NULL;
  pthread_mutex_unlock(&ctx->lock);
  return hora_gpumon_stop(arg);
}

void hora__trace_on_init(hora_ctx_t *ctx) {
  const hora_params_t *p = hora__params();
  if (p->gpu_monitor_s <= 0) return;
  /* a rank without a GPU of its own: local rank 0 watches the node's GPUs, the others nothing */
  if (ctx->device < 0 && ctx->local_rank != 0) return;
  hora_gpumon_opts_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.ctx = ctx;
  hora_gpumon_t *m = NULL;
  hora_result_t rc = hora_gpumon_start(&o, &m);
  if (rc != HORA_SUCCESS) {
    if (rc != HORA_ERR_NOT_SUPPORTED) HORA_WARN(TRACE, "GPU monitor not started: %s", hora_last_error());
    hora__error_clear();
    return;
  }
  if (hora__ctx_add_finalizer(ctx, gpumon_finalizer, m) != HORA_SUCCESS) {
    hora_gpumon_stop(m);
    hora__error_clear();
    return;
  }
  pthread_mutex_lock(&ctx->lock);
  ctx->trace = m;
  pthread_mutex_unlock(&ctx->lock);
}
