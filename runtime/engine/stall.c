/* Rank 0's stall inspector (after Horovod's stall_inspector, rewritten).
 *
 * Rank 0's coordinator table holds every name that some ranks have submitted and others have
 * not. Each cycle rank 0 looks at the oldest entries:
 *  - older than HORA_STALL_WARNING_S (and not warned about in the last such period): one WARN
 *    line listing up to 16 such tensors with the ranks missing for each, e.g.
 *      stall: 1 tensor(s) submitted by some ranks but not by others for more than 60 s
 *      (HORA_STALL_WARNING_S): 'grad/fc1' missing on rank 1
 *    The usual cause is a rank that took another branch of the program, or one that is slow.
 *  - older than HORA_STALL_SHUTDOWN_S (when > 0): the name gets a HORA_ERR_TIMEOUT response, so
 *    the ranks that did submit it get their handles back instead of waiting forever.
 * Requests waiting on the cache fast path are invisible to rank 0; negotiate.c sends them to
 * rank 0 after half the smaller of the two periods, so they are inspected too. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

#define STALL_LIST_MAX 16

/* The ranks that have neither submitted the name nor joined. */
static void missing_ranks(hora_engine_t *eng, const eng_coord_t *c, char *out, size_t outsz) {
  uint8_t *ok = malloc((size_t)eng->size);
  if (!ok) {
    snprintf(out, outsz, "?");
    return;
  }
  for (int r = 0; r < eng->size; r++) ok[r] = c->have[r] || eng->coord_joined[r];
  hora__rank_list(ok, eng->size, 0, out, outsz);
  free(ok);
}

/* Unnamed requests ("<op>.noname.<n>", as the Python bindings and Horovod name them) are numbered
 * by each rank in the order it makes them: one rank that skipped or added an unnamed call numbers
 * every later one differently, and the stall then names numbers that only look unrelated. */
#define NONAME_HINT                                                                                      \
  " (unnamed requests are numbered by each rank in the order it makes them: a rank that skipped or "     \
  "added an unnamed call numbers the later ones differently; give the collectives names)"

static int unnamed(const char *name) { return strstr(name, ".noname.") != NULL; }

void hora__stall_check(hora_engine_t *eng, double now) {
  double warn = eng->prm.stall_warning_s, shut = eng->prm.stall_shutdown_s;
  if (warn <= 0 && shut <= 0) return;
  if (now - eng->last_stall_check < 0.05) return; /* a few times per second is plenty */
  eng->last_stall_check = now;
  char line[4096];
  size_t off = 0;
  int nwarn = 0, nunnamed = 0;
  for (eng_coord_t **pp = &eng->coord; *pp;) {
    eng_coord_t *c = *pp;
    double age = now - c->first_seen;
    char miss[256];
    if (shut > 0 && age > shut) {
      missing_ranks(eng, c, miss, sizeof miss);
      uint8_t *have = c->have;
      char got[256];
      hora__rank_list(have, eng->size, 1, got, sizeof got);
      char msg[1280];
      snprintf(msg, sizeof msg,
               "tensor '%.300s': rank(s) %s did not submit it within %g s (HORA_STALL_SHUTDOWN_S); "
               "submitted by rank(s) %s%s", c->name, miss, shut, got, unnamed(c->name) ? NONAME_HINT : "");
      int first = 0;
      while (!c->have[first]) first++;
      if (hora__coord_respond(eng, c->name, &c->p[first], HORA_ERR_TIMEOUT, msg) != HORA_SUCCESS) return;
      hora__coord_remove(eng, pp);
      continue;
    }
    if (warn > 0 && age > warn && now - c->last_warn > warn) {
      c->last_warn = now;
      if (nwarn < STALL_LIST_MAX && off < sizeof line - 512) {
        missing_ranks(eng, c, miss, sizeof miss);
        off += (size_t)snprintf(line + off, sizeof line - off, "%s'%.200s' missing on rank%s %s",
                                nwarn ? "; " : "", c->name, strchr(miss, ',') || strchr(miss, '-') ? "s" : "", miss);
      }
      nwarn++;
      nunnamed += unnamed(c->name);
    }
    pp = &c->next;
  }
  if (nwarn)
    HORA_WARN(ENGINE, "stall: %d tensor(s) submitted by some ranks but not by others for more than %g s "
              "(HORA_STALL_WARNING_S): %s%s%s", nwarn, warn, line, nwarn > STALL_LIST_MAX ? "; ..." : "",
              nunnamed ? NONAME_HINT : "");
}
