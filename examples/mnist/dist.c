/* hora data parallelism of the example (see dist.h). */
#include "dist.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fcntl.h>

/* ---- gradient averaging ---- */

hora_result_t mnist_grad_layer_done(void *arg, int layer) {
  mnist_grad_sync_t *s = arg;
  const mnist_layer_t *L = &s->model->layer[layer];
  float *g = s->model->grads + L->offset;
#ifdef MNIST_HAVE_ENGINE
  /* The engine negotiates, fuses and reduces on its own thread while backward goes on. */
  char name[64];
  snprintf(name, sizeof name, "grad.%s", L->name);
  hora_handle_t *h = NULL;
  hora_result_t rc = hora_allreduce_async(s->ctx, name, g, g, L->count, HORA_FLOAT32, HORA_AVERAGE,
                                          1.0, 1.0, HORA_DEVICE_HOST, &h);
  if (rc == HORA_SUCCESS) s->pending[layer] = h;
  return rc;
#else
  return hora_allreduce(s->ctx, g, g, L->count, HORA_FLOAT32, HORA_AVERAGE, 1.0, 1.0,
                        HORA_DEVICE_HOST);
#endif
}

hora_result_t mnist_grad_wait(mnist_grad_sync_t *s) {
  hora_result_t first = HORA_SUCCESS;
#ifdef MNIST_HAVE_ENGINE
  for (int l = MNIST_LAYERS - 1; l >= 0; l--) {
    if (!s->pending[l]) continue;
    hora_result_t rc = hora_wait(s->pending[l]);
    hora_handle_free(s->pending[l]);
    s->pending[l] = NULL;
    if (first == HORA_SUCCESS) first = rc;
  }
#else
  (void)s;
#endif
  return first;
}

/* ---- checkpoints ---- */
#ifdef MNIST_HAVE_CKPT

struct mnist_ckpt {
  hora_ckpt_t *ck;
};

hora_result_t mnist_ckpt_open(hora_ctx_t *ctx, const char *local_dir, const char *persist_dir,
                              mnist_ckpt_t **out) {
  hora_ckpt_opts_t o;
  hora_result_t rc = hora_ckpt_opts_init(&o);
  if (rc != HORA_SUCCESS) return rc;
  o.local_dir = local_dir;
  o.persist_dir = persist_dir;
  /* This model's checkpoint is a few hundred KB: copy every one to persist_dir at once, so a
   * job killed without warning loses at most --ckpt-every steps. */
  o.copy_interval_s = 0;
  mnist_ckpt_t *c = calloc(1, sizeof *c);
  if (!c) return HORA_ERR_NO_MEMORY;
  rc = hora_ckpt_open(ctx, &o, &c->ck);
  if (rc != HORA_SUCCESS) {
    free(c);
    return rc;
  }
  *out = c;
  return HORA_SUCCESS;
}
hora_result_t mnist_ckpt_save(mnist_ckpt_t *c, int64_t step, const mnist_tensor_t *t, size_t n,
                              const mnist_kv_t *meta, size_t nmeta) {
  return hora_ckpt_save(c->ck, step, t, n, meta, nmeta);
}
hora_result_t mnist_ckpt_restore(mnist_ckpt_t *c, int64_t *step, mnist_tensor_t *t, size_t n) {
  return hora_ckpt_restore(c->ck, step, t, n);
}
hora_result_t mnist_ckpt_meta_get(mnist_ckpt_t *c, const char *key, const char **value) {
  return hora_ckpt_meta_get(c->ck, key, value);
}
hora_result_t mnist_ckpt_flush(mnist_ckpt_t *c) { return hora_ckpt_flush(c->ck); }
hora_result_t mnist_ckpt_close(mnist_ckpt_t *c) {
  if (!c) return HORA_SUCCESS;
  hora_result_t rc = hora_ckpt_close(c->ck);
  free(c);
  return rc;
}
hora_result_t mnist_on_signal(hora_ctx_t *ctx) { return hora_ckpt_on_signal(ctx); }
hora_result_t mnist_should_stop(hora_ctx_t *ctx, int *stop) { return hora_should_stop(ctx, stop); }

#else /* !MNIST_HAVE_CKPT: a plain checkpoint, written synchronously by rank 0 */

#define MAX_META 32
struct mnist_ckpt {
  hora_ctx_t *ctx;
  int rank;
  char local[4096], persist[4096];
  char *meta_blob; /* "key value\n" lines of the last restore */
  char *keys[MAX_META], *values[MAX_META];
  size_t nmeta;
};

static int mkdirs(const char *path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
      *p = '/';
    }
  return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

hora_result_t mnist_ckpt_open(hora_ctx_t *ctx, const char *local_dir, const char *persist_dir,
                              mnist_ckpt_t **out) {
  mnist_ckpt_t *c = calloc(1, sizeof *c);
  if (!c) return HORA_ERR_NO_MEMORY;
  c->ctx = ctx;
  hora_rank(ctx, &c->rank);
  const char *tmpdir = getenv("SLURM_TMPDIR"), *job = getenv("SLURM_JOB_ID");
  if (local_dir) snprintf(c->local, sizeof c->local, "%s", local_dir);
  else if (tmpdir) snprintf(c->local, sizeof c->local, "%s/hora-ckpt", tmpdir);
  else if (job) snprintf(c->local, sizeof c->local, "/tmp/hora-%s", job);
  else snprintf(c->local, sizeof c->local, "/tmp/hora-ckpt-%u", (unsigned)getuid());
  if (persist_dir) snprintf(c->persist, sizeof c->persist, "%s", persist_dir);
  int32_t bad = 0;
  if (c->rank == 0 && (mkdirs(c->local) || (c->persist[0] && mkdirs(c->persist)))) {
    fprintf(stderr, "mnist: cannot create the checkpoint directory %s or %s: %s\n", c->local,
            c->persist[0] ? c->persist : "-", strerror(errno));
    bad = 1;
  }
  hora_result_t rc = hora_broadcast(ctx, &bad, 1, HORA_INT32, 0, HORA_DEVICE_HOST);
  if (rc == HORA_SUCCESS && bad) rc = HORA_ERR_IO;
  if (rc != HORA_SUCCESS) {
    free(c);
    return rc;
  }
  *out = c;
  return HORA_SUCCESS;
}

/* Writes dir/mnist.ckpt through a temporary file, fsync, rename and directory fsync, so the name
 * always holds a complete checkpoint. Format: text header lines ("hora-mnist-ckpt 1", "step N",
 * "meta KEY VALUE"..., "tensor NAME COUNT DTYPE"..., "end"), then the tensors' bytes in order. */
static int write_file(const char *dir, int64_t step, const mnist_tensor_t *t, size_t n,
                      const mnist_kv_t *meta, size_t nmeta) {
  char tmp[4200], fin[4200];
  snprintf(tmp, sizeof tmp, "%s/.mnist.ckpt.tmp.%d", dir, (int)getpid());
  snprintf(fin, sizeof fin, "%s/mnist.ckpt", dir);
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    fprintf(stderr, "mnist: cannot create %s: %s\n", tmp, strerror(errno));
    return -1;
  }
  int ok = fprintf(f, "hora-mnist-ckpt 1\nstep %lld\n", (long long)step) > 0;
  for (size_t i = 0; i < nmeta; i++) ok = ok && fprintf(f, "meta %s %s\n", meta[i].key, meta[i].value) > 0;
  for (size_t i = 0; i < n; i++)
    ok = ok && fprintf(f, "tensor %s %zu %d\n", t[i].name, t[i].count, (int)t[i].dtype) > 0;
  ok = ok && fprintf(f, "end\n") > 0;
  for (size_t i = 0; i < n && ok; i++) {
    size_t es;
    hora_dtype_size(t[i].dtype, &es);
    ok = fwrite(t[i].data, es, t[i].count, f) == t[i].count;
  }
  ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = (fclose(f) == 0) && ok;
  if (ok) ok = rename(tmp, fin) == 0;
  if (!ok) {
    fprintf(stderr, "mnist: cannot write the checkpoint %s: %s\n", fin, strerror(errno));
    unlink(tmp);
    return -1;
  }
  int dfd = open(dir, O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return 0;
}

hora_result_t mnist_ckpt_save(mnist_ckpt_t *c, int64_t step, const mnist_tensor_t *t, size_t n,
                              const mnist_kv_t *meta, size_t nmeta) {
  int32_t bad = 0;
  if (c->rank == 0) {
    bad = write_file(c->local, step, t, n, meta, nmeta) != 0;
    if (!bad && c->persist[0]) bad = write_file(c->persist, step, t, n, meta, nmeta) != 0;
  }
  hora_result_t rc = hora_broadcast(c->ctx, &bad, 1, HORA_INT32, 0, HORA_DEVICE_HOST);
  return rc != HORA_SUCCESS ? rc : bad ? HORA_ERR_IO : HORA_SUCCESS;
}

/* Rank 0 reads the newest of local and persistent copies into tensors and the meta blob. */
static int read_file(mnist_ckpt_t *c, const char *dir, int64_t *step, mnist_tensor_t *t, size_t n,
                     char *blob, size_t bloblen) {
  char path[4200], line[1024];
  snprintf(path, sizeof path, "%s/mnist.ckpt", dir);
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  long long s = -1;
  size_t nt = 0, used = 0;
  int ok = fgets(line, sizeof line, f) && strcmp(line, "hora-mnist-ckpt 1\n") == 0;
  ok = ok && fgets(line, sizeof line, f) && sscanf(line, "step %lld", &s) == 1;
  blob[0] = 0;
  while (ok && fgets(line, sizeof line, f) && strcmp(line, "end\n") != 0) {
    char name[256];
    size_t cnt;
    int dt;
    if (strncmp(line, "meta ", 5) == 0) {
      size_t l = strlen(line + 5);
      ok = used + l + 1 < bloblen;
      if (ok) memcpy(blob + used, line + 5, l + 1), used += l;
    } else if (sscanf(line, "tensor %255s %zu %d", name, &cnt, &dt) == 3) {
      ok = nt < n && strcmp(name, t[nt].name) == 0 && cnt == t[nt].count && dt == (int)t[nt].dtype;
      nt++;
    } else {
      ok = 0;
    }
  }
  ok = ok && nt == n;
  for (size_t i = 0; i < n && ok; i++) {
    size_t es;
    hora_dtype_size(t[i].dtype, &es);
    ok = fread(t[i].data, es, t[i].count, f) == t[i].count;
  }
  fclose(f);
  if (!ok) return -2;
  *step = s;
  return 0;
}

hora_result_t mnist_ckpt_restore(mnist_ckpt_t *c, int64_t *step, mnist_tensor_t *t, size_t n) {
  int64_t hdr[2] = {0, -1}; /* found, step */
  static char blob[8192];
  if (c->rank == 0) {
    int64_t s;
    if (read_file(c, c->local, &s, t, n, blob, sizeof blob) == 0 ||
        (c->persist[0] && read_file(c, c->persist, &s, t, n, blob, sizeof blob) == 0))
      hdr[0] = 1, hdr[1] = s;
  }
  hora_result_t rc = hora_broadcast(c->ctx, hdr, 2, HORA_INT64, 0, HORA_DEVICE_HOST);
  if (rc != HORA_SUCCESS) return rc;
  if (!hdr[0]) return HORA_ERR_NOT_FOUND;
  for (size_t i = 0; i < n && rc == HORA_SUCCESS; i++)
    rc = hora_broadcast(c->ctx, t[i].data, t[i].count, t[i].dtype, 0, HORA_DEVICE_HOST);
  if (rc == HORA_SUCCESS) rc = hora_broadcast(c->ctx, blob, sizeof blob, HORA_UINT8, 0, HORA_DEVICE_HOST);
  if (rc != HORA_SUCCESS) return rc;
  free(c->meta_blob);
  c->meta_blob = strdup(blob);
  c->nmeta = 0;
  for (char *line = c->meta_blob; line && *line && c->nmeta < MAX_META;) {
    char *nl = strchr(line, '\n'), *sp = strchr(line, ' ');
    if (nl) *nl = 0;
    if (sp && (!nl || sp < nl)) {
      *sp = 0;
      c->keys[c->nmeta] = line;
      c->values[c->nmeta++] = sp + 1;
    }
    line = nl ? nl + 1 : NULL;
  }
  *step = hdr[1];
  return HORA_SUCCESS;
}

hora_result_t mnist_ckpt_meta_get(mnist_ckpt_t *c, const char *key, const char **value) {
  for (size_t i = 0; i < c->nmeta; i++)
    if (strcmp(c->keys[i], key) == 0) {
      *value = c->values[i];
      return HORA_SUCCESS;
    }
  return HORA_ERR_NOT_FOUND;
}

hora_result_t mnist_ckpt_flush(mnist_ckpt_t *c) { return hora_barrier(c->ctx); }

hora_result_t mnist_ckpt_close(mnist_ckpt_t *c) {
  if (!c) return HORA_SUCCESS;
  free(c->meta_blob);
  free(c);
  return HORA_SUCCESS;
}

static volatile sig_atomic_t got_signal = 0;
static void on_signal(int sig) { got_signal = sig; }

hora_result_t mnist_on_signal(hora_ctx_t *ctx) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGUSR1, &sa, NULL) || sigaction(SIGTERM, &sa, NULL)) return HORA_ERR_INTERNAL;
  return HORA_SUCCESS;
}

hora_result_t mnist_should_stop(hora_ctx_t *ctx, int *stop) {
  int32_t mine = got_signal != 0, any = 0;
  hora_result_t rc = hora_allreduce(ctx, &mine, &any, 1, HORA_INT32, HORA_MAX, 1.0, 1.0,
                                    HORA_DEVICE_HOST);
  if (rc == HORA_SUCCESS) *stop = any != 0;
  return rc;
}

#endif
