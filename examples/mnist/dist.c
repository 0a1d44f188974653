/* hora data parallelism of the example (see dist.h). */
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- gradient averaging ---- */

hora_result_t mnist_grad_layer_done(void *arg, int layer) {
  mnist_grad_sync_t *s = arg;
  const mnist_layer_t *L = &s->model->layer[layer];
  float *g = s->model->grads + L->offset;
  /* The engine negotiates, fuses and reduces on its own thread while backward goes on. On the GPU
   * path the gradient is device memory written by kernels on the legacy default stream; hora's
   * streams are blocking streams, so its allreduce orders after them (docs/gpu.md). */
  char name[64];
  snprintf(name, sizeof name, "grad.%s", L->name);
  hora_handle_t *h = NULL;
  hora_result_t rc = hora_allreduce_async(s->ctx, name, g, g, L->count, HORA_FLOAT32, HORA_AVERAGE,
                                          1.0, 1.0,
                                          s->model->cuda ? HORA_DEVICE_CUDA : HORA_DEVICE_HOST, &h);
  if (rc == HORA_SUCCESS) s->pending[layer] = h;
  return rc;
}

hora_result_t mnist_grad_wait(mnist_grad_sync_t *s) {
  hora_result_t first = HORA_SUCCESS;
  for (int l = MNIST_LAYERS - 1; l >= 0; l--) {
    if (!s->pending[l]) continue;
    hora_result_t rc = hora_wait(s->pending[l]);
    hora_handle_free(s->pending[l]);
    s->pending[l] = NULL;
    if (first == HORA_SUCCESS) first = rc;
  }
  return first;
}

/* ---- checkpoints ---- */

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
hora_ckpt_t *mnist_ckpt_handle(mnist_ckpt_t *c) { return c ? c->ck : NULL; }

/* ---- elastic training ---- */

int64_t mnist_elastic_resume_step(const mnist_elastic_pos_t *p, int size, int batch, int64_t spe) {
  const int64_t images = p->step * p->batch * p->world; /* of epoch p->epoch, over all ranks */
  const int64_t per_step = (int64_t)batch * size;
  int64_t epoch = p->epoch, s = (images + per_step - 1) / per_step;
  if (s >= spe) epoch++, s = 0;
  return epoch * spe + s;
}

hora_result_t mnist_on_signal(hora_ctx_t *ctx) { return hora_ckpt_on_signal(ctx); }
hora_result_t mnist_should_stop(hora_ctx_t *ctx, int *stop) { return hora_should_stop(ctx, stop); }
