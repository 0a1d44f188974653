/* Writes one checkpoint with a tensor of every dtype (values check_safetensors.py regenerates)
 * and prints the path of its safetensors file:  ckpt_write_dtypes LOCAL_DIR */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hora.h"

#define N 1000

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: ckpt_write_dtypes LOCAL_DIR\n");
    return 2;
  }
  static uint8_t u8[N];
  static int8_t i8[N];
  static int32_t i32[N];
  static int64_t i64[N];
  static uint16_t f16[N], bf16[N];
  static float f32[N], w[12];
  static double f64[N];
  for (int i = 0; i < N; i++) {
    u8[i] = (uint8_t)(i % 251);
    i8[i] = (int8_t)(i % 256 - 128);
    i32[i] = i * 7919 - 1000000;
    i64[i] = (int64_t)i * 1099511627791LL - 5;
    f16[i] = (uint16_t)(0x3C00 + i % 1024); /* 1.0 and the next 1023 binary16 values */
    bf16[i] = (uint16_t)(0x3F80 + i % 128); /* 1.0 and the next 127 bfloat16 values */
    f32[i] = (float)i * 0.25f - 100.0f;
    f64[i] = (double)i * 0.5 - 1e6;
  }
  for (int i = 0; i < 12; i++) w[i] = (float)i;
  static const int64_t shape[2] = {3, 4};
  hora_tensor_t t[] = {
      {"u8", u8, N, HORA_UINT8, HORA_DEVICE_HOST, 0, NULL},
      {"i8", i8, N, HORA_INT8, HORA_DEVICE_HOST, 0, NULL},
      {"i32", i32, N, HORA_INT32, HORA_DEVICE_HOST, 0, NULL},
      {"i64", i64, N, HORA_INT64, HORA_DEVICE_HOST, 0, NULL},
      {"f16", f16, N, HORA_FLOAT16, HORA_DEVICE_HOST, 0, NULL},
      {"bf16", bf16, N, HORA_BFLOAT16, HORA_DEVICE_HOST, 0, NULL},
      {"f32", f32, N, HORA_FLOAT32, HORA_DEVICE_HOST, 0, NULL},
      {"f64", f64, N, HORA_FLOAT64, HORA_DEVICE_HOST, 0, NULL},
      {"layer/w", w, 12, HORA_FLOAT32, HORA_DEVICE_HOST, 2, shape},
  };
  hora_kv_t meta[2] = {{"epoch", "3"}, {"note", "hello \"world\""}};
  hora_ctx_t *ctx;
  hora_ckpt_t *ck;
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = argv[1];
  if (hora_init(&ctx) || hora_ckpt_open(ctx, &o, &ck) ||
      hora_ckpt_save(ck, 42, t, sizeof t / sizeof t[0], meta, 2) || hora_ckpt_close(ck)) {
    fprintf(stderr, "ckpt_write_dtypes: %s\n", hora_last_error());
    return 1;
  }
  printf("%s/step-42/state.safetensors\n", argv[1]);
  return hora_finalize(ctx) == HORA_SUCCESS ? 0 : 1;
}
