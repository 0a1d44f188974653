/* The engine's one entry point for core: hora_init calls it once the layout is built. It starts
 * the engine thread and the heartbeat thread (collective: it duplicates communicators) and
 * registers the finalizer that stops them in hora_finalize. Declared weak: core links without the
 * engine (a static program that never makes an async call gets no engine thread). */
#ifndef HORA_ENGINE_INIT_H
#define HORA_ENGINE_INIT_H

#include "core/internal.h"

struct hora_ctx;
hora_result_t hora__engine_on_init(struct hora_ctx *ctx) __attribute__((weak));

#endif
