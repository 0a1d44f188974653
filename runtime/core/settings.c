/* The settings every rank of a job must share, agreed once by hora_init.
 *
 * A rank whose HORA_ALLREDUCE_ALGO, segment or chunk sizes, fusion threshold, response cache,
 * call check, GPU path or compression differs from its peers' would run another algorithm, cut
 * its messages differently, group its tensors differently or skip a step of the protocol: its
 * peers would get wrong data or wait forever. Environments do differ between ranks in practice
 * (a module loaded in one node's prologue, an export in a per-rank wrapper script), so hora_init
 * compares them: one MPI_Allreduce (MPI_MAX) of each setting's 64-bit value and of its bitwise
 * complement gives every rank the maximum and the minimum; only where they differ (the rare path)
 * an MPI_Allgather of the printed values names which ranks hold which value. Strings are compared
 * by their FNV-1a hash. Every rank then returns the same HORA_ERR_INVALID_ARGUMENT.
 *
 * Before the settings, the build: ranks that run different libhora builds (an install upgraded on
 * some nodes and not others, or a job that mixes two venvs) would meet in message formats,
 * protocols and algorithms that may differ, this agreement's own included: so first one
 * fixed-size allreduce of the hash of libhora's version and git commit (HORA_BUILD_GIT, defined
 * for this file by runtime/CMakeLists.txt at configure time). Builds from one commit agree,
 * wherever they were compiled; a build from outside git compares by its version only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"

#ifndef HORA_BUILD_GIT
#define HORA_BUILD_GIT "" /* a build without runtime/CMakeLists.txt: by the version alone */
#endif

typedef struct {
  const char *env;
  uint64_t value;   /* the number, or the string's hash */
  char shown[40];   /* the value as the message prints it */
} setting_t;

static uint64_t fnv1a(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; s && *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

static void num(setting_t *s, const char *env, uint64_t v) {
  s->env = env;
  s->value = v;
  snprintf(s->shown, sizeof s->shown, "%llu", (unsigned long long)v);
}

static void str(setting_t *s, const char *env, const char *v) {
  s->env = env;
  s->value = fnv1a(v);
  snprintf(s->shown, sizeof s->shown, "'%.37s'", v ? v : "");
}

#define N_SETTINGS 10

static void collect(const hora_params_t *p, setting_t *s) {
  num(&s[0], "HORA_CHECK", (uint64_t)p->check);
  str(&s[1], "HORA_ALLREDUCE_ALGO", p->allreduce_algo);
  num(&s[2], "HORA_RING_SEGMENT_BYTES", p->ring_segment_bytes);
  num(&s[3], "HORA_SHM_CHUNK_BYTES", p->shm_chunk_bytes);
  num(&s[4], "HORA_SHM_FLAT_BYTES", p->shm_flat_bytes);
  num(&s[5], "HORA_FUSION_THRESHOLD", p->fusion_threshold);
  num(&s[6], "HORA_CACHE_CAPACITY", (uint64_t)p->cache_capacity);
  str(&s[7], "HORA_GPU_PATH", p->gpu_path);
  num(&s[8], "HORA_STAGED_CHUNK_BYTES", p->staged_chunk_bytes);
  str(&s[9], "HORA_COMPRESSION", p->compression);
}

/* The rare path: every rank's printed value of setting k, grouped into "v on ranks a,b; w on
 * rank c" (the first values that fit the message), then `advice` in parentheses. */
static hora_result_t report(hora_ctx_t *c, const setting_t *mine, const char *advice) {
  size_t w = sizeof mine->shown;
  char *all = malloc(w * (size_t)c->size);
  if (!all) return HORA_ERR(HORA_ERR_NO_MEMORY, "hora_init: out of memory reporting %s", mine->env);
  HORA_MPI_CHECK(MPI_Allgather(mine->shown, (int)w, MPI_CHAR, all, (int)w, MPI_CHAR, c->world));
  char msg[600];
  size_t len = (size_t)snprintf(msg, sizeof msg, "hora_init: ranks disagree on %s: ", mine->env);
  for (int r = 0; r < c->size && len + 64 < sizeof msg; r++) {
    int first = 1;
    for (int q = 0; q < r && first; q++) first = strcmp(all + w * (size_t)q, all + w * (size_t)r) != 0;
    if (!first) continue;
    len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%s on rank(s) ", r ? "; " : "", all + w * (size_t)r);
    for (int q = r, k = 0; q < c->size && len + 16 < sizeof msg; q++)
      if (!strcmp(all + w * (size_t)q, all + w * (size_t)r))
        len += (size_t)snprintf(msg + len, sizeof msg - len, k++ ? ",%d" : "%d", q);
  }
  free(all);
  return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s (%s)", msg, advice);
}

/* The agreement on one setting, alone (a fixed size whatever the build). */
static hora_result_t agree_one(hora_ctx_t *c, const setting_t *s, const char *advice) {
  uint64_t w[2] = {s->value, ~s->value};
  HORA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, w, 2, MPI_UINT64_T, MPI_MAX, c->world));
  return w[0] == ~w[1] ? HORA_SUCCESS : report(c, s, advice);
}

hora_result_t hora__settings_agree(hora_ctx_t *c, const hora_params_t *p) {
  if (c->size == 1) return HORA_SUCCESS;
  setting_t build;
  char id[40];
  snprintf(id, sizeof id, "%s%s%s", HORA_VERSION_STRING, *HORA_BUILD_GIT ? " " : "", HORA_BUILD_GIT);
  str(&build, "the hora build (libhora's version and git commit)",
      p->test_build_id && *p->test_build_id ? p->test_build_id : id);
  HORA_CHECK(agree_one(c, &build, "every rank of a job must run the same libhora: install it once where "
                                  "every node reads it, or the same build on each node"));
  setting_t s[N_SETTINGS];
  collect(p, s);
  uint64_t w[2 * N_SETTINGS];
  for (int k = 0; k < N_SETTINGS; k++) w[k] = s[k].value, w[N_SETTINGS + k] = ~s[k].value;
  HORA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, w, 2 * N_SETTINGS, MPI_UINT64_T, MPI_MAX, c->world));
  for (int k = 0; k < N_SETTINGS; k++)
    if (w[k] != ~w[N_SETTINGS + k]) /* the same k on every rank */
      return report(c, &s[k], "it must be the same on every rank: set it in the job's environment, not per rank");
  return HORA_SUCCESS;
}
