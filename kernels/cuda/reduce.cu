/* CUDA elementwise reductions: hora__reduce_cuda (two sources) and hora__reduce_n_cuda (many).
 * Same contract as the host references in kernels/host/reduce.c (see hora_kernels.h).
 *
 * One kernel serves both: dst[i] = OP over s of srcs[s][i]. The source pointers travel in the
 * kernel's parameters (at most kMaxSrc per launch; more sources chain launches that fold into
 * dst). When every pointer is 16-byte aligned each thread moves 16 bytes per source per step
 * (uint4 loads and stores), the rest of the elements go one by one; a grid-stride loop with
 * size_t indices covers any count. 16-bit floats accumulate in float32 over all sources of one
 * launch and are rounded once, like the host's reduce_half_n. */
#include "common.cuh"

namespace hora_cuda {
namespace {

template <int MAXS> struct Srcs {
  const void *p[MAXS];
  int n;
};
constexpr int kMaxSrc = 64;

template <typename T> union Vec {
  uint4 raw;
  T e[sizeof(uint4) / sizeof(T)];
};

template <typename T, int OP, int MAXS>
__global__ void reduce_kernel(T *dst, Srcs<MAXS> s, size_t count, int vec) {
  using E = Elem<T>;
  using C = typename E::C;
  constexpr int V = (int)(sizeof(uint4) / sizeof(T));
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t done = 0;
  if (vec) {
    const size_t nvec = count / V;
    for (size_t i = tid; i < nvec; i += stride) {
      Vec<T> in;
      C acc[V];
      in.raw = reinterpret_cast<const uint4 *>(s.p[0])[i];
#pragma unroll
      for (int k = 0; k < V; k++) acc[k] = E::load(in.e[k]);
      for (int j = 1; j < s.n; j++) {
        in.raw = reinterpret_cast<const uint4 *>(s.p[j])[i];
#pragma unroll
        for (int k = 0; k < V; k++) acc[k] = apply<OP, C>(acc[k], E::load(in.e[k]));
      }
      Vec<T> out;
#pragma unroll
      for (int k = 0; k < V; k++) out.e[k] = E::store(acc[k]);
      reinterpret_cast<uint4 *>(dst)[i] = out.raw;
    }
    done = nvec * V;
  }
  for (size_t i = done + tid; i < count; i += stride) {
    C acc = E::load(static_cast<const T *>(s.p[0])[i]);
    for (int j = 1; j < s.n; j++) acc = apply<OP, C>(acc, E::load(static_cast<const T *>(s.p[j])[i]));
    dst[i] = E::store(acc);
  }
}

template <typename T, int MAXS>
hora_result_t launch_t(void *dst, const Srcs<MAXS> &s, size_t count, int op, cudaStream_t st) {
  uintptr_t bits = (uintptr_t)dst;
  for (int j = 0; j < s.n; j++) bits |= (uintptr_t)s.p[j];
  const int vec = (bits % sizeof(uint4)) == 0;
  const size_t V = sizeof(uint4) / sizeof(T);
  const unsigned blocks = blocks_for(vec ? count / V + V : count);
  T *d = static_cast<T *>(dst);
  switch (op) {
    case OP_SUM: reduce_kernel<T, OP_SUM, MAXS><<<blocks, kThreads, 0, st>>>(d, s, count, vec); break;
    case OP_MIN: reduce_kernel<T, OP_MIN, MAXS><<<blocks, kThreads, 0, st>>>(d, s, count, vec); break;
    case OP_MAX: reduce_kernel<T, OP_MAX, MAXS><<<blocks, kThreads, 0, st>>>(d, s, count, vec); break;
    default: reduce_kernel<T, OP_PROD, MAXS><<<blocks, kThreads, 0, st>>>(d, s, count, vec); break;
  }
  return HORA_CUDA_LAUNCHED("hora__reduce_cuda");
}

template <int MAXS>
hora_result_t launch(void *dst, const Srcs<MAXS> &s, size_t count, hora_dtype_t dtype, int op,
                     cudaStream_t st) {
  switch (dtype) {
    case HORA_UINT8: return launch_t<uint8_t>(dst, s, count, op, st);
    case HORA_INT8: return launch_t<int8_t>(dst, s, count, op, st);
    case HORA_INT16: return launch_t<int16_t>(dst, s, count, op, st);
    case HORA_BOOL: /* 0/1 bytes: OR is max, AND is min */
      return launch_t<uint8_t>(dst, s, count, op == OP_MIN || op == OP_PROD ? OP_MIN : OP_MAX, st);
    case HORA_INT32: return launch_t<int32_t>(dst, s, count, op, st);
    case HORA_INT64: return launch_t<int64_t>(dst, s, count, op, st);
    case HORA_FLOAT16: return launch_t<f16_t>(dst, s, count, op, st);
    case HORA_BFLOAT16: return launch_t<bf16_t>(dst, s, count, op, st);
    case HORA_FLOAT32: return launch_t<float>(dst, s, count, op, st);
    case HORA_FLOAT64: return launch_t<double>(dst, s, count, op, st);
  }
  return HORA_ERR_INVALID_ARGUMENT;
}

int valid(hora_dtype_t dtype, hora_op_t op) {
  return (unsigned)dtype < HORA_DTYPE_COUNT && (unsigned)op < HORA_OP_COUNT;
}

}  // namespace
}  // namespace hora_cuda

using namespace hora_cuda;

extern "C" hora_result_t hora__reduce_cuda(void *dst, const void *a, const void *b, size_t count,
                                           hora_dtype_t dtype, hora_op_t op, void *stream) {
  if (!valid(dtype, op)) return HORA_ERR_INVALID_ARGUMENT;
  if (count == 0) return HORA_SUCCESS;
  if (!dst || !a || !b) return HORA_ERR_INVALID_ARGUMENT;
  Srcs<2> s;
  s.p[0] = a;
  s.p[1] = b;
  s.n = 2;
  return launch(dst, s, count, dtype, op_index(op), as_stream(stream));
}

extern "C" hora_result_t hora__reduce_n_cuda(void *dst, const void *const *srcs, int nsrc, size_t count,
                                             hora_dtype_t dtype, hora_op_t op, void *stream) {
  if (!valid(dtype, op) || nsrc < 1) return HORA_ERR_INVALID_ARGUMENT;
  if (count == 0) return HORA_SUCCESS;
  if (!dst || !srcs) return HORA_ERR_INVALID_ARGUMENT;
  for (int j = 0; j < nsrc; j++)
    if (!srcs[j]) return HORA_ERR_INVALID_ARGUMENT;
  cudaStream_t st = as_stream(stream);
  if (nsrc == 1) {
    if (dst == srcs[0]) return HORA_SUCCESS;
    return HORA_CUDA_CALL(cudaMemcpyAsync(dst, srcs[0], count * hora__kdtype_size(dtype), cudaMemcpyDefault, st));
  }
  /* First launch: up to kMaxSrc sources; later launches fold dst with the next kMaxSrc-1. */
  Srcs<kMaxSrc> s;
  int next = 0;
  s.n = 0;
  while (next < nsrc && s.n < kMaxSrc) s.p[s.n++] = srcs[next++];
  hora_result_t rc = launch(dst, s, count, dtype, op_index(op), st);
  while (rc == HORA_SUCCESS && next < nsrc) {
    s.n = 0;
    s.p[s.n++] = dst;
    while (next < nsrc && s.n < kMaxSrc) s.p[s.n++] = srcs[next++];
    rc = launch(dst, s, count, dtype, op_index(op), st);
  }
  return rc;
}
