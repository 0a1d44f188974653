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
#include <fcntl.h>
#include <sys/stat.h>
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

void hora__ck_step_name(int64_t step, char *out, size_t n) { snprintf(out, n, "step-%" PRId64, step); }

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

hora_result_t hora__ck_manifest_read_at(int sdfd, const char *stepdir, ck_manifest_t *m) {
  unsigned char *buf = NULL;
  size_t len = 0;
  hora_result_t rc = hora__ck_read_file_at(sdfd, stepdir, CK_MANIFEST, MANIFEST_MAX_BYTES, &buf, &len);
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

/* Collect step-<N> names of the open directory stream d. */
static hora_result_t collect_steps(DIR *d, int64_t **steps, size_t *n) {
  size_t cap = 0;
  struct dirent *e;
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
        free(*steps);
        *steps = NULL;
        *n = 0;
        return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
      }
      *steps = t;
    }
    (*steps)[(*n)++] = v;
  }
  if (*n) qsort(*steps, *n, sizeof **steps, newest_first);
  return HORA_SUCCESS;
}

hora_result_t hora__ck_list_steps_at(int dfd, const char *dir, int64_t **steps, size_t *n) {
  *steps = NULL;
  *n = 0;
  int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    int e = errno;
    if (fd >= 0) close(fd);
    return HORA_ERR(HORA_ERR_IO, "opendir %s: %s", dir, strerror(e));
  }
  hora_result_t rc = collect_steps(d, steps, n);
  closedir(d);
  return rc;
}

hora_result_t hora__ck_list_steps(const char *dir, int64_t **steps, size_t *n) {
  *steps = NULL;
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return HORA_SUCCESS;
    return HORA_ERR(HORA_ERR_IO, "opendir %s: %s", dir, strerror(errno));
  }
  hora_result_t rc = collect_steps(d, steps, n);
  closedir(d);
  return rc;
}

hora_result_t hora__ck_validate_at(int sdfd, const char *stepdir, int load, ck_manifest_t *m, unsigned char **buf,
                                   ck_snap_t *snap) {
  HORA_CHECK(hora__ck_manifest_read_at(sdfd, stepdir, m));
  const char *base = strrchr(stepdir, '/');
  char want[64];
  snprintf(want, sizeof want, "step-%" PRId64, m->step);
  if (!base || strcmp(base + 1, want) != 0)
    return HORA_ERR(HORA_ERR_DATA, "%s: its manifest says step %" PRId64, stepdir, m->step);
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", stepdir, m->file);
  if (!load) {
    uint32_t crc;
    uint64_t bytes;
    HORA_CHECK(hora__ck_file_crc_at(sdfd, stepdir, m->file, (size_t)hora__params()->ckpt_chunk_bytes, &crc, &bytes));
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
  HORA_CHECK(hora__ck_read_file_at(sdfd, stepdir, m->file, m->file_bytes, &b, &len));
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

hora_result_t hora__ck_validate(const char *stepdir, int load, ck_manifest_t *m, unsigned char **buf,
                                ck_snap_t *snap) {
  int fd;
  HORA_CHECK(hora__dir_open(stepdir, 0, &fd));
  hora_result_t rc = hora__ck_validate_at(fd, stepdir, load, m, buf, snap);
  close(fd);
  return rc;
}

/* One place of a restore: its checked fd (-1: none or missing) and its steps, newest first. */
typedef struct {
  const char *dir;
  int fd;
  int64_t *steps;
  size_t n, at;
} place_t;

static hora_result_t open_place(place_t *p, const char *dir) {
  memset(p, 0, sizeof *p);
  p->dir = dir;
  p->fd = -1;
  struct stat st;
  if (!dir || (lstat(dir, &st) != 0 && errno == ENOENT)) return HORA_SUCCESS; /* nothing there yet */
  hora_result_t rc = hora__dir_open(dir, 0, &p->fd);
  if (rc == HORA_ERR_NOT_FOUND) return HORA_SUCCESS; /* nothing there yet */
  if (rc != HORA_SUCCESS) { /* nothing is read from it */
    char msg[CK_MSG_MAX];
    hora__ck_keep_msg(msg);
    return HORA_ERR(rc, "restore refuses %s: %s", dir, msg);
  }
  if (hora__ck_list_steps_at(p->fd, dir, &p->steps, &p->n) != HORA_SUCCESS)
    HORA_WARN(CKPT, "restore: cannot list %s (%s); skipping it", dir, hora_last_error());
  return HORA_SUCCESS;
}

/* Try one candidate: step directory `step` of place p. *counts: 1 when the candidate was a
 * committed checkpoint of this run (it has a manifest; a local one names our persist_dir), so
 * that its rejection makes the result HORA_ERR_CORRUPT rather than HORA_ERR_NOT_FOUND. */
static hora_result_t try_candidate(place_t *p, int local, int64_t step, const char *ours, char *sd, size_t sd_cap,
                                   unsigned char **buf, ck_snap_t *snap, int *counts) {
  char name[64];
  hora__ck_step_name(step, name, sizeof name);
  snprintf(sd, sd_cap, "%s/%s", p->dir, name);
  *counts = 1;
  int sfd;
  hora_result_t v = hora__subdir_open(p->fd, p->dir, name, 0, &sfd);
  if (v != HORA_SUCCESS) return v; /* a symlink or a foreign directory: refused, counted */
  ck_manifest_t m;
  if (faccessat(sfd, CK_MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT)
    *counts = 0; /* never committed: an interrupted first write is a fresh start, not corruption */
  v = hora__ck_validate_at(sfd, sd, 1, &m, buf, snap);
  close(sfd);
  if (v == HORA_SUCCESS && local && strcmp(m.persist_dir, ours) != 0) {
    hora__ck_snap_free(snap);
    free(*buf);
    *buf = NULL;
    *counts = 0;
    v = HORA_ERR(HORA_ERR_DATA, "%s was written by another run (persist_dir '%s', this run's is '%s')", sd,
                 m.persist_dir, ours);
  }
  return v;
}

hora_result_t hora__ck_find_newest(const char *local_dir, const char *persist_dir, char **path,
                                   unsigned char **buf, ck_snap_t *snap) {
  place_t pl[2];
  HORA_CHECK(open_place(&pl[0], local_dir));
  hora_result_t rc = open_place(&pl[1], persist_dir);
  if (rc != HORA_SUCCESS) {
    if (pl[0].fd >= 0) close(pl[0].fd);
    free(pl[0].steps);
    return rc;
  }
  rc = HORA_ERR_NOT_FOUND;
  char why[2 * CK_MSG_MAX] = "", other[CK_MSG_MAX] = "", canon[PATH_MAX];
  const char *ours = persist_dir ? (realpath(persist_dir, canon) ? canon : persist_dir) : "";
  int bad = 0, skipped = 0;
  for (;;) {
    /* Next candidate: the highest step left; local before persistent on a tie. */
    int pick = -1;
    for (int p = 0; p < 2; p++)
      if (pl[p].at < pl[p].n && (pick < 0 || pl[p].steps[pl[p].at] > pl[pick].steps[pl[pick].at])) pick = p;
    if (pick < 0) break;
    int64_t step = pl[pick].steps[pl[pick].at++];
    char sd[4400];
    int counts = 0;
    hora_result_t v = try_candidate(&pl[pick], pick == 0, step, ours, sd, sizeof sd, buf, snap, &counts);
    if (v == HORA_SUCCESS) {
      *path = strdup(sd);
      if (!*path) {
        hora__ck_snap_free(snap);
        free(*buf);
        *buf = NULL;
        rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
        break;
      }
      if (bad || skipped)
        HORA_WARN(CKPT, "restore: using %s (step %" PRId64 ", %s) because the newer candidates are torn or corrupt "
                  "(see above)", sd, step, pick == 0 ? "local" : "persistent");
      else
        HORA_INFO(CKPT, "restore: using %s (step %" PRId64 ", %s)", sd, step, pick == 0 ? "local" : "persistent");
      rc = HORA_SUCCESS;
      break;
    }
    HORA_WARN(CKPT, "restore: skipping %s: %s", sd, hora_last_error());
    if (!counts) {
      size_t used = strlen(other);
      if (used < sizeof other - 16)
        snprintf(other + used, sizeof other - used, "%s%.300s", used ? "; " : "", hora_last_error());
      skipped++;
      continue;
    }
    bad++;
    size_t used = strlen(why);
    if (used < sizeof why - 16)
      snprintf(why + used, sizeof why - used, "%s%.400s", used ? "; " : "", hora_last_error());
  }
  for (int p = 0; p < 2; p++) {
    if (pl[p].fd >= 0) close(pl[p].fd);
    free(pl[p].steps);
  }
  const char *places = local_dir && persist_dir ? " or " : "";
  if (rc == HORA_ERR_NOT_FOUND && bad)
    return HORA_ERR(HORA_ERR_CORRUPT, "%d checkpoint%s in %s%s%s, none valid (not starting over: fix or move them "
                    "away to start from step 0): %s", bad, bad == 1 ? "" : "s", local_dir ? local_dir : "", places,
                    persist_dir ? persist_dir : "", why);
  if (rc == HORA_ERR_NOT_FOUND)
    return HORA_ERR(HORA_ERR_NOT_FOUND, "no checkpoint in %s%s%s%s%s", local_dir ? local_dir : "", places,
                    persist_dir ? persist_dir : "",
                    skipped ? " (only interrupted writes or other runs' checkpoints): " : "", other);
  return rc;
}

/* A step directory that holds a complete checkpoint as far as its size shows: the manifest
 * parses and the file it names has the manifest's size (no CRC pass: pruning decides quickly). */
static int looks_complete(int dfd, const char *dir, const char *name) {
  int sfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sfd < 0) return 0;
  char sd[4400];
  snprintf(sd, sizeof sd, "%s/%s", dir, name);
  ck_manifest_t m;
  struct stat st;
  int ok = faccessat(sfd, CK_MANIFEST, F_OK, AT_SYMLINK_NOFOLLOW) == 0 &&
           hora__ck_manifest_read_at(sfd, sd, &m) == HORA_SUCCESS &&
           fstatat(sfd, m.file, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
           (uint64_t)st.st_size == m.file_bytes;
  close(sfd);
  return ok;
}

int hora__ck_prune(int dfd, const char *dir, int keep, int64_t newest, int64_t pinned) {
  int64_t *steps = NULL;
  size_t n = 0;
  if (hora__ck_list_steps_at(dfd, dir, &steps, &n) != HORA_SUCCESS) {
    HORA_WARN(CKPT, "prune: %s", hora_last_error());
    return 0;
  }
  int kept = 0, removed = 0;
  for (size_t i = 0; i < n; i++) {
    char name[64];
    hora__ck_step_name(steps[i], name, sizeof name);
    if (steps[i] > newest || steps[i] == pinned) continue; /* newer ones belong to someone else's run */
    if (kept < keep && looks_complete(dfd, dir, name)) {
      kept++;
      continue;
    }
    if (hora__ck_remove_step_at(dfd, dir, name) != HORA_SUCCESS) {
      HORA_WARN(CKPT, "prune: %s", hora_last_error());
    } else {
      HORA_INFO(CKPT, "pruned %s/%s", dir, name);
      removed++;
    }
  }
  free(steps);
  (void)hora__ck_fsync_fd(dfd, dir);
  return removed;
}
