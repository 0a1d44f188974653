/* Result names and messages, generated from result.def. */
#include <string.h>

#include "core/internal.h"

#define X(name, value, msg) _Static_assert((int)name == (value), #name " differs from result.def");
#include "core/result.def"
#undef X

HORA_EXPORT const char *hora_result_name(hora_result_t result) {
  switch ((int)result) {
#define X(name, value, msg) \
  case value:               \
    return #name;
#include "core/result.def"
#undef X
  }
  return "HORA_UNKNOWN_RESULT";
}

HORA_EXPORT const char *hora_strerror(hora_result_t result) {
  switch ((int)result) {
#define X(name, value, msg) \
  case value:               \
    return msg;
#include "core/result.def"
#undef X
  }
  return "unknown result code";
}

HORA_EXPORT hora_result_t hora_built(const char *feature, int *built) {
  static const struct { const char *name; int built; } features[] = {
      {"mpi", 1},   {"cuda", HORA_HAVE_CUDA}, {"nccl", HORA_HAVE_NCCL}, {"hwloc", HORA_HAVE_HWLOC},
      {"gloo", 0},  {"ddl", 0},               {"ccl", 0},               {"rocm", 0},
  };
  if (!feature || !built)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_built: %s is NULL", feature ? "built" : "feature");
  for (size_t i = 0; i < sizeof features / sizeof features[0]; i++)
    if (strcmp(feature, features[i].name) == 0) {
      *built = features[i].built;
      return HORA_SUCCESS;
    }
  return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                  "hora_built: unknown feature \"%.64s\" (mpi, cuda, nccl, hwloc, gloo, ddl, ccl, rocm)", feature);
}

HORA_EXPORT hora_result_t hora_dtype_size(hora_dtype_t dtype, size_t *size_bytes) {
  if (!size_bytes) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_dtype_size: size_bytes is NULL");
  size_t s = hora__dtype_size(dtype);
  if (s == 0) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_dtype_size: unknown dtype %d", (int)dtype);
  *size_bytes = s;
  return HORA_SUCCESS;
}

size_t hora__dtype_size(hora_dtype_t dtype) {
  switch (dtype) {
    case HORA_UINT8:
    case HORA_INT8:
    case HORA_BOOL: return 1;
    case HORA_INT16:
    case HORA_FLOAT16:
    case HORA_BFLOAT16: return 2;
    case HORA_INT32:
    case HORA_FLOAT32: return 4;
    case HORA_INT64:
    case HORA_FLOAT64: return 8;
  }
  return 0;
}

const char *hora__dtype_name(hora_dtype_t dtype) {
  static const char *const names[] = {"u8", "i8", "i32", "i64", "f16", "bf16", "f32", "f64", "i16", "bool"};
  return ((unsigned)dtype < HORA_DTYPE_COUNT) ? names[dtype] : "unknown";
}

const char *hora__op_name(hora_op_t op) {
  static const char *const names[] = {"sum", "avg", "min", "max", "prod"};
  if (op == HORA_ADASUM) return "adasum";
  return ((unsigned)op < HORA_OP_COUNT) ? names[op] : "unknown";
}
