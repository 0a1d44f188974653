/* The record reader's producer thread: for every epoch, the files in (shuffled) order, each read
 * in 1 MiB blocks or mapped, its framing and CRCs checked, this rank's records kept and handed to
 * the consumer as items (no shuffle) or through the shuffle slots; resume skips. Errors are stored
 * with fail() and reach the consumer after the items before them. See reader.c for the design. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fatal.h"
#include "data/reader.h"

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

/* One file being read: the block (or the mapping's item) the parser is in, and where. */
typedef struct {
  hora_records_reader_t *r;
  const char *path;
  int fd;
  int mapped;        /* the file is mapped (the items hold the mapping's references) */
  int at_eof;        /* blk holds the rest of the file: no more bytes to read */
  uint64_t size;     /* files must not grow while they are read */
  uint64_t file_off; /* file offset of blk->buf[pos] */
  size_t pos;
  item_t *blk;       /* NULL once handed to the consumer as a segment */
  size_t item_start, populated, prefetched;
  crc_batch_t batch;
} file_t;

/* What parse_one found at f->pos. */
enum { PARSED, INCOMPLETE, STOP };

/* Open, stat and (when HORA_RECORDS_MMAP allows) map `path`; the first block or view. */
static hora_result_t file_open(file_t *f) {
  hora_records_reader_t *r = f->r;
  f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) return fail(r, HORA_ERR_IO, "open %s: %s", f->path, strerror(errno));
  struct stat st;
  if (fstat(f->fd, &st) != 0) {
    close(f->fd);
    return fail(r, HORA_ERR_IO, "stat %s: %s", f->path, strerror(errno));
  }
  posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  f->size = (uint64_t)st.st_size;
  hora_map_t *map = NULL;
  if (r->mmap_mode != MMAP_OFF && f->size > 0 && f->size <= SIZE_MAX)
    map = hora__map_open(f->fd, (size_t)f->size, f->path, r->mmap_mode == MMAP_AUTO);
  /* Over a mapping the "block" is the whole file, already at its end: the parser never asks for
   * more bytes, and an incomplete record at the end is reported as truncated. */
  f->blk = map ? item_view(r, map) : item_get(r, BLOCK_BYTES);
  f->mapped = f->at_eof = map != NULL;
  if (map) hora__map_unref(map); /* the items hold it from here on */
  if (!f->blk) {
    close(f->fd);
    return fail(r, HORA_ERR_NO_MEMORY, "out of memory");
  }
  return HORA_SUCCESS;
}

/* From here the consumer parses and checks the mapped file itself, in the thread that uses the
 * records (hora_records_next): no hand-off per record, and the bytes are read once, into the cache
 * of the core that uses them. (Sharding by record needs the record count of every file and stays
 * here; so do the records a resume skips.) */
static int segment_ok(const file_t *f) {
  const hora_records_reader_t *r = f->r;
  return f->mapped && r->shuffle <= 1 && !r->by_record && !(r->epoch == r->start_epoch && r->emitted < r->skip);
}

static hora_result_t to_segment(file_t *f) {
  item_t *blk = f->blk;
  if (blk->nrec) /* not reached: records are kept only after the skip */
    return fail(f->r, HORA_ERR_INTERNAL, "records reader: %s: records before a segment", f->path);
  blk->seg = 1;
  blk->seg_start = blk->seg_populated = f->pos;
  /* Fill the page tables (and read what the page cache lacks) for the first DROP_SPAN of it here,
   * while the consumer is still busy with the previous item: that work then leaves the
   * consumer's core. */
  size_t pre = blk->used - f->pos < DROP_SPAN ? blk->used - f->pos : DROP_SPAN;
  if (hora__map_populate(blk->map, f->pos, pre)) blk->seg_populated = f->pos + pre;
  f->blk = NULL;
  return push(f->r, blk) ? HORA_SUCCESS : HORA_ERR_SHUTDOWN;
}

/* Over a mapping: keep the page tables and cache ahead of the parser, and hand over about 1 MiB
 * of records at a time, going on in a new item over the same mapping. */
static hora_result_t map_step(file_t *f) {
  hora_records_reader_t *r = f->r;
  hora_result_t rc = HORA_SUCCESS;
  map_ahead(f->blk, f->pos, &f->populated, &f->prefetched);
  if (r->shuffle <= 1 && f->blk->nrec && f->pos - f->item_start >= BLOCK_BYTES) {
    if (changed(r, f->blk->map, f->path, &rc)) return rc;
    item_t *nb = item_view(r, f->blk->map);
    if (!nb) return fail(r, HORA_ERR_NO_MEMORY, "out of memory");
    item_t *full = f->blk;
    f->blk = nb;
    f->item_start = f->pos;
    if (!push(r, full)) return HORA_ERR_SHUTDOWN;
  }
  return HORA_SUCCESS;
}

/* A corrupt record, skipped (the reader's skip_corrupt option): count it and say what happens. */
static void note_skipped(file_t *f, const char *what, const char *then) {
  atomic_fetch_add(&f->r->corrupt, 1);
  HORA_WARN(DATA, "%s: %s at byte offset %llu: %s", f->path, what, (unsigned long long)f->file_off, then);
}

/* Parse the record at f->pos: PARSED (passed on or skipped; pos moved past it), INCOMPLETE (*need
 * bytes from pos are needed and not all in the block), or STOP (*rc says why: an error, or
 * HORA_SUCCESS after a corrupt record that ends the file). */
static int parse_one(file_t *f, size_t *need, hora_result_t *rc) {
  hora_records_reader_t *r = f->r;
  item_t *blk = f->blk;
  size_t avail = blk->used - f->pos;
  *need = HORA_RECORD_HEADER_BYTES;
  if (avail < HORA_RECORD_HEADER_BYTES) return INCOMPLETE;
  uint64_t len, size = f->size, off = f->file_off;
  if (!hora__record_header_ok(blk->buf + f->pos, &len)) {
    if (changed(r, blk->map, f->path, rc)) return STOP;
    if (r->skip_corrupt) {
      note_skipped(f, "bad length checksum", "skipping the rest of the file");
      return STOP;
    }
    *rc = fail(r, HORA_ERR_DATA, "%s: bad length checksum of the record at byte offset %llu", f->path,
               (unsigned long long)off);
    return STOP;
  }
  if (off > size || len > size - off || size - off - len < HORA_RECORD_OVERHEAD_BYTES) {
    if (r->skip_corrupt) {
      note_skipped(f, "truncated record", "skipping it");
      return STOP;
    }
    *rc = fail(r, HORA_ERR_DATA, "%s: truncated record at byte offset %llu (length %llu, file has %llu bytes)",
               f->path, (unsigned long long)off, (unsigned long long)len, (unsigned long long)size);
    return STOP;
  }
  *need = HORA_RECORD_OVERHEAD_BYTES + (size_t)len;
  if (avail < *need) return INCOMPLETE;
  int mine = !r->by_record || r->global_index % (uint64_t)r->world == (uint64_t)r->rank;
  int crc_ok = mine && data_crc_ok(r, blk, f->pos, &f->batch);
  r->global_index++;
  if (mine) {
    if (!crc_ok) {
      if (changed(r, blk->map, f->path, rc)) return STOP;
      if (!r->skip_corrupt) {
        *rc = fail(r, HORA_ERR_DATA, "%s: bad data checksum of the record at byte offset %llu", f->path,
                   (unsigned long long)off);
        return STOP;
      }
      note_skipped(f, "bad data checksum", "skipping the record");
    } else if ((*rc = take(r, blk, f->pos + HORA_RECORD_HEADER_BYTES, (size_t)len)) != HORA_SUCCESS) {
      return STOP;
    }
  }
  f->pos += *need;
  f->file_off += *need;
  return PARSED;
}

/* The record at pos is incomplete and the file has no more bytes: a clean end (nothing left),
 * else a truncated record. */
static hora_result_t at_end(file_t *f) {
  hora_records_reader_t *r = f->r;
  hora_result_t rc = HORA_SUCCESS;
  size_t avail = f->blk->used - f->pos;
  if (avail == 0) return HORA_SUCCESS; /* clean end of file */
  if (changed(r, f->blk->map, f->path, &rc)) return rc;
  if (r->skip_corrupt) {
    note_skipped(f, "truncated record", "skipping it");
    return HORA_SUCCESS;
  }
  return fail(r, HORA_ERR_DATA, "%s: truncated record at byte offset %llu (%zu bytes left in the file)",
              f->path, (unsigned long long)f->file_off, avail);
}

/* The record at pos is incomplete in the block: carry the tail over into a block of at least
 * `need` bytes (a new one when this one holds records for the consumer) and read more. */
static hora_result_t refill(file_t *f, size_t need) {
  hora_records_reader_t *r = f->r;
  item_t *blk = f->blk;
  size_t avail = blk->used - f->pos;
  size_t cap = need > BLOCK_BYTES ? need : BLOCK_BYTES;
  if (r->shuffle <= 1 && blk->nrec > 0) {
    /* the block holds records for the consumer: send it and carry the tail over */
    item_t *nb = item_get(r, cap);
    if (!nb) return fail(r, HORA_ERR_NO_MEMORY, "out of memory");
    memcpy(nb->buf, blk->buf + f->pos, avail);
    nb->used = avail;
    f->blk = nb;
    if (!push(r, blk)) return HORA_ERR_SHUTDOWN;
  } else {
    memmove(blk->buf, blk->buf + f->pos, avail);
    blk->used = avail;
    blk->nrec = 0;
    if (blk->cap < cap) {
      unsigned char *b = realloc(blk->buf, cap);
      if (!b) return fail(r, HORA_ERR_NO_MEMORY, "out of memory for a %zu-byte record", need);
      blk->buf = b;
      blk->cap = cap;
    }
  }
  f->pos = 0;
  f->batch.n = f->batch.next = 0; /* positions were offsets in the old block */
  size_t got = 0;
  HORA_CHECK(read_more(r, f->fd, f->blk, f->path, &got));
  if (got == 0) f->at_eof = 1;
  return HORA_SUCCESS;
}

/* After the parse loop: hand over or release the last block. */
static hora_result_t file_done(file_t *f, hora_result_t rc) {
  hora_records_reader_t *r = f->r;
  item_t *blk = f->blk;
  close(f->fd);
  if (!blk) return rc; /* handed to the consumer as a segment */
  if (rc == HORA_SUCCESS && changed(r, blk->map, f->path, &rc)) {
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

/* Read `path`, checking framing, and pass this rank's records to take(). Blocks travel to the
 * consumer (no-shuffle mode) as soon as the parser needs bytes past their end; over a mapping,
 * every BLOCK_BYTES of the file. Read-ahead is the kernel's (POSIX_FADV_SEQUENTIAL). Explicit
 * POSIX_FADV_WILLNEED of 8 MiB windows ahead was tried: cold reads of 206 MB of shards went from
 * 0.92-0.95x to 0.84-0.89x of a plain sequential read with one rank, and from 1.00x to 0.80x with
 * 4 ranks (hora-bench records, docs/benchmarks.md). */
static hora_result_t read_file(hora_records_reader_t *r, const char *path) {
  file_t f = {.r = r, .path = path};
  f.batch.n = f.batch.next = 0;
  HORA_CHECK(file_open(&f));
  hora_result_t rc = HORA_SUCCESS;
  for (;;) {
    if (segment_ok(&f)) {
      rc = to_segment(&f);
      break;
    }
    if (f.mapped && (rc = map_step(&f)) != HORA_SUCCESS) break;
    size_t need;
    int st = parse_one(&f, &need, &rc);
    if (st == PARSED) continue;
    if (st == STOP) break;
    if (f.at_eof) {
      rc = at_end(&f);
      break;
    }
    if (stopping(r)) {
      rc = HORA_ERR_SHUTDOWN;
      break;
    }
    if ((rc = refill(&f, need)) != HORA_SUCCESS) break;
  }
  return file_done(&f, rc);
}

void *hora__records_producer(void *arg) {
  hora__thread_name("hora-records");
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
