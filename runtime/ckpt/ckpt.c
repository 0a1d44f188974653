/* The checkpointer object: options, open (threads on rank 0), flush, close, and the finalizer
 * that lets hora_finalize flush every checkpointer still open. ctx->ckpt holds the list of open
 * checkpointers (guarded by ctx->lock). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"

#define DEFAULT_KEEP 2
#define DEFAULT_COPY_INTERVAL_S 600.0

HORA_EXPORT hora_result_t hora_ckpt_opts_init(hora_ckpt_opts_t *opts) {
  if (!opts) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_opts_init: opts is NULL");
  memset(opts, 0, sizeof *opts);
  opts->size = sizeof *opts;
  opts->local_dir = NULL;
  opts->persist_dir = NULL;
  opts->keep = DEFAULT_KEEP;
  opts->copy_interval_s = DEFAULT_COPY_INTERVAL_S;
  return HORA_SUCCESS;
}

/* local_dir default: $SLURM_TMPDIR/hora-ckpt, else /tmp/hora-$SLURM_JOB_ID, else
 * /tmp/hora-ckpt-<uid>. */
static char *default_local_dir(void) {
  char buf[4096];
  const char *t = getenv("SLURM_TMPDIR"), *j = getenv("SLURM_JOB_ID");
  if (t && *t)
    snprintf(buf, sizeof buf, "%s/hora-ckpt", t);
  else if (j && *j)
    snprintf(buf, sizeof buf, "/tmp/hora-%s", j);
  else
    snprintf(buf, sizeof buf, "/tmp/hora-ckpt-%ld", (long)getuid());
  return strdup(buf);
}

/* Remove the temporary files in directory dfd (path dir). */
static void remove_tmp_in(int dfd, const char *dir) {
  int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, CK_TMP_PREFIX, strlen(CK_TMP_PREFIX)) == 0 && unlinkat(dfd, e->d_name, 0) == 0)
      HORA_INFO(CKPT, "removed %s/%s (left by an interrupted write)", dir, e->d_name);
  closedir(d);
}

/* Remove temporary files an earlier process left (crash mid-write or mid-copy) in the checked
 * directory dir and its step directories: they never carry a final name, so nothing valid is
 * lost. Step entries that are symlinks or fail the check are left alone (restore refuses them). */
static void remove_stale_tmp(const char *dir) {
  int dfd;
  if (hora__dir_open(dir, 0, &dfd) != HORA_SUCCESS) return;
  int64_t *steps = NULL;
  size_t n = 0;
  if (hora__ck_list_steps_at(dfd, dir, &steps, &n) == HORA_SUCCESS)
    for (size_t i = 0; i < n; i++) {
      char name[64], sd[4400];
      int sfd;
      hora__ck_step_name(steps[i], name, sizeof name);
      snprintf(sd, sizeof sd, "%s/%s", dir, name);
      if (hora__subdir_open(dfd, dir, name, 0, &sfd) != HORA_SUCCESS) continue;
      remove_tmp_in(sfd, sd);
      close(sfd);
    }
  remove_tmp_in(dfd, dir);
  free(steps);
  close(dfd);
}

static hora_result_t ck_finalizer(hora_ctx_t *ctx, void *arg);

void hora__ck_meta_free(hora_ckpt_t *ck) {
  for (size_t i = 0; i < ck->nmeta; i++) {
    free(ck->keys[i]);
    free(ck->vals[i]);
  }
  free(ck->keys);
  free(ck->vals);
  free(ck->restored_from);
  ck->keys = ck->vals = NULL;
  ck->restored_from = NULL;
  ck->nmeta = 0;
}

static void ck_free(hora_ckpt_t *ck) {
  if (!ck) return;
  hora__ck_stage_free(&ck->stage);
  hora__ck_snap_free(&ck->job);
  hora__ck_meta_free(ck);
  free(ck->local_dir);
  free(ck->persist_dir);
  pthread_mutex_destroy(&ck->mu);
  pthread_cond_destroy(&ck->cv);
  if (ck->comm != MPI_COMM_NULL) MPI_Comm_free(&ck->comm);
  free(ck);
}

/* Rank 0: stop the threads (after the writer drained its job and the copier its copies). */
static void stop_threads(hora_ckpt_t *ck) {
  pthread_mutex_lock(&ck->mu);
  ck->stop = 1;
  pthread_cond_broadcast(&ck->cv);
  pthread_mutex_unlock(&ck->mu);
  if (ck->writer_started) pthread_join(ck->writer, NULL);
  if (ck->copier_started) pthread_join(ck->copier, NULL);
  ck->writer_started = ck->copier_started = 0;
}

static hora_result_t open_root(hora_ckpt_t *ck) {
  HORA_CHECK(hora__ck_mkdirs(ck->local_dir));
  if (ck->persist_dir) {
    HORA_CHECK(hora__ck_mkdirs(ck->persist_dir));
    /* The canonical path identifies this run's checkpoints in local_dir (manifest.json). */
    char canon[PATH_MAX];
    char *c = realpath(ck->persist_dir, canon) ? strdup(canon) : NULL;
    if (c) {
      free(ck->persist_dir);
      ck->persist_dir = c;
    }
  }
  remove_stale_tmp(ck->local_dir);
  if (ck->persist_dir) remove_stale_tmp(ck->persist_dir);
  if (pthread_create(&ck->writer, NULL, hora__ck_writer_main, ck) != 0)
    return HORA_ERR(HORA_ERR_IO, "hora_ckpt_open: cannot start the writer thread");
  ck->writer_started = 1;
  if (ck->persist_dir) {
    if (pthread_create(&ck->copier, NULL, hora__ck_copier_main, ck) != 0) {
      stop_threads(ck);
      return HORA_ERR(HORA_ERR_IO, "hora_ckpt_open: cannot start the copier thread");
    }
    ck->copier_started = 1;
  }
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_ckpt_open(hora_ctx_t *ctx, const hora_ckpt_opts_t *opts, hora_ckpt_t **out) {
  HORA_CHECK(hora__ctx_check(ctx, "hora_ckpt_open"));
  if (ctx->parent)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_open: the context is a process set: "
                    "checkpoints belong to the root context (the one hora_init made)");
  if (!out) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_open: ck (output pointer) is NULL");
  hora_ckpt_opts_t o;
  hora_ckpt_opts_init(&o);
  if (opts) {
    if (opts->size < offsetof(hora_ckpt_opts_t, copy_interval_s) + sizeof(double))
      return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                      "hora_ckpt_open: opts->size=%zu is too small: call hora_ckpt_opts_init first", opts->size);
    o.local_dir = opts->local_dir;
    o.persist_dir = opts->persist_dir;
    o.keep = opts->keep ? opts->keep : DEFAULT_KEEP;
    o.copy_interval_s = opts->copy_interval_s < 0 ? DEFAULT_COPY_INTERVAL_S : opts->copy_interval_s;
  }
  if (o.keep < 2)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                    "hora_ckpt_open: keep=%d: at least 2 versions must be kept in each place (0 means 2), so that "
                    "an older one survives while a newer one is written", o.keep);
  if (o.copy_interval_s != o.copy_interval_s)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_open: copy_interval_s is NaN");
  if ((o.local_dir && !*o.local_dir) || (o.persist_dir && !*o.persist_dir))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_open: %s is an empty string",
                    o.local_dir && !*o.local_dir ? "local_dir" : "persist_dir");

  hora_ckpt_t *ck = calloc(1, sizeof *ck);
  if (!ck) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  ck->comm = MPI_COMM_NULL;
  pthread_mutex_init(&ck->mu, NULL);
  pthread_cond_init(&ck->cv, NULL);
  ck->ctx = ctx;
  ck->fork_gen = ctx->fork_gen;
  ck->keep = o.keep;
  ck->copy_interval_s = o.copy_interval_s;
  ck->copying_step = INT64_MIN;
  ck->local_dir = o.local_dir ? strdup(o.local_dir) : default_local_dir();
  ck->persist_dir = o.persist_dir ? strdup(o.persist_dir) : NULL;
  hora_result_t rc = HORA_SUCCESS;
  if (!ck->local_dir || (o.persist_dir && !ck->persist_dir)) rc = HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory");
  /* Strip trailing slashes so that step paths print cleanly. */
  for (char *d = ck->local_dir; d && strlen(d) > 1 && d[strlen(d) - 1] == '/';) d[strlen(d) - 1] = 0;
  for (char *d = ck->persist_dir; d && strlen(d) > 1 && d[strlen(d) - 1] == '/';) d[strlen(d) - 1] = 0;
  /* Watched: a rank that stopped or hangs before its hora_ckpt_open ends the others' call with
   * the verdict naming it, instead of keeping them in MPI_Comm_dup. */
  hora_result_t drc = hora__ctx_dup(ctx, ctx->world, &ck->comm, "hora_ckpt_open (duplicating the communicator)");
  if (drc != HORA_SUCCESS) {
    ck->comm = MPI_COMM_NULL;
    ck_free(ck);
    return drc;
  }
  MPI_Comm_set_errhandler(ck->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(ck->comm, &ck->rank);
  MPI_Comm_size(ck->comm, &ck->size);
  if (ck->rank == 0 && rc == HORA_SUCCESS) rc = open_root(ck);
  rc = hora__ck_bcast_result(ck, rc, "hora_ckpt_open");
  if (rc != HORA_SUCCESS) {
    if (ck->rank == 0) stop_threads(ck);
    ck_free(ck);
    return rc;
  }
  /* Register for hora_finalize: the first checkpointer of a context adds the finalizer. */
  pthread_mutex_lock(&ctx->lock);
  int first = ctx->ckpt == NULL;
  ck->next_open = ctx->ckpt;
  ctx->ckpt = ck;
  pthread_mutex_unlock(&ctx->lock);
  if (first && (rc = hora__ctx_add_finalizer(ctx, ck_finalizer, NULL)) != HORA_SUCCESS) {
    pthread_mutex_lock(&ctx->lock);
    ctx->ckpt = ck->next_open;
    pthread_mutex_unlock(&ctx->lock);
    if (ck->rank == 0) stop_threads(ck);
    ck_free(ck);
    return rc;
  }
  if (ck->rank == 0)
    HORA_INFO(CKPT, "checkpoints: local_dir %s, persist_dir %s, keep %d, copy interval %.1f s", ck->local_dir,
              ck->persist_dir ? ck->persist_dir : "(none)", ck->keep, ck->copy_interval_s);
  *out = ck;
  return HORA_SUCCESS;
}

/* Rank 0's part of a flush. */
static hora_result_t flush_root(hora_ckpt_t *ck) {
  hora_result_t rc = HORA_SUCCESS;
  double timeout = hora__params()->ckpt_flush_timeout_s, t0 = hora__now_s();
  pthread_mutex_lock(&ck->mu);
  ck->flush_waiters++;
  pthread_cond_broadcast(&ck->cv);
  while (ck->job_pending || ck->writing) pthread_cond_wait(&ck->cv, &ck->mu);
  if (ck->write_rc != HORA_SUCCESS) {
    rc = HORA_ERR(ck->write_rc, "%s", ck->write_msg);
    ck->write_rc = HORA_SUCCESS;
  }
  if (rc == HORA_SUCCESS && ck->persist_dir) {
    uint64_t target = ck->commit_seq;
    while (ck->copied_seq < target) {
      if (ck->copy_rc != HORA_SUCCESS && timeout > 0 && hora__now_s() - t0 > timeout) {
        rc = HORA_ERR(HORA_ERR_IO, "hora_ckpt_flush: gave up after %.0f s (HORA_CKPT_FLUSH_TIMEOUT_S): %s",
                      timeout, ck->copy_msg);
        break;
      }
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 50 * 1000000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&ck->cv, &ck->mu, &ts);
    }
    if (rc == HORA_SUCCESS && ck->copy_rc != HORA_SUCCESS)
      rc = HORA_ERR(ck->copy_rc, "hora_ckpt_flush: %s", ck->copy_msg);
  }
  ck->flush_waiters--;
  pthread_mutex_unlock(&ck->mu);
  return rc;
}

HORA_EXPORT hora_result_t hora_ckpt_flush(hora_ckpt_t *ck) {
  if (!ck) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_ckpt_flush: ck is NULL");
  HORA_CKPT_FORK_CHECK(ck, "hora_ckpt_flush");
  hora_result_t rc = ck->rank == 0 ? flush_root(ck) : HORA_SUCCESS;
  return hora__ck_bcast_result(ck, rc, "hora_ckpt_flush");
}

HORA_EXPORT hora_result_t hora_ckpt_close(hora_ckpt_t *ck) {
  if (!ck) return HORA_SUCCESS;
  HORA_CKPT_FORK_CHECK(ck, "hora_ckpt_close");
  hora_result_t rc = hora_ckpt_flush(ck);
  if (ck->rank == 0) stop_threads(ck);
  hora_ctx_t *ctx = ck->ctx;
  pthread_mutex_lock(&ctx->lock);
  for (hora_ckpt_t **p = (hora_ckpt_t **)&ctx->ckpt; *p; p = &(*p)->next_open)
    if (*p == ck) {
      *p = ck->next_open;
      break;
    }
  pthread_mutex_unlock(&ctx->lock);
  ck_free(ck);
  return rc;
}

/* hora_finalize: close (and so flush) every checkpointer still open, oldest first (the same
 * order on every rank, since opens are collective). */
static hora_result_t ck_finalizer(hora_ctx_t *ctx, void *arg) {
  (void)arg;
  hora_result_t first = HORA_SUCCESS;
  for (;;) {
    pthread_mutex_lock(&ctx->lock);
    hora_ckpt_t *oldest = ctx->ckpt;
    while (oldest && oldest->next_open) oldest = oldest->next_open;
    pthread_mutex_unlock(&ctx->lock);
    if (!oldest) break;
    hora_result_t rc = hora_ckpt_close(oldest);
    if (rc != HORA_SUCCESS && first == HORA_SUCCESS) first = rc;
  }
  return first;
}

/* hora-bench (rank 0): wait until the local write of every save so far is committed (or
 * failed), without waiting for the copier. */
void hora__ck_wait_written(hora_ckpt_t *ck) {
  pthread_mutex_lock(&ck->mu);
  while (ck->job_pending || ck->writing) pthread_cond_wait(&ck->cv, &ck->mu);
  pthread_mutex_unlock(&ck->mu);
}

/* Figures for hora-bench (rank 0): snapshot (stall) seconds of the last save, seconds of the
 * last local write and of the last copy, and the file size. */
void hora__ck_stats(hora_ckpt_t *ck, double *snapshot_s, double *write_s, double *copy_s, uint64_t *file_bytes) {
  pthread_mutex_lock(&ck->mu);
  if (snapshot_s) *snapshot_s = ck->last_snapshot_s;
  if (write_s) *write_s = ck->last_write_s;
  if (copy_s) *copy_s = ck->last_copy_dur_s;
  if (file_bytes) *file_bytes = ck->last_file_bytes;
  pthread_mutex_unlock(&ck->mu);
}
