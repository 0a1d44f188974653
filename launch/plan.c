/* A node's plan: the GPU and the CPU set of each of its local ranks, and the dry-run lines.
 *
 * Planning is linear in the ranks (a million ranks plan in well under a second): a first pass
 * chooses every local rank's GPU and adds it to the placement (place.c groups ranks by CPU
 * set); a second pass asks for the CPU list of the ranks wanted, choosing their GPU again (the
 * choice is a pure function of the local rank) rather than keeping a choice per rank. Memory is
 * two ints per local rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

/* ---- JSON output (hand-written: a few fixed fields; strings are host names and CPU lists). */
static void json_str(char *out, size_t outlen, const char *s) {
  size_t n = 0;
  if (!s) {
    snprintf(out, outlen, "null");
    return;
  }
  out[n++] = '"';
  for (; *s && n + 8 < outlen; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') n += (size_t)snprintf(out + n, outlen - n, "\\%c", c);
    else if (c < 0x20) n += (size_t)snprintf(out + n, outlen - n, "\\u%04x", c);
    else out[n++] = (char)c;
  }
  out[n++] = '"';
  out[n] = 0;
}

/* A line is built with these appends and written with one fwrite: a million lines through
 * printf's format parsing cost more than all of the planning. */
typedef struct {
  char buf[4096];
  size_t n;
} line_t;

static void put_str(line_t *b, const char *s) {
  size_t k = strlen(s);
  if (k > sizeof b->buf - b->n - 1) k = sizeof b->buf - b->n - 1;
  memcpy(b->buf + b->n, s, k);
  b->n += k;
}

static void put_int(line_t *b, const char *key, long v) {
  char tmp[24];
  int k = sizeof tmp;
  unsigned long u = v < 0 ? (unsigned long)-v : (unsigned long)v;
  do tmp[--k] = (char)('0' + u % 10);
  while ((u /= 10) > 0);
  if (v < 0) tmp[--k] = '-';
  put_str(b, key);
  if (b->n + (sizeof tmp - (size_t)k) < sizeof b->buf) {
    memcpy(b->buf + b->n, tmp + k, sizeof tmp - (size_t)k);
    b->n += sizeof tmp - (size_t)k;
  }
}

static void print_line(const launch_layout_t *l, int rank, int node, int local_rank, const char *host_json,
                       const launch_gpu_choice_t *c, const char *cpus) {
  char str[2 * LAUNCH_CPULIST_LEN + 8];
  line_t b;
  b.n = 0;
  put_int(&b, "{\"rank\":", rank);
  put_int(&b, ",\"size\":", l->size);
  put_int(&b, ",\"local_rank\":", local_rank);
  put_int(&b, ",\"local_size\":", l->tpn[node]);
  put_int(&b, ",\"node\":", node);
  put_int(&b, ",\"nodes\":", l->nnodes);
  put_str(&b, ",\"hostname\":");
  put_str(&b, host_json);
  if (c->count > 0) put_int(&b, ",\"gpu\":", c->ordinal);
  else put_str(&b, ",\"gpu\":null");
  json_str(str, sizeof str, c->count > 0 ? c->ids : NULL);
  put_str(&b, ",\"gpu_ids\":");
  put_str(&b, str);
  json_str(str, sizeof str, c->bus_id[0] ? c->bus_id : NULL);
  put_str(&b, ",\"gpu_bus_id\":");
  put_str(&b, str);
  json_str(str, sizeof str, cpus);
  put_str(&b, ",\"cpuset\":");
  put_str(&b, str);
  put_str(&b, "}\n");
  fwrite(b.buf, 1, b.n, stdout);
}

/* First pass over the n local ranks of one node: each rank's GPU choice joins a new placement
 * *pl (the caller frees it, also on error); groups[i] and indexes[i] receive rank i's CPU group
 * and its position in it. */
static int place_node(const launch_opts_t *o, launch_topo_t *t, const launch_gpus_t *g, int n,
                      launch_place_t **pl, int *groups, int *indexes) {
  *pl = NULL;
  if (launch_place_new(o, t, pl) != 0) return -1;
  int any = 0;
  launch_gpu_choice_t c;
  for (int i = 0; i < n; i++) {
    if (launch_gpu_choose(o, g, t, i, n, &c) != 0) return -1;
    any |= c.count > 0;
    if (launch_place_add(*pl, i, c.bus_id, &groups[i], &indexes[i]) != 0) return -1;
  }
  if (o->bind == LAUNCH_BIND_GPU && !any) {
    launch_error("--bind gpu but no rank of this node has a GPU (GPU list from %s is empty)", g->source);
    return -1;
  }
  return 0;
}

void launch_rank_plan_free(launch_rank_plan_t *p) {
  launch_gpus_free(&p->gpus);
  launch_topo_free(p->topo);
  memset(p, 0, sizeof(*p));
}

int launch_plan_rank(const launch_opts_t *o, const launch_layout_t *l, launch_rank_plan_t *p) {
  memset(p, 0, sizeof(*p));
  int n = l->local_size, lr = l->local_rank, rc = -1;
  int *groups = malloc((size_t)n * sizeof(int)), *indexes = malloc((size_t)n * sizeof(int));
  launch_place_t *pl = NULL;
  if (!groups || !indexes) {
    launch_error("out of memory planning %d local ranks", n);
    goto done;
  }
  if (launch_topo_load(o, &p->topo) != 0) goto done;
  if (launch_gpus_detect(o, p->topo, &p->gpus) != 0) goto done;
  p->gpus.self_local = lr;
  if (place_node(o, p->topo, &p->gpus, n, &pl, groups, indexes) != 0) goto done;
  if (launch_gpu_choose(o, &p->gpus, p->topo, lr, n, &p->gpu) != 0) goto done;
  rc = launch_place_cpus(pl, groups[lr], indexes[lr], lr, p->cpus, sizeof p->cpus);
done:
  launch_place_free(pl);
  free(groups);
  free(indexes);
  if (rc != 0) launch_rank_plan_free(p);
  return rc;
}

void launch_plan_print_rank(const launch_layout_t *l, const launch_rank_plan_t *p) {
  char host[600];
  json_str(host, sizeof host, l->hostname_env ? l->hostname_env : l->node_names[l->node]);
  print_line(l, l->rank, l->node, l->local_rank, host, &p->gpu, p->cpus);
}

/* Prints node n's lines (ranks first .. first+tpn-1); groups/indexes hold tpn entries. */
static int print_node(const launch_opts_t *o, const launch_layout_t *l, launch_topo_t *t, const launch_gpus_t *g,
                      int node, int first, int *groups, int *indexes) {
  int n = l->tpn[node], rc = -1;
  launch_place_t *pl = NULL;
  launch_gpu_choice_t c;
  char cpus[LAUNCH_CPULIST_LEN], host[600];
  json_str(host, sizeof host, l->node_names[node]);
  if (place_node(o, t, g, n, &pl, groups, indexes) != 0) goto done;
  for (int i = 0; i < n; i++) {
    if (launch_gpu_choose(o, g, t, i, n, &c) != 0) goto done;
    if (launch_place_cpus(pl, groups[i], indexes[i], i, cpus, sizeof cpus) != 0) goto done;
    print_line(l, first + i, node, i, host, &c, cpus);
  }
  rc = 0;
done:
  launch_place_free(pl);
  return rc;
}

int launch_plan_print_all(const launch_opts_t *o, const launch_layout_t *l) {
  launch_topo_t *t = NULL;
  launch_gpus_t g;
  memset(&g, 0, sizeof g);
  int most = 0, rc = -1;
  for (int n = 0; n < l->nnodes; n++)
    if (l->tpn[n] > most) most = l->tpn[n];
  int *groups = malloc((size_t)most * sizeof(int)), *indexes = malloc((size_t)most * sizeof(int));
  if (!groups || !indexes) {
    launch_error("out of memory planning %d ranks per node", most);
    goto done;
  }
  if (launch_topo_load(o, &t) != 0 || launch_gpus_detect(o, t, &g) != 0) goto done;
  for (int n = 0, first = 0; n < l->nnodes; first += l->tpn[n], n++)
    if (print_node(o, l, t, &g, n, first, groups, indexes) != 0) goto done;
  rc = 0;
done:
  fflush(stdout);
  free(groups);
  free(indexes);
  launch_gpus_free(&g);
  launch_topo_free(t);
  return rc;
}
