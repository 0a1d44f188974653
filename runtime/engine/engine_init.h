/* The engine's one entry point for hora_init (runtime/init/init.c), called once the layout is
 * built and the GPU chosen. It starts the engine thread and the heartbeat thread (collective: it
 * duplicates communicators) and registers the finalizer that stops them in hora_finalize. */
#ifndef HORA_ENGINE_INIT_H
#define HORA_ENGINE_INIT_H

#include "core/internal.h"

struct hora_ctx;
hora_result_t hora__engine_on_init(struct hora_ctx *ctx);

#endif
