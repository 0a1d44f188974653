/* libFuzzer target over launch's parsers. Each input is tried as a hostlist, a tasks-per-node
 * string, a GPU list, a -H list and a host file; besides the sanitizers' checks, the results must satisfy
 * the parsers' contracts (bounded sizes, non-empty names, counts >= 1, error message set). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096) return 0;
  char *s = malloc(size + 1);
  if (!s) return 0;
  memcpy(s, data, size);
  s[size] = 0;
  char err[256], **v = NULL;
  size_t n = 0;
  err[0] = 0;
  if (launch_hostlist_expand(s, &v, &n, err, sizeof err) == 0) {
    if (n == 0 || n > LAUNCH_MAX_NAMES) abort();
    for (size_t i = 0; i < n; i++)
      if (!v[i][0]) abort();
    launch_strv_free(v, n);
  } else if (!err[0]) {
    abort();
  }
  int *c = NULL;
  if (launch_tasks_per_node_parse(s, &c, &n, err, sizeof err) == 0) {
    long total = 0;
    for (size_t i = 0; i < n; i++) {
      if (c[i] < 1) abort();
      total += c[i];
    }
    if (total > LAUNCH_MAX_NAMES) abort();
    free(c);
  }
  if (launch_gpu_list_parse(s, &v, &n, err, sizeof err) == 0) {
    for (size_t i = 0; i < n; i++)
      for (size_t j = i + 1; j < n && j < i + 64; j++)
        if (!strcmp(v[i], v[j])) abort();
    launch_strv_free(v, n);
  }
  int *slots = NULL;
  if (launch_hosts_parse(s, &v, &slots, &n, err, sizeof err) == 0) {
    for (size_t i = 0; i < n; i++)
      if (slots[i] < 1 || !v[i][0]) abort();
    launch_strv_free(v, n);
    free(slots);
  }
  char *hosts = NULL;
  if (launch_hostfile_parse(s, &hosts, err, sizeof err) == 0) {
    /* The -H form it makes must parse as one. */
    if (launch_hosts_parse(hosts, &v, &slots, &n, err, sizeof err) != 0 || n == 0) abort();
    launch_strv_free(v, n);
    free(slots);
    free(hosts);
  }
  free(s);
  return 0;
}
