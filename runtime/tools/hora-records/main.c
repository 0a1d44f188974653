/* hora-records: make, count, verify and print record files (docs/data.md).
 *   hora-records convert-idx IDX_DIR --split train|test --shards N --out DIR
 *   hora-records count FILE...          total number of records
 *   hora-records verify FILE...         check every CRC; exit 1 naming file and byte offset
 *   hora-records cat [--raw] FILE       one line per record (index, length, leading bytes in hex),
 *                                       or with --raw the record bytes back to back on stdout
 * Exit status: 0 success, 1 failure (message on stderr), 2 usage error. */
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/idx.h"
#include "hora.h"
#include "../opt.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hora-records convert-idx IDX_DIR --split train|test --shards N --out DIR\n"
          "       hora-records count FILE...\n"
          "       hora-records verify FILE...\n"
          "       hora-records cat [--raw] FILE\n"
          "convert-idx writes DIR/<split>-SSSSS-of-NNNNN.tfrecord; each record is 1 label byte\n"
          "followed by the image's rows*cols pixel bytes (row-major, 784 for MNIST).\n");
}

static int fail_msg(const char *what) {
  fprintf(stderr, "hora-records: %s: %s\n", what, hora_last_error());
  return 1;
}

/* The one file in dir matching prefix*: "train-images" finds train-images-idx3-ubyte(.gz). */
static int find_one(const char *dir, const char *prefix, char *out, size_t n) {
  char pat[4096];
  snprintf(pat, sizeof pat, "%s/%s*", dir, prefix);
  glob_t g;
  if (glob(pat, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
    fprintf(stderr, "hora-records: no file matches %s\n", pat);
    globfree(&g);
    return 0;
  }
  /* prefer the raw file when both raw and .gz exist (the first in sorted order) */
  snprintf(out, n, "%s", g.gl_pathv[0]);
  globfree(&g);
  return 1;
}

static int convert_idx(int argc, char **argv) {
  const char *P = "hora-records convert-idx", *dir = NULL, *split = NULL, *outdir = NULL;
  long shards = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int rc = 0;
    if (!strcmp(a, "--split")) rc = opt_choice(P, argc, argv, &i, "train|test", &split);
    else if (!strcmp(a, "--shards")) rc = opt_long(P, argc, argv, &i, 1, 99999, &shards);
    else if (!strcmp(a, "--out")) rc = (outdir = opt_value(P, argc, argv, &i)) ? 0 : OPT_USAGE;
    else if (!opt_is_option(a) && !dir) dir = a;
    else rc = opt_unknown(P, a);
    if (rc) return rc;
  }
  if (!dir || !split || !outdir || !shards)
    return opt_error(P, "needs IDX_DIR, --split train|test, --shards N (1..99999) and --out DIR");
  const char *pre = strcmp(split, "train") == 0 ? "train" : "t10k";
  char ipath[4096], lpath[4096], p[4200];
  snprintf(p, sizeof p, "%s-images", pre);
  if (!find_one(dir, p, ipath, sizeof ipath)) return 1;
  snprintf(p, sizeof p, "%s-labels", pre);
  if (!find_one(dir, p, lpath, sizeof lpath)) return 1;
  hora_idx_t img, lab;
  if (hora__idx_load(ipath, &img) != HORA_SUCCESS) return fail_msg("convert-idx");
  if (hora__idx_load(lpath, &lab) != HORA_SUCCESS) {
    free(img.data);
    return fail_msg("convert-idx");
  }
  int rc = 1;
  if (img.ndims != 3 || lab.ndims != 1 || img.dims[0] != lab.dims[0]) {
    fprintf(stderr, "hora-records convert-idx: %s (%d dims) and %s (%d dims) do not describe the same images\n",
            ipath, img.ndims, lpath, lab.ndims);
    goto done;
  }
  if ((size_t)shards > img.dims[0]) {
    /* refused before anything is written: a shard without records helps no reader */
    fprintf(stderr, "hora-records convert-idx: --shards %ld is more than the %u images in %s\n", shards, (unsigned)img.dims[0], ipath);
    rc = 2;
    goto done;
  }
  if (mkdir(outdir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "hora-records convert-idx: mkdir %s: %s\n", outdir, strerror(errno));
    goto done;
  }
  size_t n = img.dims[0], pix = (size_t)img.dims[1] * img.dims[2];
  unsigned char *rec = malloc(pix + 1);
  if (!rec) goto done;
  for (long s = 0; s < shards; s++) {
    /* contiguous ranges: reading the shards in name order gives the IDX order back */
    size_t lo = n * (size_t)s / (size_t)shards, hi = n * (size_t)(s + 1) / (size_t)shards;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s-%05ld-of-%05ld.tfrecord", outdir, split, s, shards);
    hora_records_writer_t *w;
    if (hora_records_writer_open(path, &w) != HORA_SUCCESS) {
      free(rec);
      rc = fail_msg("convert-idx");
      goto done;
    }
    for (size_t i = lo; i < hi; i++) {
      rec[0] = lab.data[i];
      memcpy(rec + 1, img.data + i * pix, pix);
      if (hora_records_writer_write(w, rec, pix + 1) != HORA_SUCCESS) {
        hora_records_writer_abort(w);
        free(rec);
        rc = fail_msg("convert-idx");
        goto done;
      }
    }
    if (hora_records_writer_close(w) != HORA_SUCCESS) {
      free(rec);
      rc = fail_msg("convert-idx");
      goto done;
    }
    printf("%s: %zu records\n", path, hi - lo);
  }
  free(rec);
  printf("%zu %s images of %ux%u in %ld shard%s (record: 1 label byte + %zu pixel bytes)\n", n, split,
         img.dims[1], img.dims[2], shards, shards == 1 ? "" : "s", pix);
  rc = 0;
done:
  free(img.data);
  free(lab.data);
  return rc;
}

/* FILE... arguments of count and verify: at least one, and none that looks like an option. */
static int files_only(const char *prog, int argc, char **argv) {
  if (argc < 2) return opt_error(prog, "needs at least one FILE");
  for (int i = 1; i < argc; i++)
    if (opt_is_option(argv[i])) return opt_unknown(prog, argv[i]);
  return 0;
}

static int count(int argc, char **argv) {
  if (files_only("hora-records count", argc, argv)) return OPT_USAGE;
  uint64_t total = 0;
  for (int i = 1; i < argc; i++) {
    uint64_t c;
    if (hora_records_count(argv[i], &c) != HORA_SUCCESS) return fail_msg("count");
    total += c;
  }
  printf("%llu\n", (unsigned long long)total);
  return 0;
}

/* Read one file through a single-rank reader (every CRC checked). fn sees each record. */
static int each_record(const char *path, int (*fn)(void *, uint64_t, const unsigned char *, size_t), void *arg,
                       uint64_t *n) {
  hora_records_reader_opts_t o = {0};
  o.size = sizeof o;
  o.patterns = &path;
  o.pattern_count = 1;
  o.world_size = 1;
  hora_records_reader_t *r;
  if (hora_records_reader_open(&o, &r) != HORA_SUCCESS) return 0;
  *n = 0;
  int ok = 1;
  for (;;) {
    const void *d;
    size_t len;
    int eof;
    if (hora_records_next(r, &d, &len, &eof) != HORA_SUCCESS) {
      ok = 0;
      break;
    }
    if (eof) break;
    if (fn && !fn(arg, *n, d, len)) break;
    (*n)++;
  }
  hora_records_reader_close(r);
  return ok;
}

static int verify(int argc, char **argv) {
  if (files_only("hora-records verify", argc, argv)) return OPT_USAGE;
  int bad = 0;
  for (int i = 1; i < argc; i++) {
    uint64_t n;
    /* hora_records_reader_open expands glob characters: refuse names that contain them */
    if (strpbrk(argv[i], "*?[")) {
      fprintf(stderr, "hora-records verify: %s: file names with *, ? or [ are not supported\n", argv[i]);
      bad = 1;
      continue;
    }
    if (!each_record(argv[i], NULL, NULL, &n)) {
      fprintf(stderr, "hora-records verify: FAILED: %s\n", hora_last_error());
      bad = 1;
      continue;
    }
    printf("%s: %llu records OK\n", argv[i], (unsigned long long)n);
  }
  return bad;
}

static int print_line(void *arg, uint64_t i, const unsigned char *d, size_t len) {
  printf("%llu %zu", (unsigned long long)i, len);
  size_t show = len < 32 ? len : 32;
  printf(" ");
  for (size_t k = 0; k < show; k++) printf("%02x", d[k]);
  printf("%s\n", len > show ? "..." : "");
  return 1;
}

static int print_raw(void *arg, uint64_t i, const unsigned char *d, size_t len) {
  return fwrite(d, 1, len, stdout) == len;
}

static int cat(int argc, char **argv) {
  const char *P = "hora-records cat", *file = NULL;
  int raw = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--raw")) raw = 1;
    else if (opt_is_option(argv[i])) return opt_unknown(P, argv[i]);
    else if (file) return opt_error(P, "takes one FILE (got '%s' and '%s')", file, argv[i]);
    else file = argv[i];
  }
  if (!file) return opt_error(P, "needs a FILE");
  uint64_t n;
  if (!each_record(file, raw ? print_raw : print_line, NULL, &n)) return fail_msg("cat");
  return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  /* This tool prints every error itself; hora's WARN log lines would repeat them. */
  setenv("HORA_LOG", "NONE", 0);
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  /* `hora-records CMD --help` prints the usage (before any file is opened) */
  if (opt_wants_help(argc - 1, argv + 1)) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "convert-idx")) return convert_idx(argc - 1, argv + 1);
  if (!strcmp(argv[1], "count")) return count(argc - 1, argv + 1);
  if (!strcmp(argv[1], "verify")) return verify(argc - 1, argv + 1);
  if (!strcmp(argv[1], "cat")) return cat(argc - 1, argv + 1);
  fprintf(stderr, "hora-records: unknown command '%s' (see hora-records --help)\n", argv[1]);
  return 2;
}
