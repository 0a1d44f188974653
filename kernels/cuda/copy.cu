/* CUDA batched copy: the fusion buffer's pack (many tensors -> one buffer) and unpack (one buffer
 * -> many tensors) in one kernel launch instead of one cudaMemcpyAsync per tensor (each of which
 * costs a few microseconds of launch overhead).
 *
 *   descs (host array)       kernel parameters              grid
 *   {dst0, src0, b0}   --->  Batch{n, d[0..n-1]}  --->  blockIdx.y = region, blockIdx.x strides
 *   {dst1, src1, b1}         (by value: no device         inside it; 16-byte moves when both
 *   ...                       scratch, no H2D copy)        ends are 16-byte aligned, else 4, else 1
 *
 * The descriptors travel in the kernel's parameters, so the host array may be reused as soon as
 * the call returns and nothing has to be copied to the device first (a pageable H2D copy would
 * synchronize the stream). A launch carries up to kBatchLarge regions (24 KiB of parameters; CUDA
 * 12.1+ allows 32 KiB on sm_70 and newer); more regions take several launches. Small batches use
 * a smaller parameter block because parameter size adds to launch latency. */
#include "common.cuh"

namespace hora_cuda {
namespace {

constexpr int kBatchSmall = 32;
constexpr int kBatchLarge = 1000;

template <int N> struct Batch {
  hora_copy_desc_t d[N];
  int n;
};

template <typename W>
__device__ __forceinline__ void copy_words(char *dst, const char *src, size_t words, size_t first, size_t stride) {
  W *d = reinterpret_cast<W *>(dst);
  const W *s = reinterpret_cast<const W *>(src);
  for (size_t i = first; i < words; i += stride) d[i] = s[i];
}

template <int N> __global__ void batched_copy_kernel(Batch<N> b) {
  const int r = blockIdx.y;
  if (r >= b.n) return;
  char *dst = static_cast<char *>(b.d[r].dst);
  const char *src = static_cast<const char *>(b.d[r].src);
  const size_t bytes = b.d[r].bytes;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const uintptr_t al = (uintptr_t)dst | (uintptr_t)src;
  size_t done = 0;
  if (al % 16 == 0) {
    copy_words<uint4>(dst, src, bytes / 16, first, stride);
    done = bytes / 16 * 16;
  } else if (al % 4 == 0) {
    copy_words<uint32_t>(dst, src, bytes / 4, first, stride);
    done = bytes / 4 * 4;
  }
  for (size_t i = done + first; i < bytes; i += stride) dst[i] = src[i];
}

template <int N> hora_result_t launch_batch(const hora_copy_desc_t *descs, int n, cudaStream_t st) {
  Batch<N> b;
  size_t maxb = 0;
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (descs[i].bytes == 0) continue;
    b.d[m++] = descs[i];
    if (descs[i].bytes > maxb) maxb = descs[i].bytes;
  }
  b.n = m;
  if (m == 0) return HORA_SUCCESS;
  /* x covers the largest region in 16-byte words; the total is capped like every other kernel. */
  size_t per_region = blocks_for(maxb / 16 + 1);
  size_t cap = blocks_for((size_t)1 << 40); /* the per-device maximum */
  size_t x = per_region * (size_t)m > cap ? cap / (size_t)m : per_region;
  dim3 grid((unsigned)(x ? x : 1), (unsigned)m);
  batched_copy_kernel<N><<<grid, kThreads, 0, st>>>(b);
  return HORA_CUDA_LAUNCHED("hora__batched_copy_cuda");
}

}  // namespace
}  // namespace hora_cuda

using namespace hora_cuda;

extern "C" hora_result_t hora__batched_copy_cuda(const hora_copy_desc_t *descs, size_t n, void *stream) {
  if (n && !descs) return HORA_ERR_INVALID_ARGUMENT;
  for (size_t i = 0; i < n; i++)
    if (descs[i].bytes && (!descs[i].dst || !descs[i].src)) return HORA_ERR_INVALID_ARGUMENT;
  cudaStream_t st = as_stream(stream);
  for (size_t off = 0; off < n;) {
    size_t m = n - off;
    hora_result_t rc;
    if (m <= (size_t)kBatchSmall) {
      rc = launch_batch<kBatchSmall>(descs + off, (int)m, st);
    } else {
      if (m > (size_t)kBatchLarge) m = kBatchLarge;
      rc = launch_batch<kBatchLarge>(descs + off, (int)m, st);
    }
    if (rc != HORA_SUCCESS) return rc;
    off += m;
  }
  return HORA_SUCCESS;
}
