/* The manifest (step-N/manifest.json, written last), directory scans and validation.
 *
 * manifest.json (JSON via jansson):
 *   {"format": "hora-ckpt", "format_version": 1, "step": N, "world_size": W,
 *    "hora_version": "x.y.z", "created_unix_s": T, "file": "state.safetensors",
 *    "file_bytes": B, "file_crc32c": "8 hex digits", "data_crc32c": "8 hex digits",
 *    "tensors": {"<name>": {"dtype": "F32", "shape": [..], "crc32c": "8 hex digits"}, ...}}
 * A step directory is a checkpoint only when its manifest parses and the file it names has
 * exactly file_bytes bytes whose CRC32C is file_crc32c. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "core/crc32c.h"

#define MANIFEST_MAX_BYTES ((size_t)256 << 20)

void hora__ck_step_dir(const char *dir, int64_t step, char *out, size_t n) {
  snprintf(out, n, "%s/step-%" PRId64, dir, step);
}

hora_result_t hora__ck_manifest_json(const ck_snap_t *s, const char *file, uint64_t file_bytes,
                                     uint32_t file_crc, uint32_t data_crc, const char *persist_dir,
                                     char **json) {
  char fc[9], dc[9], tc[9];
  snprintf(fc, sizeof fc, "%08" PRIx32, file_crc);
  snprintf(dc, sizeof dc, "%08" PRIx32, data_crc);
  json_t *tensors = json_object();
  json_t *root = json_pack("{s:s, s:i, s:I, s:i, s:s, s:I, s:s, s:I, s:s, s:s}", "format", CK_FORMAT,
                           "format_version", CK_FORMAT_VERSION, "step", (json_int_t)s->step,
                           "world_size", s->world_size, "hora_version", HORA_VERSION_STRING,
                           "created_unix_s", (json_int_t)time(NULL), "file", file,
                           "file_bytes", (json_int_t)file_bytes, "file_crc32c", fc, "data_crc32c", dc);
  if (!root || !tensors) goto oom;
  json_object_set_new(root, "persist_dir", persist_dir ? json_string(persist_dir) : json_null());
  for (size_t i = 0; i < s->ntensors; i++) {
    const ck_tensor_t *t = &s->t[i];
    json_t *shape = json_array();
    if (!shape) goto oom;
    for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    snprintf(tc, sizeof tc, "%08" PRIx32, t->crc);
    json_t *o = json_pack("{s:s, s:o, s:s}", "dtype", hora__ck_dtype_st(t->dtype), "shape", shape, "crc32c", tc);
    if (!o || json_object_set_new(tensors, t->name, o)) goto oom;
  }
  if (json_object_set_new(root, "tensors", tensors)) {
    tensors = NULL;
    goto oom;
  }
  tensors = NULL;
  *json = json_dumps(root, JSON_INDENT(1));
  json_decref(root);
  if (!*json) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory writing the manifest");
  return HORA_SUCCESS;
oom:
  json_decref(tensors);
  json_decref(root);
  return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory building the manifest");
}

static int hex32(const char *s, uint32_t *v) {
  if (!s || strlen(s) != 8) return 0;
  char *end;
  unsigned long x = strtoul(s, &end, 16);
  if (*end) return 0;
  *v = (uint32_t)x;
  return 1;
}

int hora__ck_has_manifest(const char *stepdir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", stepdir, CK_MANIFEST);
  return access(path, F_OK) == 0;
}

hora_result_t hora__ck_manifest_read(const char *stepdir, ck_manifest_t *m) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", stepdir, CK_MANIFEST);
  unsigned char *buf = NULL;
  size_t len = 0;
  hora_result_t rc = hora__ck_read_file(path, MANIFEST_MAX_BYTES, &buf, &len);
  if (rc == HORA_ERR_NOT_FOUND)
    return HORA_ERR(HORA_ERR_NOT_FOUND, "%s has no %s (the write did not finish)", stepdir, CK_MANIFEST);
  if (rc != HORA_SUCCESS) return rc;
  json_error_t jerr;
  json_t *root = json_loadb((const char *)buf, len, 0, &jerr);
  free(buf);
  const char *fmt = NULL, *file = NULL, *fc = NULL, *dc = NULL;
  json_int_t step = 0, bytes = -1;
  int ver = 0, ws = 0;
  if (!root || json_unpack(root, "{s:s, s:i, s:I, s:i, s:s, s:I, s:s, s:s}", "format", &fmt, "format_version",
                           &ver, "step", &step, "world_size", &ws, "file", &file, "file_bytes", &bytes,
                           "file_crc32c", &fc, "data_crc32c", &dc)) {
    json_decref(root);
    return HORA_ERR(HORA_ERR_DATA, "%s/%s is not a valid manifest (%s)", stepdir, CK_MANIFEST,
                    root ? "missing or mistyped fields" : jerr.text);
  }
  rc = HORA_SUCCESS;
  if (strcmp(fmt, CK_FORMAT) != 0 || ver != CK_FORMAT_VERSION)
    rc = HORA_ERR(HORA_ERR_DATA, "%s/%s: format %s version %d, expected %s version %d", stepdir, CK_MANIFEST,
                  fmt, ver, CK_FORMAT, CK_FORMAT_VERSION);
  else if (bytes < 0 || !hex32(fc, &m->file_crc) || !hex32(dc, &m->data_crc) || strlen(file) >= sizeof m->file ||
           strchr(file, '/') || file[0] == '.')
    rc = HORA_ERR(HORA_ERR_DATA, "%s/%s: bad file name, size or CRC fields", stepdir, CK_MANIFEST);
  if (rc == HORA_SUCCESS) {
    m->step = step;
    m->world_size = ws;
    m->file_bytes = (uint64_t)bytes;
    snprintf(m->file, sizeof m->file, "%s", file);
    const char *pd = json_string_value(json_object_get(root, "persist_dir"));
    snprintf(m->persist_dir, sizeof m->persist_dir, "%s", pd ? pd : "");
  }
  json_decref(root);
  return rc;
}

static int newest_first(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x > y ? -1 : x < y;
}

hora_result_t hora__ck_list_steps(const char *dir, int64_t **steps, size_t *n) {
  *steps = NULL;
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return HORA_SUCCESS;
    return HORA_ERR(HORA_ERR_IO, "opendir %s: %s", dir, strerror(errno));
  }
  size_t cap = 0;
  struct dirent *e;
  hora_result_t rc = HORA_SUCCESS;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, "step-", 5) != 0) continue;
    const char *num = e->d_name + 5;
    char *end;
    errno = 0;
    long long v = strtoll(num, &end, 10);
    if (errno || end == num || *end || (num[0] == '-' && v == 0)) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      int64_t *t = realloc(*steps, cap * sizeof *t);
      if (!t) {
        rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
        break;
      }
      *steps = t;
    }
    (*steps)[(*n)++] = v;
  }
  closedir(d);
  if (rc != HORA_SUCCESS) {
    free(*steps);
    *steps = NULL;
    *n = 0;
    return rc;
  }
  if (*n) qsort(*steps, *n, sizeof **steps, newest_first);
  return HORA_SUCCESS;
}

hora_result_t hora__ck_validate(const char *stepdir, int load, ck_manifest_t *m, unsigned char **buf,
                                ck_snap_t *snap) {
  HORA_CHECK(hora__ck_manifest_read(stepdir, m));
  const char *base = strrchr(stepdir, '/');
  char want[64];
  snprintf(want, sizeof want, "step-%" PRId64, m->step);
  if (!base || strcmp(base + 1, want) != 0)
    return HORA_ERR(HORA_ERR_DATA, "%s: its manifest says step %" PRId64, stepdir, m->step);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", stepdir, m->file);
  if (!load) {
    uint32_t crc;
    uint64_t bytes;
    HORA_CHECK(hora__ck_file_crc(path, (size_t)hora__params()->ckpt_chunk_bytes, &crc, &bytes));
    if (bytes != m->file_bytes)
      return HORA_ERR(HORA_ERR_DATA, "%s has %" PRIu64 " bytes, the manifest says %" PRIu64 " (torn file)", path,
                      bytes, m->file_bytes);
    if (crc != m->file_crc)
      return HORA_ERR(HORA_ERR_DATA, "%s: CRC32C %08" PRIx32 " does not match the manifest's %08" PRIx32, path, crc,
                      m->file_crc);
    return HORA_SUCCESS;
  }
  unsigned char *b = NULL;
  size_t len = 0;
  HORA_CHECK(hora__ck_read_file(path, m->file_bytes, &b, &len));
  if (len != m->file_bytes) {
    free(b);
    return HORA_ERR(HORA_ERR_DATA, "%s has %zu bytes, the manifest says %" PRIu64 " (torn file)", path, len,
                    m->file_bytes);
  }
  hora_result_t rc = hora__ck_decode(b, len, path, 1, snap);
  if (rc != HORA_SUCCESS) {
    free(b);
    return rc;
  }
  /* The whole-file CRC from the verified tensor CRCs: header bytes + data. */
  size_t prefix = (size_t)(snap->data - b);
  uint32_t dcrc = 0;
  for (size_t i = 0; i < snap->ntensors; i++) dcrc = hora__ck_crc_combine(dcrc, snap->t[i].crc, snap->t[i].bytes);
  uint32_t fcrc = hora__ck_crc_combine(hora__crc32c(0, b, prefix), dcrc, snap->data_bytes);
  if (fcrc != m->file_crc || dcrc != m->data_crc || snap->step != m->step) {
    hora__ck_snap_free(snap);
    free(b);
    return HORA_ERR(HORA_ERR_DATA, "%s: CRC32C %08" PRIx32 " (or step) does not match the manifest's %08" PRIx32,
                    path, fcrc, m->file_crc);
  }
  *buf = b;
  return HORA_SUCCESS;
}

hora_result_t hora__ck_find_newest(const char *local_dir, const char *persist_dir, char **path,
                                   unsigned char **buf, ck_snap_t *snap) {
  const char *dirs[2] = {local_dir, persist_dir};
  int64_t *steps[2] = {NULL, NULL};
  size_t n[2] = {0, 0}, at[2] = {0, 0};
  for (int p = 0; p < 2; p++) {
    if (!dirs[p]) continue;
    if (hora__ck_list_steps(dirs[p], &steps[p], &n[p]) != HORA_SUCCESS)
      HORA_WARN(CKPT, "restore: cannot list %s (%s); skipping it", dirs[p], hora_last_error());
  }
  hora_result_t rc = HORA_ERR_NOT_FOUND;
  char why[2 * CK_MSG_MAX] = "", canon[PATH_MAX];
  const char *ours = persist_dir ? (realpath(persist_dir, canon) ? canon : persist_dir) : "";
  for (;;) {
    /* Next candidate: the highest step left; local before persistent on a tie. */
    int pick = -1;
    for (int p = 0; p < 2; p++)
      if (at[p] < n[p] && (pick < 0 || steps[p][at[p]] > steps[pick][at[pick]])) pick = p;
    if (pick < 0) break;
    int64_t step = steps[pick][at[pick]++];
    char sd[4096];
    hora__ck_step_dir(dirs[pick], step, sd, sizeof sd);
    ck_manifest_t m;
    hora_result_t v = hora__ck_validate(sd, 1, &m, buf, snap);
    if (v == HORA_SUCCESS && pick == 0 && strcmp(m.persist_dir, ours) != 0) {
      hora__ck_snap_free(snap);
      free(*buf);
      *buf = NULL;
      v = HORA_ERR(HORA_ERR_DATA, "%s was written by another run (persist_dir '%s', this run's is '%s')", sd,
                   m.persist_dir, ours);
    }
    if (v == HORA_SUCCESS) {
      *path = strdup(sd);
      if (!*path) {
        hora__ck_snap_free(snap);
        free(*buf);
        *buf = NULL;
        rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
        break;
      }
      if (why[0])
        HORA_WARN(CKPT, "restore: using %s (step %" PRId64 ", %s) because the newer candidates are torn or corrupt "
                  "(see above)", sd, step, pick == 0 ? "local" : "persistent");
      else
        HORA_INFO(CKPT, "restore: using %s (step %" PRId64 ", %s)", sd, step, pick == 0 ? "local" : "persistent");
      rc = HORA_SUCCESS;
      break;
    }
    HORA_WARN(CKPT, "restore: skipping %s: %s", sd, hora_last_error());
    size_t used = strlen(why);
    if (used < sizeof why - 16)
      snprintf(why + used, sizeof why - used, "%s%.400s: %.400s", used ? "; " : "", sd, hora_last_error());
  }
  free(steps[0]);
  free(steps[1]);
  if (rc == HORA_ERR_NOT_FOUND)
    return HORA_ERR(HORA_ERR_NOT_FOUND, "no valid checkpoint in %s%s%s%s%s", local_dir ? local_dir : "",
                    local_dir && persist_dir ? " or " : "", persist_dir ? persist_dir : "", why[0] ? ": " : "",
                    why);
  return rc;
}

void hora__ck_prune(const char *dir, int keep, int64_t newest, int64_t pinned) {
  int64_t *steps = NULL;
  size_t n = 0;
  if (hora__ck_list_steps(dir, &steps, &n) != HORA_SUCCESS) {
    HORA_WARN(CKPT, "prune: %s", hora_last_error());
    return;
  }
  int kept = 0;
  for (size_t i = 0; i < n; i++) {
    char sd[4096], mp[4200];
    hora__ck_step_dir(dir, steps[i], sd, sizeof sd);
    if (steps[i] > newest || steps[i] == pinned) continue; /* newer ones belong to someone else's run */
    snprintf(mp, sizeof mp, "%s/%s", sd, CK_MANIFEST);
    FILE *f = fopen(mp, "r");
    int committed = f != NULL;
    if (f) fclose(f);
    if (committed && kept < keep) {
      kept++;
      continue;
    }
    if (hora__ck_remove_step(sd) != HORA_SUCCESS)
      HORA_WARN(CKPT, "prune: %s", hora_last_error());
    else
      HORA_INFO(CKPT, "pruned %s", sd);
  }
  free(steps);
  (void)hora__ck_fsync_dir(dir);
}
