/* Parsers for Slurm's hostlist, tasks-per-node and GPU list formats, and launch's -H list.
 * See parse.h for the grammar each one accepts. */
#include "parse.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

void launch_strv_free(char **v, size_t n) {
  if (!v) return;
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

int launch_parse_uint(const char *s, int max, int *out) {
  if (!s || !*s) return -1;
  long long v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    v = v * 10 + (*p - '0');
    if (v > max) return -1;
  }
  *out = (int)v;
  return 0;
}

/* A growable array of strings. */
typedef struct {
  char **v;
  size_t n, cap;
} strv_t;

static int strv_push(strv_t *a, char *s) {
  if (!s) return -1;
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 8;
    char **v = realloc(a->v, cap * sizeof(*v));
    if (!v) {
      free(s);
      return -1;
    }
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n++] = s;
  return 0;
}

static char *strndup_(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = 0;
  }
  return d;
}

static int host_char(int c) { return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.'; }

/* Reads up to 9 digits at *p into *val and their count into *len. */
static int read_number(const char **p, long *val, int *len) {
  const char *q = *p;
  long v = 0;
  int n = 0;
  while (*q >= '0' && *q <= '9') {
    if (++n > 9) return -1;
    v = v * 10 + (*q - '0');
    q++;
  }
  if (n == 0) return -1;
  *val = v;
  *len = n;
  *p = q;
  return 0;
}

/* One part of an item: either a literal (one string) or a bracket's expansion. */
typedef struct {
  strv_t alts;
} part_t;

static void parts_free(part_t *parts, size_t n) {
  for (size_t i = 0; i < n; i++) launch_strv_free(parts[i].alts.v, parts[i].alts.n);
  free(parts);
}

/* Parses the bracket body starting after '['; leaves *p after ']'. */
static int parse_bracket(const char **p, const char *item, strv_t *out, size_t budget, char *err,
                         size_t errlen) {
  const char *q = *p;
  for (;;) {
    long lo, hi;
    int wlo, whi;
    const char *start = q;
    if (read_number(&q, &lo, &wlo) != 0)
      return fail(err, errlen, "hostlist '%s': expected a number (at most 9 digits) at '%.20s'", item, start);
    hi = lo;
    if (*q == '-') {
      q++;
      if (read_number(&q, &hi, &whi) != 0)
        return fail(err, errlen, "hostlist '%s': expected the end of a range at '%.20s'", item, q);
      if (hi < lo) return fail(err, errlen, "hostlist '%s': range %ld-%ld runs backwards", item, lo, hi);
    }
    if ((size_t)(hi - lo + 1) > budget)
      return fail(err, errlen, "hostlist '%s' expands to more than %d names", item, LAUNCH_MAX_NAMES);
    budget -= (size_t)(hi - lo + 1);
    for (long v = lo; v <= hi; v++) {
      char buf[24];
      snprintf(buf, sizeof buf, "%0*ld", wlo, v);
      if (strv_push(out, strndup_(buf, strlen(buf))) != 0) return fail(err, errlen, "out of memory");
    }
    if (*q == ',') {
      q++;
      continue;
    }
    if (*q == ']') {
      *p = q + 1;
      return 0;
    }
    if (*q == 0) return fail(err, errlen, "hostlist '%s': '[' is never closed", item);
    return fail(err, errlen, "hostlist '%s': unexpected character '%c' inside brackets", item, *q);
  }
}

int launch_hostlist_expand(const char *s, char ***names, size_t *count, char *err, size_t errlen) {
  if (!s || !*s) return fail(err, errlen, "hostlist is empty");
  strv_t out = {0};
  const char *p = s;
  while (*p) {
    /* One item: up to the next comma at bracket depth 0. */
    const char *item_start = p;
    size_t item_len = 0;
    for (int depth = 0; p[item_len] && (depth > 0 || p[item_len] != ','); item_len++) {
      if (p[item_len] == '[') depth++;
      if (p[item_len] == ']') depth--;
    }
    char *item = strndup_(item_start, item_len);
    if (!item) goto oom;
    if (item_len == 0) {
      free(item);
      fail(err, errlen, "hostlist '%s' has an empty entry", s);
      goto bad;
    }
    part_t *parts = NULL;
    size_t nparts = 0;
    const char *q = item;
    int rc = 0;
    /* Product of the alternatives parsed so far in this item: a bracket may expand to at most
     * (names left) / prod alternatives, so that no input materializes more than
     * LAUNCH_MAX_NAMES strings before the limit is reported. */
    size_t prod = 1;
    while (*q && rc == 0) {
      part_t *np = realloc(parts, (nparts + 1) * sizeof(*parts));
      if (!np) {
        rc = fail(err, errlen, "out of memory");
        break;
      }
      parts = np;
      memset(&parts[nparts], 0, sizeof(parts[nparts]));
      nparts++;
      if (*q == '[') {
        q++;
        rc = parse_bracket(&q, item, &parts[nparts - 1].alts, (LAUNCH_MAX_NAMES - out.n) / prod, err, errlen);
        if (rc == 0) prod *= parts[nparts - 1].alts.n;
      } else {
        const char *lit = q;
        while (*q && *q != '[') {
          if (!host_char(*q)) {
            rc = (*q == ']') ? fail(err, errlen, "hostlist '%s': ']' without '['", item)
                             : fail(err, errlen, "hostlist '%s': character '%c' is not allowed in a host name", item, *q);
            break;
          }
          q++;
        }
        if (rc == 0 && strv_push(&parts[nparts - 1].alts, strndup_(lit, (size_t)(q - lit))) != 0)
          rc = fail(err, errlen, "out of memory");
      }
    }
    /* Product of the parts, leftmost slowest. */
    size_t total = 1;
    for (size_t i = 0; rc == 0 && i < nparts; i++) {
      if (total > LAUNCH_MAX_NAMES / parts[i].alts.n) {
        rc = fail(err, errlen, "hostlist '%s' expands to more than %d names", item, LAUNCH_MAX_NAMES);
      } else {
        total *= parts[i].alts.n;
      }
    }
    if (rc == 0 && out.n + total > LAUNCH_MAX_NAMES)
      rc = fail(err, errlen, "hostlist expands to more than %d names", LAUNCH_MAX_NAMES);
    for (size_t k = 0; rc == 0 && k < total; k++) {
      size_t idx = k, len = 0;
      size_t *pick = calloc(nparts ? nparts : 1, sizeof(size_t));
      if (!pick) {
        rc = fail(err, errlen, "out of memory");
        break;
      }
      for (size_t i = nparts; i-- > 0;) {
        pick[i] = idx % parts[i].alts.n;
        idx /= parts[i].alts.n;
        len += strlen(parts[i].alts.v[pick[i]]);
      }
      char *name = malloc(len + 1);
      if (name) {
        name[0] = 0;
        for (size_t i = 0; i < nparts; i++) strcat(name, parts[i].alts.v[pick[i]]);
      }
      free(pick);
      if (strv_push(&out, name) != 0) rc = fail(err, errlen, "out of memory");
    }
    parts_free(parts, nparts);
    free(item);
    if (rc != 0) goto bad;
    p += item_len;
    if (*p == ',') {
      p++;
      if (!*p) {
        fail(err, errlen, "hostlist '%s' ends with a comma", s);
        goto bad;
      }
    }
  }
  *names = out.v;
  *count = out.n;
  return 0;
oom:
  fail(err, errlen, "out of memory");
bad:
  launch_strv_free(out.v, out.n);
  return -1;
}

int launch_tasks_per_node_parse(const char *s, int **counts, size_t *n, char *err, size_t errlen) {
  if (!s || !*s) return fail(err, errlen, "tasks-per-node string is empty");
  int *v = NULL;
  size_t len = 0, cap = 0;
  long total = 0;
  const char *p = s;
  while (*p) {
    long c, rep = 1;
    int w;
    const char *at = p;
    if (read_number(&p, &c, &w) != 0 || c < 1) {
      free(v);
      return fail(err, errlen, "tasks-per-node '%s': expected a count >= 1 at '%.20s'", s, at);
    }
    if (*p == '(') {
      if (p[1] != 'x') {
        free(v);
        return fail(err, errlen, "tasks-per-node '%s': expected '(xN)' after %ld", s, c);
      }
      p += 2;
      if (read_number(&p, &rep, &w) != 0 || rep < 1 || *p != ')') {
        free(v);
        return fail(err, errlen, "tasks-per-node '%s': malformed repeat '(x...)' after %ld", s, c);
      }
      p++;
    }
    if (rep > LAUNCH_MAX_NAMES || total + c * rep > LAUNCH_MAX_NAMES || len + (size_t)rep > LAUNCH_MAX_NAMES) {
      free(v);
      return fail(err, errlen, "tasks-per-node '%s' adds up to more than %d tasks", s, LAUNCH_MAX_NAMES);
    }
    total += c * rep;
    if (len + (size_t)rep > cap) {
      size_t ncap = (len + (size_t)rep) * 2;
      int *nv = realloc(v, ncap * sizeof(*v));
      if (!nv) {
        free(v);
        return fail(err, errlen, "out of memory");
      }
      v = nv;
      cap = ncap;
    }
    for (long i = 0; i < rep; i++) v[len++] = (int)c;
    if (*p == ',') {
      p++;
      if (!*p) {
        free(v);
        return fail(err, errlen, "tasks-per-node '%s' ends with a comma", s);
      }
    } else if (*p) {
      free(v);
      return fail(err, errlen, "tasks-per-node '%s': unexpected character '%c'", s, *p);
    }
  }
  *counts = v;
  *n = len;
  return 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int launch_gpu_list_parse(const char *s, char ***ids, size_t *count, char *err, size_t errlen) {
  strv_t out = {0};
  const char *p = s ? s : "";
  while (*p) {
    size_t n = strcspn(p, ",");
    if (n == 0) {
      fail(err, errlen, "GPU list '%s' has an empty entry", s);
      goto bad;
    }
    const char *q = p;
    long lo, hi;
    int w;
    if (read_number(&q, &lo, &w) == 0 && (q == p + n || *q == '-')) {
      hi = lo;
      if (*q == '-') {
        q++;
        if (read_number(&q, &hi, &w) != 0 || q != p + n || hi < lo || hi - lo >= 65536) {
          fail(err, errlen, "GPU list '%s': malformed range '%.*s'", s, (int)n, p);
          goto bad;
        }
      }
      for (long v = lo; v <= hi; v++) {
        char buf[24];
        snprintf(buf, sizeof buf, "%ld", v);
        if (strv_push(&out, strndup_(buf, strlen(buf))) != 0) goto oom;
      }
    } else {
      /* An opaque id (CUDA UUID): letters, digits, '-', '/', ':' and '.'. */
      for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (!(isalnum((unsigned char)c) || c == '-' || c == '/' || c == ':' || c == '.' || c == '_')) {
          fail(err, errlen, "GPU list '%s': entry '%.*s' is neither a number, a range nor a GPU UUID", s, (int)n, p);
          goto bad;
        }
      }
      if (strv_push(&out, strndup_(p, n)) != 0) goto oom;
    }
    if (out.n > 65536) {
      fail(err, errlen, "GPU list '%s' has more than 65536 entries", s);
      goto bad;
    }
    p += n;
    if (*p == ',') {
      p++;
      if (!*p) {
        fail(err, errlen, "GPU list '%s' ends with a comma", s);
        goto bad;
      }
    }
  }
  /* Duplicates: sort a copy of the pointers and compare neighbours (n log n; a pairwise check
   * is quadratic, and "0-65535" alone is 65536 entries). */
  if (out.n > 1) {
    char **sorted = malloc(out.n * sizeof(*sorted));
    if (!sorted) goto oom;
    memcpy(sorted, out.v, out.n * sizeof(*sorted));
    qsort(sorted, out.n, sizeof(*sorted), cmp_str);
    for (size_t i = 1; i < out.n; i++)
      if (strcmp(sorted[i - 1], sorted[i]) == 0) {
        fail(err, errlen, "GPU list '%s' names GPU %s twice", s, sorted[i]);
        free(sorted);
        goto bad;
      }
    free(sorted);
  }
  *ids = out.v;
  *count = out.n;
  return 0;
oom:
  fail(err, errlen, "out of memory");
bad:
  launch_strv_free(out.v, out.n);
  return -1;
}

int launch_hosts_parse(const char *s, char ***names, int **slots, size_t *count, char *err,
                       size_t errlen) {
  if (!s || !*s) return fail(err, errlen, "host list (-H) is empty");
  strv_t out = {0};
  int *sl = NULL;
  const char *p = s;
  while (*p) {
    size_t n = strcspn(p, ",");
    const char *colon = memchr(p, ':', n);
    size_t hn = colon ? (size_t)(colon - p) : n;
    int k = 1;
    if (hn == 0) {
      fail(err, errlen, "host list '%s' has an entry without a host name", s);
      goto bad;
    }
    for (size_t i = 0; i < hn; i++)
      if (!host_char(p[i])) {
        fail(err, errlen, "host list '%s': character '%c' is not allowed in a host name", s, p[i]);
        goto bad;
      }
    if (colon) {
      char buf[16];
      size_t sn = n - hn - 1;
      if (sn == 0 || sn >= sizeof buf) {
        fail(err, errlen, "host list '%s': malformed slot count in '%.*s'", s, (int)n, p);
        goto bad;
      }
      memcpy(buf, colon + 1, sn);
      buf[sn] = 0;
      if (launch_parse_uint(buf, 1 << 20, &k) != 0 || k < 1) {
        fail(err, errlen, "host list '%s': slot count '%s' is not a number >= 1", s, buf);
        goto bad;
      }
    }
    int *ns = realloc(sl, (out.n + 1) * sizeof(*sl));
    if (!ns) goto oom;
    sl = ns;
    sl[out.n] = k;
    if (strv_push(&out, strndup_(p, hn)) != 0) goto oom;
    p += n;
    if (*p == ',') {
      p++;
      if (!*p) {
        fail(err, errlen, "host list '%s' ends with a comma", s);
        goto bad;
      }
    }
  }
  *names = out.v;
  *slots = sl;
  *count = out.n;
  return 0;
oom:
  fail(err, errlen, "out of memory");
bad:
  free(sl);
  launch_strv_free(out.v, out.n);
  return -1;
}

/* One whitespace-separated word of line `ln` at *p (advanced past it); NULL at the line's end. */
static const char *word(const char **p, size_t *len) {
  while (**p == ' ' || **p == '\t' || **p == '\r') (*p)++;
  if (!**p || **p == '\n') return NULL;
  const char *w = *p;
  while (**p && **p != ' ' && **p != '\t' && **p != '\r' && **p != '\n') (*p)++;
  *len = (size_t)(*p - w);
  return w;
}

int launch_hostfile_parse(const char *text, char **hosts, char *err, size_t errlen) {
  size_t cap = 64, used = 0;
  char *out = malloc(cap);
  if (!out) return fail(err, errlen, "out of memory");
  out[0] = 0;
  int line = 0, nhosts = 0;
  for (const char *p = text; *p;) {
    line++;
    const char *eol = strchr(p, '\n');
    size_t linelen = eol ? (size_t)(eol - p) : strlen(p);
    const char *hash = memchr(p, '#', linelen);
    const char *end = hash ? hash : p + linelen; /* a comment runs to the end of the line */
    size_t hn, n;
    const char *q = p, *host = word(&q, &hn);
    if (host && host < end) {
      for (size_t i = 0; i < hn; i++)
        if (!host_char(host[i])) {
          free(out);
          return fail(err, errlen, "line %d: '%.*s' is not a host name", line, (int)(hn > 64 ? 64 : hn), host);
        }
      int slots = 1;
      const char *w;
      while ((w = word(&q, &n)) && w < end) {
        if (w + n > end) n = (size_t)(end - w);
        char buf[16];
        const char *val = NULL;
        if (n > 6 && strncmp(w, "slots=", 6) == 0) val = w + 6;
        else if (n > 10 && strncmp(w, "max_slots=", 10) == 0) val = w + 10; /* Open MPI's; not used */
        size_t vn = val ? (size_t)(w + n - val) : 0;
        int v;
        if (!val || vn >= sizeof buf) {
          free(out);
          return fail(err, errlen, "line %d: '%.*s' is not slots=N (a line is \"host slots=N\")", line,
                      (int)(n > 64 ? 64 : n), w);
        }
        memcpy(buf, val, vn);
        buf[vn] = 0;
        if (launch_parse_uint(buf, 1 << 20, &v) != 0 || v < 1) {
          free(out);
          return fail(err, errlen, "line %d: slot count '%s' is not a number from 1 to %d", line, buf, 1 << 20);
        }
        if (val == w + 6) slots = v;
      }
      char item[320];
      int k = snprintf(item, sizeof item, "%s%.*s:%d", nhosts ? "," : "", (int)hn, host, slots);
      if (k < 0 || (size_t)k >= sizeof item) {
        free(out);
        return fail(err, errlen, "line %d: host name too long", line);
      }
      if (used + (size_t)k + 1 > cap) {
        while (used + (size_t)k + 1 > cap) cap *= 2;
        char *nb = realloc(out, cap);
        if (!nb) {
          free(out);
          return fail(err, errlen, "out of memory");
        }
        out = nb;
      }
      memcpy(out + used, item, (size_t)k + 1);
      used += (size_t)k;
      if (++nhosts > LAUNCH_MAX_NAMES) {
        free(out);
        return fail(err, errlen, "more than %d hosts", LAUNCH_MAX_NAMES);
      }
    }
    p += linelen;
    if (*p == '\n') p++;
  }
  if (!nhosts) {
    free(out);
    return fail(err, errlen, "no host in it (a line is \"host slots=N\")");
  }
  *hosts = out;
  return 0;
}
