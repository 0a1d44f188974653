/* Unit tests of launch's parsers: hard expectations, malformed inputs, and (when scontrol is
 * installed) the same hostlists expanded by Slurm's own `scontrol show hostnames`, which needs a
 * slurm.conf but no daemon. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parse.h"

static int errors = 0;
#define CHECK(cond, ...)                                        \
  do {                                                          \
    if (!(cond)) {                                              \
      errors++;                                                 \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                             \
      fprintf(stderr, "\n");                                    \
    }                                                           \
  } while (0)

/* Expands s and compares with the space-separated `want`. */
static void expect_hosts(const char *s, const char *want) {
  char **v = NULL, err[256] = "";
  size_t n = 0;
  int rc = launch_hostlist_expand(s, &v, &n, err, sizeof err);
  CHECK(rc == 0, "'%s' failed: %s", s, err);
  if (rc != 0) return;
  char got[4096] = "";
  for (size_t i = 0; i < n; i++) {
    strcat(got, i ? " " : "");
    strncat(got, v[i], sizeof got - strlen(got) - 1);
  }
  CHECK(strcmp(got, want) == 0, "'%s' -> '%s', want '%s'", s, got, want);
  launch_strv_free(v, n);
}

static void expect_hosts_bad(const char *s, const char *msg_part) {
  char **v = NULL, err[256] = "";
  size_t n = 77;
  int rc = launch_hostlist_expand(s, &v, &n, err, sizeof err);
  CHECK(rc == -1, "'%s' was accepted", s);
  CHECK(n == 77 && v == NULL, "'%s': outputs changed on error", s);
  CHECK(strstr(err, msg_part) != NULL, "'%s': message '%s' lacks '%s'", s, err, msg_part);
}

static void expect_tpn(const char *s, const int *want, size_t nwant) {
  int *v = NULL;
  size_t n = 0;
  char err[256] = "";
  int rc = launch_tasks_per_node_parse(s, &v, &n, err, sizeof err);
  CHECK(rc == 0, "'%s' failed: %s", s, err);
  if (rc) return;
  CHECK(n == nwant, "'%s': %zu counts, want %zu", s, n, nwant);
  for (size_t i = 0; i < n && i < nwant; i++) CHECK(v[i] == want[i], "'%s'[%zu] = %d, want %d", s, i, v[i], want[i]);
  free(v);
}

static void expect_tpn_bad(const char *s) {
  int *v = NULL;
  size_t n = 0;
  char err[256] = "";
  CHECK(launch_tasks_per_node_parse(s, &v, &n, err, sizeof err) == -1, "'%s' was accepted", s);
  CHECK(strstr(err, "tasks-per-node") != NULL, "'%s': message '%s'", s, err);
}

static void expect_gpus(const char *s, const char *want) {
  char **v = NULL, err[256] = "";
  size_t n = 0;
  int rc = launch_gpu_list_parse(s, &v, &n, err, sizeof err);
  CHECK(rc == 0, "'%s' failed: %s", s, err);
  if (rc) return;
  char got[1024] = "";
  for (size_t i = 0; i < n; i++) {
    strcat(got, i ? " " : "");
    strcat(got, v[i]);
  }
  CHECK(strcmp(got, want) == 0, "gpus '%s' -> '%s', want '%s'", s, got, want);
  launch_strv_free(v, n);
}

static void expect_gpus_bad(const char *s) {
  char **v = NULL, err[256] = "";
  size_t n = 0;
  CHECK(launch_gpu_list_parse(s, &v, &n, err, sizeof err) == -1, "gpus '%s' was accepted", s);
  CHECK(strstr(err, "GPU list") != NULL, "'%s': message '%s'", s, err);
}

/* Compares with scontrol; returns 0 when scontrol is not usable. */
static int compare_scontrol(const char *s, const char *conf) {
  char cmd[1024], out[8192] = "";
  snprintf(cmd, sizeof cmd, "SLURM_CONF=%s scontrol show hostnames '%s' 2>/dev/null", conf, s);
  FILE *p = popen(cmd, "r");
  if (!p) return 0;
  size_t len = 0;
  char line[256];
  while (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = 0;
    len += (size_t)snprintf(out + len, sizeof out - len, "%s%s", len ? " " : "", line);
  }
  int st = pclose(p);
  CHECK(st == 0, "scontrol show hostnames '%s' failed", s);
  expect_hosts(s, out);
  return 1;
}

int main(void) {
  expect_hosts("n1", "n1");
  expect_hosts("n[1-2]", "n1 n2");
  expect_hosts("n[01-04,07],gpu-a[1-2]", "n01 n02 n03 n04 n07 gpu-a1 gpu-a2");
  expect_hosts("b04-[09-10]", "b04-09 b04-10");
  expect_hosts("rack[1-2]-n[1-3]", "rack1-n1 rack1-n2 rack1-n3 rack2-n1 rack2-n2 rack2-n3");
  expect_hosts("n[8-10]", "n8 n9 n10");
  expect_hosts("n[1-010]", "n1 n2 n3 n4 n5 n6 n7 n8 n9 n10");
  expect_hosts("n[00-2]", "n00 n01 n02");
  expect_hosts("n[7,09-10]", "n7 n09 n10");
  expect_hosts("n[1-2][3-4]", "n13 n14 n23 n24");
  expect_hosts("a,b.example.org,c_d", "a b.example.org c_d");
  expect_hosts("n[1,3-4]", "n1 n3 n4");
  expect_hosts("[1-2]", "1 2");

  expect_hosts_bad("", "empty");
  expect_hosts_bad("n[1-3", "never closed");
  expect_hosts_bad("n[3-1]", "backwards");
  expect_hosts_bad("n[]", "expected a number");
  expect_hosts_bad("n[1,]", "expected a number");
  expect_hosts_bad("n[a-b]", "expected a number");
  expect_hosts_bad("n[1-2]]", "']' without '['");
  expect_hosts_bad("a,,b", "empty entry");
  expect_hosts_bad("a,", "ends with a comma");
  expect_hosts_bad("a b", "not allowed");
  expect_hosts_bad("n[1-2x]", "unexpected character");
  expect_hosts_bad("n[1234567890]", "at most 9 digits");
  expect_hosts_bad("n[0-999999999]", "more than");
  expect_hosts_bad("n[0-999][0-999][0-999]", "more than");

  int t1[] = {2, 2, 2, 1};
  expect_tpn("2(x3),1", t1, 4);
  int t2[] = {4};
  expect_tpn("4", t2, 1);
  int t3[] = {3, 1};
  expect_tpn("3,1", t3, 2);
  int t4[] = {8, 4, 2, 2, 1};
  expect_tpn("8,4,2(x2),1", t4, 5);
  expect_tpn_bad("");
  expect_tpn_bad("2(x");
  expect_tpn_bad("2(x0)");
  expect_tpn_bad("0");
  expect_tpn_bad("2,");
  expect_tpn_bad("2(y3)");
  expect_tpn_bad("a");
  expect_tpn_bad("2(x3)1");
  expect_tpn_bad("1(x999999999)");

  expect_gpus("0,1", "0 1");
  expect_gpus("", "");
  expect_gpus("3", "3");
  expect_gpus("0-3,6", "0 1 2 3 6");
  expect_gpus("GPU-8a1f0c2e-1111-2222-3333-444455556666,1", "GPU-8a1f0c2e-1111-2222-3333-444455556666 1");
  expect_gpus("MIG-GPU-1/2/0", "MIG-GPU-1/2/0");
  expect_gpus_bad("0,,1");
  expect_gpus_bad("0,0");
  expect_gpus_bad("3-1");
  expect_gpus_bad("0;1");
  expect_gpus_bad("1,");
  expect_gpus_bad("0-3,7,2");
  {
    /* The largest range the parser accepts: must parse (in n log n; a pairwise duplicate check
     * took minutes here and timed the fuzzer out) and keep its order; a duplicate at the end of
     * a long list is still found. */
    char **v = NULL, e[256] = "";
    size_t n = 0;
    CHECK(launch_gpu_list_parse("0-65535", &v, &n, e, sizeof e) == 0, "0-65535: %s", e);
    CHECK(n == 65536 && strcmp(v[0], "0") == 0 && strcmp(v[65535], "65535") == 0,
          "0-65535 gave %zu entries", n);
    launch_strv_free(v, n);
    expect_gpus_bad("0-65534,17");
  }
  /* Several large brackets in one item: rejected before more than LAUNCH_MAX_NAMES strings exist. */
  expect_hosts_bad("a[0-999999][0-999999][0-999999][0-999999]", "more than");
  expect_hosts_bad("a[0-999999],b[0-99999]", "more than");

  char **h = NULL, err[256];
  int *sl = NULL;
  size_t nh = 0;
  CHECK(launch_hosts_parse("host1:4,host2", &h, &sl, &nh, err, sizeof err) == 0, "%s", err);
  CHECK(nh == 2 && strcmp(h[0], "host1") == 0 && sl[0] == 4 && strcmp(h[1], "host2") == 0 && sl[1] == 1,
        "-H host1:4,host2 parsed wrong");
  launch_strv_free(h, nh);
  free(sl);
  const char *bad_hosts[] = {"h:0", "h:", ":4", "h:x", "a,", "a b:2"};
  for (size_t i = 0; i < sizeof bad_hosts / sizeof *bad_hosts; i++) {
    h = NULL;
    CHECK(launch_hosts_parse(bad_hosts[i], &h, &sl, &nh, err, sizeof err) == -1, "-H '%s' accepted", bad_hosts[i]);
  }

  /* Host files (horovodrun -hostfile / Open MPI --hostfile) -> the -H form. */
  struct {
    const char *text, *want;
  } hf[] = {
      {"node1 slots=4\nnode2 slots=2\n", "node1:4,node2:2"},
      {"# cluster\n\n  gpu-a.example.org   slots=8  max_slots=8 # rack 1\r\nnode3\n", "gpu-a.example.org:8,node3:1"},
      {"n1 slots=1", "n1:1"},
      {"n1 slots=3#x\n", "n1:3"},
  };
  for (size_t i = 0; i < sizeof hf / sizeof *hf; i++) {
    char *got = NULL;
    CHECK(launch_hostfile_parse(hf[i].text, &got, err, sizeof err) == 0 && got && strcmp(got, hf[i].want) == 0,
          "host file %zu: got '%s' (%s), want '%s'", i, got ? got : "(none)", err, hf[i].want);
    free(got);
  }
  struct {
    const char *text, *msg;
  } hf_bad[] = {
      {"", "no host"},
      {"# only a comment\n\n", "no host"},
      {"n1 slots=0\n", "line 1: slot count '0'"},
      {"n1\nn2 slots=x\n", "line 2: slot count 'x'"},
      {"n1 cpus=4\n", "line 1: 'cpus=4' is not slots=N"},
      {"n1 slots=\n", "line 1: 'slots=' is not slots=N"},
      {"n1\nbad/host slots=2\n", "line 2: 'bad/host' is not a host name"},
      {"n1 slots=2000000\n", "not a number from 1 to 1048576"},
  };
  for (size_t i = 0; i < sizeof hf_bad / sizeof *hf_bad; i++) {
    char *got = NULL;
    err[0] = 0;
    CHECK(launch_hostfile_parse(hf_bad[i].text, &got, err, sizeof err) == -1 && !got && strstr(err, hf_bad[i].msg),
          "bad host file %zu: rc/message '%s', want '%s'", i, err, hf_bad[i].msg);
  }

  /* Slurm's own expansion of the same valid lists. */
  char conf[] = "/tmp/launch-parse-XXXXXX";
  int fd = mkstemp(conf);
  int compared = 0;
  if (fd >= 0 && system("command -v scontrol >/dev/null 2>&1") == 0) {
    const char *txt = "ClusterName=t\nSlurmctldHost=localhost\nNodeName=a\nPartitionName=p Nodes=a\n";
    if (write(fd, txt, strlen(txt)) == (ssize_t)strlen(txt)) {
      const char *cases[] = {"n[01-04,07],gpu-a[1-2]", "b04-[09-10]", "rack[1-2]-n[1-3]", "n[8-10]",
                             "n[1-010]", "n[00-2]", "n[7,09-10]", "n[1-2][3-4]", "n[1,3-4]", "n1,n[2-3]",
                             "x[001-120]"};
      for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) compared += compare_scontrol(cases[i], conf);
    }
  }
  if (fd >= 0) {
    close(fd);
    unlink(conf);
  }
  printf("test_launch_parse: %s (%d errors; %d lists compared with scontrol)\n", errors ? "FAILED" : "passed",
         errors, compared);
  return errors ? 1 : 0;
}
