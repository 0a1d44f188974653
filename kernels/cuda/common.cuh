/* Shared pieces of the CUDA kernels: launch geometry, launch checks, 16-bit float conversions and
 * the reduction operators. Internal to kernels/cuda.
 *
 * Conversions use CUDA's round-to-nearest-even intrinsics (cuda_fp16.h / cuda_bf16.h), which give
 * the same bits as the host reference (kernels/host/half_inline.h) for every non-NaN value; a NaN
 * stays a NaN but its payload bits may differ from the host's. The min/max operators use the same
 * comparison as the host ((y < x) ? y : x), not fminf, so that NaN propagation matches too. */
#ifndef HORA_KERNELS_CUDA_COMMON_CUH
#define HORA_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "hora_kernels.h"

/* Provided by runtime/core (log.c): records the thread's last error message and returns rc. Weak,
 * so that a program linking the kernels without libhora's core still links (then the codes come
 * back without a message). */
extern "C" hora_result_t hora__error(hora_result_t rc, const char *file, int line, const char *fmt, ...)
    __attribute__((weak));

namespace hora_cuda {

constexpr int kThreads = 256;

/* Blocks for a grid-stride loop over `work` items: enough to cover the work, at most 8 resident
 * blocks' worth per SM (more only adds scheduling overhead to a bandwidth-bound loop). The SM
 * count is cached per device ordinal; cudaGetDevice and cudaDeviceGetAttribute do not sync. */
static inline unsigned blocks_for(size_t work) {
  static int sms[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) dev = 0;
  int n = dev < 64 ? sms[dev] : 0;
  if (n <= 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 80;
    if (dev < 64) sms[dev] = n; /* benign race: every thread stores the same value */
  }
  size_t want = (work + kThreads - 1) / kThreads;
  size_t cap = (size_t)n * 8;
  if (want > cap) want = cap;
  return want ? (unsigned)want : 1u;
}

/* After a launch: HORA_ERR_CUDA naming the kernel when the launch failed. */
static inline hora_result_t check_launch(const char *what, const char *file, int line) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return HORA_SUCCESS;
  if (!hora__error) return HORA_ERR_CUDA;
  return hora__error(HORA_ERR_CUDA, file, line, "%s: kernel launch failed: %s (%s)", what,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}
#define HORA_CUDA_LAUNCHED(what) ::hora_cuda::check_launch((what), __FILE__, __LINE__)

static inline hora_result_t check_call(cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess) return HORA_SUCCESS;
  if (!hora__error) return HORA_ERR_CUDA;
  return hora__error(HORA_ERR_CUDA, file, line, "%s failed: %s (%s)", what, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}
#define HORA_CUDA_CALL(call) ::hora_cuda::check_call((call), #call, __FILE__, __LINE__)

static inline cudaStream_t as_stream(void *s) { return (cudaStream_t)s; }


/* ---- element access: every dtype is loaded into a compute type and stored back ---- */
/* 16-bit floats are carried as raw bits (uint16_t) in memory and as float in registers. */
struct f16_t { uint16_t bits; };
struct bf16_t { uint16_t bits; };

template <typename T> struct Elem {
  using C = T; /* compute type */
  static __device__ __forceinline__ C load(T v) { return v; }
  static __device__ __forceinline__ T store(C v) { return v; }
};
template <> struct Elem<f16_t> {
  using C = float;
  static __device__ __forceinline__ float load(f16_t v) { return __half2float(__ushort_as_half(v.bits)); }
  static __device__ __forceinline__ f16_t store(float v) { return f16_t{__half_as_ushort(__float2half_rn(v))}; }
};
template <> struct Elem<bf16_t> {
  using C = float;
  static __device__ __forceinline__ float load(bf16_t v) {
    return __uint_as_float((unsigned)v.bits << 16);
  }
  static __device__ __forceinline__ bf16_t store(float v) {
    return bf16_t{__bfloat16_as_ushort(__float2bfloat16_rn(v))};
  }
};

/* Integer sums and products wrap (two's complement, like MPI and NCCL): signed ones are computed
 * in the unsigned type of the same width, as the host reference does. */
template <typename C> struct Wrap { using U = C; };
template <> struct Wrap<int8_t> { using U = uint8_t; };
template <> struct Wrap<int32_t> { using U = uint32_t; };
template <> struct Wrap<int64_t> { using U = uint64_t; };

enum { OP_SUM = 0, OP_MIN = 1, OP_MAX = 2, OP_PROD = 3 };

template <int OP, typename C> __device__ __forceinline__ C apply(C x, C y) {
  using U = typename Wrap<C>::U;
  if (OP == OP_SUM) return (C)((U)x + (U)y);
  if (OP == OP_PROD) return (C)((U)x * (U)y);
  if (OP == OP_MIN) return y < x ? y : x;
  return y > x ? y : x;
}

static inline int op_index(hora_op_t op) {
  switch (op) {
    case HORA_SUM: case HORA_AVERAGE: return OP_SUM;
    case HORA_MIN: return OP_MIN;
    case HORA_MAX: return OP_MAX;
    case HORA_PRODUCT: return OP_PROD;
  }
  return -1;
}

}  // namespace hora_cuda

#endif
