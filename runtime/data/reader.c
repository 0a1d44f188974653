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

#include "core/fatal.h"
#include "core/fault.h"
#include "data/reader.h"

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
  r->fork_gen = hora__fork_watch();
  sigset_t old;
  hora__block_async_signals(&old);
  int prc = pthread_create(&r->thread, NULL, hora__records_producer, r);
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

/* A DataLoader worker (fork) iterating a reader its parent opened would wait forever for records
 * from a prefetch thread it does not have, or, had it one, read the same records as every other
 * worker. */
#define READER_FORK_FIX "open the reader in the process that reads it (in a PyTorch Dataset: in " \
  "__iter__, so that each DataLoader worker opens its own, with shard=(rank * workers + worker id, " \
  "size * workers))"

HORA_EXPORT hora_result_t hora_records_next(hora_records_reader_t *r, const void **data, size_t *len_bytes,
                                            int *eof) {
  if (!r || !data || !len_bytes || !eof)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_records_next: %s is NULL",
                    !r ? "reader" : !data ? "data" : !len_bytes ? "len_bytes" : "eof");
  HORA_CHECK(hora__fork_check(r->fork_gen, "hora_records_next", "the records reader", READER_FORK_FIX));
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
  HORA_CHECK(hora__fork_check(r->fork_gen, "hora_records_reader_close", "the records reader", READER_FORK_FIX));
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
