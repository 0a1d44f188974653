/* The response cache: the fast path of negotiation (after Horovod's response_cache, rewritten).
 *
 * Training submits the same names with the same parameters every step. Once a name has been
 * negotiated through rank 0, every rank stores (name, parameters) in the same slot of its cache:
 * all ranks insert, touch and evict in the same order (the agreed order of execution), so the
 * caches stay identical without ever being compared. A later request that finds its name with
 * equal parameters only sets bit `slot` in the cycle's bit vector; the bitwise AND over ranks
 * says which cached names every rank has submitted, with no rank-0 round trip:
 *
 *   rank 0 bits  1 0 1 1 ...      slot 0 and 3 ready everywhere -> run them this cycle
 *   rank 1 bits  1 1 0 1 ...      slot 1, 2 wait for the ranks that lack them
 *   AND          1 0 0 1 ...
 *
 * A name found with different parameters clears its slot's "valid" bit instead; the AND makes
 * every rank erase the slot in the same cycle and the request goes to rank 0 (which then reports
 * the mismatch or negotiates the new parameters). When the cache is full the least recently used
 * slot is evicted; HORA_CACHE_CAPACITY = 0 turns the fast path off. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

hora_result_t hora__cache_init(eng_cache_t *c, int cap) {
  memset(c, 0, sizeof *c);
  c->cap = cap;
  if (cap <= 0) return HORA_SUCCESS;
  c->e = calloc((size_t)cap, sizeof *c->e);
  c->nidx = 1;
  while (c->nidx < 2 * (size_t)cap) c->nidx <<= 1;
  c->idx = calloc(c->nidx, sizeof *c->idx);
  if (!c->e || !c->idx) {
    hora__cache_free(c);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory for a response cache of %d entries", cap);
  }
  return HORA_SUCCESS;
}

void hora__cache_free(eng_cache_t *c) {
  for (int i = 0; c->e && i < c->cap; i++) free(c->e[i].name);
  free(c->e);
  free(c->idx);
  memset(c, 0, sizeof *c);
}

/* Index probe: the position in idx holding `name`'s slot, or the empty position where it would
 * go. Deleted entries are handled by re-inserting the probe run after them (no tombstones). */
static size_t probe(const eng_cache_t *c, const char *name) {
  size_t m = c->nidx - 1, i = (size_t)hora__eng_hash(name, strlen(name)) & m;
  while (c->idx[i] && strcmp(c->e[c->idx[i] - 1].name, name) != 0) i = (i + 1) & m;
  return i;
}

int hora__cache_find(const eng_cache_t *c, const char *name) {
  if (c->cap <= 0) return -1;
  size_t i = probe(c, name);
  return c->idx[i] ? c->idx[i] - 1 : -1;
}

void hora__cache_touch(eng_cache_t *c, int pos) { c->e[pos].stamp = ++c->clock; }

void hora__cache_erase(eng_cache_t *c, int pos) {
  if (pos < 0 || pos >= c->cap || !c->e[pos].name) return;
  size_t m = c->nidx - 1, i = probe(c, c->e[pos].name);
  c->idx[i] = 0;
  /* Re-insert the rest of the probe run so later lookups do not stop at the hole. */
  for (size_t j = (i + 1) & m; c->idx[j]; j = (j + 1) & m) {
    int s = c->idx[j];
    c->idx[j] = 0;
    c->idx[probe(c, c->e[s - 1].name)] = s;
  }
  free(c->e[pos].name);
  c->e[pos].name = NULL;
}

int hora__cache_put(eng_cache_t *c, const char *name, const eng_params_t *p) {
  if (c->cap <= 0) return -1;
  int pos = hora__cache_find(c, name);
  if (pos < 0) {
    /* A free slot (lowest index), else the least recently used one. */
    int victim = -1;
    for (int i = 0; i < c->cap; i++) {
      if (!c->e[i].name) {
        victim = i;
        break;
      }
      if (victim < 0 || c->e[i].stamp < c->e[victim].stamp) victim = i;
    }
    hora__cache_erase(c, victim);
    char *dup = strdup(name);
    if (!dup) return -1; /* same outcome on every rank only if memory holds; see fusion.c */
    c->e[victim].name = dup;
    c->idx[probe(c, name)] = victim + 1;
    pos = victim;
  }
  c->e[pos].p = *p;
  hora__cache_touch(c, pos);
  return pos;
}
