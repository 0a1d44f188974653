/* The checkpoint file format: safetensors (https://github.com/huggingface/safetensors, "Format")
 * so that Python's `safetensors` package loads hora checkpoints as they are:
 *
 *   | u64 little-endian N | N bytes of JSON header, space-padded to a multiple of 8 | data |
 *   header: {"<tensor>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *            "__metadata__": {"<key>": "<string>", ...}}
 *   data_offsets are relative to the start of the data section; tensors are back to back.
 *
 * safetensors has no checksum, so hora adds CRC32C values (hex strings) to __metadata__:
 * "hora.crc32c.<tensor>" per tensor and "hora.data_crc32c" for the whole data section, plus
 * "hora.format", "hora.step", "hora.world_size", "hora.version". The manifest (manifest.c) holds
 * the CRC32C of the whole file. User keys are stored as they are (the "hora." prefix is reserved).
 * JSON is built and parsed with jansson. */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "core/crc32c.h"

static const char *const st_names[HORA_DTYPE_COUNT] = {
    [HORA_UINT8] = "U8",    [HORA_INT8] = "I8",     [HORA_INT32] = "I32", [HORA_INT64] = "I64",
    [HORA_FLOAT16] = "F16", [HORA_BFLOAT16] = "BF16", [HORA_FLOAT32] = "F32", [HORA_FLOAT64] = "F64",
    [HORA_INT16] = "I16",   [HORA_BOOL] = "BOOL"};

const char *hora__ck_dtype_st(hora_dtype_t dtype) {
  return ((unsigned)dtype < HORA_DTYPE_COUNT) ? st_names[dtype] : NULL;
}

int hora__ck_dtype_from_st(const char *name) {
  for (int i = 0; i < HORA_DTYPE_COUNT; i++)
    if (strcmp(name, st_names[i]) == 0) return i;
  return -1;
}

void hora__ck_snap_free(ck_snap_t *s) {
  if (!s) return;
  for (size_t i = 0; i < s->ntensors; i++) {
    free(s->t[i].name);
    free(s->t[i].shape);
  }
  free(s->t);
  for (size_t i = 0; i < s->nmeta; i++) {
    free(s->keys[i]);
    free(s->vals[i]);
  }
  free(s->keys);
  free(s->vals);
  memset(s, 0, sizeof *s);
}

/* CRC combination over GF(2) (Mark Adler's crc32_combine from zlib, for the reflected CRC32C
 * polynomial 0x82F63B78). zlib only has it for CRC-32, hence this copy: it lets the file CRC be
 * derived from the per-tensor CRCs without a second pass over gigabytes of data. */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
  uint32_t sum = 0;
  while (vec) {
    if (vec & 1) sum ^= *mat;
    vec >>= 1;
    mat++;
  }
  return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat) {
  for (int n = 0; n < 32; n++) sq[n] = gf2_times(mat, mat[n]);
}

uint32_t hora__ck_crc_combine(uint32_t crc1, uint32_t crc2, size_t len2) {
  if (len2 == 0) return crc1;
  uint32_t even[32], odd[32], row = 1;
  odd[0] = 0x82F63B78u; /* the operator for one zero bit */
  for (int n = 1; n < 32; n++) {
    odd[n] = row;
    row <<= 1;
  }
  gf2_square(even, odd); /* two zero bits */
  gf2_square(odd, even); /* four zero bits */
  do {                   /* apply len2 zero bytes to crc1 */
    gf2_square(even, odd);
    if (len2 & 1) crc1 = gf2_times(even, crc1);
    len2 >>= 1;
    if (!len2) break;
    gf2_square(odd, even);
    if (len2 & 1) crc1 = gf2_times(odd, crc1);
    len2 >>= 1;
  } while (len2);
  return crc1 ^ crc2;
}

void hora__ck_snap_crcs(ck_snap_t *s) {
  for (size_t i = 0; i < s->ntensors; i++)
    s->t[i].crc = hora__crc32c(0, s->data + s->t[i].offset, s->t[i].bytes);
}

static void hex32(char *out, uint32_t v) { snprintf(out, 9, "%08" PRIx32, v); }

static int parse_hex32(const char *s, uint32_t *v) {
  if (!s || strlen(s) != 8) return 0;
  char *end;
  unsigned long x = strtoul(s, &end, 16);
  if (*end) return 0;
  *v = (uint32_t)x;
  return 1;
}

/* Data CRC of s from its tensor CRCs (tensors are back to back in offset order). */
static uint32_t data_crc_of(const ck_snap_t *s) {
  uint32_t crc = 0;
  for (size_t i = 0; i < s->ntensors; i++) crc = hora__ck_crc_combine(crc, s->t[i].crc, s->t[i].bytes);
  return crc;
}

hora_result_t hora__ck_encode(const ck_snap_t *s, unsigned char **prefix, size_t *prefix_bytes,
                              uint32_t *file_crc, uint32_t *data_crc) {
  hora_result_t rc = HORA_SUCCESS;
  char hex[9], num[32], *json = NULL;
  json_t *root = json_object(), *meta = json_object();
  if (!root || !meta) goto oom;
  for (size_t i = 0; i < s->ntensors; i++) {
    const ck_tensor_t *t = &s->t[i];
    json_t *shape = json_array();
    if (!shape) goto oom;
    for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    json_t *o = json_pack("{s:s, s:o, s:[I,I]}", "dtype", hora__ck_dtype_st(t->dtype), "shape", shape,
                          "data_offsets", (json_int_t)t->offset, (json_int_t)(t->offset + t->bytes));
    if (!o || json_object_set_new(root, t->name, o)) goto oom;
    char key[CK_NAME_MAX + 32];
    snprintf(key, sizeof key, "hora.crc32c.%s", t->name);
    hex32(hex, t->crc);
    if (json_object_set_new(meta, key, json_string(hex))) goto oom;
  }
  uint32_t dcrc = data_crc_of(s);
  hex32(hex, dcrc);
  json_object_set_new(meta, "hora.format", json_string(CK_FORMAT));
  snprintf(num, sizeof num, "%" PRId64, s->step);
  json_object_set_new(meta, "hora.step", json_string(num));
  snprintf(num, sizeof num, "%d", s->world_size);
  json_object_set_new(meta, "hora.world_size", json_string(num));
  json_object_set_new(meta, "hora.version", json_string(HORA_VERSION_STRING));
  json_object_set_new(meta, "hora.data_crc32c", json_string(hex));
  for (size_t i = 0; i < s->nmeta; i++)
    if (json_object_set_new(meta, s->keys[i], json_string(s->vals[i]))) goto oom;
  if (json_object_set_new(root, "__metadata__", meta)) {
    meta = NULL;
    goto oom;
  }
  meta = NULL;
  json = json_dumps(root, JSON_COMPACT);
  if (!json) goto oom;
  size_t jlen = strlen(json), padded = (jlen + 7) & ~(size_t)7;
  unsigned char *p = malloc(8 + padded);
  if (!p) goto oom;
  for (int b = 0; b < 8; b++) p[b] = (unsigned char)((uint64_t)padded >> (8 * b));
  memcpy(p + 8, json, jlen);
  memset(p + 8 + jlen, ' ', padded - jlen);
  *prefix = p;
  *prefix_bytes = 8 + padded;
  *data_crc = dcrc;
  *file_crc = hora__ck_crc_combine(hora__crc32c(0, p, 8 + padded), dcrc, s->data_bytes);
  goto done;
oom:
  rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory building the safetensors header");
done:
  free(json);
  json_decref(meta);
  json_decref(root);
  return rc;
}

static int by_offset(const void *a, const void *b) {
  const ck_tensor_t *x = a, *y = b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* One tensor entry of the header (key: its name, v: its JSON object) appended to s->t: dtype,
 * shape, data offsets checked against each other and the data section. */
static hora_result_t decode_tensor(json_t *v, const char *key, const char *what, ck_snap_t *s) {
  ck_tensor_t *t = &s->t[s->ntensors];
  const char *dt = NULL;
  json_t *shape = NULL;
  json_int_t b = -1, e = -1;
  if (json_unpack(v, "{s:s, s:o, s:[II]}", "dtype", &dt, "shape", &shape, "data_offsets", &b, &e) ||
      !json_is_array(shape))
    return HORA_ERR(HORA_ERR_DATA, "%s: tensor '%s' lacks dtype, shape or data_offsets", what, key);
  int d = hora__ck_dtype_from_st(dt);
  if (d < 0)
    return HORA_ERR(HORA_ERR_DATA, "%s: tensor '%s' has dtype '%s', which hora does not know", what, key, dt);
  t->name = strdup(key);
  t->dtype = (hora_dtype_t)d;
  t->ndim = (int)json_array_size(shape);
  t->shape = malloc(sizeof(int64_t) * (t->ndim ? (size_t)t->ndim : 1));
  if (!t->name || !t->shape)
    return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  s->ntensors++;
  size_t count = 1;
  for (int i = 0; i < t->ndim; i++) {
    json_t *x = json_array_get(shape, (size_t)i);
    if (!json_is_integer(x) || json_integer_value(x) < 0)
      return HORA_ERR(HORA_ERR_DATA, "%s: tensor '%s' has a bad shape", what, key);
    t->shape[i] = json_integer_value(x);
    if (t->shape[i] && count > SIZE_MAX / (size_t)t->shape[i])
      return HORA_ERR(HORA_ERR_DATA, "%s: tensor '%s' shape overflows", what, key);
    count *= (size_t)t->shape[i];
  }
  size_t es = hora__dtype_size(t->dtype);
  t->count = count;
  if (b < 0 || e < b || count > SIZE_MAX / es || (uint64_t)(e - b) != count * es || (uint64_t)e > s->data_bytes)
    return HORA_ERR(HORA_ERR_DATA, "%s: tensor '%s' data_offsets [%lld, %lld] do not match its shape "
                    "and dtype or run past the data section (%zu bytes)", what, key, (long long)b,
                    (long long)e, s->data_bytes);
  t->offset = (size_t)b;
  t->bytes = (size_t)(e - b);
  return HORA_SUCCESS;
}

/* Every tensor's CRC32C and the data section's against the header's metadata. */
static hora_result_t check_crcs(ck_snap_t *s, json_t *meta, const char *dcrc, const char *what) {
  uint32_t want;
  for (size_t i = 0; i < s->ntensors; i++) {
    ck_tensor_t *t = &s->t[i];
    char k[CK_NAME_MAX + 32];
    snprintf(k, sizeof k, "hora.crc32c.%s", t->name);
    json_t *c = json_object_get(meta, k);
    if (!parse_hex32(json_string_value(c), &want))
      return HORA_ERR(HORA_ERR_DATA, "%s: no CRC32C for tensor '%s' in __metadata__", what, t->name);
    t->crc = hora__crc32c(0, s->data + t->offset, t->bytes);
    if (t->crc != want)
      return HORA_ERR(HORA_ERR_DATA, "%s: tensor '%s' CRC32C mismatch (data %08" PRIx32 ", header %08" PRIx32 ")",
                      what, t->name, t->crc, want);
  }
  if (!parse_hex32(dcrc, &want) || data_crc_of(s) != want)
    return HORA_ERR(HORA_ERR_DATA, "%s: data section CRC32C does not match hora.data_crc32c", what);
  return HORA_SUCCESS;
}

hora_result_t hora__ck_decode(const unsigned char *buf, size_t len, const char *what,
                              int check_crc, ck_snap_t *s) {
  memset(s, 0, sizeof *s);
  if (len < 8) return HORA_ERR(HORA_ERR_DATA, "%s: %zu bytes is shorter than the 8-byte header length", what, len);
  uint64_t hlen = 0;
  for (int b = 0; b < 8; b++) hlen |= (uint64_t)buf[b] << (8 * b);
  if (hlen > len - 8)
    return HORA_ERR(HORA_ERR_DATA, "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes)",
                    what, hlen, len);
  json_error_t jerr;
  json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, 0, &jerr);
  if (!root || !json_is_object(root)) {
    json_decref(root);
    return HORA_ERR(HORA_ERR_DATA, "%s: the safetensors header is not a JSON object (%s)", what, jerr.text);
  }
  hora_result_t rc = HORA_SUCCESS;
  s->data = buf + 8 + hlen;
  s->data_bytes = len - 8 - (size_t)hlen;
  size_t n = json_object_size(root);
  s->t = calloc(n ? n : 1, sizeof *s->t);
  if (!s->t) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
    goto fail;
  }
  json_t *meta = NULL, *v;
  const char *key;
  json_object_foreach(root, key, v) {
    if (strcmp(key, "__metadata__") == 0) {
      meta = v;
      continue;
    }
    HORA_CHECK_GOTO(decode_tensor(v, key, what, s), rc, fail);
  }
  qsort(s->t, s->ntensors, sizeof *s->t, by_offset);
  size_t at = 0;
  for (size_t i = 0; i < s->ntensors; i++) {
    if (s->t[i].offset != at) {
      rc = HORA_ERR(HORA_ERR_DATA, "%s: tensor '%s' starts at %zu, expected %zu (tensors must be back to back)",
                    what, s->t[i].name, s->t[i].offset, at);
      goto fail;
    }
    at += s->t[i].bytes;
  }
  if (at != s->data_bytes) {
    rc = HORA_ERR(HORA_ERR_DATA, "%s: the tensors cover %zu bytes but the data section has %zu (truncated or padded file)",
                  what, at, s->data_bytes);
    goto fail;
  }
  if (meta && !json_is_object(meta)) {
    rc = HORA_ERR(HORA_ERR_DATA, "%s: __metadata__ is not an object", what);
    goto fail;
  }
  size_t nm = meta ? json_object_size(meta) : 0;
  s->keys = calloc(nm ? nm : 1, sizeof *s->keys);
  s->vals = calloc(nm ? nm : 1, sizeof *s->vals);
  if (!s->keys || !s->vals) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
    goto fail;
  }
  const char *step = NULL, *ws = NULL, *dcrc = NULL;
  if (meta) {
    json_object_foreach(meta, key, v) {
      if (!json_is_string(v)) {
        rc = HORA_ERR(HORA_ERR_DATA, "%s: metadata '%s' is not a string", what, key);
        goto fail;
      }
      if (strcmp(key, "hora.step") == 0) step = json_string_value(v);
      else if (strcmp(key, "hora.world_size") == 0) ws = json_string_value(v);
      else if (strcmp(key, "hora.data_crc32c") == 0) dcrc = json_string_value(v);
      if (strncmp(key, "hora.", 5) == 0) continue;
      s->keys[s->nmeta] = strdup(key);
      s->vals[s->nmeta] = strdup(json_string_value(v));
      if (!s->keys[s->nmeta] || !s->vals[s->nmeta++]) {
        rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
        goto fail;
      }
    }
  }
  char *end = NULL;
  if (!step || (s->step = strtoll(step, &end, 10), *end)) {
    rc = HORA_ERR(HORA_ERR_DATA, "%s: no valid hora.step in __metadata__ (not a hora checkpoint?)", what);
    goto fail;
  }
  s->world_size = ws ? atoi(ws) : 0;
  if (check_crc) HORA_CHECK_GOTO(check_crcs(s, meta, dcrc, what), rc, fail);
  json_decref(root);
  return HORA_SUCCESS;
fail:
  json_decref(root);
  hora__ck_snap_free(s);
  return rc;
}
