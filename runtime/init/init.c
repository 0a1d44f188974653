/* hora_init / hora_finalize: the top floor of libhora. Core (runtime/core) builds the context and
 * the layout; this file starts the modules on it, in order, by explicit calls:
 *
 *   hora__ctx_open          core: MPI, the world communicator, layout checks, layout
 *   hora__gpu_on_init       comm: this rank's GPU (a no-op without CUDA), before the engine
 *   hora__engine_on_init    engine: its thread and the heartbeat thread (collective: they dup
 *                           communicators, which must not interleave with the program's own
 *                           collectives, so the engine starts here and not lazily)
 *   hora__ctx_publish       core: the context becomes live; rank 0 logs the banner
 *   hora__trace_on_init     trace: optional services set by environment (GPU monitor); they only
 *                           log on failure
 *
 * Modules stop in hora_finalize through the finalizers they registered (newest first), then core
 * releases the context. Every module is linked into libhora and hora_static, so no reference here
 * is weak. */
#include "core/ctx.h"
#include "comm/gpu.h"
#include "engine/engine_init.h"
#include "trace/trace.h"

HORA_EXPORT hora_result_t hora_init_ex(const hora_init_opts_t *opts, hora_ctx_t **out) {
  hora_result_t rc = HORA_SUCCESS;
  hora__error_clear();
  if (!out) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_init: ctx (output pointer) is NULL");
  hora_ctx_t *c = NULL;
  HORA_CHECK(hora__ctx_open(opts, &c));
  HORA_CHECK_GOTO(hora__gpu_on_init(c), rc, fail);
  HORA_CHECK_GOTO(hora__engine_on_init(c), rc, fail);
  HORA_CHECK_GOTO(hora__ctx_publish(c), rc, fail);
  hora__trace_on_init(c);
  *out = c;
  return HORA_SUCCESS;

fail:
  /* Stop whatever started (the finalizers registered so far), then release the context. This
   * failure can be this rank's alone (GPU, engine): the other ranks go on, so it counts as failed
   * (ctx->failed): finalizers skip what waits for every rank and MPI is not finalized. */
  __atomic_store_n(&c->failed, 1, __ATOMIC_RELEASE);
  hora__ctx_run_finalizers(c);
  hora__ctx_discard(c);
  return rc;
}

HORA_EXPORT hora_result_t hora_init(hora_ctx_t **ctx) { return hora_init_ex(NULL, ctx); }

HORA_EXPORT hora_result_t hora_finalize(hora_ctx_t *ctx) {
  if (!ctx) return HORA_SUCCESS;
  HORA_CHECK(hora__ctx_check_live(ctx, "hora_finalize"));
  if (ctx->parent)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "hora_finalize: the context is a process set: release "
                    "it with hora_process_set_destroy");
  /* Tell the peers first that this rank makes no more calls: one that waits for it in a blocking
   * call it never completed then fails instead of hanging (and so does not keep this rank waiting
   * in the finalizers below, which agree with every rank). */
  hora__engine_on_finalize_begin(ctx);
  /* Module finalizers, newest first, while the context is still live for them. */
  hora_result_t first = hora__ctx_run_finalizers(ctx);
  hora__ctx_discard(ctx);
  return first;
}
