/* Record files: writer commit, exact framing, reader order, sharding, shuffle determinism,
 * resume by position, corrupt/truncated input, and argument errors. Single process. */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "hora_test.h"

static char dir[256];
#define NREC 300

/* Record i: 4-byte id, then (i * 37) % 1500 bytes of a pattern (lengths vary, some are 0+4). */
static size_t make_record(uint32_t id, unsigned char *buf) {
  size_t extra = (id * 37u) % 1500u;
  memcpy(buf, &id, 4);
  for (size_t k = 0; k < extra; k++) buf[4 + k] = (unsigned char)(id * 7 + k);
  return 4 + extra;
}

static int check_record(const void *d, size_t len, uint32_t *id) {
  unsigned char want[4 + 1500];
  if (len < 4) return 0;
  memcpy(id, d, 4);
  size_t wl = make_record(*id, want);
  return wl == len && memcmp(want, d, len) == 0;
}

/* Write files[f] holding ids [lo, hi). */
static void write_file(const char *path, uint32_t lo, uint32_t hi) {
  hora_records_writer_t *w = NULL;
  EXPECT_OK(hora_records_writer_open(path, &w));
  unsigned char buf[4 + 1500];
  for (uint32_t i = lo; i < hi; i++) EXPECT_OK(hora_records_writer_write(w, buf, make_record(i, buf)));
  struct stat st;
  EXPECT(stat(path, &st) != 0, "%s exists before close", path);
  EXPECT_OK(hora_records_writer_close(w));
  EXPECT(stat(path, &st) == 0, "%s missing after close", path);
}

typedef struct {
  const char *pat;
  int rank, world;
  size_t prefetch, shuffle;
  uint64_t seed, epochs, start_epoch, skip;
  int skip_corrupt;
} ropts_t;

static hora_result_t open_reader(const ropts_t *ro, hora_records_reader_t **r) {
  hora_records_reader_opts_t o;
  memset(&o, 0, sizeof o);
  o.size = sizeof o;
  o.patterns = &ro->pat;
  o.pattern_count = 1;
  o.rank = ro->rank;
  o.world_size = ro->world;
  o.prefetch = ro->prefetch;
  o.shuffle_buffer = ro->shuffle;
  o.seed = ro->seed;
  o.epochs = ro->epochs;
  o.start_epoch = ro->start_epoch;
  o.skip_records = ro->skip;
  o.skip_corrupt = ro->skip_corrupt;
  return hora_records_reader_open(&o, r);
}

/* Read up to max ids (or everything) into ids[]; returns the count, -1 on error. */
static long read_ids(const ropts_t *ro, uint32_t *ids, long max, hora_records_reader_t **keep) {
  hora_records_reader_t *r = NULL;
  hora_result_t rc = open_reader(ro, &r);
  EXPECT_OK(rc);
  if (rc) return -1;
  long n = 0;
  for (;;) {
    if (max >= 0 && n == max) break;
    const void *d;
    size_t len;
    int eof = 7;
    rc = hora_records_next(r, &d, &len, &eof);
    if (rc) {
      hora_records_reader_close(r);
      return -1;
    }
    if (eof) {
      EXPECT(eof == 1 && d == NULL && len == 0, "eof outputs");
      break;
    }
    uint32_t id = 0;
    EXPECT(check_record(d, len, &id), "record %ld has wrong content (len %zu)", n, len);
    ids[n++] = id;
  }
  if (keep) *keep = r;
  else hora_records_reader_close(r);
  return n;
}

static void test_framing(void) {
  char path[300];
  snprintf(path, sizeof path, "%s/one.rec", dir);
  hora_records_writer_t *w = NULL;
  EXPECT_OK(hora_records_writer_open(path, &w));
  EXPECT_OK(hora_records_writer_write(w, "hello", 5));
  EXPECT_OK(hora_records_writer_write(w, NULL, 0));
  EXPECT_OK(hora_records_writer_close(w));
  unsigned char b[64];
  int fd = open(path, O_RDONLY);
  ssize_t n = read(fd, b, sizeof b);
  close(fd);
  EXPECT(n == 21 + 16, "file size %zd, want 37", n);
  /* independent encoding of the framing: LE length, masked CRCs */
  unsigned char want[37] = {5, 0, 0, 0, 0, 0, 0, 0};
  uint32_t c = hora__crc32c_mask(hora__crc32c(0, want, 8));
  memcpy(want + 8, &c, 4);
  memcpy(want + 12, "hello", 5);
  c = hora__crc32c_mask(hora__crc32c(0, "hello", 5));
  memcpy(want + 17, &c, 4);
  memset(want + 21, 0, 8);
  c = hora__crc32c_mask(hora__crc32c(0, want + 21, 8));
  memcpy(want + 29, &c, 4);
  c = hora__crc32c_mask(0); /* CRC32C of no bytes is 0 */
  memcpy(want + 33, &c, 4);
  EXPECT(n == 37 && memcmp(b, want, 37) == 0, "framing bytes differ");
  /* mask formula spot check: mask(0) = 0xa282ead8 */
  EXPECT(hora__crc32c_mask(0) == 0xa282ead8u, "mask(0)");
  uint64_t cnt = 0;
  EXPECT_OK(hora_records_count(path, &cnt));
  EXPECT(cnt == 2, "count %llu", (unsigned long long)cnt);
  struct stat pst;
  EXPECT(stat(path, &pst) == 0 && (pst.st_mode & 07777) == 0600, "record file mode %04o, want 0600 (HORA_FILE_MODE)",
         (unsigned)(pst.st_mode & 07777));
  /* abort leaves nothing */
  snprintf(path, sizeof path, "%s/aborted.rec", dir);
  EXPECT_OK(hora_records_writer_open(path, &w));
  EXPECT_OK(hora_records_writer_write(w, "x", 1));
  EXPECT_OK(hora_records_writer_abort(w));
  struct stat st;
  EXPECT(stat(path, &st) != 0, "aborted file exists");
  char cmd[600];
  snprintf(cmd, sizeof cmd, "ls -A %s | grep -q '^\\.tmp-'", dir);
  EXPECT(system(cmd) != 0, "a temporary file was left behind");
}

static void test_order_and_sharding(void) {
  static uint32_t ids[NREC * 4];
  char pat[300];
  snprintf(pat, sizeof pat, "%s/part-*.rec", dir);
  ropts_t ro = {.pat = pat};
  long n = read_ids(&ro, ids, -1, NULL);
  EXPECT(n == NREC, "read %ld records, want %d", n, NREC);
  for (long i = 0; i < n && i < NREC; i++) EXPECT(ids[i] == (uint32_t)i, "record %ld is id %u", i, ids[i]);
  uint64_t total = 0;
  for (int f = 0; f < 4; f++) {
    char p[300];
    uint64_t c = 0;
    snprintf(p, sizeof p, "%s/part-%d.rec", dir, f);
    EXPECT_OK(hora_records_count(p, &c));
    total += c;
  }
  EXPECT(total == NREC, "hora_records_count total %llu", (unsigned long long)total);
  /* every world size: disjoint shards covering everything, by file (w <= 4) or by record */
  int worlds[] = {1, 2, 3, 4, 5, 7};
  for (size_t wi = 0; wi < sizeof worlds / sizeof *worlds; wi++) {
    int w = worlds[wi];
    int seen[NREC] = {0};
    long sum = 0, minc = NREC, maxc = 0;
    for (int r = 0; r < w; r++) {
      ropts_t s = {.pat = pat, .rank = r, .world = w, .prefetch = 3};
      long m = read_ids(&s, ids, -1, NULL);
      EXPECT(m >= 0, "world %d rank %d failed", w, r);
      for (long i = 0; i < m; i++)
        if (ids[i] < NREC) seen[ids[i]]++;
      sum += m;
      if (m < minc) minc = m;
      if (m > maxc) maxc = m;
      if (w > 4) /* by record: record j goes to rank j % w */
        for (long i = 0; i < m; i++) EXPECT(ids[i] % (uint32_t)w == (uint32_t)r, "world %d rank %d got %u", w, r, ids[i]);
    }
    EXPECT(sum == NREC, "world %d: %ld records in all shards", w, sum);
    for (int i = 0; i < NREC; i++) EXPECT(seen[i] == 1, "world %d: id %d seen %d times", w, i, seen[i]);
    if (w > 4) EXPECT(maxc - minc <= 1, "world %d: unbalanced %ld..%ld", w, minc, maxc);
  }
}

static int is_perm(const uint32_t *ids, long n) {
  static int seen[NREC];
  memset(seen, 0, sizeof seen);
  for (long i = 0; i < n; i++) {
    if (ids[i] >= NREC || seen[ids[i]]++) return 0;
  }
  return n == NREC;
}

static void test_shuffle_epochs_resume(void) {
  static uint32_t a[NREC * 3], b[NREC * 3], c[NREC * 3];
  char pat[300];
  snprintf(pat, sizeof pat, "%s/part-*.rec", dir);
  ropts_t ro = {.pat = pat, .shuffle = 50, .seed = 42, .epochs = 3, .prefetch = 16};
  long na = read_ids(&ro, a, -1, NULL), nb = read_ids(&ro, b, -1, NULL);
  EXPECT(na == 3 * NREC && nb == na, "shuffled 3 epochs: %ld and %ld records", na, nb);
  EXPECT(na == nb && memcmp(a, b, sizeof a) == 0, "same seed gave different orders");
  for (int e = 0; e < 3; e++) EXPECT(is_perm(a + e * NREC, NREC), "epoch %d is not a permutation", e);
  long inorder = 0;
  for (long i = 0; i < NREC; i++) inorder += a[i] == (uint32_t)i;
  EXPECT(inorder < NREC / 4, "shuffled epoch has %ld records in place", inorder);
  EXPECT(memcmp(a, a + NREC, NREC * 4) != 0, "epochs 0 and 1 have the same order");
  ropts_t r2 = ro;
  r2.seed = 43;
  long nc = read_ids(&r2, c, -1, NULL);
  EXPECT(nc == na && memcmp(a, c, sizeof a) != 0, "different seeds gave the same order");
  /* prefetch does not change the order */
  r2 = ro;
  r2.prefetch = 1;
  nc = read_ids(&r2, c, -1, NULL);
  EXPECT(nc == na && memcmp(a, c, sizeof a) == 0, "prefetch changed the shuffled order");

  /* resume: stop after k records, save the position, reopen, the rest must match */
  long stops[] = {0, 1, 137, NREC - 1, NREC, NREC + 5, 3 * NREC - 1};
  for (int shuf = 0; shuf < 2; shuf++) {
    ropts_t base = ro;
    if (!shuf) base.shuffle = 0;
    long full = read_ids(&base, a, -1, NULL);
    for (size_t s = 0; s < sizeof stops / sizeof *stops; s++) {
      hora_records_reader_t *r = NULL;
      long k = read_ids(&base, b, stops[s], &r);
      EXPECT(k == stops[s], "read %ld of %ld", k, stops[s]);
      uint64_t ep = 99, cnt = 99;
      EXPECT_OK(hora_records_reader_position(r, &ep, &cnt));
      hora_records_reader_close(r);
      uint64_t want_ep = k ? (uint64_t)((k - 1) / NREC) : 0, want_cnt = k ? (uint64_t)((k - 1) % NREC + 1) : 0;
      EXPECT(ep == want_ep && cnt == want_cnt, "position after %ld: (%llu, %llu) want (%llu, %llu)", k,
             (unsigned long long)ep, (unsigned long long)cnt, (unsigned long long)want_ep,
             (unsigned long long)want_cnt);
      ropts_t res = base;
      res.start_epoch = ep;
      res.skip = cnt;
      long m = read_ids(&res, c, -1, NULL);
      EXPECT(m == full - k, "resume after %ld (shuffle %d): %ld records, want %ld", k, shuf, m, full - k);
      EXPECT(m == full - k && memcmp(c, a + k, (size_t)m * 4) == 0, "resume after %ld (shuffle %d): different records",
             k, shuf);
    }
  }
}

static void corrupt_copy(const char *src, const char *dst, long flip_at, long truncate_to) {
  FILE *f = fopen(src, "rb");
  static unsigned char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  if (flip_at >= 0) buf[flip_at] ^= 0x40;
  if (truncate_to >= 0) n = (size_t)truncate_to;
  f = fopen(dst, "wb");
  fwrite(buf, 1, n, f);
  fclose(f);
}

static void test_corrupt(void) {
  char src[300], bad[300];
  snprintf(src, sizeof src, "%s/part-1.rec", dir);
  snprintf(bad, sizeof bad, "%s/bad.rec", dir);
  /* record sizes of ids 75.. in part-1: find the offset of its 3rd record */
  unsigned char tmp[1504];
  long off3 = 0;
  for (uint32_t id = 75; id < 77; id++) off3 += 16 + (long)make_record(id, tmp);
  struct {
    long flip, trunc;
    const char *want;
    long skipped_records;
  } cases[] = {
      {off3 + 12 + 2, -1, "bad data checksum", 1},   /* data byte of record 2 */
      {off3 + 3, -1, "bad length checksum", 73},     /* length of record 2: rest of file lost */
      {-1, off3 + 20, "truncated", 73},              /* cut inside record 2 */
      {-1, off3 + 5, "truncated", 73},               /* cut inside the header of record 2 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    corrupt_copy(src, bad, cases[i].flip, cases[i].trunc);
    static uint32_t ids[NREC];
    ropts_t ro = {.pat = bad};
    long n = read_ids(&ro, ids, -1, NULL);
    EXPECT(n == -1, "case %zu: corrupt file read without error", i);
    char want_off[64];
    snprintf(want_off, sizeof want_off, "byte offset %ld", off3);
    const char *msg = hora_last_error();
    EXPECT(strstr(msg, cases[i].want) && strstr(msg, want_off) && strstr(msg, "bad.rec"),
           "case %zu: message '%s' lacks '%s', '%s' or the file name", i, msg, cases[i].want, want_off);
    uint64_t cnt;
    hora_result_t crc = hora_records_count(bad, &cnt);
    if (cases[i].flip >= 0 && strstr(cases[i].want, "data")) EXPECT(crc == HORA_SUCCESS && cnt == 75, "count of data-corrupt file");
    else EXPECT(crc == HORA_ERR_DATA, "count of a framing-corrupt file: %s", hora_result_name(crc));
    /* skip mode: everything else comes through and the corrupt record is counted */
    ro.skip_corrupt = 1;
    hora_records_reader_t *r = NULL;
    n = read_ids(&ro, ids, -1, &r);
    EXPECT(n == 75 - cases[i].skipped_records, "case %zu: skip mode read %ld", i, n);
    uint64_t corrupt = 0;
    if (r) EXPECT_OK(hora_records_reader_corrupt(r, &corrupt));
    EXPECT(corrupt == 1, "case %zu: corrupt count %llu", i, (unsigned long long)corrupt);
    hora_records_reader_close(r);
  }
  /* Several bad data checksums close together (the reader checks three records' CRCs at once):
   * records 1, 2 and 4 of part-1 (ids 76, 77, 79) flipped; skip mode delivers exactly the others
   * in order and counts 3; without skip mode the error names record 1's offset. */
  {
    static unsigned char img[1 << 20];
    FILE *f = fopen(src, "rb");
    size_t n = fread(img, 1, sizeof img, f);
    fclose(f);
    long off = 0, offs[8];
    for (uint32_t k = 0; k < 8; k++) {
      offs[k] = off;
      off += 16 + (long)make_record(75 + k, tmp);
    }
    img[offs[1] + 12 + 1] ^= 1;
    img[offs[2] + 12 + 5] ^= 2;
    img[offs[4] + 12 + 3] ^= 4;
    f = fopen(bad, "wb");
    fwrite(img, 1, n, f);
    fclose(f);
    static uint32_t ids[NREC];
    ropts_t ro = {.pat = bad};
    EXPECT(read_ids(&ro, ids, -1, NULL) == -1, "three corrupt records read without error");
    char want_off[64];
    snprintf(want_off, sizeof want_off, "byte offset %ld", offs[1]);
    EXPECT(strstr(hora_last_error(), want_off), "first bad record: '%s' lacks '%s'", hora_last_error(), want_off);
    ro.skip_corrupt = 1;
    hora_records_reader_t *r = NULL;
    long got = read_ids(&ro, ids, -1, &r);
    EXPECT(got == 72, "skip mode with three corrupt records read %ld", got);
    uint32_t want = 75;
    for (long k = 0; k < got; k++) {
      while (want == 76 || want == 77 || want == 79) want++;
      EXPECT(ids[k] == want, "skip mode record %ld: id %u, want %u", k, ids[k], want);
      want++;
    }
    uint64_t corrupt = 0;
    if (r) EXPECT_OK(hora_records_reader_corrupt(r, &corrupt));
    EXPECT(corrupt == 3, "three corrupt: count %llu", (unsigned long long)corrupt);
    hora_records_reader_close(r);
  }
  /* the error is sticky and HORA_ERR_DATA */
  corrupt_copy(src, bad, off3 + 14, -1);
  ropts_t ro = {.pat = bad};
  hora_records_reader_t *r = NULL;
  EXPECT_OK(open_reader(&ro, &r));
  const void *d;
  size_t len;
  int eof = 0;
  EXPECT_OK(hora_records_next(r, &d, &len, &eof));
  EXPECT_OK(hora_records_next(r, &d, &len, &eof));
  EXPECT_RC(hora_records_next(r, &d, &len, &eof), HORA_ERR_DATA);
  EXPECT_RC(hora_records_next(r, &d, &len, &eof), HORA_ERR_DATA);
  hora_records_reader_close(r);
}

static void test_big_and_errors(void) {
  char path[300];
  snprintf(path, sizeof path, "%s/big.rec", dir);
  size_t big = (3u << 20) + 17;
  unsigned char *p = malloc(big);
  for (size_t i = 0; i < big; i++) p[i] = (unsigned char)(i * 13);
  hora_records_writer_t *w = NULL;
  EXPECT_OK(hora_records_writer_open(path, &w));
  EXPECT_OK(hora_records_writer_write(w, "a", 1));
  EXPECT_OK(hora_records_writer_write(w, p, big));
  EXPECT_OK(hora_records_writer_write(w, "b", 1));
  EXPECT_OK(hora_records_writer_close(w));
  for (size_t shuf = 0; shuf < 3; shuf += 2) {
    ropts_t ro = {.pat = path, .shuffle = shuf};
    hora_records_reader_t *r = NULL;
    EXPECT_OK(open_reader(&ro, &r));
    const void *d;
    size_t len;
    int eof;
    int got_big = 0, small = 0;
    for (;;) {
      if (hora_records_next(r, &d, &len, &eof) != HORA_SUCCESS || eof) break;
      if (len == big) got_big += memcmp(d, p, big) == 0;
      else small += len == 1;
    }
    EXPECT(got_big == 1 && small == 2, "big record: %d intact, %d small (shuffle %zu)", got_big, small, shuf);
    hora_records_reader_close(r);
  }
  free(p);
  /* argument errors */
  char nomatch[300];
  snprintf(nomatch, sizeof nomatch, "%s/nothing-*.rec", dir);
  hora_records_reader_t *r = NULL;
  ropts_t ro = {.pat = nomatch};
  EXPECT_RC(open_reader(&ro, &r), HORA_ERR_NOT_FOUND);
  EXPECT(strstr(hora_last_error(), "nothing-*.rec") != NULL, "message: %s", hora_last_error());
  ro.pat = path;
  ro.rank = 2;
  ro.world = 2;
  EXPECT_RC(open_reader(&ro, &r), HORA_ERR_INVALID_ARGUMENT);
  ro.rank = 0;
  ro.world = 0;
  ro.epochs = 2;
  ro.start_epoch = 2;
  EXPECT_RC(open_reader(&ro, &r), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(r == NULL, "reader set on error");
  hora_records_reader_opts_t o = {0};
  o.size = 8;
  EXPECT_RC(hora_records_reader_open(&o, &r), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_records_reader_open(NULL, &r), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_OK(hora_records_reader_close(NULL));
  EXPECT_OK(hora_records_writer_close(NULL));
  EXPECT_RC(hora_records_writer_open("", &w), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_records_writer_open("/nonexistent-dir/x.rec", &w), HORA_ERR_IO);
  uint64_t c;
  EXPECT_RC(hora_records_count("/nonexistent-dir/x.rec", &c), HORA_ERR_IO);
  /* closing a reader that has not been drained (producer blocked on a full queue) */
  ropts_t ro2 = {.pat = path, .prefetch = 1, .epochs = 1000};
  EXPECT_OK(open_reader(&ro2, &r));
  const void *d;
  size_t len;
  int eof;
  EXPECT_OK(hora_records_next(r, &d, &len, &eof));
  usleep(20000);
  EXPECT_OK(hora_records_reader_close(r));
}

/* HORA_RECORDS_MMAP=on|auto: a file truncated by another process while the reader has it mapped
 * fails with HORA_ERR_IO naming the file, instead of the process dying of SIGBUS; records read
 * before the truncation are intact. Then: a SIGBUS outside the reader's mappings still ends the
 * process as before (the guard passes it on). */
static void test_truncated_while_mapped(void) {
  const char *mode = getenv("HORA_RECORDS_MMAP");
  if (mode && !strcmp(mode, "off")) return;
  char path[300];
  snprintf(path, sizeof path, "%s/cut.rec", dir);
  write_file(path, 0, 6000); /* about 4.5 MB, in the page cache: auto maps it too */
  ropts_t ro = {.pat = path, .prefetch = 8};
  hora_records_reader_t *r = NULL;
  EXPECT_OK(open_reader(&ro, &r));
  if (!r) return;
  const void *d;
  size_t len;
  int eof = 0;
  long n = 0, bad_before = 0, after = 0, bad_after = 0;
  hora_result_t rc = HORA_SUCCESS;
  for (; n < 100 && (rc = hora_records_next(r, &d, &len, &eof)) == HORA_SUCCESS && !eof; n++) {
    uint32_t id = 0;
    bad_before += !check_record(d, len, &id) || id != (uint32_t)n;
  }
  EXPECT(rc == HORA_SUCCESS && n == 100 && bad_before == 0, "before the cut: %ld records, %ld bad, rc %s", n,
         bad_before, hora_result_name(rc));
  EXPECT(truncate(path, 0) == 0, "truncate %s", path);
  for (; after < 6000; after++) {
    rc = hora_records_next(r, &d, &len, &eof);
    if (rc != HORA_SUCCESS || eof) break;
    uint32_t id = 0;
    bad_after += !check_record(d, len, &id); /* touches every byte: faults once the pages are gone */
  }
  EXPECT(rc == HORA_ERR_IO, "after the cut: %s after %ld more records (%ld bad), want HORA_ERR_IO",
         hora_result_name(rc), after, bad_after);
  EXPECT(strstr(hora_last_error(), "cut.rec") && strstr(hora_last_error(), "changed while"), "message: %s",
         hora_last_error());
  EXPECT(bad_after <= 1, "%ld records with wrong bytes were returned without an error", bad_after);
  EXPECT_OK(hora_records_reader_close(r));

  /* a SIGBUS that is not the reader's: the default action still ends the process */
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    char p2[300];
    snprintf(p2, sizeof p2, "%s/other.bin", dir);
    int fd = open(p2, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 1 << 16) != 0) _exit(3);
    volatile unsigned char *m = mmap(NULL, 1 << 16, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED || ftruncate(fd, 0) != 0) _exit(4);
    unsigned char x = m[100];
    _exit(x == 0 ? 5 : 6); /* not reached: the access raises SIGBUS */
  }
  int st = 0;
  EXPECT(pid > 0 && waitpid(pid, &st, 0) == pid, "fork/waitpid");
  /* SIGBUS, or SIGABRT when a sanitizer's handler was installed before ours (it reports, then
   * aborts): either way the guard handed the signal on and the process did not go on. */
  EXPECT(WIFSIGNALED(st) && (WTERMSIG(st) == SIGBUS || WTERMSIG(st) == SIGABRT),
         "a SIGBUS outside the reader's mappings: status 0x%x", st);
}

/* A file larger than the span after which a mapped reader drops the pages it has passed from its
 * page tables (64 MiB): every record intact, in order, before and after the drops. */
static void test_large_file(void) {
  char path[300];
  snprintf(path, sizeof path, "%s/large.rec", dir);
  enum { REC = 65536, N = 1100 }; /* 72 MB */
  unsigned char *buf = malloc(REC);
  hora_records_writer_t *w = NULL;
  EXPECT_OK(hora_records_writer_open(path, &w));
  for (uint32_t i = 0; i < N; i++) {
    for (size_t k = 0; k < REC; k += 4) memcpy(buf + k, &(uint32_t){i * 2654435761u + (uint32_t)k}, 4);
    EXPECT_OK(hora_records_writer_write(w, buf, REC - (i % 7)));
  }
  EXPECT_OK(hora_records_writer_close(w));
  ropts_t ro = {.pat = path};
  hora_records_reader_t *r = NULL;
  EXPECT_OK(open_reader(&ro, &r));
  long n = 0, bad = 0;
  for (;;) {
    const void *d;
    size_t len;
    int eof;
    if (hora_records_next(r, &d, &len, &eof) != HORA_SUCCESS || eof) break;
    for (size_t k = 0; k + 4 <= REC; k += 4) memcpy(buf + k, &(uint32_t){(uint32_t)n * 2654435761u + (uint32_t)k}, 4);
    bad += len != (size_t)(REC - (n % 7)) || memcmp(d, buf, len) != 0;
    n++;
  }
  EXPECT(n == N && bad == 0, "large file: %ld of %d records, %ld wrong", n, N, bad);
  hora_records_reader_close(r);
  unlink(path);
  free(buf);
}

int main(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/hora-test-records-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  for (int f = 0; f < 4; f++) {
    char p[300];
    snprintf(p, sizeof p, "%s/part-%d.rec", dir, f);
    write_file(p, (uint32_t)(f * NREC / 4), (uint32_t)((f + 1) * NREC / 4));
  }
  test_framing();
  test_order_and_sharding();
  test_shuffle_epochs_resume();
  test_corrupt();
  test_big_and_errors();
  test_truncated_while_mapped();
  test_large_file();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return hora_test_finish("test_records");
}
