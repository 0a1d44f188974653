/* Data of the MNIST example (see data.h). */
#include "data.h"

#include <errno.h>
#include <stdarg.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "model.h"

#define RECORD_BYTES (1 + MNIST_PIXELS)
#define CACHE_TRAIN_SHARDS 16

__attribute__((format(printf, 4, 5)))
static hora_result_t fail(char *err, size_t errlen, hora_result_t rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return rc;
}

static size_t glob_count(const char *pattern) {
  glob_t g;
  size_t n = glob(pattern, 0, NULL, &g) == 0 ? g.gl_pathc : 0;
  globfree(&g);
  return n;
}

/* The one file matching dir/prefix* (the first in sorted order: the raw file before .gz). */
static int find_one(const char *dir, const char *prefix, char *out, size_t n) {
  char pat[4200];
  snprintf(pat, sizeof pat, "%s/%s*", dir, prefix);
  glob_t g;
  int ok = glob(pat, 0, NULL, &g) == 0 && g.gl_pathc > 0;
  if (ok) snprintf(out, n, "%s", g.gl_pathv[0]);
  globfree(&g);
  return ok;
}

/* An IDX file (big-endian magic 0 0 0x08 ndims, ndims uint32 sizes, unsigned bytes), gzip or
 * raw: zlib's gzread reads both. This small loader keeps the example on hora's public API
 * (hora-records convert-idx has its own inside libhora's internals). */
static unsigned char *idx_load(const char *path, int want_dims, uint32_t dims[3], char *err,
                               size_t errlen) {
  gzFile f = gzopen(path, "rb");
  if (!f) {
    fail(err, errlen, HORA_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    return NULL;
  }
  unsigned char hdr[16];
  size_t hbytes = 4 + 4 * (size_t)want_dims;
  unsigned char *data = NULL;
  if (gzread(f, hdr, (unsigned)hbytes) != (int)hbytes || hdr[0] || hdr[1] || hdr[2] != 0x08 ||
      hdr[3] != want_dims) {
    fail(err, errlen, HORA_ERR_DATA, "%s: not an IDX file of unsigned bytes with %d dimensions",
         path, want_dims);
    goto out;
  }
  size_t total = 1;
  for (int i = 0; i < want_dims; i++) {
    const unsigned char *p = hdr + 4 + 4 * i;
    dims[i] = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    total *= dims[i];
  }
  if (total == 0 || total > ((size_t)1 << 32)) {
    fail(err, errlen, HORA_ERR_DATA, "%s: unreasonable IDX sizes", path);
    goto out;
  }
  data = malloc(total);
  size_t got = 0;
  while (data && got < total) {
    unsigned chunk = total - got > (1u << 30) ? (1u << 30) : (unsigned)(total - got);
    int r = gzread(f, data + got, chunk);
    if (r <= 0) break;
    got += (size_t)r;
  }
  if (!data || got != total) {
    fail(err, errlen, data ? HORA_ERR_DATA : HORA_ERR_NO_MEMORY, "%s: %s", path,
         data ? "truncated IDX file" : "out of memory");
    free(data);
    data = NULL;
  }
out:
  gzclose(f);
  return data;
}

/* Converts dir's <pre>-images/<pre>-labels IDX pair into `shards` record files
 * <out>/<split>-SSSSS-of-NNNNN.tfrecord (hora-records' names and 785-byte layout). */
static hora_result_t convert(const char *dir, const char *pre, const char *split, int shards,
                             const char *out, char *err, size_t errlen) {
  char ipath[4096], lpath[4096], p[64];
  snprintf(p, sizeof p, "%s-images", pre);
  if (!find_one(dir, p, ipath, sizeof ipath))
    return fail(err, errlen, HORA_ERR_NOT_FOUND, "no %s/%s* file", dir, p);
  snprintf(p, sizeof p, "%s-labels", pre);
  if (!find_one(dir, p, lpath, sizeof lpath))
    return fail(err, errlen, HORA_ERR_NOT_FOUND, "no %s/%s* file", dir, p);
  uint32_t idims[3], ldims[3];
  unsigned char *img = idx_load(ipath, 3, idims, err, errlen), *lab = NULL;
  if (!img) return HORA_ERR_DATA;
  lab = idx_load(lpath, 1, ldims, err, errlen);
  hora_result_t rc = HORA_SUCCESS;
  if (!lab) {
    rc = HORA_ERR_DATA;
  } else if (idims[1] != MNIST_ROWS || idims[2] != MNIST_COLS || ldims[0] != idims[0]) {
    rc = fail(err, errlen, HORA_ERR_DATA, "%s / %s: want N 28x28 images and N labels, got %u %ux%u and %u",
              ipath, lpath, idims[0], idims[1], idims[2], ldims[0]);
  }
  size_t n = lab ? idims[0] : 0;
  unsigned char rec[RECORD_BYTES];
  for (int s = 0; rc == HORA_SUCCESS && s < shards; s++) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s-%05d-of-%05d.tfrecord", out, split, s, shards);
    hora_records_writer_t *w;
    rc = hora_records_writer_open(path, &w);
    for (size_t i = n * s / shards; rc == HORA_SUCCESS && i < n * (s + 1) / shards; i++) {
      rec[0] = lab[i];
      memcpy(rec + 1, img + i * MNIST_PIXELS, MNIST_PIXELS);
      rc = hora_records_writer_write(w, rec, sizeof rec);
    }
    if (rc == HORA_SUCCESS) rc = hora_records_writer_close(w);
    else hora_records_writer_abort(w);
    if (rc != HORA_SUCCESS) fail(err, errlen, rc, "writing %s: %s", path, hora_last_error());
  }
  free(img);
  free(lab);
  return rc;
}

static int mkdirs(const char *path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
      *p = '/';
    }
  return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

/* This rank's records per epoch under the reader's sharding rule (hora.h): by file when there
 * are at least as many files as ranks, else by record. */
static hora_result_t shard_count(const char *pattern, int rank, int size, uint64_t *mine,
                                 uint64_t *total, char *err, size_t errlen) {
  glob_t g;
  if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
    globfree(&g);
    return fail(err, errlen, HORA_ERR_NOT_FOUND, "no file matches %s", pattern);
  }
  uint64_t sum = 0, own = 0;
  for (size_t i = 0; i < g.gl_pathc; i++) {
    uint64_t c;
    hora_result_t rc = hora_records_count(g.gl_pathv[i], &c);
    if (rc != HORA_SUCCESS) {
      fail(err, errlen, rc, "%s", hora_last_error());
      globfree(&g);
      return rc;
    }
    sum += c;
    if (i % (size_t)size == (size_t)rank) own += c;
  }
  if (g.gl_pathc < (size_t)size) own = sum / size + ((uint64_t)rank < sum % size);
  globfree(&g);
  *mine = own;
  *total = sum;
  return HORA_SUCCESS;
}

hora_result_t mnist_data_open(hora_ctx_t *ctx, const char *dir, const char *cache_dir,
                              mnist_data_t *data, char *err, size_t errlen) {
  int rank, size, local_rank;
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);
  hora_local_rank(ctx, &local_rank);
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return fail(err, errlen, HORA_ERR_NOT_FOUND, "--data %s: not a directory", dir);
  const char *src = dir;
  snprintf(data->train_pattern, sizeof data->train_pattern, "%s/train-*.tfrecord", dir);
  snprintf(data->test_pattern, sizeof data->test_pattern, "%s/test-*.tfrecord", dir);
  if (glob_count(data->train_pattern) == 0) {
    char probe[4096];
    if (!find_one(dir, "train-images", probe, sizeof probe))
      return fail(err, errlen, HORA_ERR_NOT_FOUND,
                  "--data %s has neither train-*.tfrecord shards nor train-images* IDX files", dir);
    /* IDX input: convert once per node (local rank 0) into the cache, others wait. */
    src = cache_dir;
    snprintf(data->train_pattern, sizeof data->train_pattern, "%s/train-*.tfrecord", src);
    snprintf(data->test_pattern, sizeof data->test_pattern, "%s/test-*.tfrecord", src);
    hora_result_t rc = HORA_SUCCESS;
    if (local_rank == 0) {
      char last[4400];
      snprintf(last, sizeof last, "%s/train-%05d-of-%05d.tfrecord", src, CACHE_TRAIN_SHARDS - 1,
               CACHE_TRAIN_SHARDS);
      int have = glob_count(data->train_pattern) == CACHE_TRAIN_SHARDS &&
                 glob_count(data->test_pattern) == 1 && access(last, R_OK) == 0;
      if (!have) {
        if (mkdirs(src) != 0)
          rc = fail(err, errlen, HORA_ERR_IO, "cannot create --cache-dir %s: %s", src, strerror(errno));
        if (rc == HORA_SUCCESS)
          rc = convert(dir, "train", "train", CACHE_TRAIN_SHARDS, src, err, errlen);
        if (rc == HORA_SUCCESS) rc = convert(dir, "t10k", "test", 1, src, err, errlen);
      }
    }
    /* every rank learns whether any node failed, so all stop together */
    int32_t bad = rc != HORA_SUCCESS, anybad = 0;
    hora_result_t crc = hora_allreduce(ctx, &bad, &anybad, 1, HORA_INT32, HORA_MAX, 1.0, 1.0,
                                       HORA_DEVICE_HOST);
    if (crc != HORA_SUCCESS) return fail(err, errlen, crc, "%s", hora_last_error());
    if (anybad)
      return rc != HORA_SUCCESS ? rc
                                : fail(err, errlen, HORA_ERR_REMOTE, "converting %s failed on another node", dir);
  }
  if (glob_count(data->test_pattern) == 0)
    return fail(err, errlen, HORA_ERR_NOT_FOUND, "no test shards %s", data->test_pattern);
  uint64_t total;
  hora_result_t rc = shard_count(data->train_pattern, rank, size, &data->train_records, &total,
                                 err, errlen);
  if (rc != HORA_SUCCESS) return rc;
  uint64_t mine;
  return shard_count(data->test_pattern, 0, 1, &mine, &data->test_records, err, errlen);
}

hora_result_t mnist_reader_open(hora_ctx_t *ctx, const char *pattern, int shuffle, uint64_t seed,
                                uint64_t epoch, uint64_t skip_records,
                                hora_records_reader_t **reader) {
  hora_records_reader_opts_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.patterns = &pattern;
  o.pattern_count = 1;
  o.ctx = ctx;
  o.prefetch = 1024;
  /* 10000 records (7.9 MB) mix a shard of MNIST well (docs/data.md: at least a file's records) */
  o.shuffle_buffer = shuffle ? 10000 : 0;
  o.seed = seed;
  o.epochs = epoch + 1;
  o.start_epoch = epoch;
  o.skip_records = skip_records;
  return hora_records_reader_open(&o, reader);
}

hora_result_t mnist_read_batch(hora_records_reader_t *reader, size_t n, float *x, uint8_t *labels,
                               size_t *got, char *err, size_t errlen) {
  size_t i = 0;
  for (; i < n; i++) {
    const void *rec;
    size_t len;
    int eof;
    hora_result_t rc = hora_records_next(reader, &rec, &len, &eof);
    if (rc != HORA_SUCCESS) return fail(err, errlen, rc, "%s", hora_last_error());
    if (eof) break;
    const unsigned char *r = rec;
    if (len != RECORD_BYTES || r[0] >= MNIST_CLASSES)
      return fail(err, errlen, HORA_ERR_DATA,
                  "a record of %zu bytes with label %u: want %d bytes (label 0..9, 28x28 pixels)",
                  len, len ? r[0] : 0, RECORD_BYTES);
    labels[i] = r[0];
    float *xi = x + i * MNIST_PIXELS;
    for (int p = 0; p < MNIST_PIXELS; p++) xi[p] = (float)r[1 + p] * (1.0f / 255.0f);
  }
  *got = i;
  return HORA_SUCCESS;
}
