/* The backoff of hora's polled MPI waits (hora__algo_wait_backoff, algo/state.c), against the
 * clock: it spins first, yields until 10 ms, and a wait for `bytes` of data yields (never sleeps)
 * for bytes / 50 MB/s longer, then sleeps. A sleep inside that window would stall a transfer that
 * Open MPI moves only inside this rank's MPI calls (docs/benchmarks.md, "Waits that move data"). */
#include "algo/state.h"
#include "core/internal.h"
#include "hora_test.h"

long hora_test_errors_dummy;

/* Poll the backoff as a wait would; the seconds from the first poll to the first sleep. */
static double first_sleep_after(size_t bytes, int *spins) {
  hora_backoff_t b = {0, 0, bytes};
  double t0 = hora__now_s();
  *spins = 0;
  for (unsigned i = 0;; i++) {
    int r = hora__algo_wait_backoff(i, &b);
    if (r == 0) ++*spins;
    if (r == 2) return hora__now_s() - t0;
    if (hora__now_s() - t0 > 30) return -1; /* never slept */
  }
}

int main(void) {
  int spins = 0;
  double t = first_sleep_after(0, &spins);
  printf("no data: first sleep after %.4f s, %d spins\n", t, spins);
  EXPECT(t >= 0.010, "a wait moving no data slept after %.4f s, before 10 ms", t);
  EXPECT(t < 1.0, "a wait moving no data did not sleep within 1 s (%.4f)", t);
  EXPECT(spins >= 64, "only %d spins before yielding", spins);

  /* 5 MB: 10 ms + 100 ms of polling without a sleep. */
  t = first_sleep_after(5000000, &spins);
  printf("5 MB: first sleep after %.4f s\n", t);
  EXPECT(t >= 0.110, "a wait moving 5 MB slept after %.4f s, before 110 ms", t);
  EXPECT(t < 1.1, "a wait moving 5 MB did not sleep within 1.1 s (%.4f)", t);

  /* 25 MB: 510 ms. */
  t = first_sleep_after(25000000, &spins);
  printf("25 MB: first sleep after %.4f s\n", t);
  EXPECT(t >= 0.510, "a wait moving 25 MB slept after %.4f s, before 510 ms", t);
  EXPECT(t < 1.5, "a wait moving 25 MB did not sleep within 1.5 s (%.4f)", t);
  return hora_test_finish("test_wait_backoff");
}
