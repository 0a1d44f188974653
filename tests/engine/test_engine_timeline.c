/* Timeline (HORA_TIMELINE): after hora_finalize rank 0 parses the file with jansson and checks
 * that it is one JSON array in Chrome trace form holding, for every tensor, QUEUE and NEGOTIATE,
 * the op's phase, and for the fused ones (a grouped allreduce of small tensors always travels
 * fused) MEMCPY_IN_FUSION_BUFFER/MEMCPY_OUT_FUSION_BUFFER when the group went through the fusion buffer, and
 * neither when it was reduced in place of the tensors (the engine's counters say which path ran;
 * HORA_ALLREDUCE_ALGO=mpi forces the fusion buffer), plus cycle markers (none with
 * HORA_TIMELINE_MARK_CYCLES=0).
 * With argument "cap" (and HORA_TIMELINE_MAX_BYTES=4096) the file must stay within the cap,
 * still parse, and report the dropped events.
 * With argument "dynamic" (no HORA_TIMELINE): hora_timeline_start/stop (Horovod's
 * hvd.start_timeline): argument errors, a missing directory (rank 0 only), a stop with nothing
 * recording, two files each holding exactly the requests of its own interval and readable as
 * soon as the recording moves on, cycle markers only where asked, a process set refused, and
 * starts and stops while requests are in flight (results still right; for TSan). */
#include <jansson.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>

#include "engine/engine.h"
#include "hora_test.h"

#define NG 10

static int has_phase(json_t *events, int tid, const char *phase) {
  size_t i;
  json_t *e;
  json_array_foreach(events, i, e) {
    json_t *t = json_object_get(e, "tid"), *n = json_object_get(e, "name"), *ph = json_object_get(e, "ph");
    if (t && n && ph && json_integer_value(t) == tid && strcmp(json_string_value(n), phase) == 0 &&
        strcmp(json_string_value(ph), "X") == 0)
      return 1;
  }
  return 0;
}

static int tid_of(json_t *events, const char *name) {
  size_t i;
  json_t *e;
  json_array_foreach(events, i, e) {
    json_t *n = json_object_get(e, "name"), *args = json_object_get(e, "args");
    if (n && args && strcmp(json_string_value(n), "thread_name") == 0) {
      json_t *an = json_object_get(args, "name");
      if (an && strcmp(json_string_value(an), name) == 0) return (int)json_integer_value(json_object_get(e, "tid"));
    }
  }
  return -1;
}


static int count_named(json_t *events, const char *prefix) {
  size_t i, n = 0;
  json_t *e;
  json_array_foreach(events, i, e) {
    json_t *args = json_object_get(e, "args");
    const char *an = args ? json_string_value(json_object_get(args, "name")) : NULL;
    if (an && strncmp(an, prefix, strlen(prefix)) == 0) n++;
  }
  return (int)n;
}

static int count_cycles(json_t *events) {
  size_t i, n = 0;
  json_t *e;
  json_array_foreach(events, i, e) {
    const char *nm = json_string_value(json_object_get(e, "name"));
    if (nm && strcmp(nm, "CYCLE_START") == 0) n++;
  }
  return (int)n;
}

/* k allreduces named prefix/0 .. prefix/k-1 of 64 floats, checked. */
static void step(hora_ctx_t *ctx, const char *prefix, int k, int size) {
  float s[64], r[64];
  for (int j = 0; j < k; j++) {
    char name[64];
    snprintf(name, sizeof name, "%s/%d", prefix, j);
    for (int i = 0; i < 64; i++) s[i] = (float)(i + j);
    hora_handle_t *h;
    EXPECT_OK(hora_allreduce_async(ctx, name, s, r, 64, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h));
    EXPECT_OK(hora_wait(h));
    hora_handle_free(h);
    EXPECT(r[7] == (float)((7 + j) * size), "%s: %g, want %d", name, r[7], (7 + j) * size);
  }
}

static json_t *load(const char *path) {
  json_error_t err;
  json_t *root = json_load_file(path, 0, &err);
  EXPECT(root && json_is_array(root), "%s does not parse as a JSON array: %s (line %d)", path, err.text, err.line);
  return root;
}

static int dynamic(hora_ctx_t *ctx, int rank, int size) {
  const char *a = "test_engine_timeline_dyn_a.json", *b = "test_engine_timeline_dyn_b.json";
  const char *c = "test_engine_timeline_dyn_c.json";
  EXPECT_RC(hora_timeline_start(ctx, NULL, 1), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "path is NULL"), "message: %s", hora_last_error());
  EXPECT_RC(hora_timeline_start(ctx, "", 1), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_timeline_start(NULL, a, 1), HORA_ERR_NOT_INITIALIZED);
  EXPECT_RC(hora_timeline_stop(NULL), HORA_ERR_NOT_INITIALIZED);
  hora_result_t rc = hora_timeline_start(ctx, "test_engine_timeline_no_such_dir/t.json", 1);
  if (rank == 0) {
    EXPECT_RC(rc, HORA_ERR_IO);
    EXPECT(strstr(hora_last_error(), "hora_timeline_start") && strstr(hora_last_error(), "no_such_dir"),
           "message: %s", hora_last_error());
  } else {
    EXPECT_OK(rc); /* only rank 0 writes; the path is never looked at here */
  }
  EXPECT_OK(hora_timeline_stop(ctx)); /* nothing recording: a no-op, as Horovod */
  step(ctx, "dyn/pre", 3, size);      /* before any recording: in no file */

  EXPECT_OK(hora_timeline_start(ctx, a, 1));
  step(ctx, "dyn/a", 4, size);
  EXPECT_OK(hora_timeline_start(ctx, b, 0)); /* moves the recording: a is saved now */
  EXPECT_OK(hora_barrier(ctx));              /* rank 0 reads a before anything else runs */
  if (rank == 0) {
    json_t *ja = load(a);
    if (ja) {
      EXPECT(count_named(ja, "dyn/a/") == 4, "%s: %d rows dyn/a/*, want 4", a, count_named(ja, "dyn/a/"));
      EXPECT(count_named(ja, "dyn/pre/") == 0, "%s records requests from before its start", a);
      EXPECT(count_cycles(ja) >= 1, "%s: no cycle markers with mark_cycles=1", a);
      int tid = tid_of(ja, "dyn/a/2");
      EXPECT(tid > 0 && has_phase(ja, tid, "QUEUE") && has_phase(ja, tid, "NEGOTIATE_ALLREDUCE") &&
                 has_phase(ja, tid, "ALLREDUCE"),
             "%s: dyn/a/2 lacks a phase", a);
    }
    json_decref(ja);
  }
  EXPECT_OK(hora_barrier(ctx));
  step(ctx, "dyn/b", 2, size);
  /* The file is a complete JSON array while it records: within about a second of a request's end
   * (the engine flushes at most TL_FLUSH_S = 1 s after), also while a request waits for a rank
   * that has not submitted it, as in a hung job, when the timeline is wanted most. */
  float ss[8], sr[8];
  for (int i = 0; i < 8; i++) ss[i] = (float)(rank + 1);
  hora_handle_t *stuck = NULL;
  if (rank == 0)
    EXPECT_OK(hora_allreduce_async(ctx, "dyn/stuck", ss, sr, 8, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &stuck));
  usleep(rank == 0 ? 1800000 : 3500000); /* the others submit well after rank 0 has read the file */
  if (rank == 0) {
    int stuck_done = 0;
    EXPECT_OK(hora_poll(stuck, &stuck_done));
    EXPECT(size == 1 || !stuck_done, "dyn/stuck completed without the other ranks");
    json_t *live = load(b);
    if (live)
      EXPECT(count_named(live, "dyn/b/") == 2 && count_named(live, "dyn/a/") == 0,
             "%s, read while recording: %d rows dyn/b/*, want 2", b, count_named(live, "dyn/b/"));
    json_decref(live);
  } else {
    EXPECT_OK(hora_allreduce_async(ctx, "dyn/stuck", ss, sr, 8, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &stuck));
  }
  EXPECT_OK(hora_wait(stuck));
  EXPECT_OK(hora_handle_free(stuck));
  EXPECT(sr[3] == (float)(size * (size + 1) / 2), "dyn/stuck: %g, want %d", sr[3], size * (size + 1) / 2);
  EXPECT_OK(hora_timeline_stop(ctx));
  EXPECT_OK(hora_timeline_stop(ctx)); /* again: nothing recording */
  step(ctx, "dyn/after", 2, size);    /* after the stop: in no file */

  /* A process set has no timeline of its own. */
  int all[64];
  for (int i = 0; i < size && i < 64; i++) all[i] = i;
  hora_ctx_t *set = NULL;
  EXPECT_OK(hora_process_set_create(ctx, all, (size_t)size, &set));
  EXPECT_RC(hora_timeline_start(set, c, 1), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "process set"), "message: %s", hora_last_error());
  EXPECT_RC(hora_timeline_stop(set), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_OK(hora_process_set_destroy(set));

  /* Starts and stops while requests are in flight: the engine writes events meanwhile. */
  enum { NF = 24 };
  static float fs[NF][256], fr[NF][256];
  hora_handle_t *h[NF];
  for (int j = 0; j < NF; j++) {
    char name[32];
    snprintf(name, sizeof name, "dyn/fly/%d", j);
    for (int i = 0; i < 256; i++) fs[j][i] = (float)j;
    EXPECT_OK(hora_allreduce_async(ctx, name, fs[j], fr[j], 256, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h[j]));
    if (j % 3 == 0) EXPECT_OK(hora_timeline_start(ctx, c, j % 2));
    if (j % 3 == 2) EXPECT_OK(hora_timeline_stop(ctx));
  }
  for (int j = 0; j < NF; j++) {
    EXPECT_OK(hora_wait(h[j]));
    EXPECT(fr[j][100] == (float)(j * size), "dyn/fly/%d: %g, want %d", j, fr[j][100], j * size);
    hora_handle_free(h[j]);
  }
  /* A write that fails (the file size limit stands in for a full disk) is undone: the file keeps
   * the events written before, complete, and the stop reports HORA_ERR_IO naming it. */
  const char *d = "test_engine_timeline_dyn_d.json";
  EXPECT_OK(hora_timeline_start(ctx, d, 0));
  step(ctx, "dyn/d/kept", 2, size);
  EXPECT_OK(hora_barrier(ctx));
  usleep(1300000); /* flushed */
  struct rlimit old_lim;
  struct stat dst;
  getrlimit(RLIMIT_FSIZE, &old_lim);
  if (rank == 0) {
    EXPECT(stat(d, &dst) == 0 && dst.st_size > 0, "%s: not there while recording", d);
    signal(SIGXFSZ, SIG_IGN); /* the write returns EFBIG instead */
    struct rlimit lim = old_lim;
    lim.rlim_cur = (rlim_t)dst.st_size + 40; /* part of the next write fits */
    EXPECT(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit: %s", strerror(errno));
  }
  step(ctx, "dyn/d/lost", 3, size);
  rc = hora_timeline_stop(ctx);
  if (rank == 0) {
    setrlimit(RLIMIT_FSIZE, &old_lim);
    EXPECT_RC(rc, HORA_ERR_IO);
    EXPECT(strstr(hora_last_error(), d) && strstr(hora_last_error(), "dropped"), "message: %s", hora_last_error());
    json_t *jd = load(d);
    if (jd)
      EXPECT(count_named(jd, "dyn/d/kept/") == 2 && count_named(jd, "dyn/d/lost/") == 0,
             "%s after the failed write: %d kept rows (want 2), %d lost rows (want 0)", d,
             count_named(jd, "dyn/d/kept/"), count_named(jd, "dyn/d/lost/"));
    json_decref(jd);
    EXPECT(stat(d, &dst) == 0 && dst.st_size > 0, "%s", d);
    unlink(d);
  } else {
    EXPECT_OK(rc);
  }

  EXPECT_OK(hora_timeline_start(ctx, c, 1)); /* left recording: hora_finalize saves it */
  step(ctx, "dyn/last", 2, size);
  EXPECT_OK(hora_finalize(ctx));
  if (rank == 0) {
    json_t *jb = load(b), *jc = load(c);
    if (jb) {
      EXPECT(count_named(jb, "dyn/b/") == 2, "%s: %d rows dyn/b/*, want 2", b, count_named(jb, "dyn/b/"));
      EXPECT(count_named(jb, "dyn/stuck") == 1, "%s: %d rows dyn/stuck, want 1", b, count_named(jb, "dyn/stuck"));
      EXPECT(count_named(jb, "dyn/a/") == 0 && count_named(jb, "dyn/after/") == 0, "%s records outside its interval", b);
      EXPECT(count_cycles(jb) == 0, "%s: %d cycle markers with mark_cycles=0", b, count_cycles(jb));
    }
    if (jc) EXPECT(count_named(jc, "dyn/last/") == 2 && count_named(jc, "dyn/b/") == 0, "%s: wrong rows", c);
    json_decref(jb);
    json_decref(jc);
    struct stat st;
    EXPECT(stat("test_engine_timeline_no_such_dir", &st) != 0, "the missing directory was created");
    unlink(a), unlink(b), unlink(c);
  }
  return 0;
}

int main(int argc, char **argv) {
  int cap = argc > 1 && strcmp(argv[1], "cap") == 0;
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (argc > 1 && strcmp(argv[1], "dynamic") == 0) {
    hora_ctx_t *ctx;
    if (hora_init(&ctx) != HORA_SUCCESS) return 1;
    int rank, size;
    hora_rank(ctx, &rank);
    hora_size(ctx, &size);
    dynamic(ctx, rank, size);
    int rc = hora_test_finish_mpi("test_engine_timeline dynamic");
    MPI_Finalize();
    return rc;
  }
  const char *path = getenv("HORA_TIMELINE");
  if (!path || !*path) {
    fprintf(stderr, "set HORA_TIMELINE\n");
    return 1;
  }
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) return 1;
  int rank, size;
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);
  const char *names[NG];
  char nb[NG][32];
  float *s[NG], *r[NG];
  size_t counts[NG];
  for (int k = 0; k < NG; k++) {
    snprintf(nb[k], sizeof nb[k], "tl/g/%d \"q\"", k); /* a quote: must be escaped */
    names[k] = nb[k];
    counts[k] = 100 + (size_t)k;
    s[k] = malloc(counts[k] * sizeof(float));
    r[k] = malloc(counts[k] * sizeof(float));
    for (size_t i = 0; i < counts[k]; i++) s[k][i] = 1;
  }
  size_t big = 1 << 19; /* 2 MiB of float: reduced on its own on the packing path, fused otherwise */
  float *bs = calloc(big, sizeof(float)), *br = calloc(big, sizeof(float));
  float *gs = calloc(16, sizeof(float)), *gr = calloc(16 * (size_t)size, sizeof(float));
  int steps = cap ? 40 : 3;
  for (int st = 0; st < steps; st++) {
    hora_handle_t *h[3];
    EXPECT_OK(hora_grouped_allreduce_async(ctx, names, (const void *const *)s, (void *const *)r, counts, NG,
                                           HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h[0]));
    EXPECT_OK(hora_allreduce_async(ctx, "tl/big", bs, br, big, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST, &h[1]));
    EXPECT_OK(hora_allgather_async(ctx, "tl/allgather", gs, gr, 16, HORA_FLOAT32, HORA_DEVICE_HOST, &h[2]));
    for (int k = 0; k < 3; k++) {
      EXPECT_OK(hora_wait(h[k]));
      hora_handle_free(h[k]);
    }
    EXPECT(r[3][5] == (float)size, "grouped result %g", r[3][5]);
  }
  uint64_t cycles, slow, hits, fused, sg;
  EXPECT_OK(hora__engine_stats(ctx, &cycles, &slow, &hits, &fused));
  EXPECT_OK(hora__engine_sg_groups(ctx, &sg));
  EXPECT(sg == 0 || sg == fused, "%llu of %llu fused groups without the fusion buffer: a mix", (unsigned long long)sg,
         (unsigned long long)fused);
  const char *algo = getenv("HORA_ALLREDUCE_ALGO");
  if (algo && !strcmp(algo, "mpi")) EXPECT(sg == 0, "%llu groups skipped the fusion buffer with mpi", (unsigned long long)sg);
  int packed = sg == 0;
  EXPECT_OK(hora_finalize(ctx));
  if (rank == 0) {
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    EXPECT(root && json_is_array(root), "%s does not parse as a JSON array: %s (line %d)", path, err.text, err.line);
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "ls -A \"$(dirname '%s')\" | grep -qF \".tmp-$(basename '%s').\"", path, path);
    EXPECT(system(cmd) != 0, "a temporary file was left beside %s", path);
    struct stat tst;
    EXPECT(stat(path, &tst) == 0 && (tst.st_mode & 07777) == 0600, "timeline mode %04o, want 0600",
           (unsigned)(tst.st_mode & 07777));
    if (root && !cap) {
      for (int k = 0; k < NG; k++) {
        int tid = tid_of(root, names[k]);
        EXPECT(tid > 0, "no row for tensor %s", names[k]);
        const char *ph[] = {"QUEUE", "NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER",
                            "MEMCPY_OUT_FUSION_BUFFER"};
        for (int p = 0; p < 3; p++) EXPECT(has_phase(root, tid, ph[p]), "tensor %s lacks phase %s", names[k], ph[p]);
        for (int p = 3; p < 5; p++)
          EXPECT(has_phase(root, tid, ph[p]) == packed, "tensor %s %s phase %s (%s)", names[k],
                 packed ? "lacks" : "has", ph[p], packed ? "fusion buffer" : "reduced in place");
      }
      int tid = tid_of(root, "tl/big");
      EXPECT(tid > 0 && has_phase(root, tid, "QUEUE") && has_phase(root, tid, "NEGOTIATE_ALLREDUCE") &&
             has_phase(root, tid, "ALLREDUCE"), "tl/big lacks a phase");
      tid = tid_of(root, "tl/allgather");
      EXPECT(tid > 0 && has_phase(root, tid, "QUEUE") && has_phase(root, tid, "NEGOTIATE_ALLGATHER") &&
             has_phase(root, tid, "ALLGATHER"), "tl/allgather lacks a phase");
      /* Horovod's wall-clock anchor of the microsecond timestamps (timeline tools align with it). */
      json_t *pn = json_array_get(root, 0);
      json_int_t start = json_integer_value(json_object_get(json_object_get(pn, "args"), "start_time_since_epoch_in_micros"));
      long long now = (long long)time(NULL) * 1000000LL;
      EXPECT(strcmp(json_string_value(json_object_get(pn, "name")), "process_name") == 0 && start > now - 3600000000LL &&
                 start <= now + 1000000LL,
             "process_name's start_time_since_epoch_in_micros %lld, now %lld", (long long)start, now);
      size_t i, cycles = 0;
      json_t *e;
      json_array_foreach(root, i, e) {
        const char *n = json_string_value(json_object_get(e, "name"));
        if (n && strcmp(n, "CYCLE_START") == 0 && json_integer_value(json_object_get(json_object_get(e, "args"), "cycle")) > 0)
          cycles++;
      }
      const char *mc = getenv("HORA_TIMELINE_MARK_CYCLES");
      if (mc && !strcmp(mc, "0"))
        EXPECT(cycles == 0, "%zu cycle markers with HORA_TIMELINE_MARK_CYCLES=0", cycles);
      else
        EXPECT(cycles >= 3, "only %zu cycle markers", cycles);
    }
    if (root && cap) {
      FILE *f = fopen(path, "r");
      fseek(f, 0, SEEK_END);
      long bytes = ftell(f);
      fclose(f);
      EXPECT(bytes <= 4096, "timeline is %ld bytes, cap 4096", bytes);
      json_t *last = json_array_get(root, json_array_size(root) - 1);
      json_t *d = json_object_get(json_object_get(last, "args"), "dropped_events");
      EXPECT(d && json_integer_value(d) > 0, "no dropped_events count in the last event");
    }
    json_decref(root);
    unlink(path);
  }
  for (int k = 0; k < NG; k++) free(s[k]), free(r[k]);
  free(bs), free(br), free(gs), free(gr);
  int rc = hora_test_finish_mpi("test_engine_timeline");
  MPI_Finalize();
  return rc;
}
