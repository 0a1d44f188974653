/* Internal to runtime/data's record reader: the reader's state and the items its producer
 * (producer.c: the thread that reads, checks and shards record files) hands to its consumer
 * (reader.c: open, hora_records_next, close). See reader.c for the design. */
#ifndef HORA_DATA_READER_H
#define HORA_DATA_READER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

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
  unsigned fork_gen; /* hora__fork_watch() at open: the prefetch thread exists only there */

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

/* ---- items, shared by the producer and the consumer ---- */
static inline void item_free(item_t *it) {
  if (!it) return;
  if (it->map) hora__map_unref(it->map);
  else free(it->buf);
  free(it->recs);
  free(it);
}

static inline void item_release_locked(hora_records_reader_t *r, item_t *it) {
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
static inline void map_ahead(const item_t *it, size_t pos, size_t *populated, size_t *prefetched) {
  if (pos + POPULATE_BYTES / 2 > *populated && *populated < it->used) {
    if (!hora__map_populate(it->map, *populated, POPULATE_BYTES)) *populated = it->used; /* old kernel */
    *populated += POPULATE_BYTES;
  }
  size_t until = pos + PREFETCH_AHEAD < it->used ? pos + PREFETCH_AHEAD : it->used;
  if (*prefetched < pos) *prefetched = pos;
  for (; *prefetched < until; *prefetched += 64) __builtin_prefetch(it->buf + *prefetched);
}

/* The producer thread's body (producer.c): reads every epoch's files, pushes items, sets `done`. */
void *hora__records_producer(void *arg);

#endif
