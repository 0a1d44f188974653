/* Values for the collective sweeps (tests/mpi/test_coll.c on host buffers, tests/gpu/test_coll_gpu.c
 * on device buffers): inputs that every dtype holds exactly and whose reduction is exact in any
 * order (the nccl-tests habit), the expected results and their tolerances. The including file
 * defines `static int size;` (the world size) before including this header. */
#ifndef HORA_TEST_VALUES_H
#define HORA_TEST_VALUES_H

#include <math.h>
#include <stdint.h>

#include "hora.h"
#include "hora_kernels.h"

static size_t esize(hora_dtype_t d) {
  size_t s = 0;
  hora_dtype_size(d, &s);
  return s;
}
static int is_float(hora_dtype_t d) { return d >= HORA_FLOAT16 && d <= HORA_FLOAT64; }
static int is_signed(hora_dtype_t d) { return d != HORA_UINT8; }

/* The input of rank r at element i for op: small integers whose reduction fits every dtype. */
static double input(hora_dtype_t d, hora_op_t op, int r, size_t i) {
  int sg = is_signed(d);
  switch (op) {
    case HORA_SUM: case HORA_AVERAGE: return (double)((i * 13 + (size_t)r * 7) % 11) - (sg ? 5 : 0);
    case HORA_PRODUCT: return sg ? (double)((i * 5 + (size_t)r * 3) % 4) - 1 : (double)((i + (size_t)r) % 3 + 1);
    default: return (double)((i * 31 + (size_t)r * 17) % 97) - (sg ? 48 : 0);
  }
}



/* Expected reduced value at element i of the logical vector whose element i is input(.., i). */
static double expected(hora_dtype_t d, hora_op_t op, size_t i, double pre, double post) {
  double acc = 0;
  for (int r = 0; r < size; r++) {
    double v = input(d, op, r, i) * pre;
    if (r == 0) acc = v;
    else if (op == HORA_SUM || op == HORA_AVERAGE) acc += v;
    else if (op == HORA_PRODUCT) acc *= v;
    else if (op == HORA_MIN) acc = v < acc ? v : acc;
    else acc = v > acc ? v : acc;
  }
  if (op == HORA_AVERAGE) acc = is_float(d) ? acc / size : trunc(acc / size);
  return acc * post;
}

/* Tolerance: exact except when average divides by a world size that is not a power of two. */
static double tol(hora_dtype_t d, hora_op_t op, double want) {
  if (op != HORA_AVERAGE || !is_float(d)) return 0;
  double rel = d == HORA_FLOAT16 ? 2e-3 : d == HORA_BFLOAT16 ? 1.6e-2 : d == HORA_FLOAT32 ? 4e-7 : 1e-15;
  return fabs(want) * rel + 1e-30;
}

#endif
