/* Read-only file mappings for the record reader, guarded against SIGBUS.
 *
 * Why map: a record file already in the page cache (the second and later epochs, or data staged
 * to node-local disk) is read by read() with one copy per byte into the reader's buffer, then
 * once more by the CRC check. Mapped, the CRC check is the only pass and the consumer gets
 * pointers into the page cache (hora-bench records, docs/benchmarks.md).
 *
 * Why a guard: a mapped file that another process truncates (or rewrites in place with
 * `cp`/`>`) loses its pages, and the next access to them raises SIGBUS, which would end the
 * training job. The reader's mappings are registered here; a process-wide SIGBUS handler maps
 * a zero page over a faulting address inside a registered mapping, marks the mapping as faulted
 * and returns, so the access completes; the reader checks the mark and fails with HORA_ERR_IO
 * naming the file (reader.c). A SIGBUS outside our mappings goes to the handler that was
 * installed before ours, or ends the process as the default action would. Files replaced by
 * rename (hora_records_writer_close, hora-records) keep their old pages and never fault.
 *
 * The handler is installed the first time a file is mapped. Only async-signal-safe calls run in
 * it (atomic loads and stores, mmap, sigaction, raise). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "data/records.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14; older kernels answer EINVAL and we stop asking */
#endif

#define MAX_MAPS 256 /* live mappings of all readers in the process; more fall back to read() */

struct hora_map {
  unsigned char *base;
  size_t len;
  _Atomic int refs;
  _Atomic int faulted;
  int slot;
  char *path;
};

static struct {
  _Atomic uintptr_t lo, hi;
  struct hora_map *_Atomic map;
} g_reg[MAX_MAPS];
static pthread_mutex_t g_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static struct sigaction g_old;
static int g_installed;
static uintptr_t g_page;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  uintptr_t a = (uintptr_t)si->si_addr;
  if (si->si_code > 0) { /* raised by a fault, not sent by kill() */
    for (int i = 0; i < MAX_MAPS; i++) {
      uintptr_t lo = atomic_load(&g_reg[i].lo);
      if (!lo || a < lo || a >= atomic_load(&g_reg[i].hi)) continue;
      struct hora_map *m = atomic_load(&g_reg[i].map);
      if (m) atomic_store(&m->faulted, 1);
      void *page = (void *)(a & ~(g_page - 1));
      if (mmap(page, (size_t)g_page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) return;
      break;
    }
  }
  /* Not ours: what was there before. */
  if ((g_old.sa_flags & SA_SIGINFO) && g_old.sa_sigaction) {
    g_old.sa_sigaction(sig, si, uc);
    return;
  }
  if (!(g_old.sa_flags & SA_SIGINFO) && g_old.sa_handler != SIG_DFL && g_old.sa_handler != SIG_IGN) {
    g_old.sa_handler(sig);
    return;
  }
  /* Default action: restore it; a fault then repeats and ends the process as without us. */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGBUS, &dfl, NULL);
  if (si->si_code <= 0) raise(sig);
}

static void install(void) {
  long ps = sysconf(_SC_PAGESIZE);
  g_page = ps > 0 ? (uintptr_t)ps : 4096;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  g_installed = sigaction(SIGBUS, &sa, &g_old) == 0;
}

static int resident(const unsigned char *base, size_t len) {
  /* Look at up to the first 256 MiB: files are read from the start, and a file the page cache
   * holds is usually held whole, or most of it (the kernel reclaims cold pages piecemeal). Half
   * or more resident: mapped; the pages that are missing come in through the fault path's
   * read-ahead (MADV_SEQUENTIAL). */
  size_t look = len < ((size_t)256 << 20) ? len : ((size_t)256 << 20);
  size_t pages = (look + g_page - 1) / g_page;
  unsigned char *vec = malloc(pages ? pages : 1);
  if (!vec) return 0;
  size_t in = 0;
  if (mincore((void *)base, look, vec) == 0)
    for (size_t i = 0; i < pages; i++) in += vec[i] & 1;
  free(vec);
  return in * 2 >= pages;
}

hora_map_t *hora__map_open(int fd, size_t len, const char *path, int only_if_cached) {
  pthread_once(&g_once, install);
  if (!g_installed || len == 0) return NULL;
  void *base = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return NULL;
  if (only_if_cached && !resident(base, len)) {
    munmap(base, len);
    return NULL;
  }
  madvise(base, len, MADV_SEQUENTIAL);
  hora_map_t *m = calloc(1, sizeof *m);
  if (!m || !(m->path = strdup(path))) {
    free(m);
    munmap(base, len);
    return NULL;
  }
  m->base = base;
  m->len = len;
  atomic_init(&m->refs, 1);
  atomic_init(&m->faulted, 0);
  m->slot = -1;
  pthread_mutex_lock(&g_reg_lock);
  for (int i = 0; i < MAX_MAPS; i++)
    if (!atomic_load(&g_reg[i].map)) {
      atomic_store(&g_reg[i].map, m);
      atomic_store(&g_reg[i].hi, (uintptr_t)base + len);
      atomic_store(&g_reg[i].lo, (uintptr_t)base);
      m->slot = i;
      break;
    }
  pthread_mutex_unlock(&g_reg_lock);
  if (m->slot < 0) { /* registry full: unguarded mappings are not made */
    munmap(base, len);
    free(m->path);
    free(m);
    return NULL;
  }
  return m;
}

void hora__map_ref(hora_map_t *m) { atomic_fetch_add(&m->refs, 1); }

void hora__map_unref(hora_map_t *m) {
  if (!m || atomic_fetch_sub(&m->refs, 1) != 1) return;
  pthread_mutex_lock(&g_reg_lock);
  atomic_store(&g_reg[m->slot].lo, 0);
  atomic_store(&g_reg[m->slot].hi, 0);
  atomic_store(&g_reg[m->slot].map, NULL);
  pthread_mutex_unlock(&g_reg_lock);
  munmap(m->base, m->len);
  free(m->path);
  free(m);
}

const unsigned char *hora__map_base(const hora_map_t *m) { return m->base; }
size_t hora__map_len(const hora_map_t *m) { return m->len; }
const char *hora__map_path(const hora_map_t *m) { return m->path; }
int hora__map_faulted(const hora_map_t *m) { return atomic_load(&((hora_map_t *)m)->faulted); }

int hora__map_populate(const hora_map_t *m, size_t off, size_t len) {
  if (off >= m->len) return 0;
  if (len > m->len - off) len = m->len - off;
  uintptr_t a = ((uintptr_t)m->base + off) & ~(g_page - 1);
  uintptr_t e = (uintptr_t)m->base + off + len;
  return madvise((void *)a, e - a, MADV_POPULATE_READ) == 0 || errno != EINVAL;
}

void hora__map_drop(const hora_map_t *m, size_t off, size_t len) {
  if (off >= m->len) return;
  if (len > m->len - off) len = m->len - off;
  uintptr_t a = ((uintptr_t)m->base + off + g_page - 1) & ~(g_page - 1);
  uintptr_t e = ((uintptr_t)m->base + off + len) & ~(g_page - 1);
  if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}
