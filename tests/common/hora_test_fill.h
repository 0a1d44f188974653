/* Random element values for the kernel tests (tests/unit/test_kernels_host.c against scalar
 * loops, tests/gpu/test_kernels_cuda.c against the host kernels): a xorshift64 generator whose
 * state the test may reseed, and a fill that covers every dtype. */
#ifndef HORA_TEST_FILL_H
#define HORA_TEST_FILL_H

#include <stddef.h>
#include <stdint.h>

#include "hora_kernels.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static size_t esize(hora_dtype_t d) {
  size_t s = 0;
  hora_dtype_size(d, &s);
  return s;
}

/* Random element values: integers over their whole range (so sums and products wrap), floats
 * in [-8, 8) with fractions (so rounding matters), 16-bit floats from such floats. */
static void fill(void *buf, hora_dtype_t d, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t r = next_rand();
    float f = (float)((int64_t)(r >> 40) - (1 << 23)) / (float)(1 << 20);
    switch (d) {
      case HORA_UINT8: ((uint8_t *)buf)[i] = (uint8_t)r; break;
      case HORA_INT8: ((int8_t *)buf)[i] = (int8_t)r; break;
      case HORA_INT16: ((int16_t *)buf)[i] = (int16_t)r; break;
      case HORA_BOOL: ((uint8_t *)buf)[i] = (uint8_t)(r >> 63); break;
      case HORA_INT32: ((int32_t *)buf)[i] = (int32_t)r; break;
      case HORA_INT64: ((int64_t *)buf)[i] = (int64_t)r; break;
      case HORA_FLOAT16: ((uint16_t *)buf)[i] = hora__f32_to_f16(f); break;
      case HORA_BFLOAT16: ((uint16_t *)buf)[i] = hora__f32_to_bf16(f); break;
      case HORA_FLOAT32: ((float *)buf)[i] = f; break;
      case HORA_FLOAT64: ((double *)buf)[i] = (double)f * 1.000000119; break;
    }
  }
}

#endif
