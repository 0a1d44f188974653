/* A stand-in for libnvidia-ml.so with the entry points hora's GPU monitor calls, so that the
 * sampling, CSV and TensorBoard paths run on machines without a GPU. FAKE_NVML_GPUS (default 2)
 * devices; FAKE_NVML_FAIL=1 makes nvmlInit fail. Values are deterministic: GPU i reports
 * utilization 10 + 20 i + n on its n-th utilization query (n = 0, 1, ...), memory utilization
 * 5 + i %, (1000 + 100 i) MiB used, 50 + i W, 40 + i C and 1400 + 10 i MHz. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  unsigned int gpu, memory;
} util_t;
typedef struct {
  unsigned long long total, free, used;
} mem_t;

static int ngpus(void) {
  const char *e = getenv("FAKE_NVML_GPUS");
  return e ? atoi(e) : 2;
}
static unsigned int calls[64];
static int inited;

/* handles are 1-based indices cast to pointers */
#define IDX(d) ((int)(long)(d)-1)
#define CHECK_DEV(d) \
  if (!inited || IDX(d) < 0 || IDX(d) >= ngpus()) return 999

int nvmlInit_v2(void) {
  const char *f = getenv("FAKE_NVML_FAIL");
  if (f && *f == '1') return 3; /* NVML_ERROR_NO_PERMISSION, say */
  inited = 1;
  memset(calls, 0, sizeof calls);
  return 0;
}
int nvmlShutdown(void) {
  inited = 0;
  return 0;
}
const char *nvmlErrorString(int r) { return r == 3 ? "fake: no permission" : "fake: error"; }
int nvmlDeviceGetCount_v2(unsigned int *n) {
  if (!inited) return 1;
  *n = (unsigned)ngpus();
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **d) {
  if (!inited || (int)i >= ngpus()) return 2;
  *d = (void *)(long)(i + 1);
  return 0;
}
int nvmlDeviceGetHandleByUUID(const char *uuid, void **d) {
  int i;
  if (!inited || sscanf(uuid, "GPU-fake-%d", &i) != 1 || i < 0 || i >= ngpus()) return 2;
  *d = (void *)(long)(i + 1);
  return 0;
}
int nvmlDeviceGetIndex(void *d, unsigned int *i) {
  CHECK_DEV(d);
  *i = (unsigned)IDX(d);
  return 0;
}
int nvmlDeviceGetUtilizationRates(void *d, util_t *u) {
  CHECK_DEV(d);
  int i = IDX(d);
  u->gpu = 10 + 20 * (unsigned)i + calls[i]++;
  u->memory = 5 + (unsigned)i;
  return 0;
}
int nvmlDeviceGetMemoryInfo(void *d, mem_t *m) {
  CHECK_DEV(d);
  m->total = 16ull << 30;
  m->used = (1000ull + 100ull * (unsigned)IDX(d)) << 20;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetPowerUsage(void *d, unsigned int *mw) {
  CHECK_DEV(d);
  *mw = 50000 + 1000 * (unsigned)IDX(d);
  return 0;
}
int nvmlDeviceGetTemperature(void *d, int sensor, unsigned int *t) {
  CHECK_DEV(d);
  if (sensor != 0) return 2;
  *t = 40 + (unsigned)IDX(d);
  return 0;
}
int nvmlDeviceGetClockInfo(void *d, int clock, unsigned int *mhz) {
  CHECK_DEV(d);
  if (clock != 1) return 2;
  *mhz = 1400 + 10 * (unsigned)IDX(d);
  return 0;
}
