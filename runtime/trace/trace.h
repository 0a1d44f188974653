/* Internal declarations of runtime/trace (TensorBoard writer, GPU monitor). */
#ifndef HORA_TRACE_TRACE_H
#define HORA_TRACE_TRACE_H
#include "core/internal.h"

/* mkdir -p. HORA_ERR_IO naming the component that failed. */
hora_result_t hora__mkdir_p(const char *dir);

/* Called by hora_init (runtime/init/init.c) once the context is live: starts the GPU monitor when
 * HORA_GPU_MONITOR_S > 0 (failures only log; optional features never fail hora_init). */
struct hora_ctx;
void hora__trace_on_init(struct hora_ctx *ctx);

#endif
