/* Every CUDA kernel (kernels/cuda) against its host reference (kernels/host, itself checked against
 * scalar loops by tests/unit/test_kernels_host) on fresh random data, with the device output
 * poisoned before each call, for odd sizes and unaligned offsets (the 16-byte vector body and the
 * element tail both run). Bit-exact comparison; the data has no NaN. Exits 77 without a GPU. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hora_kernels.h"
#include "hora_test.h"
#include "hora_test_cuda.h"


static const size_t sizes[] = {1, 2, 7, 15, 16, 17, 255, 1000, 4099, (1u << 20) + 3};
#define NSIZES (sizeof sizes / sizeof *sizes)
static const size_t offs[] = {0, 1, 3};
#define MAXN ((1u << 20) + 16)
#define MAXB (MAXN * 8)

#include "hora_test_fill.h"

static size_t first_diff(const void *a, const void *b, size_t n, size_t es) {
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)a + i * es, (const char *)b + i * es, es)) return i;
  return (size_t)-1;
}

/* Host buffers and device mirrors of 5 sources and the output. */
static char *h_src[5], *h_want, *h_got;
static char *d_src[5], *d_out;
static cudaStream_t stream;

static void upload(int s, size_t bytes) { CK(cudaMemcpy(d_src[s], h_src[s], bytes, cudaMemcpyHostToDevice)); }
static void poison(void) { CK(cudaMemset(d_out, 0xa5, MAXB + 64)); }
static void download(size_t bytes) {
  CK(cudaStreamSynchronize(stream));
  CK(cudaMemcpy(h_got, d_out, bytes, cudaMemcpyDeviceToHost));
}

static void test_reduce(void) {
  for (int d = 0; d < HORA_DTYPE_COUNT; d++) {
    size_t es = esize((hora_dtype_t)d);
    for (int op = 0; op < HORA_OP_COUNT; op++)
      for (size_t si = 0; si < NSIZES; si++) {
        size_t n = sizes[si], off = offs[si % 3];
        for (int s = 0; s < 5; s++) {
          fill(h_src[s], (hora_dtype_t)d, n + 4);
          upload(s, (n + 4) * es);
        }
        /* reduce: a at off, b at off+1 (unaligned relative to each other when off > 0). */
        EXPECT_OK(hora__reduce_host(h_want, h_src[0] + off * es, h_src[1] + (off + 1) * es, n, (hora_dtype_t)d,
                                    (hora_op_t)op, NULL));
        poison();
        EXPECT_OK(hora__reduce_cuda(d_out + off * es, d_src[0] + off * es, d_src[1] + (off + 1) * es, n,
                                    (hora_dtype_t)d, (hora_op_t)op, stream));
        download((n + off + 1) * es);
        size_t bad = first_diff(h_got + off * es, h_want, n, es);
        EXPECT(bad == (size_t)-1, "reduce_cuda dtype %d op %d n %zu off %zu: element %zu differs", d, op, n, off, bad);
        EXPECT((unsigned char)h_got[(n + off) * es] == 0xa5, "reduce_cuda dtype %d op %d n %zu: wrote past the end", d, op, n);
        /* In place, aligned: dst == a. */
        CK(cudaMemcpy(d_out, d_src[0], n * es, cudaMemcpyDeviceToDevice));
        EXPECT_OK(hora__reduce_host(h_want, h_src[0], h_src[1], n, (hora_dtype_t)d, (hora_op_t)op, NULL));
        EXPECT_OK(hora__reduce_cuda(d_out, d_out, d_src[1], n, (hora_dtype_t)d, (hora_op_t)op, stream));
        download(n * es);
        bad = first_diff(h_got, h_want, n, es);
        EXPECT(bad == (size_t)-1, "in-place reduce_cuda dtype %d op %d n %zu: element %zu differs", d, op, n, bad);
        /* reduce_n, 1..5 sources at different offsets. */
        for (int ns = 1; ns <= 5; ns++) {
          const void *hs[5], *ds[5];
          for (int s = 0; s < ns; s++) {
            hs[s] = h_src[s] + ((off + (size_t)s) % 4) * es;
            ds[s] = d_src[s] + ((off + (size_t)s) % 4) * es;
          }
          EXPECT_OK(hora__reduce_n_host(h_want, hs, ns, n, (hora_dtype_t)d, (hora_op_t)op, NULL));
          poison();
          EXPECT_OK(hora__reduce_n_cuda(d_out, ds, ns, n, (hora_dtype_t)d, (hora_op_t)op, stream));
          download(n * es);
          bad = first_diff(h_got, h_want, n, es);
          EXPECT(bad == (size_t)-1, "reduce_n_cuda dtype %d op %d n %zu nsrc %d: element %zu differs", d, op, n, ns, bad);
        }
      }
  }
  /* More sources than one launch carries (64): integer sum, exact in any grouping. */
  enum { NS = 70 };
  const void *ss[NS];
  size_t n = 1001;
  int32_t *want = (int32_t *)h_want;
  for (int s = 0; s < NS; s++) ss[s] = d_src[s % 5] + (size_t)(s / 5) * 4; /* shifted views of the 5 buffers */
  for (int s = 0; s < 5; s++) {
    fill(h_src[s], HORA_INT32, n + 16);
    upload(s, (n + 16) * 4);
  }
  memset(want, 0, n * 4);
  for (int s = 0; s < NS; s++)
    for (size_t i = 0; i < n; i++)
      want[i] = (int32_t)((uint32_t)want[i] + (uint32_t)((int32_t *)h_src[s % 5])[i + (size_t)(s / 5)]);
  poison();
  EXPECT_OK(hora__reduce_n_cuda(d_out, ss, NS, n, HORA_INT32, HORA_SUM, stream));
  download(n * 4);
  EXPECT(first_diff(h_got, want, n, 4) == (size_t)-1, "reduce_n_cuda with %d sources differs", NS);
}

static void test_scale(void) {
  const double factors[] = {0.5, 1.0, 0.125, 1.0 / 3.0};
  for (int d = 0; d < HORA_DTYPE_COUNT; d++) {
    size_t es = esize((hora_dtype_t)d);
    for (size_t fi = 0; fi < 4; fi++)
      for (size_t si = 0; si < NSIZES; si++) {
        size_t n = sizes[si], off = offs[si % 3];
        if (d == HORA_BOOL && factors[fi] != 1.0) { /* a bool cannot be scaled */
          EXPECT_RC(hora__scale_cuda(d_out, d_src[0], 1, HORA_BOOL, factors[fi], stream), HORA_ERR_INVALID_ARGUMENT);
          continue;
        }
        fill(h_src[0], (hora_dtype_t)d, n + 4);
        upload(0, (n + 4) * es);
        EXPECT_OK(hora__scale_host(h_want, h_src[0] + off * es, n, (hora_dtype_t)d, factors[fi], NULL));
        poison();
        EXPECT_OK(hora__scale_cuda(d_out, d_src[0] + off * es, n, (hora_dtype_t)d, factors[fi], stream));
        download(n * es);
        size_t bad = first_diff(h_got, h_want, n, es);
        EXPECT(bad == (size_t)-1, "scale_cuda dtype %d factor %g n %zu off %zu: element %zu differs", d, factors[fi], n,
               off, bad);
      }
  }
}

static void test_casts(void) {
  for (size_t si = 0; si < NSIZES; si++) {
    size_t n = sizes[si], off = offs[si % 3];
    fill(h_src[0], HORA_FLOAT32, n + 4);
    ((float *)h_src[0])[0] = 65520.0f; /* overflows binary16 */
    ((float *)h_src[0])[1] = 5.9604645e-8f;
    upload(0, (n + 4) * 4);
    const float *hf = (const float *)h_src[0] + off;
    const float *df = (const float *)d_src[0] + off;
    for (int bf = 0; bf < 2; bf++) {
      if (bf) EXPECT_OK(hora__cast_f32_to_bf16_host(h_want, hf, n, NULL));
      else EXPECT_OK(hora__cast_f32_to_f16_host(h_want, hf, n, NULL));
      poison();
      if (bf) EXPECT_OK(hora__cast_f32_to_bf16_cuda(d_out, df, n, stream));
      else EXPECT_OK(hora__cast_f32_to_f16_cuda(d_out, df, n, stream));
      download(n * 2);
      size_t bad = first_diff(h_got, h_want, n, 2);
      EXPECT(bad == (size_t)-1, "cast f32->%s n %zu: element %zu differs", bf ? "bf16" : "f16", n, bad);
      /* And back, from the 16-bit values just made (uploaded at an odd offset). */
      memcpy(h_src[1] + 2 * off, h_want, n * 2);
      upload(1, (n + off) * 2);
      if (bf) EXPECT_OK(hora__cast_bf16_to_f32_host((float *)h_want, h_src[1] + 2 * off, n, NULL));
      else EXPECT_OK(hora__cast_f16_to_f32_host((float *)h_want, h_src[1] + 2 * off, n, NULL));
      poison();
      if (bf) EXPECT_OK(hora__cast_bf16_to_f32_cuda((float *)d_out, d_src[1] + 2 * off, n, stream));
      else EXPECT_OK(hora__cast_f16_to_f32_cuda((float *)d_out, d_src[1] + 2 * off, n, stream));
      download(n * 4);
      bad = first_diff(h_got, h_want, n, 4);
      EXPECT(bad == (size_t)-1, "cast %s->f32 n %zu: element %zu differs", bf ? "bf16" : "f16", n, bad);
    }
  }
}

/* Regions of random sizes and alignments, packed into d_out with gaps; 40 regions (one small
 * launch) and 2500 (several large launches). */
static void test_batched_copy(void) {
  const size_t nr_list[] = {40, 2500};
  for (int t = 0; t < 2; t++) {
    size_t nr = nr_list[t];
    hora_copy_desc_t *dd = calloc(nr, sizeof *dd), *hd = calloc(nr, sizeof *hd);
    fill(h_src[0], HORA_UINT8, MAXB);
    upload(0, MAXB);
    memset(h_want, 0xa5, MAXB);
    size_t so = 1, dof = 3, budget = MAXB / 2;
    for (size_t i = 0; i < nr; i++) {
      size_t bytes = (i % 17 == 4) ? 0 : next_rand() % (t ? 700 : 60000) + 1;
      if (so + bytes > budget || dof + bytes > budget) bytes = 0;
      dd[i] = (hora_copy_desc_t){d_out + dof, d_src[0] + so, bytes};
      hd[i] = (hora_copy_desc_t){h_want + dof, h_src[0] + so, bytes};
      so += bytes + next_rand() % 16;
      dof += bytes + 1 + next_rand() % 16;
    }
    EXPECT_OK(hora__batched_copy_host(hd, nr, NULL));
    poison();
    EXPECT_OK(hora__batched_copy_cuda(dd, nr, stream));
    download(budget);
    size_t bad = first_diff(h_got, h_want, budget, 1);
    EXPECT(bad == (size_t)-1, "batched_copy_cuda with %zu regions: byte %zu differs", nr, bad);
    free(dd);
    free(hd);
  }
}

static void test_errors(void) {
  EXPECT_RC(hora__reduce_cuda(d_out, d_src[0], d_src[1], 1, (hora_dtype_t)99, HORA_SUM, stream), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora__reduce_cuda(NULL, d_src[0], d_src[1], 1, HORA_FLOAT32, HORA_SUM, stream), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora__scale_cuda(d_out, d_src[0], 1, (hora_dtype_t)-1, 2.0, stream), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_OK(hora__reduce_cuda(NULL, NULL, NULL, 0, HORA_FLOAT32, HORA_SUM, stream));
  EXPECT(cudaGetLastError() == cudaSuccess, "a CUDA error is pending after the tests");
}

int main(void) {
  if (!hora_test_have_gpu("test_kernels_cuda")) return HORA_TEST_SKIP;
  rng = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
  if (!rng) rng = 1;
  printf("test_kernels_cuda: seed %llu\n", (unsigned long long)rng);
  CK(cudaStreamCreate(&stream));
  for (int s = 0; s < 5; s++) {
    h_src[s] = malloc(MAXB + 64);
    CK(cudaMalloc((void **)&d_src[s], MAXB + 64));
  }
  h_want = malloc(MAXB + 64);
  h_got = malloc(MAXB + 64);
  CK(cudaMalloc((void **)&d_out, MAXB + 64));
  if (!h_want || !h_got) return 1;
  test_reduce();
  test_scale();
  test_casts();
  test_batched_copy();
  test_errors();
  for (int s = 0; s < 5; s++) {
    free(h_src[s]);
    cudaFree(d_src[s]);
  }
  free(h_want);
  free(h_got);
  cudaFree(d_out);
  cudaStreamDestroy(stream);
  return hora_test_finish("test_kernels_cuda");
}
