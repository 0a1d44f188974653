/* Record-file reader: a sharded, prefetching, optionally shuffling dataset over record files.
 *
 *   files (sorted glob matches)
 *     │  shard: file i -> rank i % W        (at least as many files as ranks)
 *     │     or record j -> rank j % W       (fewer files than ranks: every rank reads all)
 *     ▼
 *   producer thread: read 1 MiB blocks, or map the file ──► parse + check CRCs in place ──►
 *     │   keep this rank's records
 *     │   no shuffle: the block (or about 1 MiB of the mapping) becomes a queue item (records
 *     │               point into it: no copy)
 *     │   shuffle:    records are copied into a B-slot buffer; a random slot is emitted
 *     │               into an output item (one copy)
 *     │   mapped, by file, no shuffle: the rest of the file becomes one "segment" item at once;
 *     ▼               the consumer parses and checks it in hora_records_next
 *   bounded queue of items (about `prefetch` records)
 *     ▼
 *   hora_records_next(): pointer + length into the consumer's current item; the item goes back
 *   to the producer's free list when the consumer moves past it (so the pointer stays valid
 *   until the next call).
 *
 * Determinism: the order depends on (seed, epoch, rank) through a splitmix64 generator that is
 * reseeded at every epoch; the shuffle buffer is drained at the end of each epoch. Skipping
 * `skip_records` happens after shuffling, on the exact stream the consumer would have seen.
 *
 * Mapped or read: a file already in the page cache is mapped read-only (mapped.c; HORA_RECORDS_MMAP
 * decides), so the CRC check is the only pass over its bytes and the records handed out point
 * into the page cache; other files are read with read() into 1 MiB blocks, which keeps the
 * kernel's read-ahead for data on disk. Items over a mapping hold a reference to it. Segments
 * exist because a hand-off per 1 MiB item cost more than the parsing itself once the copy was
 * gone (hora-bench records warm, 1 rank: 0.70-0.75x of a plain read with the producer checking
 * the mapping, 0.88-1.0x with the consumer doing it), and because the consumer then reads bytes
 * its own core just checked. A file truncated while mapped fails with HORA_ERR_IO naming it
 * (mapped.c's SIGBUS guard).
 *
 * Ownership: the producer owns the block being filled, the shuffle slots and the output item
 * being filled; the queue and the free list are shared under `lock`; the consumer owns the item
 * it is reading. Errors in the producer are stored (code + message) and returned by the next
 * hora_records_next once the items before them are consumed. */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fault.h"
#include "data/records.h"

#define BLOCK_BYTES (1u << 20)
#define SHUFFLE_ITEM_RECORDS 64
#define FREE_LIST_MAX 4
#define DEFAULT_PREFETCH 256
/* Mapped files: fault pages in POPULATE_BYTES at a time ahead of the parser, and prefetch
 * PREFETCH_AHEAD bytes ahead into the cache (hardware prefetchers stop at page boundaries):
 * a single-thread probe of the mapped CRC pass went from 0.70x of a plain read without them to
 * 0.9-1.0x with them (8-16 KiB ahead best; 64 KiB worse). The pages the consumer has passed leave
 * the page tables DROP_SPAN at a time: each drop flushes the TLBs of every CPU this process runs
 * on. */
#define POPULATE_BYTES ((size_t)1 << 20)
#define PREFETCH_AHEAD 16384
#define DROP_SPAN ((size_t)64 << 20)

typedef struct item {
  unsigned char *buf; /* owned, or the base of `map` */
  size_t cap, used;   /* bytes allocated / filled (mapped: cap 0, used = the file's size) */
  hora_map_t *map;    /* a reference, when the records point into a mapped file */
  struct rec {
    size_t off, len;
  } *recs;
  size_t nrec, rec_cap;
  int seg;          /* a segment: the consumer parses map's bytes from seg_start to the end */
  size_t seg_start, seg_populated; /* page tables filled from seg_start to seg_populated */
  size_t queued;    /* what the item counts for in queued_records */
  uint64_t epoch;
  struct item *next;
} item_t;

typedef struct {
  unsigned char *buf;
  size_t cap, len;
} slot_t;

enum { MMAP_AUTO, MMAP_ON, MMAP_OFF };
enum { SEG_GOING, SEG_END, SEG_BAD_HEADER, SEG_TRUNCATED };

struct hora_records_reader {
  /* fixed after open */
  char **files; /* this rank's files (by file) or all files (by record) */
  size_t nfiles;
  int by_record, rank, world;
  size_t prefetch, shuffle;
  int mmap_mode; /* MMAP_AUTO, MMAP_ON or MMAP_OFF (HORA_RECORDS_MMAP) */
  uint64_t seed, epochs, start_epoch, skip;
  int skip_corrupt;

  pthread_t thread;
  int thread_started;
  pthread_mutex_t lock;
  pthread_cond_t cond; /* signalled on push, pop, release, stop, done */
  item_t *head, *tail; /* queue */
  size_t queued_records;
  item_t *free_list;
  size_t free_count;
  int stop, done;
  hora_result_t err;
  char err_msg[768];
  atomic_uint_fast64_t corrupt;

  /* producer state */
  uint64_t epoch, emitted; /* records emitted in this epoch (counting skipped ones) */
  uint64_t global_index;   /* record index over all files in this epoch (by-record sharding) */
  uint64_t rng;
  slot_t *slots;
  size_t nslots;
  item_t *out; /* shuffle mode: the output item being filled */

  /* consumer state */
  item_t *cur;
  size_t cur_i;
  struct {
    size_t pos;       /* file offset of the next record to parse */
    size_t populated; /* page tables filled up to here */
    size_t prefetched, dropped, last_ret;
    int stop;         /* a SEG_* below once parsing has stopped */
    struct rec q[3];  /* parsed records not yet returned, with their data CRC results */
    int ok[3], n, i;
  } seg;
  hora_result_t cons_err; /* a consumer-side error repeats on every later call */
  char cons_msg[640];
  uint64_t pos_epoch, pos_records;
  int eof_seen;
};

/* ---- random numbers: splitmix64 (Vigna), enough for shuffling and cheap to reseed ---- */
static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static uint64_t mix3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t s = a;
  uint64_t h = splitmix64(&s);
  s = h ^ b;
  h = splitmix64(&s);
  s = h ^ c;
  return splitmix64(&s);
}
/* Uniform-enough index in [0, n) (multiply-shift; the bias is below 2^-40 for our n). */
static size_t rand_below(uint64_t *s, size_t n) {
  return (size_t)(((unsigned __int128)splitmix64(s) * n) >> 64);
}

/* ---- items and the queue ---- */
static void item_free(item_t *it) {
  if (!it) return;
  if (it->map) hora__map_unref(it->map);
  else free(it->buf);
  free(it->recs);
  free(it);
}

/* A cleared item with at least `cap` bytes, from the free list if possible. */
static item_t *item_get(hora_records_reader_t *r, size_t cap) {
  pthread_mutex_lock(&r->lock);
  item_t *it = r->free_list;
  if (it) {
    r->free_list = it->next;
    r->free_count--;
  }
  pthread_mutex_unlock(&r->lock);
  if (!it && !(it = calloc(1, sizeof *it))) return NULL;
  it->next = NULL;
  it->used = it->nrec = 0;
  it->seg = 0;
  it->epoch = r->epoch;
  if (it->cap < cap) {
    unsigned char *b = realloc(it->buf, cap);
    if (!b) {
      item_free(it);
      return NULL;
    }
    it->buf = b;
    it->cap = cap;
  }
  return it;
}

static void item_release_locked(hora_records_reader_t *r, item_t *it) {
  if (it->map) {
    if (it->nrec) {
      /* pages the consumer is done with leave the page tables DROP_SPAN at a time */
      size_t lo = it->recs[0].off - HORA_RECORD_HEADER_BYTES;
      size_t hi = it->recs[it->nrec - 1].off + it->recs[it->nrec - 1].len + HORA_RECORD_FOOTER_BYTES;
      if (hi / DROP_SPAN > lo / DROP_SPAN) {
        size_t end = hi / DROP_SPAN * DROP_SPAN;
        hora__map_drop(it->map, end - DROP_SPAN, DROP_SPAN);
      }
    }
    hora__map_unref(it->map);
    it->map = NULL;
    it->buf = NULL;
    it->cap = 0;
  }
  if (r->free_count < FREE_LIST_MAX && it->cap <= 4 * (size_t)BLOCK_BYTES) {
    it->next = r->free_list;
    r->free_list = it;
    r->free_count++;
  } else {
    item_free(it);
  }
}

/* A parser at `pos` in the mapped item `it`: page tables filled ahead up to *populated
 * (POPULATE_BYTES at a time, half a window ahead), the cache lines of the next PREFETCH_AHEAD
 * bytes asked for up to *prefetched. */
static void map_ahead(const item_t *it, size_t pos, size_t *populated, size_t *prefetched) {
  if (pos + POPULATE_BYTES / 2 > *populated && *populated < it->used) {
    if (!hora__map_populate(it->map, *populated, POPULATE_BYTES)) *populated = it->used; /* old kernel */
    *populated += POPULATE_BYTES;
  }
  size_t until = pos + PREFETCH_AHEAD < it->used ? pos + PREFETCH_AHEAD : it->used;
  if (*prefetched < pos) *prefetched = pos;
  for (; *prefetched < until; *prefetched += 64) __builtin_prefetch(it->buf + *prefetched);
}

/* An item whose records point into the mapping `m` (offsets from the start of the file). */
static item_t *item_view(hora_records_reader_t *r, hora_map_t *m) {
  item_t *it = item_get(r, 0);
  if (!it) return NULL;
  free(it->buf);
  it->buf = (unsigned char *)hora__map_base(m); /* read-only: nothing writes through it */
  it->cap = 0;
  it->used = hora__map_len(m);
  it->map = m;
  hora__map_ref(m);
  return it;
}

static int item_add_rec(item_t *it, size_t off, size_t len) {
  if (it->nrec == it->rec_cap) {
    size_t nc = it->rec_cap ? 2 * it->rec_cap : 256;
    struct rec *n = realloc(it->recs, nc * sizeof *n);
    if (!n) return 0;
    it->recs = n;
    it->rec_cap = nc;
  }
  it->recs[it->nrec].off = off;
  it->recs[it->nrec].len = len;
  it->nrec++;
  return 1;
}

/* Hand an item to the consumer, waiting while the queue holds `prefetch` records or more.
 * Takes ownership of `it` in every case; returns 0 when the reader is stopping. */
static int push(hora_records_reader_t *r, item_t *it) {
  pthread_mutex_lock(&r->lock);
  while (!r->stop && r->head && r->queued_records >= r->prefetch) pthread_cond_wait(&r->cond, &r->lock);
  if (r->stop) {
    item_release_locked(r, it);
    pthread_mutex_unlock(&r->lock);
    return 0;
  }
  if (r->tail) r->tail->next = it;
  else r->head = it;
  r->tail = it;
  /* a segment counts as a full queue: one waits, one is read, one is being mapped */
  it->queued = it->seg ? r->prefetch : it->nrec;
  r->queued_records += it->queued;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
  return 1;
}

static int stopping(hora_records_reader_t *r) {
  pthread_mutex_lock(&r->lock);
  int s = r->stop;
  pthread_mutex_unlock(&r->lock);
  return s;
}

/* Producer-side error: remembered and reported once the consumer reaches it. */
static hora_result_t fail(hora_records_reader_t *r, hora_result_t rc, const char *fmt, ...)
    HORA_PRINTF(3, 4);
static hora_result_t fail(hora_records_reader_t *r, hora_result_t rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&r->lock);
  if (r->err == HORA_SUCCESS) {
    r->err = rc;
    vsnprintf(r->err_msg, sizeof r->err_msg, fmt, ap);
  }
  pthread_mutex_unlock(&r->lock);
  va_end(ap);
  return rc;
}

/* ---- the emitted stream: skip for resume, then into an item ---- */

/* Shuffle mode: copy one record into the output item, pushing it when full. */
static hora_result_t out_copy(hora_records_reader_t *r, const unsigned char *p, size_t len) {
  if (r->epoch == r->start_epoch && r->emitted < r->skip) {
    r->emitted++;
    return HORA_SUCCESS;
  }
  r->emitted++;
  if (r->out && (r->out->nrec >= SHUFFLE_ITEM_RECORDS || r->out->cap - r->out->used < len)) {
    if (r->out->cap - r->out->used < len && r->out->nrec == 0) {
      /* an empty item that is too small: grow it */
      unsigned char *b = realloc(r->out->buf, len);
      if (!b) return fail(r, HORA_ERR_NO_MEMORY, "out of memory for a %zu-byte record", len);
      r->out->buf = b;
      r->out->cap = len;
    } else {
      item_t *full = r->out;
      r->out = NULL;
      if (!push(r, full)) return HORA_ERR_SHUTDOWN;
    }
  }
  if (!r->out) {
    size_t want = (size_t)SHUFFLE_ITEM_RECORDS * len;
    if (want < 64 * 1024) want = 64 * 1024;
    if (want > BLOCK_BYTES) want = len > BLOCK_BYTES ? len : BLOCK_BYTES;
    if (!(r->out = item_get(r, want))) return fail(r, HORA_ERR_NO_MEMORY, "out of memory");
  }
  item_t *it = r->out;
  if (len) memcpy(it->buf + it->used, p, len);
  if (!item_add_rec(it, it->used, len)) return fail(r, HORA_ERR_NO_MEMORY, "out of memory");
  it->used += len;
  return HORA_SUCCESS;
}

static hora_result_t flush_out(hora_records_reader_t *r) {
  if (r->out && r->out->nrec) {
    item_t *full = r->out;
    r->out = NULL;
    if (!push(r, full)) return HORA_ERR_SHUTDOWN;
  }
  return HORA_SUCCESS;
}

/* One record of this rank, in read order. `blk` holds it at `off` (no-shuffle mode keeps it
 * there; shuffle mode copies it into a slot). */
static hora_result_t take(hora_records_reader_t *r, item_t *blk, size_t off, size_t len) {
  if (r->shuffle <= 1) {
    if (r->epoch == r->start_epoch && r->emitted < r->skip) {
      r->emitted++;
      return HORA_SUCCESS;
    }
    r->emitted++;
    if (!item_add_rec(blk, off, len)) return fail(r, HORA_ERR_NO_MEMORY, "out of memory");
    return HORA_SUCCESS;
  }
  slot_t *s;
  if (r->nslots < r->shuffle) {
    s = &r->slots[r->nslots++];
  } else {
    /* buffer full: emit a random slot, then refill it with the new record */
    s = &r->slots[rand_below(&r->rng, r->nslots)];
    hora_result_t rc = out_copy(r, s->buf, s->len);
    if (rc != HORA_SUCCESS) return rc;
  }
  if (s->cap < len) {
    unsigned char *b = realloc(s->buf, len);
    if (!b) return fail(r, HORA_ERR_NO_MEMORY, "out of memory for a %zu-byte record", len);
    s->buf = b;
    s->cap = len;
  }
  if (len) memcpy(s->buf, blk->buf + off, len);
  s->len = len;
  return HORA_SUCCESS;
}

/* End of epoch in shuffle mode: emit the remaining slots in random order. */
static hora_result_t drain(hora_records_reader_t *r) {
  while (r->nslots) {
    size_t j = rand_below(&r->rng, r->nslots);
    hora_result_t rc = out_copy(r, r->slots[j].buf, r->slots[j].len);
    if (rc != HORA_SUCCESS) return rc;
    slot_t t = r->slots[j];
    r->slots[j] = r->slots[r->nslots - 1];
    r->slots[r->nslots - 1] = t;
    r->nslots--;
  }
  return flush_out(r);
}

/* ---- reading one file ---- */

static hora_result_t read_more(hora_records_reader_t *r, int fd, item_t *blk, const char *path,
                               size_t *got) {
  ssize_t n;
  do n = read(fd, blk->buf + blk->used, blk->cap - blk->used);
  while (n < 0 && errno == EINTR);
  if (n < 0) return fail(r, HORA_ERR_IO, "read %s: %s", path, strerror(errno));
  blk->used += (size_t)n;
  *got = (size_t)n;
  return HORA_SUCCESS;
}

/* Data CRCs of the next records of this rank, three at a time: one record of a few hundred bytes
 * leaves the crc32 unit two thirds idle (its latency is three times its throughput), three
 * independent chains fill it. Positions are offsets in the current block. */
typedef struct {
  size_t pos[3];
  int ok[3];
  int n, next;
} crc_batch_t;

/* Fill `b` with up to three of this rank's records that lie whole in blk->buf from `pos` on, the
 * first being the one at `pos` (global record index `index`). Only lengths are read here: the
 * caller checks each header's CRC and bounds before it uses an entry, and a record after a bad
 * header is never reached. */
static void crc_batch_fill(const hora_records_reader_t *r, const item_t *blk, size_t pos, uint64_t index,
                           crc_batch_t *b) {
  const void *p[3];
  size_t n[3];
  const unsigned char *d[3];
  int k = 0;
  while (k < 3 && blk->used - pos >= HORA_RECORD_OVERHEAD_BYTES) {
    uint64_t len = hora__load_le64(blk->buf + pos);
    if (len > blk->used - pos - HORA_RECORD_OVERHEAD_BYTES) break;
    if (!r->by_record || index % (uint64_t)r->world == (uint64_t)r->rank) {
      b->pos[k] = pos;
      d[k] = blk->buf + pos + HORA_RECORD_HEADER_BYTES;
      p[k] = d[k];
      n[k] = (size_t)len;
      k++;
    }
    pos += HORA_RECORD_OVERHEAD_BYTES + (size_t)len;
    index++;
  }
  uint32_t c[3];
  if (k == 3) {
    hora__crc32c_x3(p, n, c);
  } else {
    for (int i = 0; i < k; i++) c[i] = hora__crc32c(0, p[i], n[i]);
  }
  for (int i = 0; i < k; i++) b->ok[i] = hora__load_le32(d[i] + n[i]) == hora__crc32c_mask(c[i]);
  b->n = k;
  b->next = 0;
}

/* Does the data CRC of this rank's record at `pos` (whole in the block, header checked) match? */
static int data_crc_ok(const hora_records_reader_t *r, const item_t *blk, size_t pos, crc_batch_t *b) {
  if (b->next >= b->n || b->pos[b->next] != pos) crc_batch_fill(r, blk, pos, r->global_index, b);
  if (b->next < b->n && b->pos[b->next] == pos) return b->ok[b->next++];
  /* not reachable for a whole record; checked alone all the same */
  uint64_t len = hora__load_le64(blk->buf + pos);
  const unsigned char *d = blk->buf + pos + HORA_RECORD_HEADER_BYTES;
  return hora__load_le32(d + len) == hora__masked_crc(d, (size_t)len);
}

/* A mapped file lost pages under the parser (truncated while mapped): the bytes it read from
 * them are zeros, so a bad checksum there is not the file's content. */
static int changed(hora_records_reader_t *r, const hora_map_t *map, const char *path, hora_result_t *rc) {
  if (!map || !hora__map_faulted(map)) return 0;
  *rc = fail(r, HORA_ERR_IO,
             "%s changed while it was being read (truncated or rewritten in place by another process?): "
             "replace record files by renaming a new file over them",
             path);
  return 1;
}

/* Read `path`, checking framing, and pass this rank's records to take(). Blocks travel to the
 * consumer (no-shuffle mode) as soon as the parser needs bytes past their end; over a mapping,
 * every BLOCK_BYTES of the file. */
static hora_result_t read_file(hora_records_reader_t *r, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(r, HORA_ERR_IO, "open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return fail(r, HORA_ERR_IO, "stat %s: %s", path, strerror(errno));
  }
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  uint64_t size = (uint64_t)st.st_size; /* files must not grow while they are read */
  uint64_t file_off = 0; /* file offset of blk->buf[pos] */
  size_t pos = 0;
  hora_result_t rc = HORA_SUCCESS;
  hora_map_t *map = NULL;
  if (r->mmap_mode != MMAP_OFF && size > 0 && size <= SIZE_MAX)
    map = hora__map_open(fd, (size_t)size, path, r->mmap_mode == MMAP_AUTO);
  /* Over a mapping the "block" is the whole file, already at its end: the parser never asks for
   * more bytes, and an incomplete record at the end is reported as truncated. */
  item_t *blk = map ? item_view(r, map) : item_get(r, BLOCK_BYTES);
  int at_eof = map != NULL;
  size_t item_start = 0, populated = 0, prefetched = 0;
  if (map) hora__map_unref(map); /* the items hold it from here on */
  if (!blk) {
    close(fd);
    return fail(r, HORA_ERR_NO_MEMORY, "out of memory");
  }
  crc_batch_t batch = {.n = 0, .next = 0};
  /* Read-ahead is the kernel's (POSIX_FADV_SEQUENTIAL above). Explicit POSIX_FADV_WILLNEED of
   * 8 MiB windows ahead was tried: cold reads of 206 MB of shards went from 0.92-0.95x to
   * 0.84-0.89x of a plain sequential read with one rank, and from 1.00x to 0.80x with 4 ranks
   * (hora-bench records, docs/benchmarks.md). */
  for (;;) {
    if (map && r->shuffle <= 1 && !r->by_record && !(r->epoch == r->start_epoch && r->emitted < r->skip)) {
      /* From here the consumer parses and checks the file itself, in the thread that uses the
       * records (hora_records_next): no hand-off per record, and the bytes are read once, into
       * the cache of the core that uses them. (Sharding by record needs the record count of
       * every file and stays here; so do the records a resume skips.) */
      if (blk->nrec) { /* not reached: records are kept only after the skip */
        rc = fail(r, HORA_ERR_INTERNAL, "records reader: %s: records before a segment", path);
        break;
      }
      blk->seg = 1;
      blk->seg_start = blk->seg_populated = pos;
      /* Fill the page tables (and read what the page cache lacks) for the first DROP_SPAN of it
       * here, while the consumer is still busy with the previous item: that work then leaves
       * the consumer's core. */
      size_t pre = blk->used - pos < DROP_SPAN ? blk->used - pos : DROP_SPAN;
      if (hora__map_populate(blk->map, pos, pre)) blk->seg_populated = pos + pre;
      item_t *seg = blk;
      blk = NULL;
      if (!push(r, seg)) rc = HORA_ERR_SHUTDOWN;
      break;
    }
    if (map) {
      map_ahead(blk, pos, &populated, &prefetched);
      if (r->shuffle <= 1 && blk->nrec && pos - item_start >= BLOCK_BYTES) {
        /* about 1 MiB of records: hand them over, go on in a new item over the same mapping */
        if (changed(r, blk->map, path, &rc)) break;
        item_t *nb = item_view(r, blk->map);
        if (!nb) {
          rc = fail(r, HORA_ERR_NO_MEMORY, "out of memory");
          break;
        }
        item_t *full = blk;
        blk = nb;
        item_start = pos;
        if (!push(r, full)) {
          rc = HORA_ERR_SHUTDOWN;
          break;
        }
      }
    }
    size_t avail = blk->used - pos;
    size_t need = HORA_RECORD_HEADER_BYTES;
    if (avail >= HORA_RECORD_HEADER_BYTES) {
      uint64_t len;
      if (!hora__record_header_ok(blk->buf + pos, &len)) {
        if (changed(r, blk->map, path, &rc)) break;
        if (r->skip_corrupt) {
          atomic_fetch_add(&r->corrupt, 1);
          HORA_WARN(DATA, "%s: bad length checksum at byte offset %llu: skipping the rest of the file",
                    path, (unsigned long long)file_off);
          break;
        }
        rc = fail(r, HORA_ERR_DATA, "%s: bad length checksum of the record at byte offset %llu", path,
                  (unsigned long long)file_off);
        break;
      }
      if (file_off > size || len > size - file_off || size - file_off - len < HORA_RECORD_OVERHEAD_BYTES) {
        if (r->skip_corrupt) {
          atomic_fetch_add(&r->corrupt, 1);
          HORA_WARN(DATA, "%s: truncated record at byte offset %llu: skipping it", path,
                    (unsigned long long)file_off);
          break;
        }
        rc = fail(r, HORA_ERR_DATA,
                  "%s: truncated record at byte offset %llu (length %llu, file has %llu bytes)", path,
                  (unsigned long long)file_off, (unsigned long long)len, (unsigned long long)size);
        break;
      }
      need = HORA_RECORD_OVERHEAD_BYTES + (size_t)len;
      if (avail >= need) {
        int mine = !r->by_record || r->global_index % (uint64_t)r->world == (uint64_t)r->rank;
        int crc_ok = mine && data_crc_ok(r, blk, pos, &batch);
        r->global_index++;
        if (mine) {
          if (!crc_ok) {
            if (changed(r, blk->map, path, &rc)) break;
            if (!r->skip_corrupt) {
              rc = fail(r, HORA_ERR_DATA, "%s: bad data checksum of the record at byte offset %llu",
                        path, (unsigned long long)file_off);
              break;
            }
            atomic_fetch_add(&r->corrupt, 1);
            HORA_WARN(DATA, "%s: bad data checksum at byte offset %llu: skipping the record", path,
                      (unsigned long long)file_off);
          } else if ((rc = take(r, blk, pos + HORA_RECORD_HEADER_BYTES, (size_t)len)) != HORA_SUCCESS) {
            break;
          }
        }
        pos += need;
        file_off += need;
        continue;
      }
    }
    /* The record at pos is incomplete in the block: get more bytes. */
    if (at_eof) {
      if (avail == 0) break; /* clean end of file */
      if (changed(r, blk->map, path, &rc)) break;
      if (r->skip_corrupt) {
        atomic_fetch_add(&r->corrupt, 1);
        HORA_WARN(DATA, "%s: truncated record at byte offset %llu: skipping it", path,
                  (unsigned long long)file_off);
        break;
      }
      rc = fail(r, HORA_ERR_DATA, "%s: truncated record at byte offset %llu (%zu bytes left in the file)",
                path, (unsigned long long)file_off, avail);
      break;
    }
    if (stopping(r)) {
      rc = HORA_ERR_SHUTDOWN;
      break;
    }
    size_t cap = need > BLOCK_BYTES ? need : BLOCK_BYTES;
    if (r->shuffle <= 1 && blk->nrec > 0) {
      /* the block holds records for the consumer: send it and carry the tail over */
      item_t *nb = item_get(r, cap);
      if (!nb) {
        rc = fail(r, HORA_ERR_NO_MEMORY, "out of memory");
        break;
      }
      memcpy(nb->buf, blk->buf + pos, avail);
      nb->used = avail;
      item_t *full = blk;
      blk = nb;
      if (!push(r, full)) {
        rc = HORA_ERR_SHUTDOWN;
        break;
      }
    } else {
      memmove(blk->buf, blk->buf + pos, avail);
      blk->used = avail;
      blk->nrec = 0;
      if (blk->cap < cap) {
        unsigned char *b = realloc(blk->buf, cap);
        if (!b) {
          rc = fail(r, HORA_ERR_NO_MEMORY, "out of memory for a %zu-byte record", need);
          break;
        }
        blk->buf = b;
        blk->cap = cap;
      }
    }
    pos = 0;
    batch.n = batch.next = 0; /* positions were offsets in the old block */
    size_t got = 0;
    if ((rc = read_more(r, fd, blk, path, &got)) != HORA_SUCCESS) break;
    if (got == 0) at_eof = 1;
  }
  close(fd);
  if (!blk) return rc; /* handed to the consumer as a segment */
  if (rc == HORA_SUCCESS && changed(r, blk->map, path, &rc)) {
    /* the file lost pages under the parser: its records are not handed out */
    pthread_mutex_lock(&r->lock);
    item_release_locked(r, blk);
    pthread_mutex_unlock(&r->lock);
    return rc;
  }
  /* Records parsed before an error still reach the consumer, then the error does. */
  if (rc != HORA_ERR_SHUTDOWN && r->shuffle <= 1 && blk->nrec > 0) {
    if (!push(r, blk)) rc = HORA_ERR_SHUTDOWN;
  } else {
    pthread_mutex_lock(&r->lock);
    item_release_locked(r, blk);
    pthread_mutex_unlock(&r->lock);
  }
  return rc;
}

static void *producer(void *arg) {
  hora_records_reader_t *r = arg;
  hora_result_t rc = HORA_SUCCESS;
  size_t *order = malloc((r->nfiles ? r->nfiles : 1) * sizeof *order);
  if (!order) rc = fail(r, HORA_ERR_NO_MEMORY, "out of memory");
  for (uint64_t e = r->start_epoch; rc == HORA_SUCCESS && e < r->epochs; e++) {
    r->epoch = e;
    r->emitted = 0;
    r->global_index = 0;
    /* By-record sharding needs the same file order on every rank: leave the rank out. */
    r->rng = mix3(r->seed, e, r->by_record ? 0xFFFFFFFFu : (uint64_t)r->rank);
    for (size_t i = 0; i < r->nfiles; i++) order[i] = i;
    if (r->shuffle > 1)
      for (size_t i = r->nfiles; i > 1; i--) {
        size_t j = rand_below(&r->rng, i);
        size_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
      }
    if (r->by_record) r->rng = mix3(r->seed, e, (uint64_t)r->rank);
    for (size_t i = 0; rc == HORA_SUCCESS && i < r->nfiles; i++) rc = read_file(r, r->files[order[i]]);
    if (rc == HORA_SUCCESS && r->shuffle > 1) rc = drain(r);
  }
  free(order);
  pthread_mutex_lock(&r->lock);
  r->done = 1;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
  return NULL;
}

/* ---- open / next / close ---- */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void reader_free(hora_records_reader_t *r) {
  for (size_t i = 0; i < r->nfiles; i++) free(r->files[i]);
  free(r->files);
  for (size_t i = 0; i < r->shuffle && r->slots; i++) free(r->slots[i].buf);
  free(r->slots);
  item_t *lists[2] = {r->head, r->free_list};
  for (int l = 0; l < 2; l++)
    for (item_t *it = lists[l], *n; it; it = n) {
      n = it->next;
      item_free(it);
    }
  item_free(r->cur);
  item_free(r->out);
  pthread_mutex_destroy(&r->lock);
  pthread_cond_destroy(&r->cond);
  free(r);
}

/* Expand the patterns into a sorted list without duplicates. */
static hora_result_t expand(const hora_records_reader_opts_t *o, char ***files, size_t *nfiles) {
  char **all = NULL;
  size_t n = 0, cap = 0;
  hora_result_t rc = HORA_SUCCESS;
  for (size_t p = 0; p < o->pattern_count; p++) {
    const char *pat = o->patterns[p];
    if (!pat || !*pat) {
      rc = HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_reader_open: patterns[%zu] is NULL or empty", p);
      goto fail;
    }
    glob_t g;
    int grc = glob(pat, 0, NULL, &g);
    if (grc == GLOB_NOMATCH) {
      globfree(&g);
      rc = HORA_ERR(HORA_ERR_NOT_FOUND, "hora_records_reader_open: no file matches '%s'", pat);
      goto fail;
    }
    if (grc != 0) {
      globfree(&g);
      rc = HORA_ERR(grc == GLOB_NOSPACE ? HORA_ERR_NO_MEMORY : HORA_ERR_IO,
                    "hora_records_reader_open: glob('%s') failed", pat);
      goto fail;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
      struct stat st;
      if (stat(g.gl_pathv[i], &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_reader_open: '%s' (from '%s') is not a regular file",
                      g.gl_pathv[i], pat);
        globfree(&g);
        goto fail;
      }
      if (n == cap) {
        size_t nc = cap ? 2 * cap : 16;
        char **na = realloc(all, nc * sizeof *na);
        if (!na) {
          globfree(&g);
          rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
          goto fail;
        }
        all = na;
        cap = nc;
      }
      if (!(all[n] = strdup(g.gl_pathv[i]))) {
        globfree(&g);
        rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
        goto fail;
      }
      n++;
    }
    globfree(&g);
  }
  qsort(all, n, sizeof *all, cmp_str);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (k && strcmp(all[k - 1], all[i]) == 0) free(all[i]);
    else all[k++] = all[i];
  }
  *files = all;
  *nfiles = k;
  return HORA_SUCCESS;
fail:
  for (size_t i = 0; i < n; i++) free(all[i]);
  free(all);
  return rc;
}

HORA_EXPORT hora_result_t hora_records_reader_open(const hora_records_reader_opts_t *o,
                                                   hora_records_reader_t **out) {
  if (!o || !out)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_reader_open: %s is NULL", !o ? "opts" : "reader");
  if (o->size < offsetof(hora_records_reader_opts_t, skip_corrupt) + sizeof(int))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                    "hora_records_reader_open: opts->size=%zu is too small: set it to sizeof(hora_records_reader_opts_t)",
                    o->size);
  if (!o->patterns || o->pattern_count == 0)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_reader_open: no file patterns given");
  int rank = 0, world = 1;
  if (o->world_size < 0)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_reader_open: world_size=%d is negative", o->world_size);
  if (o->world_size > 0) {
    rank = o->rank;
    world = o->world_size;
    if (rank < 0 || rank >= world)
      return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_reader_open: rank=%d is outside [0, %d)", rank, world);
  } else if (o->ctx) {
    HORA_CHECK(hora_rank(o->ctx, &rank));
    HORA_CHECK(hora_size(o->ctx, &world));
  }
  HORA_CHECK(hora__fault_hit("reader", rank));
  uint64_t epochs = o->epochs ? o->epochs : 1;
  if (o->start_epoch >= epochs)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_reader_open: start_epoch=%llu but epochs=%llu",
                    (unsigned long long)o->start_epoch, (unsigned long long)epochs);

  hora_records_reader_t *r = calloc(1, sizeof *r);
  if (!r) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  r->rank = rank;
  r->world = world;
  r->prefetch = o->prefetch ? o->prefetch : DEFAULT_PREFETCH;
  r->shuffle = o->shuffle_buffer > 1 ? o->shuffle_buffer : 0;
  r->seed = o->seed;
  r->epochs = epochs;
  r->start_epoch = o->start_epoch;
  r->skip = o->skip_records;
  r->skip_corrupt = o->skip_corrupt != 0;
  const char *mm = hora__params()->records_mmap;
  r->mmap_mode = !strcmp(mm, "on") ? MMAP_ON : !strcmp(mm, "off") ? MMAP_OFF : MMAP_AUTO;
  r->pos_epoch = o->start_epoch;
  r->pos_records = o->skip_records;
  atomic_init(&r->corrupt, 0);

  char **all = NULL;
  size_t n = 0;
  hora_result_t rc = expand(o, &all, &n);
  if (rc != HORA_SUCCESS) {
    reader_free(r);
    return rc;
  }
  if (n >= (size_t)world) {
    /* by file: keep files i with i % world == rank */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
      if (i % (size_t)world == (size_t)rank) all[k++] = all[i];
      else free(all[i]);
    }
    r->files = all;
    r->nfiles = k;
  } else {
    r->by_record = 1;
    r->files = all;
    r->nfiles = n;
  }
  if (r->shuffle && !(r->slots = calloc(r->shuffle, sizeof *r->slots))) {
    reader_free(r);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_records_reader_open: out of memory for a %zu-record shuffle buffer",
                    o->shuffle_buffer);
  }
  /* The thread blocks every signal so that process-directed signals (Slurm's SIGUSR1/SIGTERM)
   * go to the application's threads, except the ones a fault raises: a blocked SIGBUS from a
   * fault would end the process without running mapped.c's guard. */
  sigset_t blocked, old;
  sigfillset(&blocked);
  sigdelset(&blocked, SIGBUS);
  sigdelset(&blocked, SIGSEGV);
  sigdelset(&blocked, SIGFPE);
  sigdelset(&blocked, SIGILL);
  pthread_sigmask(SIG_SETMASK, &blocked, &old);
  int prc = pthread_create(&r->thread, NULL, producer, r);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (prc != 0) {
    reader_free(r);
    return HORA_ERR(HORA_ERR_IO, "hora_records_reader_open: cannot start the prefetch thread: %s", strerror(prc));
  }
  r->thread_started = 1;
  HORA_INFO(DATA, "records reader: rank %d/%d, %zu file%s, sharded by %s, prefetch %zu, shuffle %zu", rank,
            world, r->nfiles, r->nfiles == 1 ? "" : "s", r->by_record ? "record" : "file", r->prefetch,
            r->shuffle);
  *out = r;
  return HORA_SUCCESS;
}

/* Segment items: parse up to three of the next records from r->seg.pos (the file is whole in the
 * mapping), check their data CRCs at once, and keep the page tables filled ahead of the parser
 * and emptied behind the records returned. Stops at the end of the file, a bad header or a
 * truncated record (r->seg.stop); the records before the stop are returned first. */
static void seg_fill(hora_records_reader_t *r, const item_t *it) {
  const hora_map_t *m = it->map;
  const unsigned char *b = it->buf;
  size_t size = it->used;
  if (r->seg.last_ret / DROP_SPAN * DROP_SPAN > r->seg.dropped) {
    size_t to = r->seg.last_ret / DROP_SPAN * DROP_SPAN;
    hora__map_drop(m, r->seg.dropped, to - r->seg.dropped);
    r->seg.dropped = to;
  }
  r->seg.n = r->seg.i = 0;
  const void *p[3];
  size_t n[3];
  while (r->seg.n < 3) {
    size_t pos = r->seg.pos;
    map_ahead(it, pos, &r->seg.populated, &r->seg.prefetched);
    if (pos == size) {
      r->seg.stop = SEG_END;
      break;
    }
    uint64_t len;
    if (size - pos < HORA_RECORD_HEADER_BYTES) {
      r->seg.stop = SEG_TRUNCATED;
      break;
    }
    if (!hora__record_header_ok(b + pos, &len)) {
      r->seg.stop = SEG_BAD_HEADER;
      break;
    }
    if (size - pos < HORA_RECORD_OVERHEAD_BYTES || len > size - pos - HORA_RECORD_OVERHEAD_BYTES) {
      r->seg.stop = SEG_TRUNCATED;
      break;
    }
    int k = r->seg.n++;
    r->seg.q[k].off = pos + HORA_RECORD_HEADER_BYTES;
    r->seg.q[k].len = (size_t)len;
    p[k] = b + r->seg.q[k].off;
    n[k] = (size_t)len;
    r->seg.pos = pos + HORA_RECORD_OVERHEAD_BYTES + (size_t)len;
  }
  uint32_t c[3];
  if (r->seg.n == 3) hora__crc32c_x3(p, n, c);
  else
    for (int j = 0; j < r->seg.n; j++) c[j] = hora__crc32c(0, p[j], n[j]);
  for (int j = 0; j < r->seg.n; j++)
    r->seg.ok[j] = hora__load_le32((const unsigned char *)p[j] + n[j]) == hora__crc32c_mask(c[j]);
}

static hora_result_t consumer_fail(hora_records_reader_t *r, hora_result_t rc, const char *fmt, ...)
    HORA_PRINTF(3, 4);
static hora_result_t consumer_fail(hora_records_reader_t *r, hora_result_t rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->cons_msg, sizeof r->cons_msg, fmt, ap);
  va_end(ap);
  r->cons_err = rc;
  return HORA_ERR(rc, "%s", r->cons_msg);
}

/* Hand record `rec` of `it` to the caller and count it in the resume position. */
static hora_result_t give(hora_records_reader_t *r, const item_t *it, struct rec rec, const void **data,
                          size_t *len_bytes, int *eof) {
  if (it->epoch != r->pos_epoch) {
    r->pos_epoch = it->epoch;
    r->pos_records = 0;
  }
  r->pos_records++;
  *data = it->buf + rec.off;
  *len_bytes = rec.len;
  *eof = 0;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_records_next(hora_records_reader_t *r, const void **data, size_t *len_bytes,
                                            int *eof) {
  if (!r || !data || !len_bytes || !eof)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_next: %s is NULL",
                    !r ? "reader" : !data ? "data" : !len_bytes ? "len_bytes" : "eof");
  if (r->cons_err != HORA_SUCCESS) return HORA_ERR(r->cons_err, "%s", r->cons_msg);
  for (;;) {
    int cur_done = !r->cur || (r->cur->seg ? r->seg.stop == SEG_END && r->seg.i == r->seg.n : r->cur_i >= r->cur->nrec);
    if (cur_done) {
      pthread_mutex_lock(&r->lock);
      if (r->cur) {
        item_release_locked(r, r->cur);
        r->cur = NULL;
      }
      for (;;) {
        while (!r->head && !r->done) pthread_cond_wait(&r->cond, &r->lock);
        if (!r->head || r->head->nrec || r->head->seg) break;
        item_t *empty = r->head; /* never pushed today; handled so that the consumer cannot misread */
        r->head = empty->next;
        if (!r->head) r->tail = NULL;
        item_release_locked(r, empty);
      }
      if (!r->head) {
        hora_result_t err = r->err;
        pthread_mutex_unlock(&r->lock);
        if (err != HORA_SUCCESS) return HORA_ERR(err, "%s", r->err_msg);
        *data = NULL;
        *len_bytes = 0;
        *eof = 1;
        return HORA_SUCCESS;
      }
      r->cur = r->head;
      r->head = r->cur->next;
      if (!r->head) r->tail = NULL;
      r->queued_records -= r->cur->queued;
      r->cur_i = 0;
      if (r->cur->seg) {
        memset(&r->seg, 0, sizeof r->seg);
        r->seg.pos = r->seg.prefetched = r->seg.last_ret = r->cur->seg_start;
        r->seg.populated = r->cur->seg_populated;
        r->seg.dropped = r->cur->seg_start / DROP_SPAN * DROP_SPAN;
      }
      pthread_cond_broadcast(&r->cond);
      pthread_mutex_unlock(&r->lock);
    }
    item_t *it = r->cur;
    if (it->map && hora__map_faulted(it->map))
      return consumer_fail(r, HORA_ERR_IO,
                           "hora_records_next: %s changed while it was being read (truncated or rewritten in place "
                           "by another process?); the record returned before this call may hold zeros instead of "
                           "its bytes",
                           hora__map_path(it->map));
    if (it->seg) {
      if (r->seg.i == r->seg.n) {
        if (r->seg.stop == SEG_GOING) {
          seg_fill(r, it);
          continue;
        }
        if (r->seg.stop == SEG_END) continue; /* next item */
        if (hora__map_faulted(it->map)) continue; /* reported above */
        /* a bad header or a truncated record: the rest of the file is unreadable */
        unsigned long long at = (unsigned long long)r->seg.pos;
        const char *what = r->seg.stop == SEG_BAD_HEADER ? "bad length checksum of" : "truncated";
        if (!r->skip_corrupt)
          return consumer_fail(r, HORA_ERR_DATA, "%s: %s record at byte offset %llu (file has %zu bytes)",
                               hora__map_path(it->map), what, at, it->used);
        atomic_fetch_add(&r->corrupt, 1);
        HORA_WARN(DATA, "%s: %s record at byte offset %llu: skipping the rest of the file", hora__map_path(it->map),
                  what, at);
        r->seg.stop = SEG_END;
        continue;
      }
      int k = r->seg.i++;
      if (!r->seg.ok[k]) {
        if (hora__map_faulted(it->map)) continue; /* reported above */
        unsigned long long at = (unsigned long long)(r->seg.q[k].off - HORA_RECORD_HEADER_BYTES);
        if (!r->skip_corrupt)
          return consumer_fail(r, HORA_ERR_DATA, "%s: bad data checksum of the record at byte offset %llu",
                               hora__map_path(it->map), at);
        atomic_fetch_add(&r->corrupt, 1);
        HORA_WARN(DATA, "%s: bad data checksum at byte offset %llu: skipping the record", hora__map_path(it->map), at);
        continue;
      }
      r->seg.last_ret = r->seg.q[k].off - HORA_RECORD_HEADER_BYTES;
      return give(r, it, r->seg.q[k], data, len_bytes, eof);
    }
    return give(r, it, it->recs[r->cur_i++], data, len_bytes, eof);
  }
}

HORA_EXPORT hora_result_t hora_records_reader_position(hora_records_reader_t *r, uint64_t *epoch,
                                                       uint64_t *records) {
  if (!r || !epoch || !records)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_reader_position: NULL argument");
  *epoch = r->pos_epoch;
  *records = r->pos_records;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_records_reader_corrupt(hora_records_reader_t *r, uint64_t *count) {
  if (!r || !count) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_reader_corrupt: NULL argument");
  *count = atomic_load(&r->corrupt);
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_records_reader_close(hora_records_reader_t *r) {
  if (!r) return HORA_SUCCESS;
  if (r->thread_started) {
    pthread_mutex_lock(&r->lock);
    r->stop = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->thread, NULL);
  }
  reader_free(r);
  return HORA_SUCCESS;
}
