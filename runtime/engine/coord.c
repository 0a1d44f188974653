/* Rank 0's coordinator: the table of names that some ranks have submitted, the agreement check
 * when a name is ready, and the response list that negotiate.c broadcasts.
 *
 *   table (list in first-seen order + hash index by name)
 *     "fc/w": have = [1 1 0 1], params per rank        <- hora__coord_add (from the gather)
 *   ready = every rank has it or has joined            <- hora__coord_ready
 *     fields equal?  yes: response OK      no: response HORA_ERR_MISMATCH naming the field and
 *                                              which ranks hold which value
 *   all ranks joined: a JOIN response carrying the last rank to join
 *
 * The stall inspector (stall.c) walks the same table for names that stay incomplete. Only rank 0
 * has a table; the other ranks only apply the responses. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"


hora_result_t hora__coord_respond(hora_engine_t *eng, const char *name, const eng_params_t *p,
                                  hora_result_t rc, const char *msg) {
  if (eng->noutbox == eng->capoutbox) {
    size_t cap = eng->capoutbox ? eng->capoutbox * 2 : 64;
    eng_wire_resp_t *o = realloc(eng->outbox, cap * sizeof *o);
    if (!o) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory for responses");
    eng->outbox = o;
    eng->capoutbox = cap;
  }
  eng_wire_resp_t *w = &eng->outbox[eng->noutbox];
  w->name = strdup(name);
  w->msg = msg ? strdup(msg) : NULL;
  if (!w->name || (msg && !w->msg)) {
    free(w->name);
    free(w->msg);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory for responses");
  }
  w->p = *p;
  w->rc = rc;
  eng->noutbox++;
  return HORA_SUCCESS;
}

static void coord_entry_free(eng_coord_t *c) {
  free(c->name);
  free(c->p);
  free(c->have);
  free(c);
}

void hora__coord_free(hora_engine_t *eng) {
  for (eng_coord_t *c = eng->coord, *n; c; c = n) {
    n = c->next;
    coord_entry_free(c);
  }
  eng->coord = eng->coord_tail = NULL;
  free(eng->cidx);
  eng->cidx = NULL;
  eng->ncidx = eng->ncoord = 0;
  for (size_t i = 0; i < eng->noutbox; i++) {
    free(eng->outbox[i].name);
    free(eng->outbox[i].msg);
  }
  free(eng->outbox);
  eng->outbox = NULL;
  eng->noutbox = eng->capoutbox = 0;
  free(eng->coord_joined);
  free(eng->coord_join_seq);
  eng->coord_joined = NULL;
  eng->coord_join_seq = NULL;
}

/* The coordinator's name index: a table of a thousand names meets every rank's list of new names
 * at once in the first step, so lookups must not walk the list. */
static size_t cbucket(const hora_engine_t *eng, const char *name) {
  return (size_t)(hora__eng_hash(name, strlen(name)) & (eng->ncidx - 1));
}

static eng_coord_t *coord_find(hora_engine_t *eng, const char *name) {
  if (!eng->ncidx) return NULL;
  for (eng_coord_t *c = eng->cidx[cbucket(eng, name)]; c; c = c->hnext)
    if (strcmp(c->name, name) == 0) return c;
  return NULL;
}

static hora_result_t coord_index(hora_engine_t *eng, eng_coord_t *c) {
  if (eng->ncoord + 1 > eng->ncidx) {
    size_t nb = eng->ncidx ? eng->ncidx * 2 : 256;
    eng_coord_t **b = calloc(nb, sizeof *b);
    if (!b) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory in the coordinator");
    for (size_t i = 0; i < eng->ncidx; i++)
      for (eng_coord_t *x = eng->cidx[i], *nx; x; x = nx) {
        nx = x->hnext;
        size_t k = (size_t)(hora__eng_hash(x->name, strlen(x->name)) & (nb - 1));
        x->hnext = b[k];
        b[k] = x;
      }
    free(eng->cidx);
    eng->cidx = b;
    eng->ncidx = nb;
  }
  size_t k = cbucket(eng, c->name);
  c->hnext = eng->cidx[k];
  eng->cidx[k] = c;
  eng->ncoord++;
  return HORA_SUCCESS;
}

void hora__coord_remove(hora_engine_t *eng, eng_coord_t **pp) {
  eng_coord_t *c = *pp;
  for (eng_coord_t **hp = &eng->cidx[cbucket(eng, c->name)]; *hp; hp = &(*hp)->hnext)
    if (*hp == c) {
      *hp = c->hnext;
      break;
    }
  eng->ncoord--;
  *pp = c->next;
  if (eng->coord_tail == c)
    eng->coord_tail = pp == &eng->coord ? NULL : (eng_coord_t *)((char *)pp - offsetof(eng_coord_t, next));
  coord_entry_free(c);
}

/* The value of one field as text, for comparing and for the mismatch message. */
/* The group comes right after the operation: where the ranks group other tensors, the members'
 * counts differ too, and the group is the cause to name. */
enum { FLD_KIND, FLD_GROUP, FLD_DTYPE, FLD_COUNT, FLD_OP, FLD_ROOT, FLD_DEVICE, FLD_PRESCALE, FLD_POSTSCALE,
       FLD_RECVCOUNTS, FLD_SHAPE, FLD_COUNT_ };
static const char *const field_names[FLD_COUNT_] = {
    "operation", "the grouped call it belongs to", "dtype", "count", "reduce op", "root", "device", "prescale",
    "postscale", "recvcounts", "shape"};

static void field_str(const eng_params_t *p, int f, char *out, size_t n) {
  switch (f) {
    case FLD_KIND: snprintf(out, n, "%s", hora__eng_kind_name(p->kind)); break;
    case FLD_DTYPE: snprintf(out, n, "%s", hora__dtype_name((hora_dtype_t)p->dtype)); break;
    case FLD_COUNT: snprintf(out, n, "%llu", (unsigned long long)p->count); break;
    case FLD_OP: snprintf(out, n, "%s", p->kind == ENG_ALLREDUCE || p->kind == ENG_REDUCESCATTER
                                            ? hora__op_name((hora_op_t)p->op) : "-"); break;
    case FLD_ROOT: snprintf(out, n, "%d", (int)p->root); break;
    case FLD_DEVICE: snprintf(out, n, "%s", p->device == HORA_DEVICE_CUDA ? "cuda" : "host"); break;
    case FLD_PRESCALE: snprintf(out, n, "%.17g", p->prescale); break;
    case FLD_POSTSCALE: snprintf(out, n, "%.17g", p->postscale); break;
    case FLD_SHAPE: snprintf(out, n, p->shape ? "%#llx" : "unchecked", (unsigned long long)p->shape); break;
    case FLD_GROUP:
      if (p->gsize) snprintf(out, n, "a group of %u (names #%04llx)", (unsigned)p->gsize,
                             (unsigned long long)(p->group >> 48));
      else snprintf(out, n, "none (a call of its own)");
      break;
    default: snprintf(out, n, "#%016llx", (unsigned long long)p->vhash); break;
  }
}

/* A ready name that some rank refused (hora_refuse_async: its call failed that rank's own checks)
 * fails on every rank, even where all ranks refused it: write the message and return 1. */
static int find_refusal(hora_engine_t *eng, const eng_coord_t *c, uint8_t *flags, char *msg, size_t msgsz) {
  int n = eng->size, any = 0;
  for (int r = 0; r < n; r++) {
    flags[r] = c->have[r] && c->p[r].kind == ENG_REFUSED;
    any |= flags[r];
  }
  if (!any) return 0;
  char ranks[256];
  hora__rank_list(flags, n, 1, ranks, sizeof ranks);
  snprintf(msg, msgsz, "tensor '%.200s': the call failed its own argument checks on rank(s) %s, which raised the "
           "error that says why; nothing ran on any rank", c->name, ranks);
  return 1;
}

/* Compare the submitted parameters of a ready name; on disagreement write the message
 * "tensor 'x': ranks disagree on count: 10 on ranks 0,2; 20 on rank 1" and return 1. A refusal
 * (find_refusal) comes before any field. */
static int find_mismatch(hora_engine_t *eng, eng_coord_t *c, char *msg, size_t msgsz) {
  int n = eng->size;
  uint8_t *grp = malloc((size_t)n);
  if (!grp) {
    snprintf(msg, msgsz, "tensor '%s': out of memory checking the ranks' arguments", c->name);
    return 1;
  }
  if (find_refusal(eng, c, grp, msg, msgsz)) {
    free(grp);
    return 1;
  }
  for (int f = 0; f < FLD_COUNT_; f++) {
    char ref[64], v[64];
    int first = -1, differ = 0;
    for (int r = 0; r < n; r++) {
      if (!c->have[r]) continue;
      if (first < 0) {
        first = r;
        field_str(&c->p[r], f, ref, sizeof ref);
      } else {
        field_str(&c->p[r], f, v, sizeof v);
        if (strcmp(v, ref) != 0) differ = 1;
      }
    }
    if (!differ) continue;
    size_t off = (size_t)snprintf(msg, msgsz, "tensor '%.200s': ranks disagree on %s:", c->name, field_names[f]);
    uint8_t *done = calloc((size_t)n, 1);
    int groups = 0;
    for (int r = 0; r < n && done && off < msgsz; r++) {
      if (!c->have[r] || done[r]) continue;
      field_str(&c->p[r], f, ref, sizeof ref);
      int cnt = 0;
      for (int q = r; q < n; q++) {
        grp[q] = 0;
        if (c->have[q] && !done[q]) {
          field_str(&c->p[q], f, v, sizeof v);
          if (strcmp(v, ref) == 0) grp[q] = 1, done[q] = 1, cnt++;
        }
      }
      for (int q = 0; q < r; q++) grp[q] = 0;
      char ranks[256];
      hora__rank_list(grp, n, 1, ranks, sizeof ranks);
      off += (size_t)snprintf(msg + off, msgsz - off, "%s %s on rank%s %s", groups ? ";" : "", ref,
                              cnt > 1 ? "s" : "", ranks);
      groups++;
    }
    free(done);
    free(grp);
    return 1;
  }
  free(grp);
  return 0;
}

/* Record one rank's new request in the table. */
hora_result_t hora__coord_add(hora_engine_t *eng, int rank, char *name, const eng_params_t *p, double now) {
  if (p->kind == ENG_JOIN) {
    free(name);
    eng->coord_joined[rank] = 1;
    eng->coord_join_seq[rank] = ++eng->join_seq;
    return HORA_SUCCESS;
  }
  eng_coord_t *c = coord_find(eng, name);
  if (!c) {
    c = calloc(1, sizeof *c);
    if (c) {
      c->p = calloc((size_t)eng->size, sizeof *c->p);
      c->have = calloc((size_t)eng->size, 1);
    }
    if (!c || !c->p || !c->have) {
      if (c) coord_entry_free(c);
      free(name);
      return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory in the coordinator");
    }
    c->name = name;
    c->first_seen = c->last_warn = now;
    if (coord_index(eng, c) != HORA_SUCCESS) {
      coord_entry_free(c);
      return HORA_ERR_NO_MEMORY;
    }
    if (eng->coord_tail) eng->coord_tail->next = c;
    else eng->coord = c;
    eng->coord_tail = c;
  } else {
    free(name);
  }
  if (!c->have[rank]) c->nhave++;
  c->have[rank] = 1;
  c->p[rank] = *p;
  return HORA_SUCCESS;
}

/* ---- groups whose ranks disagree on the members ----
 * A grouped allreduce submits one request per member, each carrying the group's key and size
 * (api.c). When ranks group different tensors under shared names (rank 0 four gradients, rank 1
 * three of them), the shared names are answered with the mismatch of the group field, but the
 * members only some ranks submitted would never become ready, and their handles would wait
 * forever. No member carrying a key of such a group can ever succeed (a name that every rank
 * holds differs in the group field), so rank 0 answers each such key once, with an
 * ENG_GROUP_FAIL response: every rank fails all its pending members of that group, wherever they
 * are (sent here, or waiting on the cache fast path: negotiate.c), in the same cycle, so that no
 * straggler is left to meet a later request of the same name. The table's entries of the group
 * go with it. */
typedef struct {
  uint64_t key;
  char msg[512]; /* the mismatch that failed the group */
} failed_group_t;
typedef struct {
  failed_group_t *g;
  int n, cap;
} failed_groups_t;

static int failed_find(const failed_groups_t *fg, uint64_t key) {
  for (int i = 0; i < fg->n; i++)
    if (fg->g[i].key == key) return i;
  return -1;
}

/* Remember the groups of a mismatched entry whose ranks disagree on the group (msg: the
 * mismatch). */
static hora_result_t failed_add(failed_groups_t *fg, int size, const eng_coord_t *c, const char *msg) {
  int first = -1, differ = 0;
  for (int r = 0; r < size; r++) {
    if (!c->have[r]) continue;
    if (first < 0) first = r;
    else if (c->p[r].group != c->p[first].group || c->p[r].gsize != c->p[first].gsize) differ = 1;
  }
  if (!differ) return HORA_SUCCESS;
  for (int r = 0; r < size; r++) {
    if (!c->have[r] || !c->p[r].gsize || failed_find(fg, c->p[r].group) >= 0) continue;
    if (fg->n == fg->cap) {
      int cap = fg->cap ? 2 * fg->cap : 8;
      failed_group_t *g = realloc(fg->g, (size_t)cap * sizeof *g);
      if (!g) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory in the coordinator");
      fg->g = g;
      fg->cap = cap;
    }
    fg->g[fg->n].key = c->p[r].group;
    snprintf(fg->g[fg->n].msg, sizeof fg->g[fg->n].msg, "%.500s", msg);
    fg->n++;
  }
  return HORA_SUCCESS;
}

/* Whether any rank's request of entry c belongs to a failed group. */
static int failed_of(const failed_groups_t *fg, int size, const eng_coord_t *c) {
  for (int r = 0; r < size; r++)
    if (c->have[r] && c->p[r].gsize && failed_find(fg, c->p[r].group) >= 0) return 1;
  return 0;
}

/* Move every ready name (all ranks that have not joined submitted it) to the outbox, in table
 * order (the order names were first seen), then the join completion. Then answer the members of
 * groups whose ranks disagree (above) that some ranks will never submit. */
hora_result_t hora__coord_ready(hora_engine_t *eng) {
  int n = eng->size, njoined = 0;
  failed_groups_t fg = {0};
  hora_result_t frc = HORA_SUCCESS;
  for (int r = 0; r < n; r++) njoined += eng->coord_joined[r];
  for (eng_coord_t **pp = &eng->coord; *pp;) {
    eng_coord_t *c = *pp;
    int ready = 1;
    for (int r = 0; r < n && ready; r++) ready = c->have[r] || eng->coord_joined[r];
    if (!ready) {
      pp = &c->next;
      continue;
    }
    char msg[1024];
    hora_result_t rc = HORA_SUCCESS;
    int first = 0;
    while (!c->have[first]) first++;
    if (find_mismatch(eng, c, msg, sizeof msg)) {
      rc = HORA_ERR_MISMATCH;
      if (frc == HORA_SUCCESS) frc = failed_add(&fg, n, c, msg);
    } else if (njoined) {
      const eng_params_t *p = &c->p[first];
      if (p->kind != ENG_ALLREDUCE || (p->op != HORA_SUM && p->op != HORA_AVERAGE)) {
        char ranks[256];
        hora__rank_list(eng->coord_joined, n, 1, ranks, sizeof ranks);
        snprintf(msg, sizeof msg, "tensor '%.200s': %s %s while rank(s) %s have joined (hora_join): "
                 "only SUM and AVERAGE allreduce proceed with joined ranks", c->name,
                 hora__eng_kind_name(p->kind), p->kind == ENG_ALLREDUCE ? hora__op_name((hora_op_t)p->op) : "",
                 ranks);
        rc = HORA_ERR_INVALID_ARGUMENT;
      }
    }
    HORA_CHECK_GOTO(hora__coord_respond(eng, c->name, &c->p[first], rc, rc ? msg : NULL), frc, out);
    hora__coord_remove(eng, pp);
  }
  for (int i = 0; i < fg.n && frc == HORA_SUCCESS; i++) {
    eng_params_t gp = {.kind = ENG_GROUP_FAIL, .root = -1, .group = fg.g[i].key};
    frc = hora__coord_respond(eng, "", &gp, HORA_ERR_MISMATCH, fg.g[i].msg);
  }
  for (eng_coord_t **pp = &eng->coord; frc == HORA_SUCCESS && fg.n && *pp;) {
    if (failed_of(&fg, n, *pp)) hora__coord_remove(eng, pp);
    else pp = &(*pp)->next;
  }
out:
  free(fg.g);
  HORA_CHECK(frc);
  if (njoined == n) {
    int last = 0;
    for (int r = 1; r < n; r++)
      if (eng->coord_join_seq[r] >= eng->coord_join_seq[last]) last = r;
    eng_params_t jp = {.kind = ENG_JOIN, .root = last};
    HORA_CHECK(hora__coord_respond(eng, "", &jp, HORA_SUCCESS, NULL));
    memset(eng->coord_joined, 0, (size_t)n);
  }
  return HORA_SUCCESS;
}
