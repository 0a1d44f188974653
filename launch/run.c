/* Running the program: fork + exec, so that launch stays alive to forward signals, tag output
 * lines with the rank and return the program's exit status.
 *
 * Why not exec directly: the output tagging needs a process reading the program's pipes, and
 * under mpirun only launch (orted's direct child) receives the signals orted forwards.
 * Inside an srun step, slurmstepd signals every process of the step itself, so a signal that
 * comes from our parent (slurmstepd) is not forwarded again; one sent to launch alone (by kill
 * from a user, or by orted) is. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/uio.h>
#include <unistd.h>

#include "launch.h"

static volatile sig_atomic_t g_child = 0;
static volatile sig_atomic_t g_parent_signal = 0;
static pid_t g_parent = 0;
static int g_forward_from_parent = 1;

static void on_signal(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  if (si && si->si_code == SI_USER && si->si_pid == g_parent) {
    g_parent_signal = sig;
    if (!g_forward_from_parent) return;
  }
  if (g_child <= 0) return;
  kill((pid_t)g_child, sig);
}

static const int forwarded[] = {SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP, SIGQUIT};

int launch_check_program(const char *prog) {
  struct stat st;
  if (!prog || !*prog) {
    launch_error("no program given: usage is launch [options] [--] program [args]");
    return -1;
  }
  if (!strchr(prog, '/')) {
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    char buf[4096];
    for (const char *p = path; *p;) {
      size_t n = strcspn(p, ":");
      snprintf(buf, sizeof buf, "%.*s/%s", (int)n, n ? p : ".", prog);
      if (stat(buf, &st) == 0 && S_ISREG(st.st_mode) && access(buf, X_OK) == 0) return 0;
      p += n;
      if (*p == ':') p++;
    }
    launch_error("program '%s' was not found in PATH (give a path such as ./%s)", prog, prog);
    return -1;
  }
  if (stat(prog, &st) != 0) {
    launch_error("program '%s' does not exist", prog);
    return -1;
  }
  if (S_ISDIR(st.st_mode)) {
    launch_error("program '%s' is a directory", prog);
    return -1;
  }
  if (access(prog, X_OK) != 0) {
    launch_error("program '%s' is not executable (chmod +x?)", prog);
    return -1;
  }
  return 0;
}

typedef struct {
  int fd;
  int out_fd; /* where complete lines go */
  int *watch; /* when set: first failure status seen in the lines */
  char buf[8192];
  size_t len;
} stream_t;

static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += w;
    n -= (size_t)w;
  }
}

/* One output line: prefix, text and (add_nl) a newline in one writev, so that a line never mixes
 * with another rank's on the same pipe (mpirun and srun forward each write as one chunk, and a
 * pipe write of up to PIPE_BUF bytes is atomic); a line the pipe takes in part goes on with
 * write_all. */
static void write_line(int fd, const char *prefix, const char *p, size_t n, int add_nl) {
  struct iovec v[3];
  int k = 0;
  if (prefix) v[k++] = (struct iovec){(void *)prefix, strlen(prefix)};
  v[k++] = (struct iovec){(void *)p, n};
  if (add_nl) v[k++] = (struct iovec){(void *)"\n", 1};
  size_t total = 0;
  for (int i = 0; i < k; i++) total += v[i].iov_len;
  ssize_t w;
  do w = writev(fd, v, k);
  while (w < 0 && errno == EINTR);
  if (w < 0 || (size_t)w == total) return;
  size_t done = (size_t)w; /* a partial write: the rest in order */
  for (int i = 0; i < k; i++) {
    if (done >= v[i].iov_len) {
      done -= v[i].iov_len;
      continue;
    }
    write_all(fd, (const char *)v[i].iov_base + done, v[i].iov_len - done);
    done = 0;
  }
}

/* The line every failing rank's launch prints (see step.c): "launch: rank R (node N): P exited
 * with status S". */
static void scan_failure(const char *line, size_t n, int *status) {
  char buf[1024];
  if (n >= sizeof buf) n = sizeof buf - 1;
  memcpy(buf, line, n);
  buf[n] = 0;
  const char *a = strstr(buf, "launch: rank "), *b = a ? strstr(a, " exited with status ") : NULL;
  const char *k = a ? strstr(a, " killed by signal ") : NULL;
  if (b) *status = atoi(b + strlen(" exited with status "));
  else if (k) *status = 128 + atoi(k + strlen(" killed by signal "));
}

/* Emits buffered complete lines (all of it when `flush`), each prefixed when `tag`. */
static void emit(stream_t *s, const char *prefix, int flush) {
  size_t start = 0;
  for (;;) {
    char *nl = memchr(s->buf + start, '\n', s->len - start);
    size_t end;
    if (nl) {
      end = (size_t)(nl - s->buf) + 1;
    } else if ((flush || s->len == sizeof s->buf) && s->len > start) {
      end = s->len; /* a partial last line, or a line longer than the buffer */
    } else {
      break;
    }
    write_line(s->out_fd, prefix, s->buf + start, end - start, !nl);
    if (s->watch && *s->watch < 0) scan_failure(s->buf + start, end - start, s->watch);
    start = end;
    if (start == s->len) break;
  }
  memmove(s->buf, s->buf + start, s->len - start);
  s->len -= start;
}

/* Reads what is available; returns 0 at EOF. */
static int pump(stream_t *s, const char *prefix) {
  ssize_t r = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
  if (r < 0) return errno == EINTR || errno == EAGAIN ? 1 : 0;
  if (r == 0) {
    emit(s, prefix, 1);
    return 0;
  }
  s->len += (size_t)r;
  emit(s, prefix, 0);
  return 1;
}

/* Relays the program's output until it exited and its pipes are drained (or held open by a
 * grandchild after it exited); returns its wait status. */
static int relay(pid_t pid, stream_t *st, int open_streams, const char *pfx) {
  int status = 0, exited = 0;
  double drain_polls = 0;
  while (!exited || open_streams > 0) {
    if (!exited && waitpid(pid, &status, WNOHANG) == pid) exited = 1;
    if (open_streams == 0) {
      if (!exited && waitpid(pid, &status, 0) == pid) exited = 1;
      continue;
    }
    struct pollfd pf[2];
    int n = 0;
    for (int i = 0; i < 2; i++)
      if (st[i].fd >= 0) pf[n++] = (struct pollfd){.fd = st[i].fd, .events = POLLIN};
    int pr = poll(pf, (nfds_t)n, exited ? 50 : 100);
    if (pr == 0 && exited && ++drain_polls >= 4) break; /* a grandchild holds the pipe open */
    for (int k = 0; k < n; k++) {
      if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      stream_t *s = st[0].fd == pf[k].fd ? &st[0] : &st[1];
      if (!pump(s, pfx)) {
        close(s->fd);
        s->fd = -1;
        open_streams--;
      }
    }
  }
  for (int i = 0; i < 2; i++)
    if (st[i].fd >= 0) {
      emit(&st[i], pfx, 1);
      close(st[i].fd);
    }
  return status;
}

/* --output-dir: DIR/rank.R.log opened for appending; -1 after an error line. */
static int open_output(const launch_run_t *r) {
  if (mkdir(r->output_dir, 0777) != 0 && errno != EEXIST) {
    launch_error("cannot create --output-dir %s: %s", r->output_dir, strerror(errno));
    return -1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/rank.%d.log", r->output_dir, r->rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) launch_error("cannot open %s: %s", path, strerror(errno));
  return fd;
}

int launch_run(launch_run_t *r, char **prog) {
  int capture = r->tag_output || r->output_dir || r->watch;
  r->first_failure = -1;
  r->signaled = 0;
  r->parent_signal = 0;
  g_parent_signal = 0;
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, file_fd = -1;
  if (r->output_dir && (file_fd = open_output(r)) < 0) return -1;
  if (capture && (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)) {
    launch_error("pipe: %s", strerror(errno));
    if (file_fd >= 0) close(file_fd);
    return -1;
  }
  g_parent = getppid();
  g_forward_from_parent = r->forward_from_parent;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  /* Block the forwarded signals until the child's pid is known. */
  sigset_t block, old;
  sigemptyset(&block);
  for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++) sigaddset(&block, forwarded[i]);
  sigprocmask(SIG_BLOCK, &block, &old);
  for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++) sigaction(forwarded[i], &sa, NULL);

  pid_t pid = fork();
  if (pid < 0) {
    sigprocmask(SIG_SETMASK, &old, NULL);
    launch_error("fork: %s", strerror(errno));
    return -1;
  }
  if (pid == 0) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++) sigaction(forwarded[i], &dfl, NULL);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (capture) {
      if (!r->watch) dup2(out_pipe[1], 1);
      dup2(err_pipe[1], 2);
    }
    execvp(prog[0], prog);
    fprintf(stderr, "launch: error: cannot execute %s: %s\n", prog[0], strerror(errno));
    _exit(127);
  }
  g_child = pid;
  sigprocmask(SIG_SETMASK, &old, NULL);

  char prefix[32];
  snprintf(prefix, sizeof prefix, "[%d] ", r->rank);
  const char *pfx = r->output_dir || r->watch ? NULL : (r->tag_output ? prefix : NULL);
  stream_t st[2] = {{.fd = -1}, {.fd = -1}};
  int open_streams = 0;
  if (capture) {
    close(out_pipe[1]);
    close(err_pipe[1]);
    st[0] = (stream_t){.fd = out_pipe[0], .out_fd = file_fd >= 0 ? file_fd : 1};
    st[1] = (stream_t){.fd = err_pipe[0], .out_fd = file_fd >= 0 ? file_fd : 2};
    open_streams = 2;
    if (r->watch) {
      close(st[0].fd); /* stdout was not redirected */
      st[0].fd = -1;
      open_streams = 1;
      st[1].watch = &r->first_failure;
    }
  }
  int status = relay(pid, st, open_streams, pfx);
  if (file_fd >= 0) close(file_fd);
  g_child = 0;
  r->parent_signal = g_parent_signal;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    r->signaled = sig;
    return 128 + sig;
  }
  return 1;
}
