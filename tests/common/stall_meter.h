/* The stall meter of the test programs that bound how fast a survivor notices a lost peer
 * (tests/fault/stop_probe.c, tests/slurm/elastic_probe.c): a thread that sleeps
 * STALL_METER_PERIOD_S at a time and records every wake-up that came more than
 * STALL_METER_SLACK_S late as an interval in which this process was not run (a loaded or frozen
 * machine: in CI a survivor returned 12.31 s after the stop, its watcher's heartbeat thread unrun
 * for 4.49 s of them). The test drivers take the part of these intervals inside the time they
 * bound off that time, so that only time the process was run counts; a process that runs and
 * does not notice still fails. Kept in a ring of the newest STALL_METER_MAX; times are
 * CLOCK_MONOTONIC seconds (Python's time.monotonic()). One meter per process. */
#ifndef HORA_TEST_STALL_METER_H
#define HORA_TEST_STALL_METER_H

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define STALL_METER_PERIOD_S 0.01
#define STALL_METER_SLACK_S 0.05
enum { STALL_METER_MAX = 256 };
static pthread_mutex_t stall_meter_mu = PTHREAD_MUTEX_INITIALIZER;
static double stall_meter_from[STALL_METER_MAX], stall_meter_to[STALL_METER_MAX];
static long stall_meter_n;

static double stall_meter_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *stall_meter_main(void *arg) {
  (void)arg;
  struct timespec period = {0, (long)(STALL_METER_PERIOD_S * 1e9)};
  double last = stall_meter_now();
  for (;;) {
    nanosleep(&period, NULL);
    double t = stall_meter_now();
    if (t - last > STALL_METER_PERIOD_S + STALL_METER_SLACK_S) {
      pthread_mutex_lock(&stall_meter_mu);
      stall_meter_from[stall_meter_n % STALL_METER_MAX] = last + STALL_METER_PERIOD_S;
      stall_meter_to[stall_meter_n % STALL_METER_MAX] = t;
      stall_meter_n++;
      pthread_mutex_unlock(&stall_meter_mu);
    }
    last = t;
  }
  return NULL;
}

/* Starts the meter's thread (detached); 0 on success. */
static int stall_meter_start(void) {
  pthread_t th;
  if (pthread_create(&th, NULL, stall_meter_main, NULL) != 0) return -1;
  pthread_detach(th);
  return 0;
}

/* Appends " FROM:TO" to text for each recorded stall that ended after `since` (monotonic), each
 * time plus `shift` (0 for monotonic times; CLOCK_REALTIME - CLOCK_MONOTONIC for UNIX times). */
static void stall_meter_append(char *text, size_t size, double since, double shift) {
  pthread_mutex_lock(&stall_meter_mu);
  long first = stall_meter_n > STALL_METER_MAX ? stall_meter_n - STALL_METER_MAX : 0;
  for (long i = first; i < stall_meter_n; i++) {
    size_t used = strlen(text);
    if (stall_meter_to[i % STALL_METER_MAX] > since && used + 48 < size)
      snprintf(text + used, size - used, " %.6f:%.6f", stall_meter_from[i % STALL_METER_MAX] + shift,
               stall_meter_to[i % STALL_METER_MAX] + shift);
  }
  pthread_mutex_unlock(&stall_meter_mu);
}

#endif
