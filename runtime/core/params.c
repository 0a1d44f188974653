/* Parameters from the environment, generated from params.def. A malformed value is an error at
 * hora_init naming the variable; there is no silent fallback to the default. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/internal.h"

const hora_param_info_t hora__param_info[] = {
#define X(field, env, type, def, min, max, choices, unit, doc) \
  {#env, def, choices, unit, doc, HORA_PT_##type, (double)(min), (double)(max)},
#include "core/params.def"
#undef X
};
const size_t hora__param_count = sizeof hora__param_info / sizeof hora__param_info[0];

hora_result_t hora__parse_bytes(const char *s, uint64_t *out) {
  if (!s || !*s) return HORA_ERR_INVALID_ARGUMENT;
  errno = 0;
  char *end = NULL;
  double v = strtod(s, &end);
  if (errno || end == s || v < 0 || !isfinite(v)) return HORA_ERR_INVALID_ARGUMENT;
  double mult = 1;
  if (*end) {
    switch (toupper((unsigned char)*end)) {
      case 'K': mult = 1024.0; break;
      case 'M': mult = 1024.0 * 1024; break;
      case 'G': mult = 1024.0 * 1024 * 1024; break;
      case 'T': mult = 1024.0 * 1024 * 1024 * 1024; break;
      case 'B': mult = 1; end--; break;
      default: return HORA_ERR_INVALID_ARGUMENT;
    }
    end++;
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return HORA_ERR_INVALID_ARGUMENT;
  }
  double b = v * mult;
  if (b > 1.8e19 || b != floor(b)) return HORA_ERR_INVALID_ARGUMENT;
  *out = (uint64_t)b;
  return HORA_SUCCESS;
}

static hora_result_t parse_one(const hora_param_info_t *p, const char *val, void *field) {
  char *end = NULL;
  switch (p->type) {
    case HORA_PT_INT: {
      errno = 0;
      long long v = strtoll(val, &end, 10);
      if (errno || end == val || *end)
        return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s=%s is not an integer", p->env, val);
      if ((double)v < p->min || (double)v > p->max)
        return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s=%s is out of range [%.0f, %.0f]", p->env,
                        val, p->min, p->max);
      *(int64_t *)field = v;
      return HORA_SUCCESS;
    }
    case HORA_PT_DOUBLE: {
      errno = 0;
      double v = strtod(val, &end);
      if (errno || end == val || *end || !isfinite(v))
        return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s=%s is not a number", p->env, val);
      if (v < p->min || v > p->max)
        return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s=%s is out of range [%g, %g]", p->env, val,
                        p->min, p->max);
      *(double *)field = v;
      return HORA_SUCCESS;
    }
    case HORA_PT_BYTES: {
      uint64_t v;
      if (hora__parse_bytes(val, &v) != HORA_SUCCESS)
        return HORA_ERR(HORA_ERR_INVALID_ARGUMENT,
                        "%s=%s is not a byte size (a number with an optional K, M or G suffix)",
                        p->env, val);
      if ((double)v < p->min || (double)v > p->max)
        return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s=%s is out of range [%.0f, %.0f] bytes",
                        p->env, val, p->min, p->max);
      *(uint64_t *)field = v;
      return HORA_SUCCESS;
    }
    case HORA_PT_STRING: {
      if (p->choices && *p->choices) {
        const char *c = p->choices;
        size_t n = strlen(val);
        int ok = 0;
        while (*c) {
          const char *bar = strchr(c, '|');
          size_t len = bar ? (size_t)(bar - c) : strlen(c);
          if (len == n && strncasecmp(c, val, n) == 0) {
            ok = 1;
            val = c; /* canonical spelling from the list (static storage) */
            break;
          }
          c += len + (bar ? 1 : 0);
        }
        if (!ok)
          return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s=%s is not one of %s", p->env, val,
                          p->choices);
        /* Store a NUL-terminated copy of the canonical choice. */
        const char *bar = strchr(val, '|');
        size_t len = bar ? (size_t)(bar - val) : strlen(val);
        char *copy = strndup(val, len);
        if (!copy) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory reading %s", p->env);
        *(const char **)field = copy;
      } else {
        char *copy = strdup(val);
        if (!copy) return HORA_ERR(HORA_ERR_NO_MEMORY, "out of memory reading %s", p->env);
        *(const char **)field = copy;
      }
      return HORA_SUCCESS;
    }
  }
  return HORA_ERR_INTERNAL;
}

hora_result_t hora__params_load(hora_params_t *out) {
  size_t i = 0;
#define X(field, env, type, def, min, max, choices, unit, doc)                       \
  {                                                                                  \
    const char *v = getenv(#env);                                                    \
    hora_result_t rc = parse_one(&hora__param_info[i], (v && *v) ? v : def, &out->field); \
    if (rc != HORA_SUCCESS) return rc;                                               \
    i++;                                                                             \
  }
#include "core/params.def"
#undef X
  return HORA_SUCCESS;
}

/* The process-wide copy. Strings from older loads are leaked on purpose (a few bytes per
 * hora_init) because other threads may still hold pointers into them. */
static hora_params_t g_params;
static int g_loaded;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

hora_result_t hora__params_reload(void) {
  hora_params_t p;
  memset(&p, 0, sizeof p);
  hora_result_t rc = hora__params_load(&p);
  if (rc != HORA_SUCCESS) return rc;
  pthread_mutex_lock(&g_lock);
  g_params = p;
  __atomic_store_n(&g_loaded, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&g_lock);
  return HORA_SUCCESS;
}

const hora_params_t *hora__params(void) {
  if (!__atomic_load_n(&g_loaded, __ATOMIC_ACQUIRE)) {
    if (hora__params_reload() != HORA_SUCCESS) {
      /* Malformed environment before hora_init: use the defaults; hora_init reports it. */
      pthread_mutex_lock(&g_lock);
      if (!g_loaded) {
        size_t i = 0;
#define X(field, env, type, def, min, max, choices, unit, doc) \
  parse_one(&hora__param_info[i++], def, &g_params.field);
#include "core/params.def"
#undef X
        __atomic_store_n(&g_loaded, 1, __ATOMIC_RELEASE);
      }
      pthread_mutex_unlock(&g_lock);
    }
  }
  return &g_params;
}
