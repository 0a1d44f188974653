/* Ring allreduce and ring reduce-scatter over MPI point-to-point (nonblocking, pipelined).
 *
 * n ranks form a ring: each sends only to rank+1 and receives only from rank-1. The buffer is cut
 * into n blocks B0..B(n-1) (sizes differ by at most one element), and every block into segments
 * of HORA_RING_SEGMENT_BYTES. Example with n = 3 and contributions a (rank 0), b, c:
 *
 *              rank 0             rank 1             rank 2
 *   start      a0   a1   a2       b0   b1   b2       c0   c1   c2
 *   RS step 0  a0   a1c1 a2       b0   b1   a2b2     b0c0 c1   c2     rank r sends block r-1,
 *   RS step 1  abc0 .    .        .    abc1 .        .    .    abc2   receives block r-2 (then
 *                                                                      r-3, ...) and reduces it
 *   AG step 0  abc0 .    abc2     abc0 abc1 .        .    abc1 abc2   rank r sends block r, then
 *   AG step 1  abc0 abc1 abc2     abc0 abc1 abc2     abc0 abc1 abc2   forwards what it received
 *
 * In reduce-scatter (RS) step t rank r sends block r-t-1 and receives block r-t-2, which it reduces
 * with its own contribution; after n-1 steps rank r owns block r fully reduced, which is exactly
 * what hora_reducescatter needs. The allgather (AG) steps t = n-1 .. 2n-3 use the same rule
 * (receive block r-t-2, send block r-t-1) and copy instead of reducing.
 *
 * Pipelining: the unit of work is a segment, not a step. Segment k of a block is forwarded to the
 * right neighbour as soon as it has been received and reduced, while later segments of the same
 * block are still in flight; receives for 4 MiB of segments are posted ahead and 8 MiB of sends
 * may be in flight (ring_depth: 4 and 8 segments of the 1 MiB default, 32 and 64 of the 65024-byte
 * segments of a ring across nodes, state.c), so the reduction of one segment overlaps the transfer
 * of the next ones and the link has data queued while a rank waits for its core. Messages between
 * two neighbours match in posting order (MPI's non-overtaking rule), so one tag suffices.
 *
 * Cost model (N bytes, n ranks, per-message latency a, per-byte transfer time b, per-byte reduce
 * time g, segment S bytes): every rank sends and receives 2(n-1)/n * N bytes and reduces
 * (n-1)/n * N bytes: T = 2(n-1) * a * max(1, N/(nS)) + 2(n-1)/n * N * b + (n-1)/n * N * g, with
 * the pipeline hiding most of the g term behind b. Bandwidth-optimal (busbw -> 1/b), latency
 * 2(n-1) * a: for tiny messages a single MPI_Allreduce (log n latency) is better, which is why
 * dispatch.c picks MPI below a threshold.
 *
 * Memory: one segment of receive scratch per receive posted ahead, per context (reused across
 * calls); the reduce-scatter of hora_reducescatter also needs (n-2) blocks for the partial sums it forwards.
 * Counts are size_t throughout; a segment is at most 1 GiB so that MPI's int count holds it. */
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "hora_kernels.h"

#define RING_TAG 0x4852
/* Receives posted ahead (each owns one segment of scratch in RS steps) and sends in flight: enough
 * segments for RING_SLOTS_BYTES and RING_WINDOW_BYTES, at least 4 and 8, at most RING_SLOTS_MAX
 * and RING_WINDOW_MAX (ring_depth). */
#define RING_SLOTS_BYTES ((size_t)4 << 20)
#define RING_WINDOW_BYTES ((size_t)8 << 20)
#define RING_SLOTS_MAX 32
#define RING_WINDOW_MAX 64

typedef struct {
  MPI_Comm comm;
  int n, r, steps;    /* group size, this rank, steps to run: n-1 (RS) or 2(n-1) (RS + AG) */
  size_t es, seg;     /* element size in bytes, segment size in elements */
  hora_dtype_t dtype;
  hora_op_t op;
  const char *src;    /* this rank's contribution: block b at src + off[b]*es */
  char **out;         /* where the RS step writes the reduction of block b (its first byte) */
  char *ag;           /* AG steps receive block b at ag + off[b]*es; NULL when steps == n-1 */
  const size_t *off, *len; /* block offsets and lengths in elements */
  hora_ctx_t *ctx;    /* its failure verdict ends a wait (hora__algo_wait) */
  int nslots, nwin;   /* receives posted ahead, sends in flight (ring_depth) */
} ring_t;

static int clamp_depth(size_t bytes, size_t segb, int lo, int hi) {
  size_t d = bytes / (segb ? segb : 1);
  return d < (size_t)lo ? lo : d > (size_t)hi ? hi : (int)d;
}

/* The pipeline's depth for segments of segb bytes: the bytes in flight stay about the same
 * whatever the segment size, so small segments do not starve the link. */
static void ring_depth(ring_t *R) {
  size_t segb = R->seg * R->es;
  R->nslots = clamp_depth(RING_SLOTS_BYTES, segb, 4, RING_SLOTS_MAX);
  R->nwin = clamp_depth(RING_WINDOW_BYTES, segb, 8, RING_WINDOW_MAX);
}

/* Position in the sequence of (step, segment) messages of one direction. */
typedef struct {
  int t;
  size_t seg, nseg;
} cursor_t;

static int mod(int a, int n) { return ((a % n) + n) % n; }
static int recv_block(const ring_t *R, int t) { return mod(R->r - t - 2, R->n); }
static int send_block(const ring_t *R, int t) { return mod(R->r - t - 1, R->n); }
static size_t nseg_of(const ring_t *R, int b) { return (R->len[b] + R->seg - 1) / R->seg; }

/* Skip steps whose block is empty (counts smaller than n leave some blocks empty). */
static void cursor_settle(const ring_t *R, cursor_t *c, int sending) {
  while (c->t < R->steps && c->seg >= c->nseg) {
    c->t++;
    c->seg = 0;
    c->nseg = c->t < R->steps ? nseg_of(R, sending ? send_block(R, c->t) : recv_block(R, c->t)) : 0;
  }
}
static cursor_t cursor_start(const ring_t *R, int sending) {
  cursor_t c = {0, 0, nseg_of(R, sending ? send_block(R, 0) : recv_block(R, 0))};
  cursor_settle(R, &c, sending);
  return c;
}
static void cursor_next(const ring_t *R, cursor_t *c, int sending) {
  c->seg++;
  cursor_settle(R, c, sending);
}

/* Elements of segment `seg` of block b, and its first element's offset within the block. */
static size_t seg_len(const ring_t *R, int b, size_t seg) {
  size_t start = seg * R->seg, left = R->len[b] - start;
  return left < R->seg ? left : R->seg;
}

static void cancel_all(MPI_Request *req, int n) {
  for (int i = 0; i < n; i++)
    if (req[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&req[i]);
      MPI_Request_free(&req[i]);
    }
}

/* MPI_Waitsome that also ends when the context gets a failure verdict (a peer declared dead or
 * stopped): then HORA_ERR_REMOTE (the verdict's code) and the requests are abandoned. The same
 * polling as hora__algo_wait (state.c): MPI_Waitsome spins in Open MPI's progress engine too. */
static hora_result_t wait_some(const ring_t *R, int nreq, MPI_Request *req, int *outcount, int *idx) {
  hora_backoff_t backoff = {0, 0, 0};
  for (unsigned i = 0;; i++) {
    int mrc = MPI_Testsome(nreq, req, outcount, idx, MPI_STATUSES_IGNORE);
    if (mrc != MPI_SUCCESS) return hora__mpi_error(mrc, "MPI_Testsome (ring)", __FILE__, __LINE__);
    if (*outcount != 0) return HORA_SUCCESS; /* some done, or MPI_UNDEFINED: none active */
    if (hora__ctx_failed(R->ctx)) return hora__ctx_verdict(R->ctx, "ring allreduce");
    hora__algo_wait_backoff(i, &backoff);
  }
}

/* Run the ring described by R. `slots` holds R->nslots segments of scratch. */
static hora_result_t ring_run(const ring_t *R, char *slots) {
  const size_t es = R->es, segb = R->seg * es;
  size_t nrecv = 0, nsend = 0;
  for (int t = 0; t < R->steps; t++) {
    nrecv += nseg_of(R, recv_block(R, t));
    nsend += nseg_of(R, send_block(R, t));
  }
  const size_t first_sends = nseg_of(R, send_block(R, 0)); /* ready at once: our own block */
  const int right = (R->r + 1) % R->n, left = (R->r - 1 + R->n) % R->n;
  const int NS = R->nslots, NW = R->nwin, nreq = NS + NW;
  MPI_Request req[RING_SLOTS_MAX + RING_WINDOW_MAX];
  int done[RING_SLOTS_MAX] = {0}, idx[RING_SLOTS_MAX + RING_WINDOW_MAX];
  for (int i = 0; i < nreq; i++) req[i] = MPI_REQUEST_NULL;
  cursor_t rpost = cursor_start(R, 0), rproc = rpost, spost = cursor_start(R, 1);
  size_t nrposted = 0, nrdone = 0, nsposted = 0;
  int mrc = MPI_SUCCESS;
  const char *what = "";

  for (;;) {
    /* Post receives ahead. RS segments land in a scratch slot, AG segments in place. */
    while (nrposted < nrecv && nrposted - nrdone < (size_t)NS) {
      int b = recv_block(R, rpost.t);
      size_t m = seg_len(R, b, rpost.seg);
      char *p = rpost.t < R->n - 1 ? slots + (nrposted % NS) * segb
                                   : R->ag + (R->off[b] + rpost.seg * R->seg) * es;
      mrc = MPI_Irecv(p, (int)(m * es), MPI_BYTE, left, RING_TAG, R->comm, &req[nrposted % NS]);
      if (mrc != MPI_SUCCESS) { what = "MPI_Irecv"; goto fail; }
      nrposted++;
      cursor_next(R, &rpost, 0);
    }
    /* Post sends that are ready (own block, or a segment already received and reduced) while
     * the next window slot is free. Sends go out in sequence order. */
    while (nsposted < nsend && (nsposted < first_sends || nsposted - first_sends < nrdone)) {
      MPI_Request *q = &req[NS + nsposted % NW];
      if (*q != MPI_REQUEST_NULL) break;
      int b = send_block(R, spost.t);
      size_t m = seg_len(R, b, spost.seg), o = spost.seg * R->seg;
      const char *p = spost.t == 0         ? R->src + (R->off[b] + o) * es
                      : spost.t < R->n     ? R->out[b] + o * es
                                           : R->ag + (R->off[b] + o) * es;
      mrc = MPI_Isend(p, (int)(m * es), MPI_BYTE, right, RING_TAG, R->comm, q);
      if (mrc != MPI_SUCCESS) { what = "MPI_Isend"; goto fail; }
      nsposted++;
      cursor_next(R, &spost, 1);
    }
    /* Consume received segments strictly in order. */
    if (nrdone < nrposted && done[nrdone % NS]) {
      done[nrdone % NS] = 0;
      if (rproc.t < R->n - 1) {
        int b = recv_block(R, rproc.t);
        size_t m = seg_len(R, b, rproc.seg), o = rproc.seg * R->seg;
        hora_result_t hr = hora__reduce_host(R->out[b] + o * es, slots + (nrdone % NS) * segb,
                                             R->src + (R->off[b] + o) * es, m, R->dtype, R->op, NULL);
        if (hr != HORA_SUCCESS) {
          cancel_all(req, nreq);
          return HORA_ERR(HORA_ERR_INTERNAL, "ring: host reduce failed (%s)", hora_result_name(hr));
        }
      }
      nrdone++;
      cursor_next(R, &rproc, 0);
      continue;
    }
    int pending = 0;
    for (int i = 0; i < nreq; i++) pending |= req[i] != MPI_REQUEST_NULL;
    if (!pending) break;
    int outcount = 0;
    hora_result_t wrc = wait_some(R, nreq, req, &outcount, idx);
    if (wrc != HORA_SUCCESS) {
      if (!hora__ctx_failed(R->ctx)) cancel_all(req, nreq);
      return wrc; /* after a verdict the requests are left to MPI (their buffers are leaked) */
    }
    for (int i = 0; i < outcount && outcount != MPI_UNDEFINED; i++)
      if (idx[i] < NS) done[idx[i]] = 1;
  }
  if (nrdone != nrecv || nsposted != nsend)
    return HORA_ERR(HORA_ERR_INTERNAL, "ring: stopped after %zu/%zu receives and %zu/%zu sends",
                    nrdone, nrecv, nsposted, nsend);
  return HORA_SUCCESS;
fail:
  cancel_all(req, nreq);
  return hora__mpi_error(mrc, what, __FILE__, __LINE__);
}

/* Get R->nslots segments of scratch from the context (sets the ring's depth first). */
static hora_result_t get_slots(hora_ctx_t *ctx, ring_t *R, char **slots) {
  void *p;
  ring_depth(R);
  HORA_CHECK(hora__algo_scratch(ctx, (size_t)R->nslots * R->seg * R->es, &p));
  *slots = p;
  return HORA_SUCCESS;
}

hora_result_t hora__ring_allreduce(hora_ctx_t *ctx, MPI_Comm comm, const void *src, void *dst,
                                   size_t count, hora_dtype_t dtype, hora_op_t op) {
  int n, r;
  HORA_MPI_CHECK(MPI_Comm_size(comm, &n));
  HORA_MPI_CHECK(MPI_Comm_rank(comm, &r));
  size_t es = hora__dtype_size(dtype);
  if (n == 1 || count == 0) {
    if (src != dst && count) memmove(dst, src, count * es);
    return HORA_SUCCESS;
  }
  size_t *off = malloc(2 * (size_t)n * sizeof *off);
  char **out = malloc((size_t)n * sizeof *out);
  if (!off || !out) {
    free(off);
    free(out);
    return HORA_ERR(HORA_ERR_NO_MEMORY, "ring allreduce: out of memory");
  }
  size_t *len = off + n, base = count / (size_t)n, rem = count % (size_t)n, o = 0;
  for (int b = 0; b < n; b++) {
    off[b] = o;
    len[b] = base + ((size_t)b < rem);
    out[b] = (char *)dst + o * es;
    o += len[b];
  }
  ring_t R = {comm, n, r, 2 * (n - 1), es, hora__ring_segment_elems(ctx, es), dtype, op, src, out, dst, off, len, ctx, 0, 0};
  if (R.seg > base + 1) R.seg = base + 1; /* no scratch beyond one block */
  char *slots;
  hora_result_t rc = get_slots(ctx, &R, &slots);
  if (rc == HORA_SUCCESS) rc = ring_run(&R, slots);
  free(off);
  free(out);
  return rc;
}

hora_result_t hora__ring_reducescatter(hora_ctx_t *ctx, const void *src, void *dst, size_t count,
                                       hora_dtype_t dtype, hora_op_t op) {
  int n = ctx->size, r = ctx->rank;
  size_t es = hora__dtype_size(dtype);
  if (count == 0) return HORA_SUCCESS;
  const char *mine = (const char *)src + (size_t)r * count * es;
  if (n == 1) {
    if (mine != dst) memmove(dst, mine, count * es);
    return HORA_SUCCESS;
  }
  size_t *off = malloc(2 * (size_t)n * sizeof *off);
  char **out = malloc((size_t)n * sizeof *out);
  /* Partial sums of the blocks this rank forwards: the block received in step t (t < n-2) is
   * kept at partial + t*count until the right neighbour has it. */
  char *partial = n > 2 ? malloc((size_t)(n - 2) * count * es) : NULL;
  hora_result_t rc = HORA_SUCCESS;
  if (!off || !out || (n > 2 && !partial)) {
    rc = HORA_ERR(HORA_ERR_NO_MEMORY, "hora_reducescatter: out of memory (%zu bytes of partial sums)",
                  (size_t)(n - 2) * count * es);
    goto done;
  }
  size_t *len = off + n;
  for (int b = 0; b < n; b++) {
    off[b] = (size_t)b * count;
    len[b] = count;
    int t = mod(r - b - 2, n); /* the RS step that receives block b */
    out[b] = b == r ? (char *)dst : t < n - 2 ? partial + (size_t)t * count * es : NULL;
  }
  ring_t R = {ctx->world, n, r, n - 1, es, hora__ring_segment_elems(ctx, es), dtype, op, src, out, NULL, off, len, ctx, 0, 0};
  if (R.seg > count) R.seg = count;
  char *slots;
  rc = get_slots(ctx, &R, &slots);
  if (rc == HORA_SUCCESS) rc = ring_run(&R, slots);
done:
  free(off);
  free(out);
  if (!hora__ctx_failed(ctx)) free(partial); /* else abandoned sends may still read it */
  return rc;
}
