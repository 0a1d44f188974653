/* The example's use of hora for data parallelism, behind four small wrappers: per-layer gradient
 * averaging (hora_allreduce_async, overlapping backward), checkpoints (hora_ckpt_*), and the
 * preemption signal (hora_ckpt_on_signal / hora_should_stop). */
#ifndef MNIST_DIST_H
#define MNIST_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "hora.h"
#include "model.h"

#ifndef HORA_EXIT_REQUEUE
#define MNIST_EXIT_REQUEUE 3 /* exit status after a preemption checkpoint: requeue me */
#else
#define MNIST_EXIT_REQUEUE HORA_EXIT_REQUEUE
#endif

/* ---- gradient averaging ---- */
typedef struct {
  hora_ctx_t *ctx;
  mnist_model_t *model;
  void *pending[MNIST_LAYERS]; /* hora_handle_t * of each layer in flight */
} mnist_grad_sync_t;

/* The model's layer_done callback: starts averaging (HORA_AVERAGE) the layer's gradient in place
 * across ranks as soon as backward has produced it. */
hora_result_t mnist_grad_layer_done(void *sync, int layer);
/* Waits for every layer's average; after it the gradients are the same on every rank. */
hora_result_t mnist_grad_wait(mnist_grad_sync_t *sync);

/* ---- checkpoints ---- */
typedef hora_tensor_t mnist_tensor_t;
typedef hora_kv_t mnist_kv_t;
typedef struct mnist_ckpt mnist_ckpt_t;

/* Collective. local_dir NULL: hora's default node-local directory; persist_dir NULL: none. */
hora_result_t mnist_ckpt_open(hora_ctx_t *ctx, const char *local_dir, const char *persist_dir,
                              mnist_ckpt_t **ck);
/* Collective; rank 0's tensors are saved (all ranks hold the same state). */
hora_result_t mnist_ckpt_save(mnist_ckpt_t *ck, int64_t step, const mnist_tensor_t *t, size_t n,
                              const mnist_kv_t *meta, size_t nmeta);
/* Collective; fills every tensor on every rank from the newest valid checkpoint;
 * HORA_ERR_NOT_FOUND when there is none (nothing written). */
hora_result_t mnist_ckpt_restore(mnist_ckpt_t *ck, int64_t *step, mnist_tensor_t *t, size_t n);
/* Metadata of the last restore; HORA_ERR_NOT_FOUND for a missing key. */
hora_result_t mnist_ckpt_meta_get(mnist_ckpt_t *ck, const char *key, const char **value);
/* Collective: waits until the last checkpoint is durable in the persistent directory. */
hora_result_t mnist_ckpt_flush(mnist_ckpt_t *ck);
hora_result_t mnist_ckpt_close(mnist_ckpt_t *ck);

/* The hora_ckpt_t behind ck (for hora_elastic_open); NULL for NULL. */
hora_ckpt_t *mnist_ckpt_handle(mnist_ckpt_t *ck);

/* ---- elastic training (hora_elastic_*, docs/elastic.md) ----
 * The blob of every commit: where in the data the committed state is. */
typedef struct {
  int64_t epoch;       /* the epoch the position is in (0-based) */
  int64_t step;        /* steps of that epoch done (0: at its start) */
  int64_t world;       /* world size that took those steps */
  int64_t batch;       /* images per rank and step */
  uint64_t seed;       /* --seed of the run */
  int64_t global_step; /* steps done in all (the schedule's step at that world size) */
} mnist_elastic_pos_t;

/* Where a world of `size` ranks with `spe` steps per epoch goes on from p: the same epoch, after
 * as many steps as cover the images p's world had taken in it (rounded up, so no step of the new
 * world trains on fewer images than were committed); a position at an epoch's end is the next
 * epoch's start. Returns the global step (epoch * spe + step in the epoch). */
int64_t mnist_elastic_resume_step(const mnist_elastic_pos_t *p, int size, int batch, int64_t spe);

/* ---- preemption ---- */
/* Installs flag-only handlers for SIGUSR1 and SIGTERM (Slurm's --signal and scancel). */
hora_result_t mnist_on_signal(hora_ctx_t *ctx);
/* Collective: *stop = 1 on every rank when any rank got one of the signals. */
hora_result_t mnist_should_stop(hora_ctx_t *ctx, int *stop);

#endif
