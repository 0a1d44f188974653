/* hora_init layout, errors before init / after finalize, and the world-size checks. */
#include <unistd.h>

#include "hora_test.h"

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int wrank, wsize;
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  setenv("HORA_LOG", "NONE", 1);

  /* Before init: errors, never a crash. */
  int v = -5;
  EXPECT_RC(hora_rank(NULL, &v), HORA_ERR_NOT_INITIALIZED);
  EXPECT(v == -5, "output changed on error");
  float x = 1;
  EXPECT_RC(hora_allreduce(NULL, &x, &x, 1, HORA_FLOAT32, HORA_SUM, 1, 1, HORA_DEVICE_HOST),
            HORA_ERR_NOT_INITIALIZED);

  hora_ctx_t *ctx = NULL;
  EXPECT_OK(hora_init(&ctx));
  int r = -1, s = -1, lr = -1, ls = -1, cr = -1, cs = -1;
  EXPECT_OK(hora_rank(ctx, &r));
  EXPECT_OK(hora_size(ctx, &s));
  EXPECT_OK(hora_local_rank(ctx, &lr));
  EXPECT_OK(hora_local_size(ctx, &ls));
  EXPECT_OK(hora_cross_rank(ctx, &cr));
  EXPECT_OK(hora_cross_size(ctx, &cs));
  EXPECT(r == wrank && s == wsize, "rank %d/%d vs world %d/%d", r, s, wrank, wsize);
  /* mpirun on one machine: one node, local == world. */
  EXPECT(lr == wrank && ls == wsize && cr == 0 && cs == 1, "layout lr=%d ls=%d cr=%d cs=%d", lr, ls, cr, cs);
  EXPECT_OK(hora_finalize(ctx));
  /* After finalize: errors, never a crash. */
  EXPECT_RC(hora_rank(ctx, &v), HORA_ERR_NOT_INITIALIZED);
  EXPECT_RC(hora_barrier(ctx), HORA_ERR_NOT_INITIALIZED);

  /* HORA_SIZE disagreeing with the world: HORA_ERR_LAYOUT with an actionable message. */
  char buf[16];
  snprintf(buf, sizeof buf, "%d", wsize + 3);
  setenv("HORA_SIZE", buf, 1);
  ctx = NULL;
  EXPECT_RC(hora_init(&ctx), HORA_ERR_LAYOUT);
  EXPECT(ctx == NULL, "ctx set on error");
  EXPECT(strstr(hora_last_error(), "--mpi=pmix") != NULL, "message: %s", hora_last_error());
  unsetenv("HORA_SIZE");

  /* srun step with SLURM_NTASKS != world (and not started by mpirun). */
  char *ompi = getenv("OMPI_COMM_WORLD_SIZE");
  char saved[32] = "";
  if (ompi) snprintf(saved, sizeof saved, "%s", ompi);
  unsetenv("OMPI_COMM_WORLD_SIZE");
  setenv("SLURM_STEP_ID", "0", 1);
  snprintf(buf, sizeof buf, "%d", wsize + 1);
  setenv("SLURM_NTASKS", buf, 1);
  EXPECT_RC(hora_init(&ctx), HORA_ERR_LAYOUT);
  char want[64];
  snprintf(want, sizeof want, "srun started %d tasks but MPI sees %d process", wsize + 1, wsize);
  EXPECT(strstr(hora_last_error(), want) != NULL, "message: %s", hora_last_error());
  unsetenv("SLURM_STEP_ID");
  unsetenv("SLURM_NTASKS");
  if (*saved) setenv("OMPI_COMM_WORLD_SIZE", saved, 1);

  /* A malformed variable fails init naming it. */
  setenv("HORA_FUSION_THRESHOLD", "lots", 1);
  EXPECT_RC(hora_init(&ctx), HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "HORA_FUSION_THRESHOLD") != NULL, "message: %s", hora_last_error());
  unsetenv("HORA_FUSION_THRESHOLD");

  /* Fake Slurm node ids split the local group even on one host (fake multi-node clusters). */
  setenv("HORA_CROSS_RANK", wrank < wsize / 2 ? "0" : "1", 1);
  EXPECT_OK(hora_init(&ctx));
  EXPECT_OK(hora_cross_size(ctx, &cs));
  EXPECT_OK(hora_local_size(ctx, &ls));
  int want_nodes = wsize >= 2 ? 2 : 1;
  EXPECT(cs == want_nodes, "cross size %d, want %d", cs, want_nodes);
  EXPECT(ls == (wrank < wsize / 2 ? wsize / 2 : wsize - wsize / 2), "local size %d", ls);
  EXPECT_OK(hora_finalize(ctx));
  unsetenv("HORA_CROSS_RANK");

  int rc = hora_test_finish_mpi("test_init");
  MPI_Finalize();
  return rc;
}
