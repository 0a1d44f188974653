/* Test-only fault injection (HORA_TEST_FAULT=STAGE:KIND:RANK[:NTH]), so that the error paths of
 * every stage can be run on purpose: a peer that vanishes, crashes, goes silent, or a call that
 * fails, at init, restore, the record reader's start, a training step, a checkpoint save or copy,
 * or finalize (tests/fault). The stages call hora__fault_hit(stage, rank) where that stage
 * begins; with the variable unset that is one load and compare.
 *
 * The kinds that end the process do so on purpose, as the failure they stand for would: this is
 * the one place in the library that may, and only when a test asks for it. */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fault.h"
#include "core/internal.h"

static const char *const stages[] = {"init", "restore", "reader", "step", "save", "copy", "finalize"};
enum { NSTAGES = sizeof stages / sizeof *stages };
static const char *const kinds[] = {"exit", "kill", "segv", "mute", "fail", "late"};
enum { K_EXIT, K_KILL, K_SEGV, K_MUTE, K_FAIL, K_LATE, NKINDS };

static atomic_long hits[NSTAGES];
static atomic_int muted;
static _Atomic double late_until; /* "late": silent until this hora__now_s() */

static int lookup(const char *const *names, int n, const char *s, size_t len) {
  for (int i = 0; i < n; i++)
    if (strlen(names[i]) == len && strncmp(names[i], s, len) == 0) return i;
  return -1;
}

/* Parse "STAGE:KIND:RANK[:NTH]". */
static hora_result_t parse(const char *spec, int *stage, int *kind, long *rank, long *nth) {
  const char *c1 = strchr(spec, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
  char *end = NULL;
  if (!c1 || !c2) goto bad;
  *stage = lookup(stages, NSTAGES, spec, (size_t)(c1 - spec));
  *kind = lookup(kinds, NKINDS, c1 + 1, (size_t)(c2 - c1 - 1));
  if (*stage < 0 || *kind < 0) goto bad;
  *rank = strtol(c2 + 1, &end, 10);
  if (end == c2 + 1 || *rank < 0) goto bad;
  *nth = 1;
  if (*end == ':') {
    const char *s = end + 1;
    *nth = strtol(s, &end, 10);
    if (end == s || *nth < 1) goto bad;
  }
  if (*end) goto bad;
  return HORA_SUCCESS;
bad:
  return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                  "HORA_TEST_FAULT=%s: want STAGE:KIND:RANK[:NTH], STAGE one of init|restore|reader|"
                  "step|save|copy|finalize, KIND one of exit|kill|segv|mute|fail|late, RANK >= 0, NTH >= 1",
                  spec);
}

hora_result_t hora__fault_hit(const char *stage_name, int rank) {
  const char *spec = hora__params()->test_fault;
  if (!spec || !*spec) return HORA_SUCCESS;
  int stage = -1, kind = -1;
  long want_rank = -1, nth = 1;
  HORA_CHECK(parse(spec, &stage, &kind, &want_rank, &nth));
  if (strcmp(stages[stage], stage_name) != 0 || rank != want_rank) return HORA_SUCCESS;
  if (atomic_fetch_add(&hits[stage], 1) + 1 != nth) return HORA_SUCCESS;
  HORA_WARN(INIT, "HORA_TEST_FAULT=%s: injecting '%s' at %s on rank %d", spec, kinds[kind], stage_name, rank);
  switch (kind) {
    case K_EXIT: _exit(1);
    case K_KILL: kill(getpid(), SIGKILL); break;
    case K_SEGV: raise(SIGSEGV); break;
    case K_MUTE: atomic_store(&muted, 1); return HORA_SUCCESS;
    case K_LATE: atomic_store(&late_until, hora__now_s() + 2 * hora__params()->peer_timeout_s); return HORA_SUCCESS;
    default: break;
  }
  return HORA_ERR(HORA_ERR_INTERNAL, "HORA_TEST_FAULT=%s: injected failure at %s on rank %d", spec,
                  stage_name, rank);
}

int hora__fault_muted(void) {
  return atomic_load(&muted) || (atomic_load(&late_until) > 0 && hora__now_s() < atomic_load(&late_until));
}
