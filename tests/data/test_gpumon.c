/* GPU monitor against a fake NVML (argv[1]): sampling, the CSV rows and their values, the
 * TensorBoard scalars, CUDA_VISIBLE_DEVICES mapping, NVML missing or failing, and the
 * HORA_GPU_MONITOR_S path through hora_init/hora_finalize. */
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "hora_test.h"

static char dir[256];

static void set_lib(const char *lib) {
  setenv("HORA_NVML_LIBRARY", lib, 1);
  hora__params_reload();
}

static hora_result_t start(const char *csv, hora_tb_t *tb, int device, int all, hora_gpumon_t **m) {
  hora_gpumon_opts_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.period_s = 0.02;
  o.csv_path = csv;
  o.tb = tb;
  o.device = device;
  o.all_gpus = all;
  return hora_gpumon_start(&o, m);
}

static void wait_samples(hora_gpumon_t *m, uint64_t n) {
  uint64_t s = 0;
  for (int i = 0; i < 500 && s < n; i++) {
    hora_gpumon_samples(m, &s);
    usleep(5000);
  }
  EXPECT(s >= n, "only %llu samples", (unsigned long long)s);
}

/* Parse the CSV; checks every row's values. Returns the number of rows, fills per-GPU counts. */
static int check_csv(const char *csv, int rows_gpu[2]) {
  struct stat st;
  EXPECT(stat(csv, &st) == 0 && (st.st_mode & 07777) == 0600, "CSV %s mode %04o, want 0600 (HORA_FILE_MODE)", csv,
         (unsigned)(st.st_mode & 07777));
  FILE *f = fopen(csv, "r");
  EXPECT(f != NULL, "no CSV %s", csv);
  if (!f) return 0;
  char line[512];
  int rows = 0;
  EXPECT(fgets(line, sizeof line, f) && strcmp(line, "date,time,rank,gpu,pwr_w,gtemp_c,sm_pct,mem_pct,fb_used_mib,sclk_mhz\n") == 0,
         "CSV header: %s", line);
  while (fgets(line, sizeof line, f)) {
    unsigned date, rank, gpu, temp, sm, mem, fb, clk;
    int hh, mm, ss;
    double pwr;
    int n = sscanf(line, "%8u,%d:%d:%d,%u,%u,%lf,%u,%u,%u,%u,%u", &date, &hh, &mm, &ss, &rank, &gpu, &pwr, &temp, &sm,
                   &mem, &fb, &clk);
    EXPECT(n == 12, "CSV row '%s' has %d fields", line, n);
    if (n != 12 || gpu > 1) continue;
    EXPECT(date > 20200000 && hh < 24 && mm < 60 && ss < 61, "date/time in '%s'", line);
    EXPECT(rank == 0, "rank %u", rank);
    EXPECT(pwr == 50.0 + gpu && temp == 40 + gpu && mem == 5 + gpu && fb == 1000 + 100 * gpu && clk == 1400 + 10 * gpu,
           "values of row '%s'", line);
    unsigned want_sm = 10 + 20 * gpu + (unsigned)rows_gpu[gpu];
    EXPECT(sm == want_sm, "sm %u want %u in '%s'", sm, want_sm, line);
    rows_gpu[gpu]++;
    rows++;
  }
  fclose(f);
  return rows;
}

/* Count TensorBoard records carrying `tag` (the tag bytes appear once per event). */
static int count_tag(const char *tbdir, const char *tag) {
  char pat[512];
  snprintf(pat, sizeof pat, "%s/events.out.tfevents.*", tbdir);
  const char *p = pat;
  hora_records_reader_opts_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.patterns = &p;
  o.pattern_count = 1;
  hora_records_reader_t *r;
  if (hora_records_reader_open(&o, &r) != HORA_SUCCESS) return -1;
  int n = 0;
  for (;;) {
    const void *d;
    size_t len;
    int eof;
    if (hora_records_next(r, &d, &len, &eof) != HORA_SUCCESS) {
      n = -1;
      break;
    }
    if (eof) break;
    if (memmem(d, len, tag, strlen(tag))) n++;
  }
  hora_records_reader_close(r);
  return n;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_gpumon FAKE_NVML_LIBRARY\n");
    return 2;
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/hora-test-gpumon-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) return 1;
  unsetenv("CUDA_VISIBLE_DEVICES");
  char csv[512], tbdir[512];
  hora_gpumon_t *m = NULL;

  /* no NVML: NOT_SUPPORTED, nothing created */
  set_lib("libhora-no-such-nvml.so.1");
  snprintf(csv, sizeof csv, "%s/none.csv", dir);
  EXPECT_RC(start(csv, NULL, 0, 0, &m), HORA_ERR_NOT_SUPPORTED);
  EXPECT(m == NULL && access(csv, F_OK) != 0, "monitor without NVML created something");
  set_lib(argv[1]);
  setenv("FAKE_NVML_FAIL", "1", 1);
  EXPECT_RC(start(csv, NULL, 0, 0, &m), HORA_ERR_NOT_SUPPORTED);
  EXPECT(strstr(hora_last_error(), "fake: no permission") != NULL, "message: %s", hora_last_error());
  unsetenv("FAKE_NVML_FAIL");

  /* every GPU, CSV + TensorBoard */
  snprintf(csv, sizeof csv, "%s/all.csv", dir);
  snprintf(tbdir, sizeof tbdir, "%s/tb", dir);
  hora_tb_t *tb = NULL;
  EXPECT_OK(hora_tb_open(tbdir, &tb));
  EXPECT_OK(start(csv, tb, 0, 1, &m));
  if (m) {
    wait_samples(m, 4);
    uint64_t s = 0;
    EXPECT_OK(hora_gpumon_stop(m));
    m = NULL;
    int per[2] = {0, 0};
    int rows = check_csv(csv, per);
    EXPECT(rows >= 8 && per[0] == per[1], "CSV rows %d (gpu0 %d, gpu1 %d)", rows, per[0], per[1]);
    EXPECT_OK(hora_tb_close(tb));
    tb = NULL;
    int n0 = count_tag(tbdir, "gpu0/sm_util_pct"), n1 = count_tag(tbdir, "gpu1/power_w");
    int nclk = count_tag(tbdir, "gpu1/sm_clock_mhz");
    EXPECT(n0 == per[0] && n1 == per[1] && nclk == per[1], "TensorBoard events %d %d %d, CSV rows %d", n0, n1, nclk, per[0]);
    (void)s;
  }
  hora_tb_close(tb);

  /* CUDA_VISIBLE_DEVICES maps ordinal 0 to NVML GPU 1 (index form and UUID form) */
  const char *cvds[] = {"1", "GPU-fake-1", "3,1"};
  int ords[] = {0, 0, 1};
  for (int k = 0; k < 3; k++) {
    setenv("CUDA_VISIBLE_DEVICES", cvds[k], 1);
    snprintf(csv, sizeof csv, "%s/cvd%d.csv", dir, k);
    m = NULL;
    EXPECT_OK(start(csv, NULL, ords[k], 0, &m));
    hora_gpumon_stop(m);
    int per[2] = {0, 0};
    int rows = check_csv(csv, per);
    EXPECT(rows >= 1 && per[0] == 0 && per[1] == rows, "CUDA_VISIBLE_DEVICES=%s: rows %d gpu1 %d", cvds[k], rows, per[1]);
  }
  setenv("CUDA_VISIBLE_DEVICES", "0", 1);
  m = NULL;
  EXPECT_RC(start(csv, NULL, 1, 0, &m), HORA_ERR_NOT_SUPPORTED); /* no ordinal 1 */
  unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_RC(start(csv, NULL, -1, 0, &m), HORA_ERR_INVALID_ARGUMENT);
  snprintf(csv, sizeof csv, "%s/no-such-dir/x.csv", dir);
  EXPECT_RC(start(csv, NULL, 0, 0, &m), HORA_ERR_IO);
  EXPECT_OK(hora_gpumon_stop(NULL));

  /* HORA_GPU_MONITOR_S through hora_init: a rank without a GPU, local rank 0 watches all */
  snprintf(csv, sizeof csv, "%s/env.csv", dir);
  setenv("HORA_GPU_MONITOR_S", "0.02", 1);
  setenv("HORA_GPU_MONITOR_CSV", csv, 1);
  hora_ctx_t *ctx = NULL;
  EXPECT_OK(hora_init(&ctx));
  usleep(100000);
  EXPECT_OK(hora_finalize(ctx));
  int per[2] = {0, 0};
  int rows = check_csv(csv, per);
  EXPECT(rows >= 4 && per[0] >= 2 && per[1] >= 2, "hora_init monitor: %d rows", rows);

  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return hora_test_finish("test_gpumon");
}
