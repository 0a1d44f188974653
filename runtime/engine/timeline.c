/* The timeline (HORA_TIMELINE): a Chrome trace written by rank 0, loadable in Perfetto and
 * chrome://tracing (format: "Trace Event Format", a JSON array of events; Horovod's timeline is
 * the model, and its names are used where hora has the same thing, so that tools reading
 * Horovod's timelines read hora's). One row (thread) per tensor, named by a thread_name metadata
 * event (hora.torch names requests "allreduce.<name>" as Horovod does); each phase of a request is
 * one complete event ("ph":"X", microseconds since the file was opened, whose wall-clock time
 * is the process_name event's start_time_since_epoch_in_micros, as in Horovod's):
 *
 *   allreduce.fc1 |QUEUE|NEGOTIATE_ALLREDUCE|MEMCPY_IN_FUSION_BUFFER|ALLREDUCE|MEMCPY_OUT_FUSION_BUFFER|
 *   cycles        ^ CYCLE_START (instant event, args.cycle; only for cycles that ran something)
 *
 * MEMCPY_* appear only for tensors that went through the fusion buffer. A fused group that the
 * shared-memory algorithm reduces in place of its tensors (one node, engine/fusion.c) has no
 * copies: its tensors show QUEUE, NEGOTIATE and one ALLREDUCE covering the whole group.
 *
 * Size cap: a long run must not grow the file to gigabytes (Horovod #603). Once the next event
 * would pass HORA_TIMELINE_MAX_BYTES, events are dropped and counted; the closing metadata
 * event reports the count.
 *
 * The file under its final name is a complete JSON array from the start of the recording to its
 * end, so that it can be opened while the job runs, and after the job was killed or hung: the
 * case a timeline is most needed for (Horovod's file, too, grows while it records). It is made
 * under a temporary name next to the final one (".tmp-<name>.<16 random hex digits>", created with
 * O_EXCL|O_NOFOLLOW in a directory that passed the shared-node check of core/safefs.h, mode
 * HORA_FILE_MODE), holding "[", the process_name event and "]", and renamed to the final name at
 * once. Events then collect in a 64 KiB buffer; a flush (buffer full, TL_FLUSH_S after the
 * previous one with events waiting, hora__timeline_poll from the engine's loop and waits, or the
 * end) writes them in one pwrite over the closing "\n]\n", followed by a new "\n]\n", so every
 * write leaves a complete array. A write that fails (disk full) is undone (truncated, the closing
 * bracket put back), later events are dropped, and the end reports HORA_ERR_IO: the file keeps
 * the events written before. Strings are escaped by jansson.
 *
 * Started at hora_init from HORA_TIMELINE, or at any time by hora_timeline_start (Horovod's
 * hvd.start_timeline), which may also move it to a new file; hora_timeline_stop closes it. The
 * engine thread writes events under eng->tl_mu, the only lock the switch needs, so starting or
 * stopping never waits for a cycle. */
#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/safefs.h"
#include "engine/engine.h"

typedef struct tl_name {
  char *name;
  int id;
  struct tl_name *next;
} tl_name_t;

/* The file is written through our own buffer and write(2), not stdio: a fork() child of rank 0
 * that ends with exit() flushes every stdio stream it inherited, and would append a second copy
 * of whatever the parent had not written yet. */
#define TL_FLUSH_S 1.0 /* events wait at most this long in the buffer while the engine runs */
#define TL_CLOSE "\n]\n"
struct eng_timeline {
  int fd;
  int werr;          /* errno of the first failed write (the rest are dropped), or 0 */
  uint64_t flen;     /* bytes in the file: a complete array ending with TL_CLOSE */
  double last_flush; /* hora__now_s() of the last flush */
  uint64_t nbuf;     /* events in buf (counted as dropped if their write fails) */
  size_t blen;
  char buf[(1 << 16) + 4]; /* events, then room for TL_CLOSE */
  char *path, *tmp; /* tmp: dir/tmpname, for messages */
  int dirfd;        /* the checked directory of path (core/safefs.h) */
  char dir[4096], base[256], tmpname[320];
  uint64_t max_bytes, bytes, dropped;
  double t0;
  tl_name_t *b[1024];
  int next_id;
  int mark_cycles; /* CYCLE instant events (HORA_TIMELINE_MARK_CYCLES, or hora_timeline_start's flag) */
};

/* Write the buffered events over the file's closing bracket, with a new one after them. */
static void tl_flush(eng_timeline_t *t) {
  t->last_flush = hora__now_s();
  if (t->blen == 0 || t->werr) {
    t->blen = 0;
    return;
  }
  memcpy(t->buf + t->blen, TL_CLOSE, 3);
  size_t n = t->blen + 3, done = 0;
  off_t at = (off_t)(t->flen - 3);
  while (done < n) {
    ssize_t w = pwrite(t->fd, t->buf + done, n - done, at + (off_t)done);
    if (w > 0) done += (size_t)w;
    else if (w < 0 && errno == EINTR) continue;
    else {
      t->werr = w < 0 ? errno : EIO;
      /* Undo: the file as it was (the bracket's blocks are allocated, so this write fits). */
      int undone = pwrite(t->fd, TL_CLOSE, 3, at) == 3 && ftruncate(t->fd, (off_t)t->flen) == 0;
      if (!undone)
        HORA_WARN(ENGINE, "timeline %s: a failed write (%s) could not be undone: its end may be torn", t->path,
                  strerror(t->werr));
      t->dropped += t->nbuf;
      t->nbuf = 0;
      t->blen = 0;
      return;
    }
  }
  t->flen = (uint64_t)at + n;
  t->blen = 0;
  t->nbuf = 0;
}

/* Append text that fits (callers make room with tl_room). */
static void tl_put(eng_timeline_t *t, const char *s, size_t n) {
  memcpy(t->buf + t->blen, s, n);
  t->blen += n;
}

/* Only whole events go to the file: flush first when `n` more bytes would not fit. */
static void tl_room(eng_timeline_t *t, size_t n) {
  if (t->blen + n > sizeof t->buf - 4) tl_flush(t);
}

static void emit(eng_timeline_t *t, const char *s, size_t n) {
  /* 160 bytes stay for the closing event and bracket. After a failed write nothing more is
   * written (the file keeps what it had). */
  if (t->werr || t->bytes + n + 2 + 160 > t->max_bytes) {
    t->dropped++;
    return;
  }
  tl_room(t, n + 2);
  t->nbuf++;
  tl_put(t, ",\n", 2); /* the process_name event is always first, written at open */
  tl_put(t, s, n);
  t->bytes += n + 2;
}

/* JSON text of a string (with quotes), or NULL. */
static char *jstr(const char *s) {
  json_t *j = json_string(s);
  if (!j) return NULL;
  char *out = json_dumps(j, JSON_ENCODE_ANY);
  json_decref(j);
  return out;
}

static int tensor_id(eng_timeline_t *t, const char *name) {
  size_t k = (size_t)(hora__eng_hash(name, strlen(name)) % 1024);
  for (tl_name_t *x = t->b[k]; x; x = x->next)
    if (strcmp(x->name, name) == 0) return x->id;
  tl_name_t *x = calloc(1, sizeof *x);
  if (!x || !(x->name = strdup(name))) {
    free(x);
    return 0;
  }
  x->id = ++t->next_id;
  x->next = t->b[k];
  t->b[k] = x;
  char *js = jstr(name);
  if (js) {
    char ev[1200];
    int n = snprintf(ev, sizeof ev, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{\"name\":%s}}",
                     x->id, js);
    if (n > 0 && (size_t)n < sizeof ev) emit(t, ev, (size_t)n);
    free(js);
  }
  return x->id;
}

hora_result_t hora__timeline_open(const char *what, const char *path, uint64_t max_bytes, int mark_cycles,
                                  eng_timeline_t **out) {
  eng_timeline_t *t = calloc(1, sizeof *t);
  if (!t) return HORA_ERR(HORA_ERR_NO_MEMORY, "timeline: out of memory");
  t->dirfd = -1;
  t->path = strdup(path);
  size_t n = strlen(path) + 340;
  t->tmp = malloc(n);
  hora_result_t rc = (!t->path || !t->tmp) ? HORA_ERR(HORA_ERR_NO_MEMORY, "timeline: out of memory") : HORA_SUCCESS;
  /* The directory is checked (owner, mode, symlinks: core/safefs.h); the temporary file is
   * created in it with openat(O_EXCL|O_NOFOLLOW) under an unpredictable name, mode 0600. */
  if (rc == HORA_SUCCESS) rc = hora__path_split(path, t->dir, sizeof t->dir, t->base, sizeof t->base);
  if (rc == HORA_SUCCESS) {
    rc = hora__dir_open(t->dir, 0, &t->dirfd);
    if (rc == HORA_ERR_NOT_FOUND) rc = HORA_ERR(HORA_ERR_IO, "%s: %s: no such directory", what, t->dir);
  }
  int fd = -1;
  if (rc == HORA_SUCCESS)
    rc = hora__file_create_tmp(t->dirfd, t->dir, t->base, O_WRONLY, t->tmpname, sizeof t->tmpname, &fd);
  if (rc == HORA_SUCCESS) {
    snprintf(t->tmp, n, "%s/%s", t->dir, t->tmpname);
    t->fd = fd;
    /* The first complete array ("[", the process_name event, "]"), then the final name. */
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    char head[300];
    int hn = snprintf(head, sizeof head,
                      "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"hora rank 0\","
                      "\"start_time_since_epoch_in_micros\":%lld}}" TL_CLOSE,
                      (long long)wall.tv_sec * 1000000LL + wall.tv_nsec / 1000);
    ssize_t w = pwrite(fd, head, (size_t)hn, 0);
    if (w != hn) rc = HORA_ERR(HORA_ERR_IO, "%s: write %s: %s", what, t->tmp, w < 0 ? strerror(errno) : "short write");
    if (rc == HORA_SUCCESS) rc = hora__file_commit(t->dirfd, t->dir, t->tmpname, t->base);
    if (rc != HORA_SUCCESS) {
      close(fd);
      unlinkat(t->dirfd, t->tmpname, 0);
    }
    t->flen = (uint64_t)hn;
    t->bytes = (uint64_t)hn;
  }
  if (rc != HORA_SUCCESS) {
    if (t->dirfd >= 0) close(t->dirfd);
    free(t->path);
    free(t->tmp);
    free(t);
    return rc;
  }
  t->max_bytes = max_bytes;
  t->mark_cycles = mark_cycles != 0;
  t->t0 = hora__now_s();
  t->last_flush = t->t0;
  *out = t;
  return HORA_SUCCESS;
}

void hora__timeline_poll(hora_engine_t *eng) {
  if (!__atomic_load_n(&eng->tl, __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&eng->tl_mu);
  eng_timeline_t *t = eng->tl;
  if (t && t->blen && hora__now_s() - t->last_flush >= TL_FLUSH_S) tl_flush(t);
  pthread_mutex_unlock(&eng->tl_mu);
}

void hora__timeline_span(eng_timeline_t *t, const char *tensor, const char *phase, double t0, double t1) {
  if (!t) return;
  int id = tensor_id(t, tensor);
  char ev[256];
  double ts = (t0 - t->t0) * 1e6, dur = (t1 - t0) * 1e6;
  if (dur < 0) dur = 0;
  int n = snprintf(ev, sizeof ev, "{\"name\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
                   phase, id, ts, dur);
  if (n > 0 && (size_t)n < sizeof ev) emit(t, ev, (size_t)n);
}

void hora__timeline_cycle(eng_timeline_t *t, double ts, uint64_t cycle) {
  if (!t || !t->mark_cycles) return;
  char ev[160];
  int n = snprintf(ev, sizeof ev,
                   "{\"name\":\"CYCLE_START\",\"ph\":\"i\",\"s\":\"p\",\"pid\":0,\"tid\":0,\"ts\":%.3f,"
                   "\"args\":{\"cycle\":%llu}}",
                   (ts - t->t0) * 1e6, (unsigned long long)cycle);
  if (n > 0 && (size_t)n < sizeof ev) emit(t, ev, (size_t)n);
}

hora_result_t hora__timeline_close(eng_timeline_t *t) {
  if (!t) return HORA_SUCCESS;
  if (!t->werr) { /* the closing metadata event, past the cap (160 bytes were kept for it) */
    char end[160];
    int en = snprintf(end, sizeof end, ",\n{\"name\":\"hora_timeline\",\"ph\":\"M\",\"pid\":0,\"args\":{\"dropped_events\":%llu}}",
                      (unsigned long long)t->dropped);
    tl_room(t, (size_t)en);
    tl_put(t, end, (size_t)en);
  }
  tl_flush(t);
  hora_result_t rc = HORA_SUCCESS;
  if (t->werr)
    rc = HORA_ERR(HORA_ERR_IO, "timeline %s: write: %s (the file holds the events written before; %llu dropped)",
                  t->path, strerror(t->werr), (unsigned long long)t->dropped);
  else if (fsync(t->fd) != 0) rc = HORA_ERR(HORA_ERR_IO, "timeline %s: fsync: %s", t->path, strerror(errno));
  if (close(t->fd) != 0 && rc == HORA_SUCCESS) rc = HORA_ERR(HORA_ERR_IO, "timeline %s: close: %s", t->path, strerror(errno));
  close(t->dirfd);
  if (t->dropped) HORA_INFO(ENGINE, "timeline: %llu events dropped at the %llu-byte cap (HORA_TIMELINE_MAX_BYTES)",
                            (unsigned long long)t->dropped, (unsigned long long)t->max_bytes);
  for (int i = 0; i < 1024; i++)
    for (tl_name_t *x = t->b[i], *nx; x; x = nx) {
      nx = x->next;
      free(x->name);
      free(x);
    }
  free(t->path);
  free(t->tmp);
  free(t);
  return rc;
}

/* ---- hora_timeline_start / hora_timeline_stop (hora.h) ---- */

/* The root context's engine, for the two calls below; HORA_ERR_INVALID_ARGUMENT on a process set. */
static hora_result_t tl_engine(hora_ctx_t *ctx, const char *fn, hora_engine_t **out) {
  HORA_CHECK(hora__ctx_check(ctx, fn));
  if (ctx->parent)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: ctx is a process set; the timeline belongs to the context made "
                    "by hora_init and records that context's operations", fn);
  return hora__engine_get(ctx, fn, out);
}

/* Install `t` (NULL: none) as the engine's timeline and close the one it replaces. */
static hora_result_t tl_swap(hora_engine_t *eng, eng_timeline_t *t) {
  pthread_mutex_lock(&eng->tl_mu);
  eng_timeline_t *old = eng->tl;
  __atomic_store_n(&eng->tl, t, __ATOMIC_RELEASE); /* fusion.c reads it without the lock first */
  pthread_mutex_unlock(&eng->tl_mu);
  return hora__timeline_close(old); /* commits the old file under its final name */
}

HORA_EXPORT hora_result_t hora_timeline_start(hora_ctx_t *ctx, const char *path, int mark_cycles) {
  const char *fn = "hora_timeline_start";
  hora_engine_t *eng;
  HORA_CHECK(tl_engine(ctx, fn, &eng));
  if (!path || !*path) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: path is %s", fn, path ? "empty" : "NULL");
  if (eng->rank != 0) return HORA_SUCCESS; /* rank 0 records every rank's view of each request */
  eng_timeline_t *t;
  HORA_CHECK(hora__timeline_open(fn, path, eng->prm.timeline_max_bytes, mark_cycles, &t));
  hora_result_t rc = tl_swap(eng, t);
  if (rc != HORA_SUCCESS) {
    char why[512]; /* hora_last_error() is the buffer HORA_ERR writes: copy it first */
    snprintf(why, sizeof why, "%s", hora_last_error());
    return HORA_ERR(rc, "%s: the new timeline %s is recording, but the previous one was not saved: %s", fn, path, why);
  }
  HORA_INFO(ENGINE, "timeline started: %s", path);
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_timeline_stop(hora_ctx_t *ctx) {
  const char *fn = "hora_timeline_stop";
  hora_engine_t *eng;
  HORA_CHECK(tl_engine(ctx, fn, &eng));
  if (eng->rank != 0) return HORA_SUCCESS;
  return tl_swap(eng, NULL);
}
