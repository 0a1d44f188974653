/* CUDA scaling (prescale, postscale, average) and the float32 <-> float16/bfloat16 casts used by
 * compression. Same contract and rounding as kernels/host (see hora_kernels.h): floating dtypes
 * are multiplied in their own precision (float32 and the 16-bit floats by (float)factor, float64
 * by factor), integers by the double factor and truncated toward zero.
 *
 * One elementwise kernel template, grid-stride with size_t indices; the work per element is a
 * load, a multiply or conversion and a store, so the loop is bound by memory bandwidth. */
#include "common.cuh"

namespace hora_cuda {
namespace {

template <typename S, typename D, typename F>
__global__ void map_kernel(D *dst, const S *src, size_t count, F f) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) dst[i] = f(src[i]);
}

template <typename S, typename D, typename F>
hora_result_t map(D *dst, const S *src, size_t count, F f, cudaStream_t st, const char *what) {
  map_kernel<S, D, F><<<blocks_for(count), kThreads, 0, st>>>(dst, src, count, f);
  return HORA_CUDA_LAUNCHED(what);
}

template <typename T> struct ScaleInt {
  double f;
  __device__ T operator()(T x) const { return (T)((double)x * f); }
};
struct ScaleF32 {
  float f;
  __device__ float operator()(float x) const { return x * f; }
};
struct ScaleF64 {
  double f;
  __device__ double operator()(double x) const { return x * f; }
};
template <typename T> struct ScaleHalf {
  float f;
  __device__ T operator()(T x) const { return Elem<T>::store(Elem<T>::load(x) * f); }
};
template <typename S, typename D> struct Convert {
  __device__ D operator()(S x) const { return Elem<D>::store(Elem<S>::load(x)); }
};

}  // namespace
}  // namespace hora_cuda

using namespace hora_cuda;

extern "C" hora_result_t hora__scale_cuda(void *dst, const void *src, size_t count, hora_dtype_t dtype,
                                          double factor, void *stream) {
  if ((unsigned)dtype >= HORA_DTYPE_COUNT) return HORA_ERR_INVALID_ARGUMENT;
  if (count == 0) return HORA_SUCCESS;
  if (!dst || !src) return HORA_ERR_INVALID_ARGUMENT;
  cudaStream_t st = as_stream(stream);
  const char *what = "hora__scale_cuda";
  if (factor == 1.0) {
    if (dst == src) return HORA_SUCCESS;
    return HORA_CUDA_CALL(cudaMemcpyAsync(dst, src, count * hora__kdtype_size(dtype), cudaMemcpyDefault, st));
  }
  switch (dtype) {
    case HORA_UINT8: return map((uint8_t *)dst, (const uint8_t *)src, count, ScaleInt<uint8_t>{factor}, st, what);
    case HORA_INT8: return map((int8_t *)dst, (const int8_t *)src, count, ScaleInt<int8_t>{factor}, st, what);
    case HORA_INT16: return map((int16_t *)dst, (const int16_t *)src, count, ScaleInt<int16_t>{factor}, st, what);
    case HORA_BOOL: return HORA_ERR_INVALID_ARGUMENT; /* a bool cannot be scaled */
    case HORA_INT32: return map((int32_t *)dst, (const int32_t *)src, count, ScaleInt<int32_t>{factor}, st, what);
    case HORA_INT64: return map((int64_t *)dst, (const int64_t *)src, count, ScaleInt<int64_t>{factor}, st, what);
    case HORA_FLOAT32: return map((float *)dst, (const float *)src, count, ScaleF32{(float)factor}, st, what);
    case HORA_FLOAT64: return map((double *)dst, (const double *)src, count, ScaleF64{factor}, st, what);
    case HORA_FLOAT16:
      return map((f16_t *)dst, (const f16_t *)src, count, ScaleHalf<f16_t>{(float)factor}, st, what);
    case HORA_BFLOAT16:
      return map((bf16_t *)dst, (const bf16_t *)src, count, ScaleHalf<bf16_t>{(float)factor}, st, what);
  }
  return HORA_ERR_INVALID_ARGUMENT;
}

extern "C" hora_result_t hora__cast_f32_to_f16_cuda(void *dst, const float *src, size_t count, void *stream) {
  if (count && (!dst || !src)) return HORA_ERR_INVALID_ARGUMENT;
  if (count == 0) return HORA_SUCCESS;
  return map((f16_t *)dst, src, count, Convert<float, f16_t>{}, as_stream(stream), "hora__cast_f32_to_f16_cuda");
}
extern "C" hora_result_t hora__cast_f16_to_f32_cuda(float *dst, const void *src, size_t count, void *stream) {
  if (count && (!dst || !src)) return HORA_ERR_INVALID_ARGUMENT;
  if (count == 0) return HORA_SUCCESS;
  return map(dst, (const f16_t *)src, count, Convert<f16_t, float>{}, as_stream(stream), "hora__cast_f16_to_f32_cuda");
}
extern "C" hora_result_t hora__cast_f32_to_bf16_cuda(void *dst, const float *src, size_t count, void *stream) {
  if (count && (!dst || !src)) return HORA_ERR_INVALID_ARGUMENT;
  if (count == 0) return HORA_SUCCESS;
  return map((bf16_t *)dst, src, count, Convert<float, bf16_t>{}, as_stream(stream), "hora__cast_f32_to_bf16_cuda");
}
extern "C" hora_result_t hora__cast_bf16_to_f32_cuda(float *dst, const void *src, size_t count, void *stream) {
  if (count && (!dst || !src)) return HORA_ERR_INVALID_ARGUMENT;
  if (count == 0) return HORA_SUCCESS;
  return map(dst, (const bf16_t *)src, count, Convert<bf16_t, float>{}, as_stream(stream), "hora__cast_bf16_to_f32_cuda");
}
