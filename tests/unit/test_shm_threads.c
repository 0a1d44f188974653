/* The default thread count of the shared-memory allreduce (hora__shm_auto_threads, algo/shm.c,
 * HORA_SHM_THREADS=0): a rank's share of its node's CPUs, capped at 8 and at its own CPUs. The
 * 2-core test machine only ever computes 1 in the collective tests, so the layouts of real nodes
 * are checked here. */
#include "algo/algo.h"
#include "hora_test.h"

long hora_test_errors_dummy;

int main(void) {
  static const struct {
    int node, local, own, want;
    const char *what;
  } c[] = {
      {16, 2, 8, 8, "16 cores split between 2 ranks (launch)"},
      {16, 4, 4, 4, "16 cores split among 4 ranks"},
      {16, 4, 16, 4, "4 unbound ranks on 16 cores: the share, not the whole node"},
      {64, 2, 32, 8, "2 ranks of 32 cores: at most 8"},
      {2, 2, 1, 1, "a core per rank (the 2-core test machine)"},
      {2, 4, 2, 1, "more ranks than cores: 1"},
      {16, 2, 1, 1, "a rank bound to one core on a larger node"},
      {16, 2, 3, 3, "own mask smaller than the share"},
      {0, 2, 0, 1, "nothing known: 1"},
      {8, 0, 8, 8, "local size 0 taken as 1"},
      {7, 2, 7, 3, "odd CPU counts round down"},
  };
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    int got = hora__shm_auto_threads(c[i].node, c[i].local, c[i].own);
    EXPECT(got == c[i].want, "%s: node %d CPUs, %d local ranks, own %d: %d threads, want %d", c[i].what, c[i].node,
           c[i].local, c[i].own, got, c[i].want);
  }
  return hora_test_finish("test_shm_threads");
}
