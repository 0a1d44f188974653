/* The last rank submits a tensor with one field different from the other ranks': every rank's
 * handle must complete with HORA_ERR_MISMATCH within seconds, with a message naming the tensor,
 * the field and the ranks. Each field once on the coordinator path (new name) and once after the
 * name is in the response cache (the cache slot is invalidated and rank 0 reports it). Then a
 * matching request must still work (the engine is not broken by a mismatch). The same for grouped
 * allreduces whose ranks group other tensors (members that only some ranks submit included), and
 * for refusals (hora_refuse_async: one rank's call failed its own checks). */
#include <stdint.h>
#include <unistd.h>

#include "hora_test.h"

static int rank, size;

enum { F_OPERATION, F_DTYPE, F_COUNT, F_OP, F_ROOT, F_PRESCALE, F_POSTSCALE, F_RECVCOUNTS, F_N };
static const char *const fname[F_N] = {"operation", "dtype", "count", "reduce op", "root",
                                       "prescale", "postscale", "recvcounts"};

static double sbuf[64], rbuf[64 * 8];

/* Submit `name` as case f; `differ` makes this rank's field different. */
static hora_result_t submit(hora_ctx_t *ctx, const char *name, int f, int differ, hora_handle_t **h) {
  size_t count = 10 + (f == F_COUNT && differ);
  hora_dtype_t dt = f == F_DTYPE && differ ? HORA_INT64 : HORA_FLOAT64;
  hora_op_t op = f == F_OP && differ ? HORA_MAX : HORA_SUM;
  double pre = f == F_PRESCALE && differ ? 2.0 : 1.0, post = f == F_POSTSCALE && differ ? 0.25 : 1.0;
  if (f == F_OPERATION && differ) return hora_allgather_async(ctx, name, sbuf, rbuf, 10, HORA_FLOAT64, HORA_DEVICE_HOST, h);
  if (f == F_ROOT) return hora_broadcast_async(ctx, name, rbuf, 10, HORA_FLOAT64, differ ? 1 : 0, HORA_DEVICE_HOST, h);
  if (f == F_RECVCOUNTS) {
    size_t rc[8];
    for (int r = 0; r < size; r++) rc[r] = (size_t)r + 1;
    if (differ) rc[0] += 1, rc[size - 1] -= 1;
    return hora_allgatherv_async(ctx, name, sbuf, rc[rank], rbuf, rc, HORA_FLOAT64, HORA_DEVICE_HOST, h);
  }
  if (f == F_DTYPE && differ) pre = post = 1.0;
  return hora_allreduce_async(ctx, name, sbuf, rbuf, count, dt, op, pre, post, HORA_DEVICE_HOST, h);
}

static void expect_mismatch(hora_ctx_t *ctx, const char *name, int f) {
  hora_handle_t *h;
  double t0 = MPI_Wtime();
  EXPECT_OK(submit(ctx, name, f, rank == size - 1, &h));
  hora_result_t rc = hora_wait(h);
  double dt = MPI_Wtime() - t0;
  EXPECT(rc == HORA_ERR_MISMATCH, "%s (%s): got %s, want HORA_ERR_MISMATCH", name, fname[f], hora_result_name(rc));
  const char *msg = hora_last_error();
  char want_rank[32];
  snprintf(want_rank, sizeof want_rank, "rank %d", size - 1);
  EXPECT(strstr(msg, name) && strstr(msg, fname[f]) && strstr(msg, want_rank),
         "%s: message does not name tensor, field '%s' and %s: %s", name, fname[f], want_rank, msg);
  EXPECT(dt < 5.0, "%s: mismatch took %.1f s", name, dt);
  hora_handle_free(h);
}

/* Grouped allreduce whose ranks disagree on the members (hora_grouped_allreduce_async): the
 * last rank groups `theirs` names where the others group `ours` (prefix + member letters; an
 * empty `theirs` member list means the last rank submits member 'a' as an allreduce of its own).
 * Every rank's handle must fail with HORA_ERR_MISMATCH naming the group, within seconds, also on
 * the ranks holding members the last rank never submits. */
static hora_result_t submit_group(hora_ctx_t *ctx, const char *prefix, const char *members, hora_handle_t **h) {
  const char *names[8];
  char store[8][64];
  const void *sb[8];
  void *rb[8];
  size_t counts[8];
  size_t n = strlen(members);
  if (n == 0) {
    snprintf(store[0], sizeof store[0], "%s/a", prefix);
    return hora_allreduce_async(ctx, store[0], sbuf, rbuf, 10, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST, h);
  }
  for (size_t i = 0; i < n; i++) {
    snprintf(store[i], sizeof store[i], "%s/%c", prefix, members[i]);
    names[i] = store[i];
    sb[i] = sbuf;
    rb[i] = rbuf + 10 * i;
    counts[i] = 10;
  }
  return hora_grouped_allreduce_async(ctx, names, sb, rb, counts, n, HORA_FLOAT64, HORA_SUM, 1, 1,
                                      HORA_DEVICE_HOST, h);
}

static void expect_group_mismatch(hora_ctx_t *ctx, const char *prefix, const char *ours, const char *theirs) {
  hora_handle_t *h;
  double t0 = MPI_Wtime();
  EXPECT_OK(submit_group(ctx, prefix, rank == size - 1 ? theirs : ours, &h));
  hora_result_t rc = hora_wait(h);
  double dt = MPI_Wtime() - t0;
  EXPECT(rc == HORA_ERR_MISMATCH, "group %s (%s / %s): got %s, want HORA_ERR_MISMATCH", prefix, ours, theirs,
         hora_result_name(rc));
  const char *msg = hora_last_error();
  EXPECT(strstr(msg, prefix) && strstr(msg, "grouped call"), "group %s: message does not name the group: %s",
         prefix, msg);
  EXPECT(dt < 5.0, "group %s: mismatch took %.1f s", prefix, dt);
  hora_handle_free(h);
}

/* A group tagged member by member (hora_set_call_group: allgathers submitted one by one, as the
 * Python bindings' grouped allgather does); the last rank's members are `theirs`. With `pause`,
 * each rank sleeps 30 ms between its members, so that they reach the engine in different cycles
 * (held until the group is complete). Returns the handles' first result. */
static hora_result_t tagged_group(hora_ctx_t *ctx, const char *prefix, const char *ours, const char *theirs,
                                  int pause) {
  const char *members = rank == size - 1 ? theirs : ours;
  size_t n = strlen(members);
  char names[8][64];
  uint64_t key = 0;
  for (size_t i = 0; i < n; i++) snprintf(names[i], sizeof names[i], "%s/%c", prefix, members[i]);
  for (size_t i = 0; i < n; i++) { /* any digest of the set of names: a sum of the names' FNV-1a */
    uint64_t d = 1469598103934665603ull;
    for (const char *c = names[i]; *c; c++) d = (d ^ (unsigned char)*c) * 1099511628211ull;
    key += d;
  }
  hora_handle_t *h[8];
  memset(rbuf, 0, sizeof rbuf);
  for (size_t i = 0; i < n; i++) {
    if (pause && i) usleep(30000);
    EXPECT_OK(hora_set_call_group(ctx, key, (uint32_t)n));
    EXPECT_OK(hora_allgather_async(ctx, names[i], sbuf, rbuf + 10 * size * i, 10, HORA_FLOAT64, HORA_DEVICE_HOST, &h[i]));
  }
  hora_result_t first = HORA_SUCCESS;
  for (size_t i = 0; i < n; i++) {
    hora_result_t rc = hora_wait(h[i]);
    if (first == HORA_SUCCESS && rc != HORA_SUCCESS) first = rc;
    hora_handle_free(h[i]);
  }
  return first;
}

/* The same group on every rank: completes with the sums. */
static void expect_group_ok(hora_ctx_t *ctx, const char *prefix, const char *members) {
  hora_handle_t *h;
  memset(rbuf, 0, sizeof rbuf);
  EXPECT_OK(submit_group(ctx, prefix, members, &h));
  EXPECT_OK(hora_wait(h));
  hora_handle_free(h);
  for (size_t i = 0; i < 10 * strlen(members); i++)
    EXPECT(rbuf[i] == size * (size + 1) / 2.0, "group %s (%s): element %zu is %g", prefix, members, i, rbuf[i]);
}

/* Refusals: `who` ranks (-1: every rank; else that rank) refuse the name(s) while the others
 * submit the real call (an allreduce, or a grouped allreduce of `members`). Every rank's handle
 * fails within seconds with HORA_ERR_MISMATCH naming the tensor and the refusing ranks. */
static void expect_refused(hora_ctx_t *ctx, const char *prefix, const char *members, int who) {
  const char *names[8];
  char store[8][64];
  size_t n = members ? strlen(members) : 1;
  for (size_t i = 0; i < n; i++) {
    if (members) snprintf(store[i], sizeof store[i], "%s/%c", prefix, members[i]);
    else snprintf(store[i], sizeof store[i], "%s", prefix);
    names[i] = store[i];
  }
  hora_handle_t *h;
  double t0 = MPI_Wtime();
  if (who < 0 || rank == who) EXPECT_OK(hora_refuse_async(ctx, names, n, &h));
  else if (members) EXPECT_OK(submit_group(ctx, prefix, members, &h));
  else EXPECT_OK(hora_allreduce_async(ctx, prefix, sbuf, rbuf, 10, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h));
  hora_result_t rc = hora_wait(h);
  double dt = MPI_Wtime() - t0;
  EXPECT(rc == HORA_ERR_MISMATCH, "refused %s (by %d): got %s, want HORA_ERR_MISMATCH", prefix, who,
         hora_result_name(rc));
  const char *msg = hora_last_error();
  char want[64];
  if (who < 0) snprintf(want, sizeof want, "rank(s) 0-%d,", size - 1);
  else snprintf(want, sizeof want, "rank(s) %d,", who); /* followed by the message's ", which" */
  EXPECT(strstr(msg, prefix) && strstr(msg, "failed its own argument checks") && strstr(msg, want),
         "refused %s: message does not name the tensor and '%s': %s", prefix, want, msg);
  EXPECT(dt < 5.0, "refused %s: took %.1f s", prefix, dt);
  hora_handle_free(h);
}

static void test_refusals(hora_ctx_t *ctx) {
  hora_handle_t *h = (hora_handle_t *)0x1;
  const char *one[1] = {"ref/x"};
  EXPECT_RC(hora_refuse_async(ctx, one, 0, &h), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_refuse_async(ctx, NULL, 1, &h), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_refuse_async(ctx, one, 1, NULL), HORA_ERR_INVALID_ARGUMENT);
  const char *empty[1] = {""};
  EXPECT_RC(hora_refuse_async(ctx, empty, 1, &h), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(h == (hora_handle_t *)0x1, "handle changed on error");
  /* The last rank, then rank 0, then every rank; new names and a cached one; then the name runs. */
  expect_refused(ctx, "ref/last", NULL, size - 1);
  expect_refused(ctx, "ref/first", NULL, 0);
  expect_refused(ctx, "ref/all", NULL, -1);
  EXPECT_OK(hora_allreduce_async(ctx, "ref/cached", sbuf, rbuf, 10, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h));
  EXPECT_OK(hora_wait(h));
  hora_handle_free(h);
  expect_refused(ctx, "ref/cached", NULL, size - 1);
  const char *names[4] = {"ref/last", "ref/first", "ref/all", "ref/cached"};
  for (int i = 0; i < 4; i++) {
    memset(rbuf, 0, 10 * sizeof *rbuf);
    EXPECT_OK(hora_allreduce_async(ctx, names[i], sbuf, rbuf, 10, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h));
    EXPECT_OK(hora_wait(h));
    hora_handle_free(h);
    EXPECT(rbuf[0] == size * (size + 1) / 2.0 && rbuf[9] == rbuf[0], "%s after its refusal: %g %g", names[i], rbuf[0],
           rbuf[9]);
  }
  /* A grouped allreduce refused by the last rank (its refusal names the same members), and one
   * whose refusal names a member fewer: every member fails on every rank, none is left waiting. */
  expect_refused(ctx, "ref/grp", "abc", size - 1);
  expect_group_ok(ctx, "ref/grp", "abc");
  {
    const char *two[2] = {"ref/grp2/a", "ref/grp2/b"};
    if (rank == size - 1) EXPECT_OK(hora_refuse_async(ctx, two, 2, &h));
    else EXPECT_OK(submit_group(ctx, "ref/grp2", "abc", &h));
    double t0 = MPI_Wtime();
    hora_result_t rc = hora_wait(h);
    EXPECT(rc == HORA_ERR_MISMATCH, "group refused with a member fewer: got %s", hora_result_name(rc));
    EXPECT(MPI_Wtime() - t0 < 5.0, "group refused with a member fewer: took %.1f s", MPI_Wtime() - t0);
    hora_handle_free(h);
    expect_group_ok(ctx, "ref/grp2", "abc");
  }
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) return 1;
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);
  if (size < 2 || size > 8) {
    EXPECT_OK(hora_finalize(ctx));
    MPI_Finalize();
    return HORA_TEST_SKIP;
  }
  for (int i = 0; i < 64; i++) sbuf[i] = rank + 1;
  for (int f = 0; f < F_N; f++) {
    char name[64];
    snprintf(name, sizeof name, "mm/new/%d", f);
    expect_mismatch(ctx, name, f);
    /* Cached first: one matching round, then the mismatch. */
    snprintf(name, sizeof name, "mm/cached/%d", f);
    hora_handle_t *h;
    EXPECT_OK(submit(ctx, name, f, 0, &h));
    EXPECT_OK(hora_wait(h));
    hora_handle_free(h);
    expect_mismatch(ctx, name, f);
    /* And matching again afterwards. */
    EXPECT_OK(submit(ctx, name, f, 0, &h));
    EXPECT_OK(hora_wait(h));
    hora_handle_free(h);
  }
  /* Groups: a member fewer on the last rank, a member more, a lone allreduce against a group,
   * the same number of members under other names; each new and after the group was cached;
   * and then the group the ranks agree on again. */
  static const char *const cases[][2] = {{"abc", "ab"}, {"ab", "abc"}, {"ab", ""}, {"abc", "abd"}};
  /* The order of the members does not matter: the same set of names is the same group. */
  {
    hora_handle_t *h;
    memset(rbuf, 0, sizeof rbuf);
    EXPECT_OK(submit_group(ctx, "grp/order", rank == size - 1 ? "cab" : "abc", &h));
    EXPECT_OK(hora_wait(h));
    hora_handle_free(h);
    EXPECT(rbuf[0] == size * (size + 1) / 2.0 && rbuf[29] == size * (size + 1) / 2.0,
           "group in another order: %g %g", rbuf[0], rbuf[29]);
  }
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "grp/new/%zu", k);
    expect_group_mismatch(ctx, prefix, cases[k][0], cases[k][1]);
    expect_group_ok(ctx, prefix, cases[k][0]);
    snprintf(prefix, sizeof prefix, "grp/cached/%zu", k);
    expect_group_ok(ctx, prefix, cases[k][0]);
    expect_group_mismatch(ctx, prefix, cases[k][0], cases[k][1]);
    expect_group_ok(ctx, prefix, cases[k][0]);
  }
  /* Groups tagged member by member: agreed (members in different cycles: held, then released
   * together), then a member more on the last rank, then agreed again (no straggler left). */
  for (int pause = 0; pause < 2; pause++) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "tag/%d", pause);
    EXPECT_OK(tagged_group(ctx, prefix, "abc", "abc", pause));
    for (int r = 0; r < size; r++)
      EXPECT(rbuf[10 * r] == r + 1 && rbuf[10 * size * 2 + 10 * r + 9] == r + 1,
             "tagged group %s: rank %d's block holds %g, %g", prefix, r, rbuf[10 * r], rbuf[10 * size * 2 + 10 * r + 9]);
    double t0 = MPI_Wtime();
    hora_result_t rc = tagged_group(ctx, prefix, "abc", "abcd", pause);
    EXPECT(rc == HORA_ERR_MISMATCH && strstr(hora_last_error(), "grouped call"),
           "tagged group %s, a member more on the last rank: got %s (%s)", prefix, hora_result_name(rc),
           hora_last_error());
    EXPECT(MPI_Wtime() - t0 < 5.0, "tagged group %s: mismatch took %.1f s", prefix, MPI_Wtime() - t0);
    EXPECT_OK(tagged_group(ctx, prefix, "abc", "abc", pause));
  }
  test_refusals(ctx);
  EXPECT(hora_set_call_group(ctx, 42, 0) == HORA_ERR_INVALID_ARGUMENT, "hora_set_call_group(size 0) accepted");
  EXPECT_OK(hora_set_call_group(ctx, 0, 0));
  double x = rank + 1, y = 0;
  hora_handle_t *h;
  EXPECT_OK(hora_allreduce_async(ctx, "mm/after", &x, &y, 1, HORA_FLOAT64, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h));
  EXPECT_OK(hora_wait(h));
  hora_handle_free(h);
  EXPECT(y == size * (size + 1) / 2.0, "after mismatches: %g", y);
  EXPECT_OK(hora_finalize(ctx));
  int rc = hora_test_finish_mpi("test_engine_mismatch");
  MPI_Finalize();
  return rc;
}
