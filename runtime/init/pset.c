/* Process sets (Horovod's add_process_set / remove_process_set): a process set IS a hora context,
 * derived from a parent context, whose world is a sub-communicator of the parent's world. Every
 * collective, the async engine and the layout getters then work on it unchanged.
 *
 *   parent world  0 1 2 3            hora_process_set_create(parent, {1,3}) on every parent rank
 *                   │   │            1. local checks of the list, then one MPI_Allreduce(MAX) of
 *                   ▼   ▼               {error, n, hash, -n, -hash}: a bad list on any rank or two
 *   set world       0   1               different lists fail on every rank (no hang); non-blocking
 *                                       and waited on with the heartbeat's verdict watched
 *                                       (hora__algo_wait), so a dead or stopped rank of the
 *                                       parent ends it with HORA_ERR_REMOTE naming that rank
 *                                    2. MPI_Comm_split(parent world): members get the sub-comm
 *                                    3. members: layout on it, the set's engine (its own thread and
 *                                       communicators, the root's heartbeat), publish
 *                                    4. one more MPI_Allreduce over the parent: a failure of any
 *                                       rank in 3 is every rank's error (watched as in 1)
 *
 * Steps 2 and 3 (MPI_Comm_split, the layout on the new communicator, the engine's MPI_Comm_dup)
 * have no form that can be abandoned; they run right after step 1 has shown every rank present.
 *
 * Ranks outside the set get an `excluded` context: every call on it but hora_process_set_destroy
 * returns HORA_ERR_INVALID_ARGUMENT naming the set's ranks (hora__ctx_check).
 *
 * Shared with the root context (made once, by hora_init): MPI, the fatal-signal handler, the
 * heartbeat (peer death fails the root's engine and, through it, every set's engine), the
 * timeline and GPU monitor (the root's only), the device. Not shared: communicators, the engine
 * thread, algorithm scratch and the shared-memory window (the set's own, on its own ranks).
 * A set's lifetime is inside its parent's: hora_finalize of the parent destroys the sets still
 * live, newest first (a finalizer on the parent, removed by hora_process_set_destroy). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/state.h"
#include "core/ctx.h"
#include "engine/engine_init.h"

/* Check the list and return it sorted (malloc'd) through *out. */
static hora_result_t check_list(const hora_ctx_t *ctx, const int *ranks, size_t nranks, int **out) {
  const char *fn = "hora_process_set_create";
  if (nranks == 0) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: the rank list is empty", fn);
  if (!ranks) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: ranks is NULL", fn);
  if (nranks > (size_t)INT32_MAX)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: nranks = %zu is not a rank count", fn, nranks);
  char *seen = calloc((size_t)ctx->size, 1);
  int *s = malloc(nranks * sizeof *s); /* nranks > size fails below: a rank repeats or is out of range */
  if (!seen || !s) {
    free(seen);
    free(s);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", fn);
  }
  hora_result_t rc = HORA_SUCCESS;
  for (size_t i = 0; i < nranks && rc == HORA_SUCCESS; i++) {
    if (ranks[i] < 0 || ranks[i] >= ctx->size)
      rc = HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: ranks[%zu] = %d is not a rank of the parent (0..%d)",
                    fn, i, ranks[i], ctx->size - 1);
    else if (seen[ranks[i]]++)
      rc = HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: rank %d is listed twice", fn, ranks[i]);
  }
  size_t n = 0;
  for (int r = 0; r < ctx->size; r++)
    if (seen[r]) s[n++] = r;
  free(seen);
  if (rc != HORA_SUCCESS) {
    free(s);
    return rc;
  }
  *out = s;
  return HORA_SUCCESS;
}

/* MPI_Allreduce(MAX) of n int64 over the parent, waited on with the verdict watched. After a
 * verdict MPI may still write `out`: it lives in a static buffer then, never on the caller's stack
 * (leaked by design, like the ring's buffers: core/ctx.h). */
static hora_result_t allreduce_max(hora_ctx_t *ctx, const int64_t *in, int64_t *out, int n) {
  static _Thread_local int64_t buf[2][5 + HORA_SET_SLOTS];
  memcpy(buf[0], in, (size_t)n * sizeof *in);
  MPI_Request req = MPI_REQUEST_NULL;
  HORA_MPI_CHECK(MPI_Iallreduce(buf[0], buf[1], n, MPI_INT64_T, MPI_MAX, ctx->world, &req));
  HORA_CHECK(hora__algo_wait(ctx, 1, &req, "hora_process_set_create"));
  memcpy(out, buf[1], (size_t)n * sizeof *out);
  return HORA_SUCCESS;
}

/* The call-count slot of a set made from `ctx` (core/ctx.h, HORA_SET_SLOTS): 1 in v[k] for each
 * slot this rank uses, so that the MAX over the parent marks the slots any rank uses; none for a
 * set made from a set. */
static int slots_mark(const hora_ctx_t *ctx, int64_t *v) {
  memset(v, 0, HORA_SET_SLOTS * sizeof *v);
  if (ctx->parent || !ctx->calls) return 0;
  for (int k = 0; k < HORA_SET_SLOTS; k++) v[k] = __atomic_load_n(&ctx->calls[1 + k].live, __ATOMIC_ACQUIRE);
  return 1;
}

/* Step 1's agreement: every rank's check result and its (sorted) list, compared; *slot gets the
 * lowest call-count slot no rank of the parent uses (-1: none, or a set made from a set). */
static hora_result_t agree_list(hora_ctx_t *ctx, hora_result_t mine, const int *sorted, size_t n, int *slot) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the sorted list */
  for (size_t i = 0; sorted && i < n; i++) {
    h ^= (uint64_t)(unsigned)sorted[i];
    h *= 1099511628211ull;
  }
  int64_t hv = (int64_t)(h >> 1), nv = (int64_t)n;
  int64_t v[5 + HORA_SET_SLOTS] = {mine != HORA_SUCCESS ? (int64_t)mine : 0, nv, hv, -nv, -hv}, mx[5 + HORA_SET_SLOTS];
  if (mine != HORA_SUCCESS) v[1] = v[2] = v[3] = v[4] = INT64_MIN + 1; /* not compared */
  int counted = slots_mark(ctx, v + 5);
  HORA_CHECK(allreduce_max(ctx, v, mx, 5 + HORA_SET_SLOTS));
  *slot = -1;
  for (int k = 0; counted && k < HORA_SET_SLOTS && *slot < 0; k++)
    if (!mx[5 + k]) *slot = k;
  if (mine != HORA_SUCCESS) return mine;
  if (mx[0]) return HORA_ERR((hora_result_t)mx[0], "hora_process_set_create: another rank rejected its "
                             "rank list (%s)", hora_result_name((hora_result_t)mx[0]));
  if (mx[1] != -mx[3] || mx[2] != -mx[4])
    return HORA_ERR(HORA_ERR_MISMATCH, "hora_process_set_create: the ranks passed different rank lists "
                    "(this rank, %d, passed %zu ranks starting at %d); every rank of the parent must pass "
                    "the same list", ctx->rank, n, sorted[0]);
  return HORA_SUCCESS;
}

/* A member's set takes its call-count slot (agreed in step 1): counted from zero from now on. */
static void slot_take(hora_ctx_t *set, int slot) {
  if (slot < 0 || set->excluded) return;
  struct hora_calls *c = &set->parent->calls[1 + slot];
  /* Atomic: the heartbeat thread may still be reading the slot's counts of a set destroyed just
   * before (it reads them without a lock, and checks `live` between). */
  __atomic_store_n(&c->entered, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&c->done, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&c->fin, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&c->lag, 0, __ATOMIC_RELAXED);
  snprintf(c->what, sizeof c->what, "process set of %d ranks (%d..%d)", set->size, set->set_ranks[0],
           set->set_ranks[set->set_nranks - 1]);
  set->calls = c;
  __atomic_store_n(&c->live, 1, __ATOMIC_RELEASE);
}

static hora_result_t destroy_now(hora_ctx_t *set) {
  if (set->calls) __atomic_store_n(&set->calls->live, 0, __ATOMIC_RELEASE); /* the heartbeat lets go */
  if (__atomic_load_n(&set->parent->failed, __ATOMIC_ACQUIRE)) __atomic_store_n(&set->failed, 1, __ATOMIC_RELEASE);
  hora_result_t rc = hora__ctx_run_finalizers(set);
  hora__ctx_discard(set);
  return rc;
}

/* The parent's finalizer for a set the program did not destroy. */
static hora_result_t parent_finalizer(hora_ctx_t *parent, void *arg) {
  (void)parent;
  return destroy_now(arg);
}

/* Steps 2 and 3 on this rank: the sub-communicator, then (members) the set's context. */
static hora_result_t build_set(hora_ctx_t *ctx, int *sorted, size_t n, hora_ctx_t **out) {
  int member = 0;
  for (size_t i = 0; i < n; i++) member |= sorted[i] == ctx->rank;
  MPI_Comm comm = MPI_COMM_NULL;
  int mrc = MPI_Comm_split(ctx->world, member ? 0 : MPI_UNDEFINED, ctx->rank, &comm);
  if (mrc != MPI_SUCCESS) {
    free(sorted);
    return hora__mpi_error(mrc, "MPI_Comm_split(process set)", __FILE__, __LINE__);
  }
  hora_ctx_t *c = NULL;
  HORA_CHECK(hora__ctx_open_sub(ctx, comm, sorted, (int)n, &c)); /* owns comm and sorted */
  hora_result_t rc = HORA_SUCCESS;
  if (member) HORA_CHECK_GOTO(hora__engine_on_init(c), rc, fail);
  HORA_CHECK_GOTO(hora__ctx_publish(c), rc, fail);
  *out = c;
  return HORA_SUCCESS;
fail:
  __atomic_store_n(&c->failed, 1, __ATOMIC_RELEASE);
  hora__engine_abort(c, HORA_ERR_REMOTE, "hora_process_set_create failed");
  hora__ctx_run_finalizers(c);
  hora__ctx_discard(c);
  return rc;
}

HORA_EXPORT hora_result_t hora_process_set_create(hora_ctx_t *ctx, const int *ranks, size_t nranks,
                                                  hora_ctx_t **set) {
  hora__error_clear();
  HORA_CHECK(hora__ctx_check(ctx, "hora_process_set_create"));
  int *sorted = NULL;
  hora_result_t mine = set ? check_list(ctx, ranks, nranks, &sorted)
                           : HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_process_set_create: set (output) is NULL");
  int slot = -1;
  hora_result_t rc = agree_list(ctx, mine, sorted, nranks, &slot);
  if (rc != HORA_SUCCESS) {
    free(sorted);
    return rc;
  }
  hora_ctx_t *c = NULL;
  rc = build_set(ctx, sorted, nranks, &c);
  if (rc == HORA_SUCCESS) rc = hora__ctx_add_finalizer(ctx, parent_finalizer, c);
  /* Step 4: one rank's failure is everyone's. */
  int64_t bad = rc != HORA_SUCCESS ? (int64_t)rc : 0, any = 0;
  hora_result_t arc = allreduce_max(ctx, &bad, &any, 1);
  if (rc == HORA_SUCCESS && (any || arc != HORA_SUCCESS)) {
    rc = arc != HORA_SUCCESS ? arc
                             : HORA_ERR((hora_result_t)any, "hora_process_set_create: another rank failed "
                                        "to create the set (%s)", hora_result_name((hora_result_t)any));
    hora__ctx_remove_finalizer(ctx, parent_finalizer, c);
    __atomic_store_n(&c->failed, 1, __ATOMIC_RELEASE);
    hora__engine_abort(c, HORA_ERR_REMOTE, hora_last_error());
    hora__ctx_run_finalizers(c);
    hora__ctx_discard(c);
    return rc;
  }
  if (rc != HORA_SUCCESS) return rc;
  slot_take(c, slot);
  if (!c->excluded && c->rank == 0)
    HORA_INFO(INIT, "process set of %d ranks (parent ranks %d..%d) created", c->size, c->set_ranks[0],
              c->set_ranks[c->set_nranks - 1]);
  *set = c;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_process_set_destroy(hora_ctx_t *set) {
  if (!set) return HORA_SUCCESS;
  HORA_CHECK(hora__ctx_check_live(set, "hora_process_set_destroy"));
  if (!set->parent)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_process_set_destroy: the context was made by "
                    "hora_init, not hora_process_set_create: release it with hora_finalize");
  hora__ctx_remove_finalizer(set->parent, parent_finalizer, set);
  return destroy_now(set);
}

HORA_EXPORT hora_result_t hora_process_set_included(hora_ctx_t *set, int *included) {
  HORA_CHECK(hora__ctx_check_live(set, "hora_process_set_included"));
  if (!included) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_process_set_included: included is NULL");
  *included = !set->excluded;
  return HORA_SUCCESS;
}
