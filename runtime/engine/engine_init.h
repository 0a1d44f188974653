/* The engine's entry points for hora_init (runtime/init/init.c) and hora_process_set_create
 * (runtime/init/pset.c), called once the layout is built and the GPU chosen. On a process set's
 * context (ctx->parent set) it starts no heartbeat and no timeline: the set shares its root
 * context's heartbeat and fails with its parent's engine. It starts the engine thread and the heartbeat thread (collective: it
 * duplicates communicators) and registers the finalizer that stops them in hora_finalize. */
#ifndef HORA_ENGINE_INIT_H
#define HORA_ENGINE_INIT_H

#include "core/internal.h"

struct hora_ctx;
hora_result_t hora__engine_on_init(struct hora_ctx *ctx);
/* Fail ctx's engine (every pending and later request gets rc and msg) so that its finalizer
 * returns within seconds instead of waiting for peers: used when a process set's creation
 * failed on another rank after this one had started the set's engine. No-op without an engine. */
void hora__engine_abort(struct hora_ctx *ctx, hora_result_t rc, const char *msg);
/* The first step of hora_finalize on the context hora_init made, before any module stops: tells
 * the other ranks this rank will make no more calls (hora__hb_announce_finalize). */
void hora__engine_on_finalize_begin(struct hora_ctx *ctx);

#endif
