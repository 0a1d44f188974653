/* Result codes, names, dtype sizes and parameter parsing, without MPI. */
#include <stdlib.h>

#include "core/internal.h"
#include "hora_test.h"

long hora_test_errors_dummy;

int main(void) {
  EXPECT(strcmp(hora_result_name(HORA_SUCCESS), "HORA_SUCCESS") == 0, "name of 0");
  EXPECT(strcmp(hora_result_name(HORA_ERR_MISMATCH), "HORA_ERR_MISMATCH") == 0, "name of mismatch");
  EXPECT(strcmp(hora_result_name((hora_result_t)999), "HORA_UNKNOWN_RESULT") == 0, "unknown name");
  EXPECT(strlen(hora_strerror(HORA_ERR_IO)) > 5, "strerror");
  size_t s = 0;
  EXPECT_OK(hora_dtype_size(HORA_BFLOAT16, &s));
  EXPECT(s == 2, "bf16 size %zu", s);
  EXPECT_OK(hora_dtype_size(HORA_INT64, &s));
  EXPECT(s == 8, "i64 size %zu", s);
  EXPECT_RC(hora_dtype_size((hora_dtype_t)42, &s), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "unknown dtype 42") != NULL, "message: %s", hora_last_error());

  int built = -1;
  EXPECT_OK(hora_built("mpi", &built));
  EXPECT(built == 1, "mpi built %d", built);
  EXPECT_OK(hora_built("cuda", &built));
  EXPECT(built == HORA_HAVE_CUDA, "cuda built %d, config.h says %d", built, HORA_HAVE_CUDA);
  EXPECT_OK(hora_built("nccl", &built));
  EXPECT(built == HORA_HAVE_NCCL, "nccl built %d, config.h says %d", built, HORA_HAVE_NCCL);
  EXPECT_OK(hora_built("gloo", &built));
  EXPECT(built == 0, "gloo built %d", built);
  EXPECT_RC(hora_built("tpu", &built), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "\"tpu\"") != NULL, "message: %s", hora_last_error());
  EXPECT_RC(hora_built(NULL, &built), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_built("mpi", NULL), HORA_ERR_INVALID_ARGUMENT);

  uint64_t b = 0;
  EXPECT_OK(hora__parse_bytes("128M", &b));
  EXPECT(b == 128ull << 20, "128M -> %llu", (unsigned long long)b);
  EXPECT_OK(hora__parse_bytes("4k", &b));
  EXPECT(b == 4096, "4k -> %llu", (unsigned long long)b);
  EXPECT_OK(hora__parse_bytes("1GiB", &b));
  EXPECT(b == 1ull << 30, "1GiB");
  EXPECT_RC(hora__parse_bytes("12Q", &b), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora__parse_bytes("-1", &b), HORA_ERR_INVALID_ARGUMENT);

  /* A malformed variable is an error naming it; a good one is parsed. */
  hora_params_t p;
  setenv("HORA_FUSION_THRESHOLD", "64M", 1);
  EXPECT_OK(hora__params_load(&p));
  EXPECT(p.fusion_threshold == 64ull << 20, "fusion threshold %llu", (unsigned long long)p.fusion_threshold);
  EXPECT(p.cycle_time_ms == 1.0, "default cycle time %g", p.cycle_time_ms);
  setenv("HORA_CYCLE_TIME_MS", "fast", 1);
  EXPECT_RC(hora__params_load(&p), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "HORA_CYCLE_TIME_MS=fast") != NULL, "message: %s", hora_last_error());
  unsetenv("HORA_CYCLE_TIME_MS");
  setenv("HORA_ALLREDUCE_ALGO", "RING", 1);
  EXPECT_OK(hora__params_load(&p));
  EXPECT(strcmp(p.allreduce_algo, "ring") == 0, "canonical choice %s", p.allreduce_algo);
  setenv("HORA_ALLREDUCE_ALGO", "butterfly", 1);
  EXPECT_RC(hora__params_load(&p), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "HORA_ALLREDUCE_ALGO") != NULL, "message: %s", hora_last_error());
  return hora_test_finish("test_results");
}
