/* Tensor fusion and the execution of ready responses.
 *
 * Every rank holds the same ordered list of ready responses (negotiate.c), so every rank forms
 * the same groups: walking the list, an allreduce starts a group and takes every later allreduce
 * with the same dtype, reduce op, prescale, postscale and device, while the group fits in the
 * fusion buffer (HORA_FUSION_THRESHOLD bytes; 0 turns fusion off). A group of several tensors is
 * reduced by ONE host allreduce (runtime/algo on the engine's shadow context), in one of two ways.
 *
 * Scatter-gather (one node, more than one rank, no prescale, and the group's size resolves to the
 * shared-memory algorithm: hora__allreduce_segs_direct): the tensors are the segments of one
 * virtual buffer that the algorithm layer reduces where they are (hora__allreduce_segs, run by
 * algo/shm.c): its copy-in reads the slices straight from the
 * send buffers and its copy-out writes straight into the recv buffers; average and postscale are
 * applied by the rank that reduces each element, before it is published (same bits everywhere).
 *
 *   a[0..3) b[0..5) c[0..2)  ==  virtual |a a a b b b b b c c|  --shm allreduce-->  a, b, c recv
 *
 * Otherwise (several nodes, MPI or ring chosen, prescale): packed with the kernels' batched copy
 * into the fusion buffer, reduced, and unpacked:
 *
 *   a[0..3) b[0..5) c[0..2)  --pack-->  fusion buffer |a a a b b b b b c c|  --allreduce-->
 *                            <-unpack-  (same layout on every rank)
 *
 * On the packing path tensors of FUSION_DIRECT_MIN_BYTES or more are not packed: their allreduce
 * already runs at full bandwidth, and the two copies would cost more than the call's latency
 * saves. On the scatter-gather path there are no copies and they join the group: one run of
 * pieces and barriers for everything (both measured with `hora-bench fusion`, docs/benchmarks.md).
 * A rank that has joined (hora_join) contributes zeros.
 * Device allreduces form groups the same way (tensors of any size, up to the threshold) and go to
 * the GPU path as one (run_fused_sg: a device fusion buffer, one collective, one wait, as
 * Horovod fuses on the GPU); single device tensors go to run_device().
 * Other collectives run one by one, through the algorithm layer's host bodies (algo/coll.h): the
 * engine calls no MPI for data. run_device() and run_fused_sg() are where the GPU path plugs
 * in. A failed collective may leave the ranks out of step, so it fails the
 * whole engine (every handle gets the error) rather than risk a hang. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algo/coll.h"
#include "engine/engine.h"
#include "hora_kernels.h"

#define FUSION_DIRECT_MIN_BYTES ((size_t)1 << 20)

static size_t resp_bytes(const eng_resp_t *x) { return (size_t)x->p.count * hora__dtype_size((hora_dtype_t)x->p.dtype); }

static int fusable(const eng_resp_t *a, const eng_resp_t *b) {
  /* Adasum's dot products are per tensor: it never fuses. */
  return b->p.kind == ENG_ALLREDUCE && a->p.op != HORA_ADASUM && a->p.dtype == b->p.dtype && a->p.op == b->p.op &&
         a->p.prescale == b->p.prescale && a->p.postscale == b->p.postscale && a->p.device == b->p.device;
}

static hora_result_t grow(void **buf, size_t *have, size_t need, int zero) {
  if (*have >= need) return HORA_SUCCESS;
  void *p = NULL;
  if (posix_memalign(&p, 64, need) != 0)
    return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory (%zu bytes of fusion buffer)", need);
  if (zero) memset(p, 0, need);
  free(*buf);
  *buf = p;
  *have = need;
  return HORA_SUCCESS;
}

/* eng->tl is swapped by hora_timeline_start/stop from other threads (timeline.c): an atomic load
 * tells whether one records (the common case, none, costs no lock), and events are written under
 * tl_mu, which the swap takes. */
static int recording(hora_engine_t *eng) { return __atomic_load_n(&eng->tl, __ATOMIC_ACQUIRE) != NULL; }

static void span(hora_engine_t *eng, const eng_resp_t *x, const char *phase, double t0, double t1) {
  if (!x->req || !recording(eng)) return;
  pthread_mutex_lock(&eng->tl_mu);
  if (eng->tl) hora__timeline_span(eng->tl, x->name, phase, t0, t1);
  pthread_mutex_unlock(&eng->tl_mu);
}

/* QUEUE and NEGOTIATE phases of a request, ending when its execution starts. */
static void spans_before(hora_engine_t *eng, const eng_resp_t *x, double start) {
  if (!x->req || !recording(eng)) return;
  span(eng, x, "QUEUE", x->req->t_enqueue, x->req->t_negotiate);
  char neg[40]; /* Horovod's name of the phase: NEGOTIATE_ALLREDUCE, NEGOTIATE_ALLGATHER, ... */
  snprintf(neg, sizeof neg, "NEGOTIATE_%s", hora__eng_kind_name(x->p.kind));
  span(eng, x, neg, x->req->t_negotiate, start);
}

/* The one place where device buffers would be dispatched: the GPU path (runtime/comm) installs
 * hora__gpu_hooks in CUDA builds; they run blocking on the engine's shadow context. */
static hora_result_t run_device(hora_engine_t *eng, eng_resp_t *x) {
  hora_ctx_t *s = eng->shadow;
  const eng_params_t *p = &x->p;
  eng_req_t *r = x->req;
  hora_gpu_hooks_t *g = &hora__gpu_hooks;
  if (!r) { /* this rank has joined (negotiate.c answers only SUM/AVERAGE allreduces then) */
    if (p->kind == ENG_ALLREDUCE && g->allreduce_zeros)
      return g->allreduce_zeros(s, p->count, p->dtype, p->op, p->prescale, p->postscale);
    return HORA_ERR(HORA_ERR_NOT_SUPPORTED, "tensor '%s': this rank has joined and cannot add zeros to it (a "
                    "device allreduce needs a CUDA build of hora)", x->name);
  }
  switch (p->kind) {
    case ENG_ALLREDUCE:
      if (g->allreduce) return g->allreduce(s, r->send, r->recv, p->count, p->dtype, p->op, p->prescale, p->postscale);
      break;
    case ENG_BROADCAST:
      if (g->broadcast) return g->broadcast(s, r->recv, p->count, p->dtype, p->root);
      break;
    case ENG_ALLGATHER:
      if (g->allgather) return g->allgather(s, r->send, r->recv, p->count, p->dtype);
      break;
    case ENG_ALLGATHERV:
      if (g->allgatherv) return g->allgatherv(s, r->send, p->count, r->recv, r->recvcounts, p->dtype);
      break;
    case ENG_REDUCESCATTER:
      if (g->reducescatter) return g->reducescatter(s, r->send, r->recv, p->count, p->dtype, p->op, p->prescale, p->postscale);
      break;
    case ENG_ALLTOALL:
      if (g->alltoall) return g->alltoall(s, r->send, r->recv, p->count, p->dtype);
      break;
    default: break;
  }
  return HORA_ERR(HORA_ERR_NOT_SUPPORTED, "tensor '%s': device buffers need a CUDA build of hora", x->name);
}

/* One non-fused response on host buffers. */
static hora_result_t run_one(hora_engine_t *eng, eng_resp_t *x, hora_algo_t algo) {
  hora_ctx_t *s = eng->shadow;
  const eng_params_t *p = &x->p;
  eng_req_t *r = x->req;
  size_t es = hora__dtype_size((hora_dtype_t)p->dtype), bytes = (size_t)p->count * es;
  if (!r && p->kind != ENG_ALLREDUCE) /* negotiate.c never produces this */
    return HORA_ERR(HORA_ERR_INTERNAL, "engine: tensor '%s' ready without a request on this rank", x->name);
  switch (p->kind) {
    case ENG_ALLREDUCE:
      if (!r) { /* joined: zeros in, result discarded */
        HORA_CHECK(grow(&eng->zeros, &eng->zeros_bytes, bytes, 1));
        HORA_CHECK(grow(&eng->fusion, &eng->fusion_bytes, bytes, 0));
        return hora__allreduce_host_full(s, eng->zeros, eng->fusion, p->count, p->dtype, p->op, p->prescale,
                                         p->postscale, algo);
      }
      return hora__allreduce_host_full(s, r->send, r->recv, p->count, p->dtype, p->op, p->prescale, p->postscale, algo);
    case ENG_BROADCAST:
      return hora__broadcast_host(s, r->recv, bytes, p->root);
    case ENG_REDUCESCATTER:
      return hora__reducescatter_host(s, r->send, r->recv, p->count, p->dtype, p->op, p->prescale, p->postscale);
    case ENG_ALLGATHER:
      return hora__allgather_host(s, r->send, r->recv, bytes);
    case ENG_ALLGATHERV:
      return hora__allgatherv_host(s, r->send, r->recv, r->recvcounts, es);
    case ENG_ALLTOALL:
      return hora__alltoall_host(s, r->send, r->recv, bytes);
    default:
      return HORA_ERR(HORA_ERR_INTERNAL, "engine: unknown request kind %d", p->kind);
  }
}

/* Pack members [0, k) into the fusion buffer, allreduce it once, unpack. */
static hora_result_t run_fused(hora_engine_t *eng, eng_resp_t **m, size_t k, size_t total, hora_algo_t algo) {
  const eng_params_t *p = &m[0]->p;
  size_t es = hora__dtype_size((hora_dtype_t)p->dtype);
  HORA_CHECK(grow(&eng->fusion, &eng->fusion_bytes, total, 0));
  hora_copy_desc_t *d = malloc(k * sizeof *d);
  if (!d) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
  char *fb = eng->fusion;
  size_t off = 0, nd = 0;
  double t0 = hora__now_s();
  for (size_t i = 0; i < k; i++) {
    size_t b = resp_bytes(m[i]);
    if (!b) continue; /* an empty tensor may have NULL buffers */
    if (m[i]->req) d[nd++] = (hora_copy_desc_t){fb + off, m[i]->req->send, b};
    else memset(fb + off, 0, b);
    off += b;
  }
  hora_result_t rc = hora__batched_copy_host(d, nd, NULL);
  double t1 = hora__now_s();
  if (rc == HORA_SUCCESS)
    rc = hora__allreduce_host_full(eng->shadow, fb, fb, total / es, p->dtype, p->op, p->prescale, p->postscale, algo);
  double t2 = hora__now_s();
  if (rc == HORA_SUCCESS) {
    off = 0;
    nd = 0;
    for (size_t i = 0; i < k; i++) {
      size_t b = resp_bytes(m[i]);
      if (m[i]->req && b) d[nd++] = (hora_copy_desc_t){m[i]->req->recv, fb + off, b};
      off += b;
    }
    rc = hora__batched_copy_host(d, nd, NULL);
  }
  double t3 = hora__now_s();
  free(d);
  for (size_t i = 0; i < k; i++) {
    spans_before(eng, m[i], t0);
    span(eng, m[i], "MEMCPY_IN_FUSION_BUFFER", t0, t1);
    span(eng, m[i], "ALLREDUCE", t1, t2);
    span(eng, m[i], "MEMCPY_OUT_FUSION_BUFFER", t2, t3);
  }
  return rc;
}

/* Whether a group of host allreduces with params p and `bytes` bytes in all can skip the fusion
 * buffer: the algorithm layer runs a segmented allreduce of that size on the tensors where they
 * are (algo/dispatch.c says when: one node, no prescale, shared memory chosen). */
static int sg_possible(hora_engine_t *eng, const eng_params_t *p, size_t bytes, hora_algo_t algo) {
  hora_dtype_t dt = (hora_dtype_t)p->dtype;
  return p->device == HORA_DEVICE_HOST &&
         hora__allreduce_segs_direct(eng->shadow, bytes / hora__dtype_size(dt), dt, p->prescale, algo);
}

/* Members [0, k) reduced where they are, as the segments of one virtual buffer. Host tensors
 * (device 0): by the algorithm layer's segmented allreduce (the shared-memory algorithm's
 * scatter-gather form), with no fusion buffer, no pack and no unpack. Device tensors (device 1):
 * by the GPU path (hook allreduce_segs, runtime/comm/gpu.c: packed into its device fusion buffer,
 * one collective, unpacked, one wait). A member of a joined rank (no request) reads zeros and its
 * result is discarded: on the host several such members share one zero buffer and one discard
 * buffer (the zeros are only read, and nothing reads the discarded results); on the device its
 * segment is NULL and the GPU path supplies the zeros. */
static hora_result_t run_fused_sg(hora_engine_t *eng, eng_resp_t **m, size_t k, int device) {
  const eng_params_t *p = &m[0]->p;
  hora_seg_t *seg = malloc(k * sizeof *seg);
  if (!seg) return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
  size_t joined_max = 0;
  for (size_t i = 0; i < k; i++)
    if (!device && !m[i]->req && resp_bytes(m[i]) > joined_max) joined_max = resp_bytes(m[i]);
  hora_result_t rc = HORA_SUCCESS;
  if (joined_max) {
    rc = grow(&eng->zeros, &eng->zeros_bytes, joined_max, 1);
    if (rc == HORA_SUCCESS) rc = grow(&eng->fusion, &eng->fusion_bytes, joined_max, 0);
  }
  double t0 = hora__now_s();
  if (rc == HORA_SUCCESS) {
    for (size_t i = 0; i < k; i++) {
      eng_req_t *r = m[i]->req;
      size_t n = (size_t)m[i]->p.count;
      seg[i] = r ? (hora_seg_t){r->send, r->recv, n}
                 : device ? (hora_seg_t){NULL, NULL, n} : (hora_seg_t){eng->zeros, eng->fusion, n};
    }
    rc = device ? hora__gpu_hooks.allreduce_segs(eng->shadow, seg, k, (hora_dtype_t)p->dtype, (hora_op_t)p->op,
                                                 p->prescale, p->postscale)
                : hora__allreduce_segs(eng->shadow, seg, k, (hora_dtype_t)p->dtype, (hora_op_t)p->op, p->postscale);
  }
  double t1 = hora__now_s();
  free(seg);
  for (size_t i = 0; i < k; i++) {
    spans_before(eng, m[i], t0);
    span(eng, m[i], "ALLREDUCE", t0, t1);
  }
  return rc;
}

/* The group that list[i] starts: list[i] first, then every later unused allreduce that fuses
 * with it (same dtype, op, scale factors, device) and has fewer than `direct` bytes, in list order
 * while the group fits in `threshold` bytes; marks them used. Returns the members in m, their
 * count (1: list[i] alone, also when it cannot fuse) and *total, their bytes. */
static size_t gather(eng_resp_t *list, size_t n, size_t i, uint8_t *used, size_t threshold, size_t direct,
                     eng_resp_t **m, size_t *total) {
  size_t k = 1;
  m[0] = &list[i];
  *total = resp_bytes(&list[i]);
  if (list[i].p.kind != ENG_ALLREDUCE || list[i].p.op == HORA_ADASUM || threshold == 0 || *total >= direct ||
      *total > threshold)
    return 1;
  for (size_t j = i + 1; j < n; j++) {
    size_t bj = resp_bytes(&list[j]);
    if (used[j] || !fusable(&list[i], &list[j]) || bj >= direct || *total + bj > threshold) continue;
    used[j] = 1;
    m[k++] = &list[j];
    *total += bj;
  }
  return k;
}

/* hora_set_call_ready: a group's data is ready once every member's CUDA event has completed (the
 * members of one grouped call share theirs: waited for once). A failed wait fails the group and
 * the engine, as a failed collective does; the peers learn it from the heartbeat. */
static hora_result_t wait_ready(hora_engine_t *eng, eng_resp_t **m, size_t k) {
  void *prev = NULL;
  for (size_t q = 0; q < k; q++) {
    eng_req_t *r = m[q]->req;
    if (!r || !r->ready || r->ready == prev) continue;
    if (!hora__gpu_hooks.wait_event) /* hora_set_call_ready refuses events without CUDA */
      return HORA_ERR(HORA_ERR_INTERNAL, "tensor '%s': a ready event in a build without CUDA", m[q]->name);
    double t0 = hora__now_s();
    HORA_CHECK(hora__gpu_hooks.wait_event(eng->shadow, r->ready, m[q]->name));
    span(eng, m[q], "WAIT_FOR_DATA", t0, hora__now_s());
    prev = r->ready;
  }
  return HORA_SUCCESS;
}

static void finish(hora_engine_t *eng, eng_resp_t *x, hora_result_t rc) {
  if (!x->req) return;
  hora__req_finish(eng, x->req, rc, rc == HORA_SUCCESS ? NULL : hora_last_error());
  x->req = NULL;
}

hora_result_t hora__fusion_run(hora_engine_t *eng, eng_resp_t *list, size_t n) {
  hora_algo_t algo;
  HORA_CHECK(hora__algo_parse(eng->prm.allreduce_algo, &algo));
  if (recording(eng)) {
    pthread_mutex_lock(&eng->tl_mu);
    if (eng->tl) hora__timeline_cycle(eng->tl, hora__now_s(), eng->cycle);
    pthread_mutex_unlock(&eng->tl_mu);
  }
  size_t threshold = (size_t)eng->prm.fusion_threshold;
  uint8_t *used = calloc(n, 1);
  eng_resp_t **m = malloc(n * sizeof *m);
  if (!used || !m) {
    free(used);
    free(m);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "engine: out of memory");
  }
  hora_result_t rc = HORA_SUCCESS;
  for (size_t i = 0; i < n && rc == HORA_SUCCESS; i++) {
    if (used[i]) continue;
    used[i] = 1;
    eng_resp_t *x = &list[i];
    size_t k, total;
    if (x->p.device == HORA_DEVICE_CUDA) {
      /* Device tensors of any size join: a device-to-device pack costs microseconds, a collective
       * and a wait for the GPU each much more. */
      k = gather(list, n, i, used, hora__gpu_hooks.allreduce_segs ? threshold : 0, SIZE_MAX, m, &total);
      rc = wait_ready(eng, m, k); /* on failure the engine fails as a whole (below) */
      if (rc == HORA_SUCCESS && k > 1) {
        atomic_fetch_add(&eng->stat_fused_groups, 1);
        rc = run_fused_sg(eng, m, k, 1);
      } else if (rc == HORA_SUCCESS) {
        double t0 = hora__now_s();
        spans_before(eng, x, t0);
        rc = run_device(eng, x);
        span(eng, x, hora__eng_kind_name(x->p.kind), t0, hora__now_s());
      }
      hora_result_t frc = rc;
      /* NOT_SUPPORTED happens on every rank alike: report it, keep the engine. */
      if (rc == HORA_ERR_NOT_SUPPORTED) rc = HORA_SUCCESS;
      for (size_t q = 0; q < k; q++) finish(eng, m[q], frc);
      continue;
    }
    /* Where a group of big tensors would take the scatter-gather path, nothing is copied and big
     * tensors join the group (fewer barriers); elsewhere they are reduced on their own. A group
     * that holds one is at least FUSION_DIRECT_MIN_BYTES long, so it does take that path. */
    int allreduce = x->p.kind == ENG_ALLREDUCE && x->p.op != HORA_ADASUM;
    size_t direct = allreduce && sg_possible(eng, &x->p, FUSION_DIRECT_MIN_BYTES, algo) ? SIZE_MAX : FUSION_DIRECT_MIN_BYTES;
    k = gather(list, n, i, used, threshold, direct, m, &total);
    rc = wait_ready(eng, m, k);
    if (rc == HORA_SUCCESS && k > 1) {
      atomic_fetch_add(&eng->stat_fused_groups, 1);
      if (sg_possible(eng, &x->p, total, algo)) {
        atomic_fetch_add(&eng->stat_sg_groups, 1);
        rc = run_fused_sg(eng, m, k, 0);
      } else {
        rc = run_fused(eng, m, k, total, algo);
      }
    } else if (rc == HORA_SUCCESS) {
      double t0 = hora__now_s();
      spans_before(eng, x, t0);
      rc = run_one(eng, x, algo);
      span(eng, x, hora__eng_kind_name(x->p.kind), t0, hora__now_s());
    }
    for (size_t q = 0; q < k; q++) finish(eng, m[q], rc);
  }
  /* After a failure, the rest never ran: the engine fails as a whole (engine.c). */
  free(used);
  free(m);
  return rc;
}
