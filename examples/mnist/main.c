/* mnist: the Keras MNIST convnet trained data-parallel with hora on real data (docs/mnist.md).
 *
 *   launch -np 4 mnist --data DIR [--epochs N] [--batch-size B] [--lr X] [--optimizer adam|sgd]
 *       [--seed S] [--ckpt-dir DIR] [--persist-dir DIR] [--ckpt-every STEPS] [--resume]
 *       [--tensorboard DIR] [--device auto|cpu|cuda] ...
 *
 * Every rank reads its shard of the record files (shuffled per epoch from the seed), computes the
 * gradient of its batch, and averages each layer's gradient across ranks as soon as backward has
 * produced it; after the wait all ranks apply the same optimizer step, so their weights stay
 * identical (they start from rank 0's, broadcast). Rank 0 prints progress, writes TensorBoard
 * scalars and saves checkpoints; the last line is
 *   test_accuracy=<0..1> images_per_s=<n> ranks=<n>
 * Exit status: 0 done, 1 failure, 2 usage error, MNIST_EXIT_REQUEUE (3) after a checkpoint taken
 * because of SIGUSR1/SIGTERM (the job script requeues); with --elastic, HORA_EXIT_ELASTIC (4) after
 * a lost peer or a changed node count, with the last commit saved (`launch --elastic` re-forms). */
#include <cblas.h>
#include <getopt.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef MNIST_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "data.h"
#include "dist.h"
#include "hora.h"
#include "model.h"
#include "opt.h" /* runtime/tools/opt.h: the tools' option parser */

typedef struct {
  const char *data, *ckpt_dir, *persist_dir, *tensorboard, *cache_dir, *save_weights;
  const char *elastic_dir; /* --elastic-dir (NULL: hora's default) */
  int elastic, commit_every;
  const char *device; /* auto|cpu|cuda */
  int epochs, batch, ckpt_every, resume, log_every, threads;
  double lr, momentum, warmup_epochs;
  int sgd;
  const char *lr_scaling; /* auto|linear|sqrt|none */
  int cosine;             /* --lr-schedule cosine */
  uint64_t seed;
  int64_t max_steps;
} opts_t;

static int g_rank = 0;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  if (g_rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
}

static void usage(FILE *f) {
  fprintf(f,
    "usage: mnist --data DIR [options]\n"
    "  --data DIR            record shards (train-*.tfrecord, test-*.tfrecord from hora-records\n"
    "                        convert-idx) or MNIST-format IDX files (gzip or raw)\n"
    "  --epochs N            passes over the training set (default 10)\n"
    "  --batch-size B        images per rank and step (default 64)\n"
    "  --lr X                learning rate for one rank (default: adam 0.001, sgd 0.01); scaled\n"
    "                        by the rank count, see --lr-scaling\n"
    "  --optimizer adam|sgd  Adam, or SGD with momentum (default adam)\n"
    "  --momentum M          SGD momentum (default 0.9)\n"
    "  --lr-scaling MODE     auto|linear|sqrt|none: lr * ranks (linear), lr * sqrt(ranks) (sqrt);\n"
    "                        auto = linear for sgd, sqrt for adam (default auto)\n"
    "  --warmup-epochs F     ramp the lr linearly from --lr to the scaled lr over F epochs\n"
    "                        (default 1; Goyal et al. 2017)\n"
    "  --lr-schedule S       after the warm-up: constant, or cosine decay to 0 at the end of the\n"
    "                        last epoch (Loshchilov & Hutter 2017) (default cosine)\n"
    "  --seed S              initialization, shuffling and dropout seed (default 42)\n"
    "  --ckpt-dir DIR        node-local checkpoint directory (default: hora's, $SLURM_TMPDIR/hora-ckpt)\n"
    "  --persist-dir DIR     persistent directory checkpoints are copied to (default: none)\n"
    "  --ckpt-every STEPS    checkpoint every STEPS steps (default 0: only on a signal and at the end)\n"
    "  --resume              continue from the newest valid checkpoint, if any\n"
    "  --tensorboard DIR     write TensorBoard scalars under DIR (rank 0)\n"
#ifdef MNIST_HAVE_CUDA
    "  --device D            auto|cpu|cuda: cuda runs every layer, the optimizer and the\n"
    "                        evaluation on the GPU hora gives the rank (hora_device_index);\n"
    "                        auto = cuda when every rank has a GPU, else cpu (default auto)\n"
#else
    "  --device D            auto|cpu|cuda (default auto: cpu; this build has no CUDA layer kernels)\n"
#endif
    "  --log-every STEPS     progress line every STEPS steps (default 50)\n"
    "  --threads N           OpenBLAS threads per rank (default: the cores this rank is bound to)\n"
    "  --elastic             elastic training under `launch --elastic` (docs/elastic.md): commit\n"
    "                        the state every --commit-every steps and at each epoch's end, go on\n"
    "                        from the last commit when a rank is lost, grow at epoch boundaries\n"
    "  --commit-every STEPS  steps between elastic commits inside an epoch (default 20); with\n"
    "                        --elastic, --ckpt-every N makes every N-th commit a checkpoint too\n"
    "  --elastic-dir DIR     where survivors write their commit (default: hora's, HORA_ELASTIC_DIR)\n"
    "  --max-steps N         stop after global step N (checkpoint, test, final line)\n"
    "  --cache-dir DIR       where IDX input is converted to record shards\n"
    "                        (default $TMPDIR or /tmp, hora-mnist-<uid>/<hash of --data>)\n"
    "  --save-weights FILE   rank 0 writes the final parameters as raw float32 to FILE\n"
    "Exit status: 0 done, 1 error, 2 usage, %d checkpointed after SIGUSR1/SIGTERM (requeue),\n"
    "%d (--elastic) last commit saved after a lost peer or a changed node count (re-form).\n",
    MNIST_EXIT_REQUEUE, HORA_EXIT_ELASTIC);
}

/* Numbers are checked in full by the tools' shared parser (runtime/tools/opt.h): digits only, no
 * overflow, inside the option's range; it prints one line naming the option on rank 0. */
static int parse_int(const char *opt, const char *s, long lo, long hi, long *out) {
  uint64_t v = 0;
  if (opt_parse_u64("mnist", opt, s, (uint64_t)lo, (uint64_t)hi, &v)) return 0;
  *out = (long)v;
  return 1;
}
static int parse_double(const char *opt, const char *s, double lo, double hi, double *out) {
  return opt_parse_double("mnist", opt, s, lo, hi, out) == 0;
}

static int parse_args(int argc, char **argv, opts_t *o) {
  memset(o, 0, sizeof *o);
  o->epochs = 10, o->batch = 64, o->lr = -1, o->momentum = 0.9, o->warmup_epochs = 1;
  o->seed = 42, o->log_every = 50, o->lr_scaling = "auto", o->cosine = 1, o->commit_every = 20;
  const char *device = "auto", *opt = "adam";
  static const struct option lo[] = {
      {"data", 1, 0, 'd'},        {"epochs", 1, 0, 'e'},      {"batch-size", 1, 0, 'b'},
      {"lr", 1, 0, 'l'},          {"optimizer", 1, 0, 'o'},   {"seed", 1, 0, 's'},
      {"ckpt-dir", 1, 0, 'c'},    {"persist-dir", 1, 0, 'p'}, {"ckpt-every", 1, 0, 'k'},
      {"resume", 0, 0, 'r'},      {"tensorboard", 1, 0, 't'}, {"device", 1, 0, 'D'},
      {"log-every", 1, 0, 'L'},   {"threads", 1, 0, 'T'},     {"max-steps", 1, 0, 'M'},
      {"cache-dir", 1, 0, 'C'},   {"momentum", 1, 0, 'm'},    {"lr-scaling", 1, 0, 'S'},
      {"warmup-epochs", 1, 0, 'w'}, {"save-weights", 1, 0, 'W'}, {"help", 0, 0, 'h'},
      {"lr-schedule", 1, 0, 'R'}, {"elastic", 0, 0, 'E'},     {"commit-every", 1, 0, 'F'},
      {"elastic-dir", 1, 0, 'G'},
      {0, 0, 0, 0}};
  int c;
  long v;
  opterr = 0; /* errors are printed below, once, on rank 0 */
  opt_quiet = g_rank != 0;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    const char *a = optarg;
    int ok = 1;
    char nm[32] = "--";
    for (const struct option *p = lo; p->name; p++)
      if (p->val == c) snprintf(nm, sizeof nm, "--%s", p->name);
    /* "--data --resume": getopt takes the next option as the value; it is a missing value. */
    if (a && (opt_is_option(a) || !*a)) {
      opt_error("mnist", "%s needs a value", nm);
      return -1;
    }
    switch (c) {
      case 'd': o->data = a; break;
      case 'e': ok = parse_int(nm, a, 1, 100000, &v), o->epochs = (int)v; break;
      case 'b': ok = parse_int(nm, a, 1, 65536, &v), o->batch = (int)v; break;
      case 'l': ok = parse_double(nm, a, 1e-12, 100, &o->lr); break;
      case 'o': opt = a; ok = !strcmp(a, "adam") || !strcmp(a, "sgd"); break;
      case 's': ok = parse_int(nm, a, 0, 0x7fffffffffffffffL, &v), o->seed = (uint64_t)v; break;
      case 'c': o->ckpt_dir = a; break;
      case 'p': o->persist_dir = a; break;
      case 'k': ok = parse_int(nm, a, 0, 0x7fffffff, &v), o->ckpt_every = (int)v; break;
      case 'r': o->resume = 1; break;
      case 't': o->tensorboard = a; break;
      case 'D': device = a; ok = !strcmp(a, "auto") || !strcmp(a, "cpu") || !strcmp(a, "cuda"); break;
      case 'L': ok = parse_int(nm, a, 1, 1L << 30, &v), o->log_every = (int)v; break;
      case 'T': ok = parse_int(nm, a, 0, 4096, &v), o->threads = (int)v; break;
      case 'M': ok = parse_int(nm, a, 1, 1L << 50, &v), o->max_steps = v; break;
      case 'C': o->cache_dir = a; break;
      case 'm': ok = parse_double(nm, a, 0, 0.9999, &o->momentum); break;
      case 'S': o->lr_scaling = a;
        ok = !strcmp(a, "auto") || !strcmp(a, "linear") || !strcmp(a, "sqrt") || !strcmp(a, "none");
        break;
      case 'w': ok = parse_double(nm, a, 0, 1000, &o->warmup_epochs); break;
      case 'W': o->save_weights = a; break;
      case 'E': o->elastic = 1; break;
      case 'F': ok = parse_int(nm, a, 1, 1L << 30, &v), o->commit_every = (int)v; break;
      case 'G': o->elastic_dir = a; break;
      case 'R': ok = !strcmp(a, "cosine") || !strcmp(a, "constant"), o->cosine = !strcmp(a, "cosine"); break;
      case 'h': usage(stdout); return 0;
      default: {
        /* getopt_long: ':' when a value is missing at the end, '?' for an unknown option */
        const char *bad = argv[optind - 1];
        int known = 0;
        for (const struct option *p = lo; p->name; p++)
          if (!strncmp(bad, "--", 2) && !strncmp(bad + 2, p->name, strlen(p->name))) known = 1;
        if (known) opt_error("mnist", "%s needs a value", bad);
        else if (optopt) opt_error("mnist", "unknown option '-%c'", optopt);
        else opt_unknown("mnist", bad);
        return -1;
      }
    }
    if (!ok) {
      /* numbers were reported by the parser; the words here */
      if (c == 'o' || c == 'D' || c == 'S' || c == 'R') opt_error("mnist", "%s '%s' is not one of %s", nm, a,
          c == 'o' ? "adam|sgd" : c == 'D' ? "auto|cpu|cuda" : c == 'S' ? "auto|linear|sqrt|none" : "cosine|constant");
      return -1;
    }
  }
  if (optind < argc) {
    opt_unknown("mnist", argv[optind]);
    return -1;
  }
  if (!o->data) {
    opt_error("mnist", "--data DIR is required");
    return -1;
  }
  if (o->elastic && o->resume) {
    /* the elastic sync takes the newest commit (and, with --ckpt-every, the checkpoint) itself */
    opt_error("mnist", "--resume cannot be combined with --elastic (the elastic sync resumes)");
    return -1;
  }
  o->device = device;
  o->sgd = !strcmp(opt, "sgd");
  if (o->lr < 0) o->lr = o->sgd ? 0.01 : 0.001;
  if (!strcmp(o->lr_scaling, "auto")) o->lr_scaling = o->sgd ? "linear" : "sqrt";
  return 1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fmt_eta(double s, char *buf, size_t n) {
  long t = s > 0 ? (long)(s + 0.5) : 0;
  if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

/* Cores in this rank's CPU affinity mask (what launch bound it to). */
static int affinity_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

/* The message of the last failure: the CUDA layer kernels keep their own (they cannot reach
 * hora_last_error() through the shared libhora), everything else is hora's. */
static const char *err_text(int cuda) {
#ifdef MNIST_HAVE_CUDA
  if (cuda && hora__layers_cuda_last_error()[0]) return hora__layers_cuda_last_error();
#endif
  (void)cuda;
  return hora_last_error();
}

/* Test-set evaluation: every rank runs its share (by-record or by-file sharding, no shuffle)
 * without dropout; sums go through one allreduce. */
static hora_result_t evaluate(hora_ctx_t *ctx, mnist_model_t *m, const mnist_data_t *d,
                              double *loss, double *acc, char *err, size_t errlen) {
  hora_records_reader_t *r;
  hora_result_t rc = mnist_reader_open(ctx, d->test_pattern, 0, 0, 0, 0, &r);
  if (rc != HORA_SUCCESS) return snprintf(err, errlen, "%s", hora_last_error()), rc;
  double sums[3] = {0, 0, 0}; /* loss, correct, images */
  for (;;) {
    size_t got, ok;
    double l;
    rc = mnist_read_batch(r, m->capacity, m->x_in, m->labels_in, &got, err, errlen);
    if (rc != HORA_SUCCESS || got == 0) break;
    rc = mnist_model_forward(m, got, 0, 0, &l, &ok);
    if (rc != HORA_SUCCESS) {
      snprintf(err, errlen, "forward: %s: %s", hora_result_name(rc), err_text(m->cuda));
      break;
    }
    sums[0] += l, sums[1] += (double)ok, sums[2] += (double)got;
  }
  hora_records_reader_close(r);
  if (rc != HORA_SUCCESS) return rc;
  rc = hora_allreduce(ctx, sums, sums, 3, HORA_FLOAT64, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST);
  if (rc != HORA_SUCCESS) return snprintf(err, errlen, "%s", hora_last_error()), rc;
  *loss = sums[2] > 0 ? sums[0] / sums[2] : 0;
  *acc = sums[2] > 0 ? sums[1] / sums[2] : 0;
  return HORA_SUCCESS;
}

/* The optimizers of each path (one signature per optimizer for both). */
#ifdef MNIST_HAVE_CUDA
#define sgd_cuda hora__sgd_momentum_cuda
#define adam_cuda hora__adam_cuda
#else
#define sgd_cuda hora__sgd_momentum_host
#define adam_cuda hora__adam_host
#endif

static int save_weights(const char *path, const float *dp, size_t n, int cuda) {
  const float *p = dp;
  float *staged = NULL;
#ifdef MNIST_HAVE_CUDA
  if (cuda) {
    staged = malloc(n * sizeof(float));
    if (!staged || cudaMemcpy(staged, dp, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
      free(staged);
      return -1;
    }
    p = staged;
  }
#endif
  (void)cuda;
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    free(staged);
    return -1;
  }
  int ok = fwrite(p, sizeof(float), n, f) == n;
  ok = (fclose(f) == 0) && ok;
  free(staged);
  if (ok && rename(tmp, path) == 0) return 0;
  unlink(tmp);
  return -1;
}

static uint64_t fnv1a(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

/* Saves params and optimizer state with the data position of `step`: epoch and records of that
 * epoch consumed by every rank (all ranks consume the same count, so rank 0's position stands
 * for all), plus what a resume must match. */
static hora_result_t save_ckpt(mnist_ckpt_t *ck, int64_t step, int64_t spe, const opts_t *o,
                               int size, const mnist_tensor_t *t, size_t nt) {
  /* Device tensors need no synchronization here: the layer kernels run on the legacy default
   * stream, and hora_ckpt_save's copy stream orders after it (hora.h). */
  uint64_t pe = (uint64_t)(step / spe), pr = (uint64_t)((step % spe) * o->batch);
  if (step > 0 && step % spe == 0) pe--, pr = (uint64_t)(spe * o->batch);
  char v[6][64];
  snprintf(v[0], 64, "%llu", (unsigned long long)pe);
  snprintf(v[1], 64, "%llu", (unsigned long long)pr);
  snprintf(v[2], 64, "%llu", (unsigned long long)o->seed);
  snprintf(v[3], 64, "%d", size);
  snprintf(v[4], 64, "%d", o->batch);
  snprintf(v[5], 64, "%s", o->sgd ? "sgd" : "adam");
  mnist_kv_t meta[6] = {{"epoch", v[0]},      {"records", v[1]},    {"seed", v[2]},
                        {"world_size", v[3]}, {"batch_size", v[4]}, {"optimizer", v[5]}};
  return mnist_ckpt_save(ck, step, t, nt, meta, 6);
}


/* FNV-1a (64 bits) over the bytes of the tensors, in order: the elastic lines print it at each
 * commit and each sync, so that a resume can be checked bit for bit against its commit. */
static uint64_t state_crc(const mnist_tensor_t *t, size_t n, int cuda) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) {
    const size_t bytes = t[i].count * sizeof(float);
    const unsigned char *p = t[i].data;
    unsigned char *staged = NULL;
#ifdef MNIST_HAVE_CUDA
    if (cuda) {
      staged = malloc(bytes);
      if (!staged || cudaMemcpy(staged, t[i].data, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(staged);
        return 0;
      }
      p = staged;
    }
#endif
    (void)cuda;
    for (size_t k = 0; k < bytes; k++) h = (h ^ p[k]) * 0x100000001b3ull;
    free(staged);
  }
  return h;
}

/* hora_elastic_commit of the tensors with the data position; rank 0 prints the commit line. */
static hora_result_t elastic_commit(hora_elastic_t *es, const mnist_tensor_t *t, size_t n, int cuda,
                                    const mnist_elastic_pos_t *pos) {
  hora_result_t rc = hora_elastic_commit(es, t, n, pos, sizeof *pos);
  if (rc != HORA_SUCCESS) return rc;
  int64_t c = -1;
  hora_elastic_commit_id(es, &c);
  if (g_rank == 0)
    say("mnist: elastic: commit %lld world %lld crc %016llx epoch %lld step %lld\n", (long long)c,
        (long long)pos->world, (unsigned long long)state_crc(t, n, cuda), (long long)pos->epoch + 1,
        (long long)pos->step);
  return HORA_SUCCESS;
}

/* The elastic start of a step: hora_elastic_sync (the newest commit of any rank, else a fresh
 * commit 0 of rank 0's tensors), every rank's sync line, and the global step to go on from in this
 * world (mnist_elastic_resume_step). HORA_ERR_MISMATCH with a message in err when the commit was
 * made with another --batch-size or --seed. */
static hora_result_t elastic_resume(hora_elastic_t *es, const opts_t *o, int size, int64_t spe,
                                    mnist_tensor_t *t, size_t n, int cuda, int64_t *step,
                                    char *err, size_t errlen) {
  mnist_elastic_pos_t p;
  size_t bb = 0;
  int64_t c = -1;
  hora_result_t rc = hora_elastic_sync(es, t, n, &p, sizeof p, &bb, &c);
  if (rc != HORA_SUCCESS) return snprintf(err, errlen, "%s", hora_last_error()), rc;
  printf("mnist: elastic: sync rank %d world %d commit %lld crc %016llx\n", g_rank, size,
         (long long)c, (unsigned long long)state_crc(t, n, cuda));
  fflush(stdout);
  if (bb == 0) { /* a fresh start: commit 0 holds the initial parameters */
    *step = 0;
    say("mnist: elastic: fresh start (commit %lld), world size %d\n", (long long)c, size);
    return HORA_SUCCESS;
  }
  if (bb != sizeof p) {
    snprintf(err, errlen, "commit %lld has a %zu-byte blob, not this program's position", (long long)c, bb);
    return HORA_ERR_MISMATCH;
  }
  if (p.batch != o->batch || p.seed != o->seed) {
    snprintf(err, errlen, "commit %lld was made with --batch-size %lld --seed %llu, this run has "
             "--batch-size %d --seed %llu", (long long)c, (long long)p.batch,
             (unsigned long long)p.seed, o->batch, (unsigned long long)o->seed);
    return HORA_ERR_MISMATCH;
  }
  *step = mnist_elastic_resume_step(&p, size, o->batch, spe);
  say("mnist: elastic: resumed commit %lld (epoch %lld after %lld steps at world size %lld); "
      "world size %d goes on at epoch %lld after %lld of %lld steps\n",
      (long long)c, (long long)p.epoch + 1, (long long)p.step, (long long)p.world, size,
      (long long)(*step / spe) + 1, (long long)(*step % spe), (long long)spe);
  return HORA_SUCCESS;
}

#define FAIL(...)                                             \
  do {                                                        \
    fprintf(stderr, "mnist: rank %d: ", g_rank);              \
    fprintf(stderr, __VA_ARGS__);                             \
    fprintf(stderr, "\n");                                    \
    exit_code = 1;                                            \
    goto done;                                                \
  } while (0)
/* With --elastic, a peer's death (HORA_ERR_REMOTE) is not a failure: the survivors save their
 * last commit and exit HORA_EXIT_ELASTIC for `launch --elastic` (label lost). */
#define LOST_IF_REMOTE(rc, what)          \
  do {                                    \
    if ((rc) == HORA_ERR_REMOTE && es) {  \
      lost_what = what;                   \
      goto lost;                          \
    }                                     \
  } while (0)
#define CHECK(call, what)                                                                  \
  do {                                                                                     \
    hora_result_t rc_ = (call);                                                            \
    LOST_IF_REMOTE(rc_, what);                                                             \
    if (rc_ != HORA_SUCCESS) FAIL("%s: %s: %s", what, hora_result_name(rc_), err_text(cuda)); \
  } while (0)

int main(int argc, char **argv) {
  hora_ctx_t *ctx = NULL;
  hora_result_t rc = hora_init(&ctx);
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "mnist: hora_init: %s: %s\n", hora_result_name(rc), hora_last_error());
    return 1;
  }
  int size = 1, exit_code = 0;
  hora_rank(ctx, &g_rank);
  hora_size(ctx, &size);
  opts_t o;
  mnist_model_t m;
  memset(&m, 0, sizeof m);
  float *opt_m = NULL, *opt_v = NULL;
  int cuda = 0; /* this run's layers, optimizer state and evaluation are on the GPU */
  mnist_ckpt_t *ck = NULL;
  hora_tb_t *tb = NULL;
  hora_gpumon_t *gpumon = NULL;
  hora_records_reader_t *reader = NULL;
  hora_elastic_t *es = NULL;  /* --elastic */
  const char *lost_what = ""; /* the call that reported a lost peer */
  mnist_grad_sync_t sync = {ctx, &m, {0}};
  char err[4400] = "";
  int pa = parse_args(argc, argv, &o);
  if (pa <= 0) {
    exit_code = pa == 0 ? 0 : 2;
    goto done;
  }
  const int B = o.batch;
  /* Device: cuda needs the CUDA layer kernels in this build and a GPU for the rank
   * (hora_device_index); every rank must take the same path (hora's collectives take one device
   * for all ranks), so the ranks agree with one allreduce. */
  if (strcmp(o.device, "cpu") != 0) {
    char why[512] = "this build has no CUDA layer kernels (no CUDA toolkit or cuBLAS when it was "
                    "configured)";
    int64_t have = 0;
#ifdef MNIST_HAVE_CUDA
    int dev = -1, ndev = 0;
    cudaError_t ne = cudaGetDeviceCount(&ndev);
    hora_result_t drc = HORA_ERR_NOT_SUPPORTED;
    if (ne != cudaSuccess || ndev == 0)
      snprintf(why, sizeof why, "no GPU visible to rank %d (cudaGetDeviceCount: %s)", g_rank,
               ne != cudaSuccess ? cudaGetErrorString(ne) : "0 devices");
    else if ((drc = hora_device_index(ctx, &dev)) != HORA_SUCCESS) {
      snprintf(why, sizeof why, "no GPU for rank %d (hora_device_index: %s: %s)", g_rank,
               hora_result_name(drc), hora_last_error());
    } else {
      cudaError_t ce = cudaSetDevice(dev);
      if (ce == cudaSuccess) have = 1;
      else snprintf(why, sizeof why, "cudaSetDevice(%d): %s", dev, cudaGetErrorString(ce));
    }
#endif
    int64_t all = have;
    CHECK(hora_allreduce(ctx, &have, &all, 1, HORA_INT64, HORA_MIN, 1.0, 1.0, HORA_DEVICE_HOST),
          "allreduce");
    if (!strcmp(o.device, "cuda") && !all)
      FAIL("--device cuda: %s; use --device cpu (or auto)", have ? "another rank has no GPU" : why);
    cuda = (int)all;
  }
  int threads = o.threads ? o.threads : affinity_cores();
  openblas_set_num_threads(threads);

  char cache[4096];
  if (o.cache_dir) snprintf(cache, sizeof cache, "%s", o.cache_dir);
  else {
    char real[4096];
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(cache, sizeof cache, "%s/hora-mnist-%u/%016llx", base, (unsigned)getuid(),
             (unsigned long long)fnv1a(realpath(o.data, real) ? real : o.data));
  }
  mnist_data_t data;
  rc = mnist_data_open(ctx, o.data, cache, &data, err, sizeof err);
  if (rc != HORA_SUCCESS) FAIL("data: %s", err);
  /* Every rank takes the same number of steps per epoch: the smallest shard decides. */
  uint64_t min_records = data.train_records;
  CHECK(hora_allreduce(ctx, &min_records, &min_records, 1, HORA_INT64, HORA_MIN, 1.0, 1.0,
                       HORA_DEVICE_HOST), "allreduce");
  const int64_t spe = (int64_t)(min_records / (uint64_t)B);
  if (spe == 0)
    FAIL("--batch-size %d is larger than the smallest rank's shard (%llu training records)", B,
         (unsigned long long)min_records);
  const int64_t total_steps = spe * o.epochs;
  const int64_t last_step = o.max_steps && o.max_steps < total_steps ? o.max_steps : total_steps;

  const hora_device_t mem = cuda ? HORA_DEVICE_CUDA : HORA_DEVICE_HOST;
  CHECK(mnist_model_create_on(&m, (size_t)B, cuda), "model");
  opt_m = mnist_zalloc(cuda, m.nparams * sizeof(float));
  opt_v = mnist_zalloc(cuda, m.nparams * sizeof(float));
  if (!opt_m || !opt_v) FAIL("out of %s memory", cuda ? "GPU" : "host");
  if (g_rank == 0) mnist_model_init_params(&m, o.seed);
  /* Parameters start from rank 0's on every rank. */
  CHECK(hora_broadcast(ctx, m.params, m.nparams, HORA_FLOAT32, 0, mem), "broadcast");

  rc = mnist_ckpt_open(ctx, o.ckpt_dir, o.persist_dir, &ck);
  if (rc != HORA_SUCCESS)
    FAIL("checkpoints (--ckpt-dir %s, --persist-dir %s): %s: %s",
         o.ckpt_dir ? o.ckpt_dir : "(default)", o.persist_dir ? o.persist_dir : "(none)",
         hora_result_name(rc), hora_last_error());
  CHECK(mnist_on_signal(ctx), "signal handlers");
  mnist_tensor_t tensors[3] = {
      {"params", m.params, m.nparams, HORA_FLOAT32, mem, 0, NULL},
      {"opt.m", opt_m, m.nparams, HORA_FLOAT32, mem, 0, NULL},
      {"opt.v", opt_v, m.nparams, HORA_FLOAT32, mem, 0, NULL}};
  const size_t ntensors = o.sgd ? 2 : 3;
  int64_t step = 0;
  if (o.elastic) {
    /* --ckpt-every N with --elastic: every N-th commit is also a checkpoint (the fallback of the
     * sync when no survivor's commit is left, e.g. after a requeue on other nodes). */
    rc = hora_elastic_open(ctx, o.elastic_dir, o.ckpt_every ? mnist_ckpt_handle(ck) : NULL, o.ckpt_every, &es);
    if (rc != HORA_SUCCESS)
      FAIL("elastic (--elastic-dir %s): %s: %s", o.elastic_dir ? o.elastic_dir : "(default)",
           hora_result_name(rc), hora_last_error());
    rc = elastic_resume(es, &o, size, spe, tensors, ntensors, cuda, &step, err, sizeof err);
    LOST_IF_REMOTE(rc, "elastic sync");
    if (rc != HORA_SUCCESS) FAIL("elastic sync: %s: %s", hora_result_name(rc), err);
  }
  if (o.resume) {
    int64_t s;
    rc = mnist_ckpt_restore(ck, &s, tensors, ntensors);
    if (rc == HORA_ERR_NOT_FOUND) {
      say("resume: no checkpoint found, starting from step 0\n");
    } else if (rc != HORA_SUCCESS) {
      /* HORA_ERR_CORRUPT (checkpoints exist, none valid) or HORA_ERR_IO (a directory failed the
       * shared-node check): stop; starting over from step 0 would silently discard the run. */
      FAIL("resume: %s: %s", hora_result_name(rc), hora_last_error());
    } else {
      /* The run must be the same run: same seed, rank count, batch and optimizer. */
      const char *keys[4] = {"seed", "world_size", "batch_size", "optimizer"};
      char want[4][64];
      snprintf(want[0], 64, "%llu", (unsigned long long)o.seed);
      snprintf(want[1], 64, "%d", size);
      snprintf(want[2], 64, "%d", B);
      snprintf(want[3], 64, "%s", o.sgd ? "sgd" : "adam");
      for (int i = 0; i < 4; i++) {
        const char *v = NULL;
        if (mnist_ckpt_meta_get(ck, keys[i], &v) != HORA_SUCCESS || strcmp(v, want[i]) != 0)
          FAIL("resume: the checkpoint was written with %s=%s, this run has %s (use the same "
               "--seed, rank count, --batch-size and --optimizer, or start without --resume)",
               keys[i], v ? v : "(missing)", want[i]);
      }
      const char *ve = NULL, *vr = NULL;
      unsigned long long e = 0, r = 0;
      if (mnist_ckpt_meta_get(ck, "epoch", &ve) != HORA_SUCCESS ||
          mnist_ckpt_meta_get(ck, "records", &vr) != HORA_SUCCESS ||
          sscanf(ve, "%llu", &e) != 1 || sscanf(vr, "%llu", &r) != 1)
        FAIL("resume: the checkpoint has no data position (epoch, records)");
      /* A checkpoint at the end of an epoch continues with the next one. */
      if (r >= (unsigned long long)(spe * B)) e++, r = 0;
      if ((int64_t)e * spe + (int64_t)r / B != s || r % B)
        FAIL("resume: data position epoch %llu records %llu does not match step %lld", e, r,
             (long long)s);
      step = s;
      say("resume: step %lld (epoch %llu, %llu records into it)\n", (long long)step, e + 1, r);
    }
  }

  if (g_rank == 0 && o.tensorboard) CHECK(hora_tb_open(o.tensorboard, &tb), "tensorboard");
  if (tb && cuda) {
    /* On the GPU: rank 0's GPU utilization, memory, power, temperature and clock beside the
     * training scalars (gpu<N>/... in TensorBoard, and a CSV in the same directory); without
     * NVML the monitor is simply off. */
    char csv[4200];
    snprintf(csv, sizeof csv, "%s/hora-gpu-0.csv", o.tensorboard);
    hora_gpumon_opts_t go;
    memset(&go, 0, sizeof go);
    go.size = sizeof go;
    go.csv_path = csv;
    go.tb = tb;
    go.ctx = ctx;
    rc = hora_gpumon_start(&go, &gpumon);
    if (rc != HORA_SUCCESS && rc != HORA_ERR_NOT_SUPPORTED)
      FAIL("GPU monitor: %s: %s", hora_result_name(rc), hora_last_error());
  }
  char where[64];
  if (cuda) snprintf(where, sizeof where, "device cuda");
  else snprintf(where, sizeof where, "%d OpenBLAS thread(s) on rank 0, device cpu", threads);
  say("mnist: %d rank(s), %s, %lld train images per "
      "rank per epoch (%llu test), batch %d per rank (%d global), %lld steps per epoch, %d epochs, "
      "%s lr %g -> %g (%s scaling, %.3g warm-up epochs, then %s), seed %llu\n",
      size, where, (long long)(spe * B), (unsigned long long)data.test_records, B, B * size,
      (long long)spe, o.epochs, o.sgd ? "sgd" : "adam", o.lr,
      o.lr * (!strcmp(o.lr_scaling, "linear") ? size : !strcmp(o.lr_scaling, "sqrt") ? sqrt(size) : 1),
      o.lr_scaling, o.warmup_epochs, o.cosine ? "cosine decay" : "constant",
      (unsigned long long)o.seed);

  const double lr_target =
      o.lr * (!strcmp(o.lr_scaling, "linear") ? size : !strcmp(o.lr_scaling, "sqrt") ? sqrt(size) : 1.0);
  const double warm_steps = o.warmup_epochs * (double)spe;
  double train_time = 0, t_start = now_s(), t_log = t_start;
  int64_t images_trained = 0, log_steps = 0;
  double stats[3] = {0, 0, 0}; /* loss sum, correct, images since the last line */
  double ep_stats[3] = {0, 0, 0};
  double test_acc = -1, test_loss = 0;
  int stopped = 0, trained = 0;
  const uint64_t dropout_base = hora__rng_u64(o.seed, 0x64726f70ull + (uint64_t)g_rank);

  for (int64_t epoch = step / spe; epoch < o.epochs && step < last_step && !stopped; epoch++) {
    int64_t first = step - epoch * spe;
    CHECK(mnist_reader_open(ctx, data.train_pattern, 1, o.seed, (uint64_t)epoch,
                            (uint64_t)(first * B), &reader), "train reader");
    ep_stats[0] = ep_stats[1] = ep_stats[2] = 0;
    double t_epoch = now_s();
    for (int64_t s = first; s < spe && step < last_step; s++) {
      double t0 = now_s();
      if (es && !trained) { /* the time a re-formed world is training again (docs/benchmarks.md) */
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        say("mnist: elastic: train world %d epoch %lld step %lld t=%.3f\n", size, (long long)epoch + 1,
            (long long)s, (double)rt.tv_sec + rt.tv_nsec * 1e-9);
      }
      trained = 1;
      size_t got;
      rc = mnist_read_batch(reader, (size_t)B, m.x_in, m.labels_in, &got, err, sizeof err);
      if (rc != HORA_SUCCESS) FAIL("train data: %s", err);
      if (got != (size_t)B) FAIL("train data ended early (%zu of %d records in step %lld)", got, B, (long long)step);
      double loss;
      size_t correct;
      /* The dropout mask is a function of (seed, rank, step): a resumed run draws the same. */
      CHECK(mnist_model_forward(&m, (size_t)B, 1, hora__rng_u64(dropout_base, (uint64_t)step),
                                &loss, &correct), "forward");
      CHECK(mnist_model_backward(&m, mnist_grad_layer_done, &sync), "backward/allreduce");
      CHECK(mnist_grad_wait(&sync), "gradient allreduce");
      /* Goyal et al.: linear warm-up from the one-rank lr to the scaled lr. */
      /* Cosine decay over the steps after the warm-up, to 0 at the end of the last epoch (a
       * function of the step and --epochs only, so --max-steps and resume do not change it). */
      double lr = lr_target;
      if (warm_steps > 0 && step < warm_steps)
        lr = o.lr + (lr_target - o.lr) * (double)(step + 1) / warm_steps;
      else if (o.cosine && total_steps > warm_steps)
        lr = 0.5 * lr_target *
             (1.0 + cos(M_PI * ((double)step - warm_steps) / ((double)total_steps - warm_steps)));
      if (o.sgd)
        CHECK((cuda ? sgd_cuda : hora__sgd_momentum_host)(m.params, m.grads, opt_m, m.nparams,
                                                          (float)lr, (float)o.momentum), "sgd");
      else
        CHECK((cuda ? adam_cuda : hora__adam_host)(m.params, m.grads, opt_m, opt_v, m.nparams,
                                                   (float)lr, 0.9f, 0.999f, 1e-7f, step + 1),
              "adam");
      step++;
      train_time += now_s() - t0;
      images_trained += (int64_t)B * size;
      log_steps++;
      stats[0] += loss, stats[1] += (double)correct, stats[2] += B;
      ep_stats[0] += loss, ep_stats[1] += (double)correct, ep_stats[2] += B;

      if (step % o.log_every == 0 || s + 1 == spe) {
        double g[3];
        CHECK(hora_allreduce(ctx, stats, g, 3, HORA_FLOAT64, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST),
              "allreduce");
        double t = now_s(), ips = (double)log_steps * B * size / (t - t_log);
        char eta[32];
        fmt_eta((double)(last_step - step) * (t - t_log) / (double)log_steps, eta, sizeof eta);
        say("epoch %lld/%d step %lld/%lld (%lld of epoch) loss %.4f train_acc %.4f lr %.3g "
            "images/s %.0f eta %s\n",
            (long long)epoch + 1, o.epochs, (long long)step, (long long)last_step,
            (long long)(s + 1), g[0] / g[2], g[1] / g[2], lr, ips, eta);
        if (tb) {
          hora_tb_scalar(tb, "train/loss", step, g[0] / g[2]);
          hora_tb_scalar(tb, "train/accuracy", step, g[1] / g[2]);
          hora_tb_scalar(tb, "train/images_per_s", step, ips);
          hora_tb_scalar(tb, "train/learning_rate", step, lr);
        }
        stats[0] = stats[1] = stats[2] = 0;
        log_steps = 0;
        t_log = t;
      }
      int stop = 0;
      CHECK(mnist_should_stop(ctx, &stop), "stop check");
      const mnist_elastic_pos_t pos = {epoch, s + 1, size, B, o.seed, step};
      if (es && (stop || ((s + 1) % o.commit_every == 0 && s + 1 < spe)))
        CHECK(elastic_commit(es, tensors, ntensors, cuda, &pos), "elastic commit");
      if (es && stop) CHECK(hora_elastic_save(es), "elastic save");
      int periodic = !es && o.ckpt_every > 0 && step % o.ckpt_every == 0;
      if (periodic || (stop && !es)) {
        /* the reader agrees with the position derived from the step */
        uint64_t pe, pr;
        hora_records_reader_position(reader, &pe, &pr);
        if (pe != (uint64_t)epoch || pr != (uint64_t)((s + 1) * B))
          FAIL("reader position epoch %llu records %llu, want %lld %lld", (unsigned long long)pe,
               (unsigned long long)pr, (long long)epoch, (long long)((s + 1) * B));
        CHECK(save_ckpt(ck, step, spe, &o, size, tensors, ntensors), "checkpoint save");
      }
      if (stop) {
        CHECK(mnist_ckpt_flush(ck), "checkpoint flush");
        say("mnist: stop signal: %s of step %lld saved; exiting with %d for requeue\n",
            es ? "elastic commit" : "checkpoint", (long long)step, MNIST_EXIT_REQUEUE);
        stopped = 1;
        exit_code = MNIST_EXIT_REQUEUE;
        break;
      }
    }
    hora_records_reader_close(reader);
    reader = NULL;
    if (stopped) break;
    /* The end-of-run checkpoint (also when --max-steps ends the run mid-epoch). */
    if (!es && step == last_step && !(o.ckpt_every > 0 && step % o.ckpt_every == 0))
      CHECK(save_ckpt(ck, step, spe, &o, size, tensors, ntensors), "checkpoint save");
    double ep_time = now_s() - t_epoch;
    rc = evaluate(ctx, &m, &data, &test_loss, &test_acc, err, sizeof err);
    LOST_IF_REMOTE(rc, "test");
    if (rc != HORA_SUCCESS) FAIL("test: %s", err);
    double g[3];
    CHECK(hora_allreduce(ctx, ep_stats, g, 3, HORA_FLOAT64, HORA_SUM, 1.0, 1.0, HORA_DEVICE_HOST),
          "allreduce");
    say("epoch %lld/%d done: train_loss %.4f train_acc %.4f test_loss %.4f test_accuracy %.4f "
        "time %.1fs\n",
        (long long)epoch + 1, o.epochs, g[2] > 0 ? g[0] / g[2] : 0, g[2] > 0 ? g[1] / g[2] : 0,
        test_loss, test_acc, ep_time);
    if (tb) {
      hora_tb_scalar(tb, "test/accuracy", step, test_acc);
      hora_tb_scalar(tb, "test/loss", step, test_loss);
    }
    if (es) {
      /* Commit at the epoch's end, then grow (or shrink) here if the driver's node count changed. */
      const mnist_elastic_pos_t pos = {epoch + 1, 0, size, B, o.seed, step};
      CHECK(elastic_commit(es, tensors, ntensors, cuda, &pos), "elastic commit");
      int changed = 0;
      CHECK(hora_elastic_hosts_changed(es, &changed), "elastic host check");
      if (changed && epoch + 1 < o.epochs && step < last_step) {
        CHECK(hora_elastic_save(es), "elastic save");
        say("mnist: elastic: the driver has another node count: re-forming after epoch %lld\n",
            (long long)epoch + 1);
        stopped = 1;
        exit_code = HORA_EXIT_ELASTIC;
      }
    }
  }
  if (!stopped) {
    if (test_acc < 0) { /* resumed at the very end: nothing trained, still report */
      rc = evaluate(ctx, &m, &data, &test_loss, &test_acc, err, sizeof err);
      if (rc != HORA_SUCCESS) FAIL("test: %s", err);
    }
    if (o.save_weights && g_rank == 0 &&
        save_weights(o.save_weights, m.params, m.nparams, cuda) != 0)
      FAIL("--save-weights %s: cannot write", o.save_weights);
    CHECK(mnist_ckpt_flush(ck), "checkpoint flush");
    say("mnist: %lld steps in %.1fs (%.1fs training)\n", (long long)step, now_s() - t_start,
        train_time);
    say("test_accuracy=%.4f images_per_s=%.0f ranks=%d\n", test_acc,
        train_time > 0 ? (double)images_trained / train_time : 0.0, size);
  }

done:
  if (exit_code == 1) {
    /* A rank that failed alone cannot take part in collectives (checkpoint close, finalize)
     * with ranks still running: exit at once and let launch (or mpirun/srun) end the others. */
    fflush(NULL);
    _exit(exit_code);
  }
  if (reader) hora_records_reader_close(reader);
  if (gpumon) hora_gpumon_stop(gpumon); /* before the TensorBoard file it writes to */
  if (tb) hora_tb_close(tb);
  hora_elastic_close(es); /* before the checkpointer it may use */
  if (ck) {
    hora_result_t crc = mnist_ckpt_close(ck);
    if (crc != HORA_SUCCESS && exit_code == 0) {
      fprintf(stderr, "mnist: checkpoint close: %s: %s\n", hora_result_name(crc), hora_last_error());
      exit_code = 1;
    }
  }
  mnist_model_destroy(&m);
  mnist_zfree(cuda, opt_m);
  mnist_zfree(cuda, opt_v);
  hora_finalize(ctx);
  return exit_code;

lost: {
  /* A peer died or fell silent: this world is broken (no collective call may follow). Keep the
   * last commit in a file for the next step's sync, and leave with HORA_EXIT_ELASTIC. */
  int64_t c = -1;
  hora_elastic_commit_id(es, &c);
  hora_result_t src = hora_elastic_save(es);
  printf("mnist: elastic: rank %d lost a peer (%s): saved commit %lld: %s\n", g_rank, lost_what,
         (long long)c, src == HORA_SUCCESS ? "ok" : hora_last_error());
  fflush(NULL);
  mnist_grad_wait(&sync); /* handles of a broken world end at once */
  if (reader) hora_records_reader_close(reader);
  hora_elastic_close(es);
  hora_finalize(ctx);
  return src == HORA_SUCCESS ? HORA_EXIT_ELASTIC : 1;
}
}
