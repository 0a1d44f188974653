/* The engine's leaf helpers: the per-rank name table (a chained hash table of pending requests,
 * keyed by tensor name), request parameter comparison, kind names and rank-range lists for
 * messages. They touch only what they are given: no engine state, no locks, no MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

/* ---- the name table ---- */

uint64_t hora__eng_hash(const char *s, size_t len) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static size_t bucket(const eng_table_t *t, const char *name) {
  return (size_t)(hora__eng_hash(name, strlen(name)) & (t->nb - 1));
}

eng_req_t *hora__eng_table_get(eng_table_t *t, const char *name) {
  if (!t->nb) return NULL;
  for (eng_req_t *r = t->b[bucket(t, name)]; r; r = r->hnext)
    if (strcmp(r->name, name) == 0) return r;
  return NULL;
}

hora_result_t hora__eng_table_put(eng_table_t *t, eng_req_t *r) {
  if (t->n + 1 > t->nb) { /* grow x2 (load factor <= 1) */
    size_t nb = t->nb ? t->nb * 2 : 64;
    eng_req_t **b = calloc(nb, sizeof *b);
    if (!b) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory for the pending table");
    for (size_t i = 0; i < t->nb; i++)
      for (eng_req_t *x = t->b[i], *nx; x; x = nx) {
        nx = x->hnext;
        size_t k = (size_t)(hora__eng_hash(x->name, strlen(x->name)) & (nb - 1));
        x->hnext = b[k];
        b[k] = x;
      }
    free(t->b);
    t->b = b;
    t->nb = nb;
  }
  size_t k = bucket(t, r->name);
  r->hnext = t->b[k];
  t->b[k] = r;
  t->n++;
  return HORA_SUCCESS;
}

void hora__eng_table_del(eng_table_t *t, eng_req_t *r) {
  if (!t->nb) return;
  for (eng_req_t **pp = &t->b[bucket(t, r->name)]; *pp; pp = &(*pp)->hnext)
    if (*pp == r) {
      *pp = r->hnext;
      t->n--;
      return;
    }
}

int hora__eng_params_equal(const eng_params_t *a, const eng_params_t *b) {
  return a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->device == b->device &&
         a->root == b->root && a->count == b->count && a->prescale == b->prescale &&
         a->postscale == b->postscale && a->vhash == b->vhash && a->shape == b->shape &&
         a->group == b->group && a->gsize == b->gsize;
}

/* ---- names for messages ---- */

const char *hora__eng_kind_name(int kind) {
  static const char *const n[ENG_KIND_COUNT] = {"ALLREDUCE", "ALLGATHER", "ALLGATHERV", "BROADCAST",
                                                "REDUCESCATTER", "ALLTOALL", "JOIN", "GROUP_FAIL",
                                                "REFUSED"};
  return kind >= 0 && kind < ENG_KIND_COUNT ? n[kind] : "UNKNOWN";
}

void hora__rank_list(const uint8_t *flags, int size, int want, char *out, size_t outsz) {
  size_t off = 0;
  out[0] = 0;
  for (int r = 0; r < size && off + 24 < outsz;) {
    if ((flags[r] != 0) != (want != 0)) {
      r++;
      continue;
    }
    int e = r;
    while (e + 1 < size && (flags[e + 1] != 0) == (want != 0)) e++;
    if (e == r) off += (size_t)snprintf(out + off, outsz - off, "%s%d", off ? "," : "", r);
    else off += (size_t)snprintf(out + off, outsz - off, "%s%d-%d", off ? "," : "", r, e);
    r = e + 1;
  }
  if (off + 24 >= outsz) snprintf(out + off, outsz - off, ",...");
}
