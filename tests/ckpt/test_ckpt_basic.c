/* Checkpoints on one rank: round trip of every dtype with shapes and metadata, the directory
 * layout, keep, byte-flip corruption in local and persistent copies (fallback), re-saving a
 * committed step, argument errors, CRC32C combination, and hora_finalize flushing an open
 * checkpointer. */
#include <inttypes.h>

#include "ckpt/ckpt.h"
#include "ckpt_test.h"
#include "core/crc32c.h"
#include "hora_test.h"

#define NT 10
static const hora_dtype_t dtypes[NT] = {HORA_UINT8, HORA_INT8, HORA_INT32, HORA_INT64, HORA_FLOAT16,
                                        HORA_BFLOAT16, HORA_FLOAT32, HORA_FLOAT64, HORA_FLOAT32, HORA_INT64};
static const char *names[NT] = {"u8", "i8", "i32", "i64", "f16", "bf16", "f32", "f64", "layer1/w", "empty"};
static size_t counts[NT] = {1001, 7, 1000, 333, 513, 129, 4096, 65, 12, 0};
static const int64_t shape_w[2] = {3, 4};
static void *bufs[NT];

static void tensors_for(hora_tensor_t *t) {
  for (int k = 0; k < NT; k++) {
    t[k] = (hora_tensor_t){names[k], bufs[k], counts[k], dtypes[k], HORA_DEVICE_HOST, 0, NULL};
    if (k == 8) {
      t[k].ndim = 2;
      t[k].shape = shape_w;
    }
  }
}

static size_t tbytes(int k) { return counts[k] * hora__dtype_size(dtypes[k]); }

static void fill_all(int64_t step) {
  for (int k = 0; k < NT; k++) ck_fill(bufs[k], tbytes(k), step, k);
}

static void check_all(int64_t step, const char *what) {
  for (int k = 0; k < NT; k++) {
    long bad = ck_check(bufs[k], tbytes(k), step, k);
    EXPECT(bad < 0, "%s: tensor %s differs from step %" PRId64 " at byte %ld", what, names[k], step, bad);
  }
}

static void zero_all(void) {
  for (int k = 0; k < NT; k++) memset(bufs[k], 0, tbytes(k) ? tbytes(k) : 1);
}

static void save_step(hora_ckpt_t *ck, int64_t step) {
  hora_tensor_t t[NT];
  char sv[32];
  snprintf(sv, sizeof sv, "%" PRId64, step);
  hora_kv_t meta[2] = {{"epoch", sv}, {"lr", "0.01"}};
  fill_all(step);
  tensors_for(t);
  EXPECT_OK(hora_ckpt_save(ck, step, t, NT, meta, 2));
  /* The caller may overwrite its buffers right away. */
  for (int k = 0; k < NT; k++) memset(bufs[k], 0xEE, tbytes(k) ? tbytes(k) : 1);
}

static int64_t restore(hora_ckpt_t *ck, hora_result_t want) {
  hora_tensor_t t[NT];
  tensors_for(t);
  zero_all();
  int64_t step = -1;
  EXPECT_RC(hora_ckpt_restore(ck, &step, t, NT), want);
  return step;
}

static void expect_source(hora_ckpt_t *ck, const char *dir, int64_t step) {
  const char *src = NULL;
  char want[4200];
  snprintf(want, sizeof want, "%s/step-%" PRId64, dir, step);
  EXPECT_OK(hora_ckpt_restore_source(ck, &src));
  EXPECT(src && strcmp(src, want) == 0, "restored from %s, want %s", src ? src : "(null)", want);
}

static void read_text(const char *path, char *out, size_t n) {
  out[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return;
  size_t r = fread(out, 1, n - 1, f);
  out[r] = 0;
  fclose(f);
}

static void test_crc_combine(void) {
  unsigned char b[3000];
  for (size_t i = 0; i < sizeof b; i++) b[i] = (unsigned char)(i * 31 + 7);
  size_t cuts[] = {0, 1, 100, 2999, 3000};
  for (size_t c = 0; c < 5; c++) {
    uint32_t a = hora__crc32c(0, b, cuts[c]), z = hora__crc32c(0, b + cuts[c], sizeof b - cuts[c]);
    EXPECT(hora__ck_crc_combine(a, z, sizeof b - cuts[c]) == hora__crc32c(0, b, sizeof b), "combine at %zu", cuts[c]);
  }
}

static void test_errors(hora_ctx_t *ctx, const char *L) {
  hora_ckpt_opts_t o;
  hora_ckpt_t *ck = NULL;
  EXPECT_RC(hora_ckpt_opts_init(NULL), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_OK(hora_ckpt_opts_init(&o));
  EXPECT(o.size == sizeof o && o.keep == 2 && o.copy_interval_s == 600 && !o.local_dir && !o.persist_dir, "defaults");
  o.local_dir = L;
  o.keep = 1;
  EXPECT_RC(hora_ckpt_open(ctx, &o, &ck), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "keep=1"), "message names keep: %s", hora_last_error());
  o.keep = 0;
  EXPECT_RC(hora_ckpt_open(NULL, &o, &ck), HORA_ERR_NOT_INITIALIZED);
  EXPECT_RC(hora_ckpt_open(ctx, &o, NULL), HORA_ERR_INVALID_ARGUMENT);
  o.size = 4;
  EXPECT_RC(hora_ckpt_open(ctx, &o, &ck), HORA_ERR_INVALID_ARGUMENT);
  o.size = sizeof o;
  char file[4400];
  hora__ck_mkdirs(L);
  snprintf(file, sizeof file, "%s/a-file", L);
  FILE *f = fopen(file, "w");
  if (f) fclose(f);
  o.local_dir = file;
  EXPECT_RC(hora_ckpt_open(ctx, &o, &ck), HORA_ERR_IO);
  EXPECT(strstr(hora_last_error(), "a-file"), "message names the directory: %s", hora_last_error());
  o.local_dir = L;
  EXPECT(ck == NULL, "ck set on error");
  EXPECT_OK(hora_ckpt_open(ctx, &o, &ck));
  if (!ck) return;
  int32_t x[4] = {1, 2, 3, 4};
  int64_t bad_shape[2] = {3, 3};
  hora_tensor_t t[2] = {{"a", x, 4, HORA_INT32, HORA_DEVICE_HOST, 0, NULL}, {"a", x, 4, HORA_INT32, HORA_DEVICE_HOST, 0, NULL}};
  EXPECT_RC(hora_ckpt_save(ck, 1, t, 2, NULL, 0), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "'a' appears twice"), "%s", hora_last_error());
  t[1].name = "__metadata__";
  EXPECT_RC(hora_ckpt_save(ck, 1, t, 2, NULL, 0), HORA_ERR_INVALID_ARGUMENT);
  t[1].name = "b";
  t[1].ndim = 2;
  t[1].shape = bad_shape;
  EXPECT_RC(hora_ckpt_save(ck, 1, t, 2, NULL, 0), HORA_ERR_INVALID_ARGUMENT);
  t[1].ndim = 0;
  t[1].data = NULL;
  EXPECT_RC(hora_ckpt_save(ck, 1, t, 2, NULL, 0), HORA_ERR_INVALID_ARGUMENT);
  t[1].data = x;
  t[1].dtype = (hora_dtype_t)99;
  EXPECT_RC(hora_ckpt_save(ck, 1, t, 2, NULL, 0), HORA_ERR_INVALID_ARGUMENT);
  t[1].dtype = HORA_INT32;
  hora_kv_t meta = {"hora.step", "5"};
  EXPECT_RC(hora_ckpt_save(ck, 1, t, 2, &meta, 1), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_ckpt_save(NULL, 1, t, 2, NULL, 0), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_ckpt_save(ck, 1, NULL, 2, NULL, 0), HORA_ERR_INVALID_ARGUMENT);
  /* Nothing was written by the failed saves; a fresh start restores nothing. */
  int64_t step = 77;
  int32_t y[4] = {9, 9, 9, 9};
  hora_tensor_t r = {"a", y, 4, HORA_INT32, HORA_DEVICE_HOST, 0, NULL};
  EXPECT_RC(hora_ckpt_restore(ck, &step, &r, 1), HORA_ERR_NOT_FOUND);
  EXPECT(step == 77 && y[0] == 9, "restore wrote on NOT_FOUND");
  const char *v;
  EXPECT_RC(hora_ckpt_meta_get(ck, "x", &v), HORA_ERR_NOT_FOUND);
  EXPECT_OK(hora_ckpt_save(ck, 1, t, 2, NULL, 0));
  EXPECT_OK(hora_ckpt_flush(ck));
  /* Restore mismatches: other dtype, other count, missing name; nothing written. */
  r.dtype = HORA_FLOAT32;
  EXPECT_RC(hora_ckpt_restore(ck, &step, &r, 1), HORA_ERR_MISMATCH);
  r.dtype = HORA_INT32;
  r.count = 3;
  EXPECT_RC(hora_ckpt_restore(ck, &step, &r, 1), HORA_ERR_MISMATCH);
  r.count = 4;
  r.name = "nope";
  EXPECT_RC(hora_ckpt_restore(ck, &step, &r, 1), HORA_ERR_MISMATCH);
  EXPECT(strstr(hora_last_error(), "'nope'"), "%s", hora_last_error());
  EXPECT(step == 77 && y[0] == 9, "restore wrote on MISMATCH");
  r.name = "b";
  EXPECT_OK(hora_ckpt_restore(ck, &step, &r, 1));
  EXPECT(step == 1 && y[0] == 1 && y[3] == 4, "subset restore: step %" PRId64 " y %d %d", step, y[0], y[3]);
  EXPECT_OK(hora_ckpt_close(ck));
  EXPECT_OK(hora_ckpt_close(NULL));
}

int main(void) {
  setenv("HORA_CKPT_SNAPSHOT_THREADS", "3", 1); /* the >64 MiB case below copies with 3 threads */
  hora_ctx_t *ctx = NULL;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  for (int k = 0; k < NT; k++) bufs[k] = malloc(tbytes(k) ? tbytes(k) : 1);
  test_crc_combine();
  char *root = ck_mktemp("ckpt-basic");
  char L[4200], P[4200], path[4400], text[256];
  snprintf(L, sizeof L, "%s/local", root);
  snprintf(P, sizeof P, "%s/persist/run1", root);

  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = L;
  o.persist_dir = P;
  o.copy_interval_s = 0;
  hora_ckpt_t *ck = NULL;
  EXPECT_OK(hora_ckpt_open(ctx, &o, &ck));
  restore(ck, HORA_ERR_NOT_FOUND);
  save_step(ck, 10);
  save_step(ck, 20); /* waits for step 10's write */
  EXPECT_OK(hora_ckpt_flush(ck));
  EXPECT(restore(ck, HORA_SUCCESS) == 20, "newest step");
  check_all(20, "round trip");
  const char *v = NULL;
  EXPECT_OK(hora_ckpt_meta_get(ck, "epoch", &v));
  EXPECT(v && strcmp(v, "20") == 0, "meta epoch = %s", v ? v : "(null)");
  EXPECT_OK(hora_ckpt_meta_get(ck, "lr", &v));
  EXPECT(v && strcmp(v, "0.01") == 0, "meta lr");
  expect_source(ck, L, 20);
  /* Layout: manifest and file in both places, `latest` in both. */
  const char *files[] = {"step-20/manifest.json", "step-20/state.safetensors", "step-10/manifest.json"};
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%s", L, files[i]);
    EXPECT(ck_exists(path), "%s missing", path);
    snprintf(path, sizeof path, "%s/%s", P, files[i]);
    EXPECT(ck_exists(path), "%s missing", path);
  }
  snprintf(path, sizeof path, "%s/latest", L);
  read_text(path, text, sizeof text);
  EXPECT(strcmp(text, "step-20\n") == 0, "local latest: '%s'", text);
  snprintf(path, sizeof path, "%s/latest", P);
  read_text(path, text, sizeof text);
  EXPECT(strcmp(text, "step-20\n") == 0, "persistent latest: '%s'", text);
  /* keep = 2: step 10 goes once step 30 is verified. */
  save_step(ck, 30);
  EXPECT_OK(hora_ckpt_flush(ck));
  snprintf(path, sizeof path, "%s/step-10", L);
  EXPECT(!ck_exists(path), "%s kept beyond keep=2", path);
  snprintf(path, sizeof path, "%s/step-10", P);
  EXPECT(!ck_exists(path), "%s kept beyond keep=2", path);
  snprintf(path, sizeof path, "%s/step-20", P);
  EXPECT(ck_exists(path), "%s removed", path);
  EXPECT(ck_count_tmp(L) == 0 && ck_count_tmp(P) == 0, "temporary files left");

  /* Corruption: a flipped data byte in the local newest -> the persistent copy of the same
   * step; also flipped there -> the previous step (local). */
  snprintf(path, sizeof path, "%s/step-30/state.safetensors", L);
  EXPECT(ck_flip(path, -5) == 0, "flip %s", path);
  EXPECT(restore(ck, HORA_SUCCESS) == 30, "fallback to persistent step 30");
  check_all(30, "persistent copy");
  expect_source(ck, P, 30);
  snprintf(path, sizeof path, "%s/step-30/state.safetensors", P);
  EXPECT(ck_flip(path, -1000) == 0, "flip %s", path);
  EXPECT(restore(ck, HORA_SUCCESS) == 20, "fallback to step 20");
  check_all(20, "previous version");
  expect_source(ck, L, 20);
  /* A flipped byte in the JSON header of local step 20 -> persistent step 20. */
  snprintf(path, sizeof path, "%s/step-20/state.safetensors", L);
  EXPECT(ck_flip(path, 20) == 0, "flip header");
  EXPECT(restore(ck, HORA_SUCCESS) == 20, "fallback to persistent step 20");
  expect_source(ck, P, 20);
  check_all(20, "persistent step 20");
  /* A truncated persistent file and a garbled manifest: nothing valid is left. */
  snprintf(path, sizeof path, "%s/step-20/state.safetensors", P);
  EXPECT(truncate(path, 100) == 0, "truncate");
  /* Checkpoints exist but none is valid: HORA_ERR_CORRUPT (not the NOT_FOUND of a fresh start,
   * on which a resume loop would silently restart from step 0), naming every file and why. */
  restore(ck, HORA_ERR_CORRUPT);
  {
    const char *e = hora_last_error();
    char want[4][4400];
    snprintf(want[0], sizeof want[0], "%s/step-30/state.safetensors: tensor", L);
    snprintf(want[1], sizeof want[1], "%s/step-30/state.safetensors: tensor", P);
    snprintf(want[2], sizeof want[2], "%s/step-20/state.safetensors: tensor", L);
    snprintf(want[3], sizeof want[3], "%s/step-20/state.safetensors has 100 bytes", P);
    EXPECT(strstr(e, "4 checkpoints") != NULL, "CORRUPT message counts 4: %s", e);
    for (int i = 0; i < 4; i++) EXPECT(strstr(e, want[i]) != NULL, "CORRUPT message lacks '%s': %s", want[i], e);
    EXPECT(strstr(e, "CRC32C mismatch") && strstr(e, "torn"), "CORRUPT message gives reasons: %s", e);
  }

  /* A new save repairs everything; re-saving a committed step replaces it atomically. */
  save_step(ck, 40);
  EXPECT_OK(hora_ckpt_flush(ck));
  EXPECT(restore(ck, HORA_SUCCESS) == 40, "step 40");
  save_step(ck, 41);
  EXPECT_OK(hora_ckpt_flush(ck));
  fill_all(99); /* new content for step 41 */
  {
    hora_tensor_t t[NT];
    tensors_for(t);
    EXPECT_OK(hora_ckpt_save(ck, 41, t, NT, NULL, 0));
  }
  EXPECT_OK(hora_ckpt_flush(ck));
  EXPECT(restore(ck, HORA_SUCCESS) == 41, "re-saved step 41");
  check_all(99, "re-saved content");
  expect_source(ck, L, 41);
  snprintf(path, sizeof path, "%s/step-41/state.safetensors", L);
  EXPECT(!ck_exists(path), "the replaced file stays beside the new one");
  snprintf(path, sizeof path, "%s/step-41/state.1.safetensors", P);
  EXPECT(ck_exists(path), "persistent re-save");
  EXPECT_OK(hora_ckpt_close(ck));

  char L3[4200];
  snprintf(L3, sizeof L3, "%s/local3", root);
  test_errors(ctx, L3);

  /* More than 64 MiB: the snapshot and the restore copy with several threads, whose byte
   * ranges cross tensor borders. */
  {
    char L4[4200];
    snprintf(L4, sizeof L4, "%s/local4", root);
    hora_ckpt_opts_t o4;
    hora_ckpt_opts_init(&o4);
    o4.local_dir = L4;
    hora_ckpt_t *ck4 = NULL;
    EXPECT_OK(hora_ckpt_open(ctx, &o4, &ck4));
    const size_t big[3] = {(40u << 20) + 1, (17u << 20) + 3, (13u << 20) + 5};
    hora_tensor_t bt[3];
    for (int k = 0; k < 3; k++) {
      bt[k] = (hora_tensor_t){k == 0 ? "a" : k == 1 ? "b" : "c", malloc(big[k]), big[k], HORA_UINT8, HORA_DEVICE_HOST, 0, NULL};
      ck_fill(bt[k].data, big[k], 3, k);
    }
    EXPECT_OK(hora_ckpt_save(ck4, 3, bt, 3, NULL, 0));
    for (int k = 0; k < 3; k++) memset(bt[k].data, 0, big[k]);
    int64_t s4 = 0;
    EXPECT_OK(hora_ckpt_restore(ck4, &s4, bt, 3));
    for (int k = 0; k < 3; k++) {
      long at = ck_check(bt[k].data, big[k], 3, k);
      EXPECT(s4 == 3 && at < 0, "big tensor %d differs at byte %ld", k, at);
      free(bt[k].data);
    }
    EXPECT_OK(hora_ckpt_close(ck4));
  }

  /* A node-local directory shared with another run (same local_dir, other persist_dir): its
   * checkpoints are not this run's and are not restored. */
  {
    char LX[4200], PA[4200], PB[4200];
    snprintf(LX, sizeof LX, "%s/shared-local", root);
    snprintf(PA, sizeof PA, "%s/run-a", root);
    snprintf(PB, sizeof PB, "%s/run-b", root);
    hora_ckpt_opts_t ox;
    hora_ckpt_opts_init(&ox);
    ox.local_dir = LX;
    ox.persist_dir = PA;
    hora_ckpt_t *cx = NULL;
    EXPECT_OK(hora_ckpt_open(ctx, &ox, &cx));
    save_step(cx, 100);
    EXPECT_OK(hora_ckpt_close(cx));
    ox.persist_dir = PB;
    EXPECT_OK(hora_ckpt_open(ctx, &ox, &cx));
    restore(cx, HORA_ERR_NOT_FOUND);
    EXPECT(strstr(hora_last_error(), "another run"), "message: %s", hora_last_error());
    EXPECT_OK(hora_ckpt_close(cx));
    ox.persist_dir = PA; /* the same run again (a requeue): local step 100 is used */
    EXPECT_OK(hora_ckpt_open(ctx, &ox, &cx));
    EXPECT(restore(cx, HORA_SUCCESS) == 100, "same run");
    expect_source(cx, LX, 100);
    EXPECT_OK(hora_ckpt_close(cx));
  }

  /* hora_finalize flushes a checkpointer still open: with a long copy interval nothing is
   * copied until then. */
  char L2[4200], P2[4200];
  snprintf(L2, sizeof L2, "%s/local2", root);
  snprintf(P2, sizeof P2, "%s/persist2", root);
  o.local_dir = L2;
  o.persist_dir = P2;
  o.copy_interval_s = 1000;
  ck = NULL;
  EXPECT_OK(hora_ckpt_open(ctx, &o, &ck));
  save_step(ck, 5);
  EXPECT_OK(hora_finalize(ctx));
  snprintf(path, sizeof path, "%s/step-5/manifest.json", P2);
  EXPECT(ck_exists(path), "hora_finalize did not flush to %s", P2);
  ck_manifest_t m;
  char sd[4400];
  snprintf(sd, sizeof sd, "%s/step-5", P2);
  EXPECT(hora__ck_validate(sd, 0, &m, NULL, NULL) == HORA_SUCCESS, "persistent step 5 invalid: %s", hora_last_error());
  ck_rmrf(root);
  free(root);
  for (int k = 0; k < NT; k++) free(bufs[k]);
  return hora_test_finish("test_ckpt_basic");
}
