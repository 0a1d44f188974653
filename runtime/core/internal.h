/* Internal declarations shared by every runtime module: export macro, errors, logging, params,
 * dtype helpers. Modules include this and "core/ctx.h" (which needs mpi.h) where they need the
 * context. Internal non-static symbols are named hora__*. */
#ifndef HORA_CORE_INTERNAL_H
#define HORA_CORE_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "hora.h"

#define HORA_EXPORT __attribute__((visibility("default")))
#define HORA_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* ---- logging (HORA_LOG, HORA_LOG_SUBSYS) ---- */
typedef enum { HORA_LOG_NONE = 0, HORA_LOG_WARN = 1, HORA_LOG_INFO = 2, HORA_LOG_TRACE = 3 } hora_log_level_t;

/* Subsystems; the names (upper case) are what HORA_LOG_SUBSYS lists. */
#define HORA_SUBSYS_LIST(X) \
  X(INIT) X(COMM) X(RING) X(SHM) X(ENGINE) X(CKPT) X(DATA) X(TRACE) X(CUDA) X(NCCL) X(BENCH)
typedef enum {
#define X(s) HORA_SUBSYS_##s,
  HORA_SUBSYS_LIST(X)
#undef X
  HORA_SUBSYS_COUNT
} hora_subsys_t;

/* Configure logging from HORA_LOG / HORA_LOG_SUBSYS (called by hora_init; the first log call
 * also does it lazily). Returns HORA_ERR_INVALID_ARGUMENT for malformed values. */
hora_result_t hora__log_configure(void);
/* Set the rank shown in the log prefix (-1 before init). */
void hora__log_set_rank(int rank);
int hora__log_enabled(hora_log_level_t level, hora_subsys_t subsys);
void hora__log(hora_log_level_t level, hora_subsys_t subsys, const char *file, int line,
               const char *fmt, ...) HORA_PRINTF(5, 6);

#define HORA_LOG_AT(level, subsys, ...)                                              \
  do {                                                                               \
    if (hora__log_enabled(level, HORA_SUBSYS_##subsys))                              \
      hora__log(level, HORA_SUBSYS_##subsys, __FILE__, __LINE__, __VA_ARGS__);       \
  } while (0)
#define HORA_WARN(subsys, ...) HORA_LOG_AT(HORA_LOG_WARN, subsys, __VA_ARGS__)
#define HORA_INFO(subsys, ...) HORA_LOG_AT(HORA_LOG_INFO, subsys, __VA_ARGS__)
#define HORA_TRACE(subsys, ...) HORA_LOG_AT(HORA_LOG_TRACE, subsys, __VA_ARGS__)

/* ---- errors ----
 * HORA_ERR(rc, fmt, ...) records the message as the thread's hora_last_error(), logs it at WARN
 * with file:line, and evaluates to rc: `return HORA_ERR(HORA_ERR_IO, "open %s: %s", p, e);`.
 * HORA_CHECK(call) returns the call's error upward with an INFO "-> rc" trace line.
 * HORA_CHECK_GOTO(call, rc, label) stores it in rc and jumps to the function's one fail label. */
hora_result_t hora__error(hora_result_t rc, const char *file, int line, const char *fmt, ...)
    HORA_PRINTF(4, 5);
void hora__error_clear(void);
/* Put back a message saved from hora_last_error() (after a later call overwrote it), without
 * logging it again. */
void hora__error_restore(const char *msg);
#define HORA_ERR(rc, ...) hora__error((rc), __FILE__, __LINE__, __VA_ARGS__)
#define HORA_CHECK(call)                                                                  \
  do {                                                                                    \
    hora_result_t hora_check_rc_ = (call);                                                \
    if (hora_check_rc_ != HORA_SUCCESS) {                                                 \
      HORA_INFO(INIT, "%s:%d -> %s", __FILE__, __LINE__, hora_result_name(hora_check_rc_)); \
      return hora_check_rc_;                                                              \
    }                                                                                     \
  } while (0)
#define HORA_CHECK_GOTO(call, rc, label)                                     \
  do {                                                                       \
    (rc) = (call);                                                           \
    if ((rc) != HORA_SUCCESS) {                                              \
      HORA_INFO(INIT, "%s:%d -> %s", __FILE__, __LINE__, hora_result_name(rc)); \
      goto label;                                                            \
    }                                                                        \
  } while (0)

/* ---- dtypes ---- */
size_t hora__dtype_size(hora_dtype_t dtype); /* 0 for an unknown dtype */
const char *hora__dtype_name(hora_dtype_t dtype);
const char *hora__op_name(hora_op_t op);

/* ---- params (params.def) ---- */
typedef enum { HORA_PT_INT, HORA_PT_DOUBLE, HORA_PT_BYTES, HORA_PT_STRING } hora_param_type_t;

typedef struct hora_params {
#define HORA_PARAM_FIELD_INT int64_t
#define HORA_PARAM_FIELD_DOUBLE double
#define HORA_PARAM_FIELD_BYTES uint64_t
#define HORA_PARAM_FIELD_STRING const char *
#define X(field, env, type, def, min, max, choices, unit, doc) HORA_PARAM_FIELD_##type field;
#include "core/params.def"
#undef X
} hora_params_t;

/* Description of one parameter, for docs/env.md and the non-default report. */
typedef struct {
  const char *env, *def, *choices, *unit, *doc;
  hora_param_type_t type;
  double min, max;
} hora_param_info_t;
extern const hora_param_info_t hora__param_info[];
extern const size_t hora__param_count;

/* Parse every parameter from the environment into *out. A malformed or out-of-range value is
 * HORA_ERR_INVALID_ARGUMENT naming the variable; *out is then unspecified. */
hora_result_t hora__params_load(hora_params_t *out);
/* The process-wide parameters (loaded on first use, reloaded by hora_init). Never NULL. */
const hora_params_t *hora__params(void);
/* Reload from the environment; used by hora_init and by tests that change variables. */
hora_result_t hora__params_reload(void);
/* Parse "128M", "4k", "1G", "4096" into bytes (K/M/G are powers of 1024). */
hora_result_t hora__parse_bytes(const char *s, uint64_t *out);

/* ---- fork() children (core/fork.c) ----
 * hora__fork_watch: registers the fork handler (once per process, thread-safe) and returns the
 * current fork generation (0 in the process that was started, +1 in each fork() child). Objects
 * that own a thread or MPI state store it when they are made.
 * hora__fork_check: HORA_SUCCESS when `gen` is the current generation, else HORA_ERR_NOT_SUPPORTED
 * naming `fn`, `what` (the object, e.g. "the records reader"), both pids and `fix` (may be NULL).
 * One relaxed atomic load on the success path. hora__fork_check_rc returns `rc` instead: a
 * context is HORA_ERR_NOT_INITIALIZED there (not live in this process), which also keeps the
 * blocking calls' refusal from telling the parent's peers about it over MPI (algo/coll.c). */
unsigned hora__fork_watch(void);
hora_result_t hora__fork_check_rc(unsigned gen, hora_result_t rc, const char *fn, const char *what, const char *fix);
#define hora__fork_check(gen, fn, what, fix) hora__fork_check_rc(gen, HORA_ERR_NOT_SUPPORTED, fn, what, fix)

/* ---- time ---- */
double hora__now_s(void); /* CLOCK_MONOTONIC seconds */

#endif
