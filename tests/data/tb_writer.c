/* Helper of check_tensorboard.py: writes known scalars (and, with a fake NVML library as argv[2],
 * two GPU monitor samples) into the TensorBoard directory argv[1]. The values are a function of
 * the step that the Python side recomputes: loss = 1/(step+1), lr = 0.1 * 0.5^(step/10),
 * big/step: value = step for steps 2^40 and 2^40+1. */
#include <unistd.h>

#include "core/internal.h"
#include "hora_test.h"

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  hora_tb_t *tb = NULL;
  EXPECT_OK(hora_tb_open(argv[1], &tb));
  for (int s = 0; s < 50; s++) {
    EXPECT_OK(hora_tb_scalar(tb, "train/loss", s, 1.0 / (s + 1)));
    if (s % 10 == 0) EXPECT_OK(hora_tb_scalar(tb, "train/lr", s, 0.1 * (s == 0 ? 1 : s == 10 ? 0.5 : s == 20 ? 0.25 : s == 30 ? 0.125 : 0.0625)));
  }
  EXPECT_OK(hora_tb_scalar(tb, "big/step", (int64_t)1 << 40, 1099511627776.0));
  EXPECT_OK(hora_tb_scalar(tb, "big/step", ((int64_t)1 << 40) + 1, 1099511627777.0));
  if (argc > 2) {
    setenv("HORA_NVML_LIBRARY", argv[2], 1);
    hora__params_reload();
    hora_gpumon_opts_t o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.period_s = 3600; /* only the first sample, taken by start */
    o.tb = tb;
    o.all_gpus = 1;
    char csv[4096];
    snprintf(csv, sizeof csv, "%s/gpu.csv", argv[1]);
    o.csv_path = csv;
    hora_gpumon_t *m = NULL;
    EXPECT_OK(hora_gpumon_start(&o, &m));
    EXPECT_OK(hora_gpumon_stop(m));
  }
  EXPECT_OK(hora_tb_flush(tb));
  EXPECT_OK(hora_tb_close(tb));
  return hora_test_finish("tb_writer");
}
