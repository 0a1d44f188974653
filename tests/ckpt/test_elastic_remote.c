/* A peer that stops answering during hora_elastic_sync or hora_elastic_hosts_changed ends the
 * call on the others with HORA_ERR_REMOTE within HORA_PEER_TIMEOUT_S (plus slack), not a hang,
 * and the survivor can still save its commit for the next step:
 *   1. every rank syncs (fresh) and commits id 1
 *   2. the last rank stops itself (SIGSTOP: alive but silent); the others call sync, which must
 *      return HORA_ERR_REMOTE; they save commit 1 (the file must exist), finalize, and rank 0
 *      sends SIGCONT to the last rank
 *   3. the last rank, resumed, calls hora_elastic_hosts_changed: its peers have finalized, so it
 *      must get HORA_ERR_REMOTE too; it saves and finalizes
 * After the failure MPI cannot carry the error counts: each rank prints "rank R ok" or FAILED and
 * elastic_remote_test.py judges the job by those lines (mpirun's own status reports the ranks
 * that hora_finalize left without MPI_Finalize after the failure). */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hora.h"
#include "hora_test.h"

#define PEER_TIMEOUT_S 3 /* as the fault tests (tests/fault) */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
  char pt[16];
  snprintf(pt, sizeof pt, "%d", PEER_TIMEOUT_S);
  setenv("HORA_PEER_TIMEOUT_S", pt, 1);
  hora_ctx_t *ctx = NULL;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  int rank = 0, size = 1;
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);
  if (size < 2) { /* needs a peer to lose */
    hora_finalize(ctx);
    return 0;
  }
  int64_t pid = getpid(), *pids = calloc((size_t)size, sizeof *pids);
  char dir[256] = "";
  if (rank == 0) {
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/hora-test-elastic-remote-%ld", t && *t ? t : "/tmp", (long)pid);
  }
  float w[64];
  for (int i = 0; i < 64; i++) w[i] = (float)(i + 1);
  hora_tensor_t t = {"w", w, 64, HORA_FLOAT32, HORA_DEVICE_HOST, 0, NULL};
  hora_elastic_t *es = NULL;
  int64_t id = -1;
  EXPECT_RC(hora_broadcast(ctx, dir, sizeof dir, HORA_UINT8, 0, HORA_DEVICE_HOST), HORA_SUCCESS);
  EXPECT_RC(hora_allgather(ctx, &pid, pids, 1, HORA_INT64, HORA_DEVICE_HOST), HORA_SUCCESS);
  EXPECT_RC(hora_elastic_open(ctx, dir, NULL, 0, &es), HORA_SUCCESS);
  EXPECT_RC(hora_elastic_sync(es, &t, 1, NULL, 0, NULL, &id), HORA_SUCCESS);
  EXPECT_RC(hora_elastic_commit(es, &t, 1, NULL, 0), HORA_SUCCESS);
  EXPECT_RC(hora_barrier(ctx), HORA_SUCCESS);
  const int last = size - 1;
  char file[400];
  snprintf(file, sizeof file, "%s/commit-1.r%d.hora", dir, rank);
  struct stat st;
  if (rank == last) {
    raise(SIGSTOP); /* rank 0 resumes it after the others gave up */
    double t0 = now_s();
    int changed = -1;
    EXPECT_ERR(hora_elastic_hosts_changed(es, &changed), HORA_ERR_REMOTE, "heartbeat");
    EXPECT(now_s() - t0 < PEER_TIMEOUT_S + 20, "hosts_changed took %.1f s", now_s() - t0);
  } else {
    double t0 = now_s();
    EXPECT_ERR(hora_elastic_sync(es, &t, 1, NULL, 0, NULL, &id), HORA_ERR_REMOTE, "heartbeat");
    double dt = now_s() - t0;
    EXPECT(dt < PEER_TIMEOUT_S + 20, "sync took %.1f s to report the silent rank", dt);
    fprintf(stderr, "rank %d: sync returned HORA_ERR_REMOTE after %.1f s\n", rank, dt);
  }
  EXPECT_RC(hora_elastic_save(es), HORA_SUCCESS);
  EXPECT(stat(file, &st) == 0 && st.st_size > 64 * 4, "rank %d: %s missing after hora_elastic_save", rank, file);
  int64_t c = -1;
  EXPECT_RC(hora_elastic_commit_id(es, &c), HORA_SUCCESS);
  EXPECT(c == 1, "rank %d: commit %" PRId64 " after the failed call, want 1", rank, c);
  if (rank == 0) {
    /* Resume the last rank only when every other survivor has saved (its file exists): a rank
     * learns of the failure from the heartbeat, and a rank 0 that left early could hide it. */
    for (int r = 1; r < last; r++) {
      char f[400];
      snprintf(f, sizeof f, "%s/commit-1.r%d.hora", dir, r);
      for (int i = 0; i < 300 && stat(f, &st) != 0; i++) usleep(100000);
      EXPECT(stat(f, &st) == 0, "rank %d never saved %s", r, f);
    }
  }
  hora_finalize(ctx);
  if (rank == 0) kill((pid_t)pids[last], SIGCONT);
  if (hora_test_errors) fprintf(stderr, "test_elastic_remote: rank %d FAILED (%ld errors)\n", rank, hora_test_errors);
  else printf("test_elastic_remote: rank %d ok\n", rank);
  fflush(NULL);
  if (rank != last) {
    /* mpirun ends the job when the first rank exits without MPI_Finalize: hold until the resumed
     * rank has reported (one peer timeout after the others finalized); it cleans up and exits
     * first, and mpirun then ends these. */
    sleep(2 * PEER_TIMEOUT_S + 4);
  } else {
    snprintf(file, sizeof file, "rm -rf '%s'", dir);
    if (system(file) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  }
  free(pids);
  return hora_test_errors ? 1 : 0;
}
