/* Checkpoints on several ranks: rank 0's tensors are saved; restore broadcasts step, metadata
 * and every tensor's bytes to all ranks (the other ranks' buffers start as garbage); errors on
 * rank 0 (bad argument) and on one other rank (mismatched tensors) reach every rank and write
 * nothing; hora_should_stop agrees on every rank after one rank got SIGUSR1, and after that stop
 * a late SIGUSR1 or SIGTERM does not kill a rank past hora_finalize. Meanwhile hora's threads
 * carry their names (hora-engine; the checkpoint writer on rank 0) and the process keeps its own:
 * a save stages rank 0's tensors on the calling thread, which must not take a hora-* name. */
#include <dirent.h>
#include <inttypes.h>
#include <signal.h>

#include "ckpt_test.h"
#include "hora_test.h"

#define NT 3
static const size_t counts[NT] = {1000, 1 << 16, 3};
static const hora_dtype_t dtypes[NT] = {HORA_FLOAT32, HORA_BFLOAT16, HORA_INT64};
static const char *names[NT] = {"w", "emb", "counters"};

/* The name of /proc/self/task/TID/comm (or of the process for tid "" ), without its newline. */
static void comm_of(const char *tid, char *out, size_t cap) {
  char path[128];
  snprintf(path, sizeof path, *tid ? "/proc/self/task/%s/comm" : "/proc/self/comm", tid);
  out[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return;
  if (fgets(out, (int)cap, f)) out[strcspn(out, "\n")] = 0;
  fclose(f);
}

/* 1 when one of this process's threads is named `name`. */
static int has_thread(const char *name) {
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  int found = 0;
  while (d && !found && (e = readdir(d)))
    if (e->d_name[0] != '.') {
      char c[32];
      comm_of(e->d_name, c, sizeof c);
      found = strcmp(c, name) == 0;
    }
  if (d) closedir(d);
  return found;
}

int main(void) {
  hora_ctx_t *ctx;
  if (hora_init(&ctx) != HORA_SUCCESS) {
    fprintf(stderr, "hora_init: %s\n", hora_last_error());
    return 1;
  }
  int rank, size;
  hora_rank(ctx, &rank);
  hora_size(ctx, &size);
  char root[512] = "";
  if (rank == 0) {
    char *d = ck_mktemp("ckpt-mpi");
    snprintf(root, sizeof root, "%s", d ? d : "");
    free(d);
  }
  MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
  char L[700], P[700];
  snprintf(L, sizeof L, "%s/local", root);
  snprintf(P, sizeof P, "%s/persist", root);
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  o.local_dir = L;
  o.persist_dir = P;
  o.copy_interval_s = 0;
  hora_ckpt_t *ck = NULL;
  EXPECT_OK(hora_ckpt_open(ctx, &o, &ck));

  void *b[NT];
  size_t bytes[NT];
  hora_tensor_t t[NT];
  for (int k = 0; k < NT; k++) {
    bytes[k] = counts[k] * (dtypes[k] == HORA_BFLOAT16 ? 2 : dtypes[k] == HORA_FLOAT32 ? 4 : 8);
    b[k] = malloc(bytes[k]);
    t[k] = (hora_tensor_t){names[k], b[k], counts[k], dtypes[k], HORA_DEVICE_HOST, 0, NULL};
  }
  /* Nothing yet: NOT_FOUND everywhere. */
  int64_t step = -5;
  EXPECT_RC(hora_ckpt_restore(ck, &step, t, NT), HORA_ERR_NOT_FOUND);
  EXPECT(step == -5, "step written on NOT_FOUND");
  for (int64_t s = 1; s <= 3; s++) {
    for (int k = 0; k < NT; k++)
      if (rank == 0) ck_fill(b[k], bytes[k], s, k);
      else memset(b[k], 0xAB, bytes[k]); /* other ranks' tensors are not read */
    char v[32];
    snprintf(v, sizeof v, "v%" PRId64, s * 10);
    hora_kv_t meta = {"tag", v};
    EXPECT_OK(hora_ckpt_save(ck, s, t, NT, &meta, 1));
  }
  /* A bad argument on rank 0 fails the save on every rank. */
  hora_tensor_t bad = t[0];
  bad.name = rank == 0 ? "" : "w";
  EXPECT_RC(hora_ckpt_save(ck, 4, &bad, 1, NULL, 0), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_OK(hora_ckpt_flush(ck));
  char me[32];
  comm_of("", me, sizeof me);
  EXPECT(strcmp(me, "test_ckpt_mpi") == 0, "rank %d: the process is named '%s' after the saves", rank, me);
  EXPECT(has_thread("hora-engine"), "rank %d: no thread named hora-engine", rank);
  EXPECT(rank != 0 || has_thread("hora-ckpt-write"), "rank 0: no thread named hora-ckpt-write");

  for (int k = 0; k < NT; k++) memset(b[k], 0, bytes[k]);
  EXPECT_OK(hora_ckpt_restore(ck, &step, t, NT));
  EXPECT(step == 3, "rank %d restored step %" PRId64, rank, step);
  for (int k = 0; k < NT; k++) {
    long at = ck_check(b[k], bytes[k], 3, k);
    EXPECT(at < 0, "rank %d: tensor %s differs at byte %ld", rank, names[k], at);
  }
  const char *v = NULL, *src = NULL;
  EXPECT_OK(hora_ckpt_meta_get(ck, "tag", &v));
  EXPECT(v && strcmp(v, "v30") == 0, "rank %d: tag=%s", rank, v ? v : "(null)");
  EXPECT_OK(hora_ckpt_restore_source(ck, &src));
  char want[800];
  snprintf(want, sizeof want, "%s/step-3", L);
  EXPECT(src && strcmp(src, want) == 0, "rank %d: source %s", rank, src ? src : "(null)");

  /* One rank asks for a different count: every rank fails, nothing is written anywhere. */
  if (size > 1) {
    for (int k = 0; k < NT; k++) memset(b[k], 0x11, bytes[k]);
    if (rank == size - 1) t[0].count = counts[0] - 1;
    step = -5;
    EXPECT_RC(hora_ckpt_restore(ck, &step, t, NT), HORA_ERR_MISMATCH);
    t[0].count = counts[0];
    EXPECT(step == -5 && ((unsigned char *)b[1])[0] == 0x11, "rank %d: restore wrote on MISMATCH", rank);
  }
  EXPECT_OK(hora_ckpt_close(ck));

  /* Preemption flag: agreed on every rank. */
  int stop = -1;
  EXPECT_OK(hora_ckpt_on_signal(ctx));
  EXPECT_OK(hora_should_stop(ctx, &stop));
  EXPECT(stop == 0, "rank %d: stop=%d before any signal", rank, stop);
  if (rank == size - 1) raise(SIGUSR1); /* the handler sets the flag; the process lives on */
  EXPECT_OK(hora_should_stop(ctx, &stop));
  EXPECT(stop == 1, "rank %d: stop=%d after rank %d got SIGUSR1", rank, stop, size - 1);
  EXPECT_OK(hora_should_stop(ctx, &stop));
  EXPECT(stop == 1, "rank %d: the stop flag is sticky", rank);
  EXPECT_RC(hora_should_stop(ctx, NULL), HORA_ERR_INVALID_ARGUMENT);
  EXPECT_RC(hora_should_stop(NULL, &stop), HORA_ERR_NOT_INITIALIZED);

  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && root[0]) ck_rmrf(root);
  for (int k = 0; k < NT; k++) free(b[k]);
  int code = hora_test_finish_mpi("test_ckpt_mpi");
  hora_finalize(ctx);
  /* hora_should_stop said stop on every rank, so hora_finalize kept the flag handler: a late copy
   * of the signal (Slurm signals node by node) must not kill a rank on its way out. Without it the
   * default action of either signal ends the process here, and mpirun reports it. */
  raise(SIGUSR1);
  raise(SIGTERM);
  return code;
}
