/* The public async calls: validate the arguments on the caller's thread (so that bad input is an
 * immediate error and never reaches the other ranks), build a request and queue it. The checks
 * are those of the blocking collectives (algo/coll.c) plus the name. Nothing here talks to MPI. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algo/coll.h"
#include "core/fault.h"
#include "engine/engine.h"

static hora_result_t check_name(const char *fn, const char *name) {
  if (!name) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: name is NULL", fn);
  size_t n = strnlen(name, ENG_NAME_MAX);
  if (n == 0) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: name is empty", fn);
  if (n >= ENG_NAME_MAX)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: name '%.40s...' is longer than %d bytes", fn, name,
                    ENG_NAME_MAX - 1);
  return HORA_SUCCESS;
}

static int strcmp_p(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Common prologue: live context, running engine, dtype/device, handle pointer (callers check
 * their names first). */
static hora_result_t prologue(hora_ctx_t *ctx, const char *fn, hora_dtype_t dtype,
                              hora_device_t device, hora_handle_t **handle, hora_engine_t **eng) {
  HORA_CHECK(hora__check_common(ctx, fn, dtype, device));
  if (!handle) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: handle (output pointer) is NULL", fn);
  if (device == HORA_DEVICE_CUDA && !HORA_HAVE_CUDA)
    return HORA_ERR(HORA_ERR_NOT_SUPPORTED, "%s: device buffers (HORA_DEVICE_CUDA) need a CUDA build of hora", fn);
  HORA_CHECK(hora__engine_get(ctx, fn, eng));
  return HORA_SUCCESS;
}

/* This thread's tags for its next call on ctx, taken (and cleared) by every async call: the
 * shape fingerprint of hora_set_call_shape, the group of hora_set_call_group (0: none) and the
 * CUDA event of hora_set_call_ready (NULL: none). */
typedef struct {
  uint64_t shape, group;
  uint32_t gsize;
  void *ready;
} call_tags_t;

static call_tags_t take_tags(const hora_ctx_t *ctx) {
  call_tags_t t;
  t.ready = hora__call_ready_take(ctx);           /* first: taking the shape clears them too */
  hora__call_group_take(ctx, &t.group, &t.gsize);
  t.shape = hora__call_shape_take(ctx);
  return t;
}

static eng_req_t *req_new(const char *fn, const char *name, const eng_params_t *p, const void *send, void *recv,
                          void *ready) {
  eng_req_t *r = calloc(1, sizeof *r);
  if (r) r->name = strdup(name);
  if (!r || !r->name) {
    free(r);
    HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", fn);
    return NULL;
  }
  r->p = *p;
  r->send = send;
  r->recv = recv;
  r->ready = ready;
  r->t_enqueue = hora__now_s();
  r->cache_pos = -1;
  return r;
}

/* Queue one request with a fresh handle; on error nothing stays allocated. */
static hora_result_t submit_one(hora_engine_t *eng, const char *fn, const char *name, const eng_params_t *p,
                                const void *send, void *recv, size_t *recvcounts, void *ready,
                                hora_handle_t **handle) {
  eng_req_t *r = req_new(fn, name, p, send, recv, ready);
  if (!r) {
    free(recvcounts);
    return HORA_ERR_NO_MEMORY;
  }
  r->recvcounts = recvcounts;
  hora_handle_t *h;
  hora_result_t rc = hora__handle_new(eng, 1, &h);
  if (rc != HORA_SUCCESS) {
    hora__req_free(r);
    return rc;
  }
  r->h = h;
  rc = hora__engine_submit(eng, r, r);
  if (rc != HORA_SUCCESS) {
    hora__req_free(r);
    hora__handle_release(h); /* the request's reference */
    hora__handle_release(h); /* the user's */
    return rc;
  }
  *handle = h;
  return HORA_SUCCESS;
}

/* The key of a group of n names (the set of its names, in any order, and their number), which
 * every member carries and the ranks must agree on like any other field: ranks that group other
 * tensors under the same names get HORA_ERR_MISMATCH for every member, the ones only some ranks
 * submitted included (coord.c), instead of waiting for members that never come. A sum of the
 * names' mixed hashes, so that the order of the members does not matter. */
static uint64_t group_key(const char *const *names, size_t n) {
  uint64_t key = (uint64_t)n * 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; i++) {
    uint64_t x = hora__eng_hash(names[i], strlen(names[i]));
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull; /* splitmix64's finalizer */
    key += x ^ (x >> 29);
  }
  return key ? key : 1;
}

/* Queue n requests of parameters *p (counts[i], sendbufs[i], recvbufs[i]: NULL for none) under
 * names[i], completed through one fresh handle; on error nothing stays allocated. */
static hora_result_t submit_group(hora_engine_t *eng, const char *fn, const char *const *names,
                                  const eng_params_t *p, const size_t *counts, const void *const *sendbufs,
                                  void *const *recvbufs, size_t n, void *ready, hora_handle_t **handle) {
  hora_handle_t *h;
  HORA_CHECK(hora__handle_new(eng, (int)n, &h));
  eng_req_t *first = NULL, *last = NULL;
  hora_result_t rc = HORA_SUCCESS;
  for (size_t i = 0; i < n && rc == HORA_SUCCESS; i++) {
    eng_params_t pi = *p;
    if (counts) pi.count = counts[i];
    eng_req_t *r = req_new(fn, names[i], &pi, sendbufs ? sendbufs[i] : NULL, recvbufs ? recvbufs[i] : NULL, ready);
    if (!r) {
      rc = HORA_ERR_NO_MEMORY;
      break;
    }
    r->h = h;
    if (last) last->qnext = r;
    else first = r;
    last = r;
  }
  if (rc == HORA_SUCCESS) rc = hora__engine_submit(eng, first, last);
  if (rc != HORA_SUCCESS) {
    while (first) {
      eng_req_t *nx = first->qnext;
      hora__req_free(first);
      first = nx;
    }
    for (size_t k = 0; k <= n; k++) hora__handle_release(h); /* each request's reference and the user's */
    return rc;
  }
  *handle = h;
  return HORA_SUCCESS;
}

HORA_EXPORT hora_result_t hora_allreduce_async(hora_ctx_t *ctx, const char *name, const void *sendbuf,
                                               void *recvbuf, size_t count, hora_dtype_t dtype, hora_op_t op,
                                               double prescale, double postscale, hora_device_t device,
                                               hora_handle_t **handle) {
  const char *fn = "hora_allreduce_async";
  call_tags_t tag = take_tags(ctx);
  hora_engine_t *eng;
  HORA_CHECK(hora__check_allreduce(ctx, fn, sendbuf, recvbuf, count, dtype, op, prescale, postscale, device));
  HORA_CHECK(check_name(fn, name));
  HORA_CHECK(prologue(ctx, fn, dtype, device, handle, &eng));
  HORA_CHECK(hora__fault_hit("step", eng->rank));
  eng_params_t p = {.kind = ENG_ALLREDUCE, .dtype = (uint8_t)dtype, .op = (uint8_t)op, .device = (uint8_t)device,
                    .root = -1, .count = count, .prescale = prescale, .postscale = postscale, .shape = tag.shape,
                    .group = tag.group, .gsize = tag.gsize};
  return submit_one(eng, fn, name, &p, sendbuf, recvbuf, NULL, tag.ready, handle);
}

HORA_EXPORT hora_result_t hora_grouped_allreduce_async(hora_ctx_t *ctx, const char *const *names,
                                                       const void *const *sendbufs, void *const *recvbufs,
                                                       const size_t *counts, size_t ntensors,
                                                       hora_dtype_t dtype, hora_op_t op, double prescale,
                                                       double postscale, hora_device_t device,
                                                       hora_handle_t **handle) {
  const char *fn = "hora_grouped_allreduce_async";
  void *ready = hora__call_ready_take(ctx); /* one event for every member */
  uint64_t shape = hora__call_shape_take(ctx); /* one fingerprint for the whole group: every member */
  hora_engine_t *eng;
  HORA_CHECK(prologue(ctx, fn, dtype, device, handle, &eng));
  if (!names || !sendbufs || !recvbufs || !counts)
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                    !names ? "names" : !sendbufs ? "sendbufs" : !recvbufs ? "recvbufs" : "counts");
  if (ntensors == 0) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: ntensors is 0", fn);
  if (ntensors > (size_t)INT32_MAX) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: ntensors %zu is too large", fn, ntensors);
  for (size_t i = 0; i < ntensors; i++) {
    char what[64];
    snprintf(what, sizeof what, "%s (tensor %zu)", fn, i);
    HORA_CHECK(check_name(what, names[i]));
    HORA_CHECK(hora__check_allreduce(ctx, what, sendbufs[i], recvbufs[i], counts[i], dtype, op, prescale,
                                     postscale, device));
  }
  /* Duplicate names within the group: sort a copy of the pointers. */
  const char **sorted = malloc(ntensors * sizeof *sorted);
  if (!sorted) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", fn);
  memcpy(sorted, names, ntensors * sizeof *sorted);
  qsort(sorted, ntensors, sizeof *sorted, strcmp_p);
  for (size_t i = 1; i < ntensors; i++)
    if (strcmp(sorted[i - 1], sorted[i]) == 0) {
      hora_result_t rc = HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: name '%.200s' appears twice in the group", fn, sorted[i]);
      free(sorted);
      return rc;
    }
  free(sorted);

  eng_params_t p = {.kind = ENG_ALLREDUCE, .dtype = (uint8_t)dtype, .op = (uint8_t)op, .device = (uint8_t)device,
                    .root = -1, .prescale = prescale, .postscale = postscale, .shape = shape,
                    .group = group_key(names, ntensors), .gsize = (uint32_t)ntensors};
  return submit_group(eng, fn, names, &p, counts, sendbufs, recvbufs, ntensors, ready, handle);
}

HORA_EXPORT hora_result_t hora_allgather_async(hora_ctx_t *ctx, const char *name, const void *sendbuf,
                                               void *recvbuf, size_t count, hora_dtype_t dtype,
                                               hora_device_t device, hora_handle_t **handle) {
  const char *fn = "hora_allgather_async";
  call_tags_t tag = take_tags(ctx);
  hora_engine_t *eng;
  HORA_CHECK(check_name(fn, name));
  HORA_CHECK(prologue(ctx, fn, dtype, device, handle, &eng));
  HORA_CHECK(hora__check_allgather(ctx, fn, sendbuf, recvbuf, count, dtype, device, NULL));
  eng_params_t p = {.kind = ENG_ALLGATHER, .dtype = (uint8_t)dtype, .device = (uint8_t)device, .root = -1, .count = count,
                    .prescale = 1, .postscale = 1, .shape = tag.shape,
                    .group = tag.group, .gsize = tag.gsize};
  return submit_one(eng, fn, name, &p, sendbuf, recvbuf, NULL, tag.ready, handle);
}

HORA_EXPORT hora_result_t hora_allgatherv_async(hora_ctx_t *ctx, const char *name, const void *sendbuf,
                                                size_t sendcount, void *recvbuf, const size_t *recvcounts,
                                                hora_dtype_t dtype, hora_device_t device,
                                                hora_handle_t **handle) {
  const char *fn = "hora_allgatherv_async";
  call_tags_t tag = take_tags(ctx);
  hora_engine_t *eng;
  HORA_CHECK(check_name(fn, name));
  HORA_CHECK(prologue(ctx, fn, dtype, device, handle, &eng));
  if (!recvcounts) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: recvcounts is NULL", fn);
  size_t total = 0;
  HORA_CHECK(hora__check_allgatherv_local(ctx, fn, sendbuf, sendcount, recvbuf, recvcounts, dtype, &total));
  size_t *rc_copy = malloc((size_t)ctx->size * sizeof *rc_copy);
  if (!rc_copy) return HORA_ERR(HORA_ERR_NO_MEMORY, "%s: out of memory", fn);
  memcpy(rc_copy, recvcounts, (size_t)ctx->size * sizeof *rc_copy);
  eng_params_t p = {.kind = ENG_ALLGATHERV, .dtype = (uint8_t)dtype, .device = (uint8_t)device, .root = -1,
                    .count = total, .prescale = 1, .postscale = 1, /* sendcount is recvcounts[rank] */
                    .vhash = hora__eng_hash((const char *)rc_copy, (size_t)ctx->size * sizeof *rc_copy), .shape = tag.shape,
                    .group = tag.group, .gsize = tag.gsize};
  return submit_one(eng, fn, name, &p, sendbuf, recvbuf, rc_copy, tag.ready, handle);
}

HORA_EXPORT hora_result_t hora_broadcast_async(hora_ctx_t *ctx, const char *name, void *buf, size_t count,
                                               hora_dtype_t dtype, int root, hora_device_t device,
                                               hora_handle_t **handle) {
  const char *fn = "hora_broadcast_async";
  call_tags_t tag = take_tags(ctx);
  hora_engine_t *eng;
  HORA_CHECK(check_name(fn, name));
  HORA_CHECK(prologue(ctx, fn, dtype, device, handle, &eng));
  HORA_CHECK(hora__check_broadcast(ctx, fn, buf, count, dtype, root, device, NULL));
  eng_params_t p = {.kind = ENG_BROADCAST, .dtype = (uint8_t)dtype, .device = (uint8_t)device, .root = root,
                    .count = count, .prescale = 1, .postscale = 1, .shape = tag.shape,
                    .group = tag.group, .gsize = tag.gsize};
  return submit_one(eng, fn, name, &p, buf, buf, NULL, tag.ready, handle);
}

HORA_EXPORT hora_result_t hora_reducescatter_async(hora_ctx_t *ctx, const char *name, const void *sendbuf,
                                                   void *recvbuf, size_t recvcount, hora_dtype_t dtype,
                                                   hora_op_t op, double prescale, double postscale,
                                                   hora_device_t device, hora_handle_t **handle) {
  const char *fn = "hora_reducescatter_async";
  call_tags_t tag = take_tags(ctx);
  hora_engine_t *eng;
  HORA_CHECK(check_name(fn, name));
  HORA_CHECK(prologue(ctx, fn, dtype, device, handle, &eng));
  HORA_CHECK(hora__check_reducescatter(ctx, fn, sendbuf, recvbuf, recvcount, dtype, op, prescale, postscale, device));
  eng_params_t p = {.kind = ENG_REDUCESCATTER, .dtype = (uint8_t)dtype, .op = (uint8_t)op, .device = (uint8_t)device,
                    .root = -1, .count = recvcount, .prescale = prescale, .postscale = postscale, .shape = tag.shape,
                    .group = tag.group, .gsize = tag.gsize};
  return submit_one(eng, fn, name, &p, sendbuf, recvbuf, NULL, tag.ready, handle);
}

HORA_EXPORT hora_result_t hora_alltoall_async(hora_ctx_t *ctx, const char *name, const void *sendbuf,
                                              void *recvbuf, size_t count, hora_dtype_t dtype,
                                              hora_device_t device, hora_handle_t **handle) {
  const char *fn = "hora_alltoall_async";
  call_tags_t tag = take_tags(ctx);
  hora_engine_t *eng;
  HORA_CHECK(check_name(fn, name));
  HORA_CHECK(prologue(ctx, fn, dtype, device, handle, &eng));
  HORA_CHECK(hora__check_alltoall(ctx, fn, sendbuf, recvbuf, count, dtype, device));
  eng_params_t p = {.kind = ENG_ALLTOALL, .dtype = (uint8_t)dtype, .device = (uint8_t)device, .root = -1,
                    .count = count, .prescale = 1, .postscale = 1, .shape = tag.shape,
                    .group = tag.group, .gsize = tag.gsize};
  return submit_one(eng, fn, name, &p, sendbuf, recvbuf, NULL, tag.ready, handle);
}

HORA_EXPORT hora_result_t hora_refuse_async(hora_ctx_t *ctx, const char *const *names, size_t n,
                                            hora_handle_t **handle) {
  const char *fn = "hora_refuse_async";
  call_tags_t tag = take_tags(ctx);
  hora_engine_t *eng;
  HORA_CHECK(prologue(ctx, fn, HORA_UINT8, HORA_DEVICE_HOST, handle, &eng));
  if (!names) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: names is NULL", fn);
  if (n == 0) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: n is 0", fn);
  if (n > (size_t)INT32_MAX) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: n %zu is too large", fn, n);
  for (size_t i = 0; i < n; i++) {
    char what[64];
    snprintf(what, sizeof what, "%s (name %zu)", fn, i);
    HORA_CHECK(check_name(what, names[i]));
  }
  /* Tagged as the call it stands for was, so that the peers' members fail with it: the caller's
   * hora_set_call_group, else the key hora_grouped_allreduce_async gives n names. */
  eng_params_t p = {.kind = ENG_REFUSED, .root = -1, .prescale = 1, .postscale = 1};
  if (tag.group) p.group = tag.group, p.gsize = tag.gsize;
  else if (n > 1) p.group = group_key(names, n), p.gsize = (uint32_t)n;
  return submit_group(eng, fn, names, &p, NULL, NULL, NULL, n, NULL, handle);
}

HORA_EXPORT hora_result_t hora_join(hora_ctx_t *ctx, int *last_rank) {
  const char *fn = "hora_join";
  HORA_CHECK(hora__ctx_check(ctx, fn));
  if (!last_rank) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s: last_rank is NULL", fn);
  hora_engine_t *eng;
  HORA_CHECK(hora__engine_get(ctx, fn, &eng));
  eng_params_t p = {.kind = ENG_JOIN, .root = -1};
  hora_handle_t *h;
  hora_result_t rc = submit_one(eng, fn, "", &p, NULL, NULL, NULL, NULL, &h);
  if (rc != HORA_SUCCESS) return rc;
  rc = hora_wait(h);
  int last = h->last_rank;
  hora__handle_release(h);
  if (rc == HORA_SUCCESS) *last_rank = last;
  return rc;
}
