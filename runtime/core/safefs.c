/* Checked directories and private files (safefs.h): the rules OpenSSH's StrictModes and
 * PostgreSQL's data-directory check apply, and creation through an fd of the checked directory. */
#include "core/safefs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define MAX_SYMLINKS 40

mode_t hora__file_mode(void) {
  const char *m = hora__params()->file_mode;
  if (m && strcmp(m, "0640") == 0) return 0640;
  if (m && strcmp(m, "0644") == 0) return 0644;
  return 0600;
}

mode_t hora__dir_mode(void) {
  mode_t f = hora__file_mode();
  return 0700 | ((f & 0040) ? 0050 : 0) | ((f & 0004) ? 0005 : 0);
}

static void user_name(uid_t uid, char *out, size_t cap) {
  struct passwd pw, *res = NULL;
  char buf[1024];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res)
    snprintf(out, cap, "%s (uid %u)", res->pw_name, (unsigned)uid);
  else
    snprintf(out, cap, "uid %u", (unsigned)uid);
}

hora_result_t hora__dir_check_stat(const struct stat *st, const char *path) {
  uid_t me = geteuid();
  char owner[300], you[300];
  if (!S_ISDIR(st->st_mode))
    return HORA_ERR(HORA_ERR_IO, "%s is not a directory", path);
  if (st->st_uid != me && st->st_uid != 0) {
    user_name(st->st_uid, owner, sizeof owner);
    user_name(me, you, sizeof you);
    return HORA_ERR(HORA_ERR_IO,
                    "%s is owned by %s, mode %04o, not by you (%s) or root: that user could read or replace what "
                    "hora writes there; use a directory of your own (for example one made by `mktemp -d`)",
                    path, owner, (unsigned)(st->st_mode & 07777), you);
  }
  if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX)) {
    user_name(st->st_uid, owner, sizeof owner);
    return HORA_ERR(HORA_ERR_IO,
                    "%s (owner %s) has mode %04o: writable by %s without the sticky bit, so others could replace "
                    "its entries; run `chmod go-w %s` or use a directory of your own", path, owner,
                    (unsigned)(st->st_mode & 07777), (st->st_mode & S_IWOTH) ? "everyone" : "its group", path);
  }
  return HORA_SUCCESS;
}

/* Append component `name` to the printable path `cur` (cap bytes). */
static void path_push(char *cur, size_t cap, const char *name) {
  size_t n = strlen(cur);
  snprintf(cur + n, cap - n, "%s%s", (n == 1 && cur[0] == '/') ? "" : "/", name);
}

static void path_pop(char *cur) {
  char *s = strrchr(cur, '/');
  if (!s) return;
  if (s == cur) cur[1] = 0;
  else *s = 0;
}

/* One step of the walk: the entry `name` of the checked directory *fd (path cur). Follows a
 * trusted symlink by splicing its target in front of the rest (rest, rest_cap); otherwise
 * replaces *fd by the checked subdirectory and extends cur. */
static hora_result_t walk_step(int *fd, char *cur, size_t cur_cap, const char *name, char *rest, size_t rest_cap,
                               int create, int *hops) {
  char shown[PATH_MAX + 256];
  snprintf(shown, sizeof shown, "%s", cur);
  path_push(shown, sizeof shown, name);
  struct stat st;
  if (fstatat(*fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) return HORA_ERR(HORA_ERR_IO, "stat %s: %s", shown, strerror(errno));
    if (!create) return HORA_ERR(HORA_ERR_NOT_FOUND, "%s does not exist", shown);
    if (mkdirat(*fd, name, hora__dir_mode()) != 0 && errno != EEXIST)
      return HORA_ERR(HORA_ERR_IO, "mkdir %s: %s", shown, strerror(errno));
    int sfd = openat(*fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* O_PATH fds cannot be fsynced */
    if (sfd >= 0) {
      (void)fsync(sfd); /* the new entry is durable in its parent */
      close(sfd);
    }
    if (fstatat(*fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
      return HORA_ERR(HORA_ERR_IO, "stat %s: %s", shown, strerror(errno));
  }
  if (S_ISLNK(st.st_mode)) {
    if (st.st_uid != geteuid() && st.st_uid != 0) {
      char owner[300];
      user_name(st.st_uid, owner, sizeof owner);
      return HORA_ERR(HORA_ERR_IO, "%s is a symlink owned by %s: that user decides where it points; use the "
                      "real directory or one of your own", shown, owner);
    }
    if (++*hops > MAX_SYMLINKS) return HORA_ERR(HORA_ERR_IO, "%s: too many levels of symbolic links", shown);
    char target[PATH_MAX];
    ssize_t n = readlinkat(*fd, name, target, sizeof target - 1);
    if (n <= 0) return HORA_ERR(HORA_ERR_IO, "readlink %s: %s", shown, n < 0 ? strerror(errno) : "empty");
    target[n] = 0;
    char joined[2 * PATH_MAX];
    if ((size_t)snprintf(joined, sizeof joined, "%s/%s", target, rest) >= rest_cap)
      return HORA_ERR(HORA_ERR_IO, "%s: path too long after following its symlinks", shown);
    snprintf(rest, rest_cap, "%s", joined);
    if (target[0] == '/') {
      int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (root < 0) return HORA_ERR(HORA_ERR_IO, "open /: %s", strerror(errno));
      close(*fd);
      *fd = root;
      snprintf(cur, cur_cap, "/");
    }
    return HORA_SUCCESS;
  }
  int nfd = openat(*fd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (nfd < 0)
    return HORA_ERR(HORA_ERR_IO, "%s is not a usable directory: %s", shown, strerror(errno));
  struct stat st2;
  if (fstat(nfd, &st2) != 0 || st2.st_dev != st.st_dev || st2.st_ino != st.st_ino) {
    close(nfd);
    return HORA_ERR(HORA_ERR_IO, "%s changed while it was being checked (someone else is modifying it)", shown);
  }
  hora_result_t rc = hora__dir_check_stat(&st2, shown);
  if (rc != HORA_SUCCESS) {
    close(nfd);
    return rc;
  }
  close(*fd);
  *fd = nfd;
  snprintf(cur, cur_cap, "%s", shown);
  return HORA_SUCCESS;
}

hora_result_t hora__dir_open(const char *path, int create, int *dirfd) {
  if (!path || !*path) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "empty directory path");
  char rest[2 * PATH_MAX], cur[PATH_MAX + 256] = "/";
  if (path[0] == '/') {
    if (strlen(path) >= sizeof rest) return HORA_ERR(HORA_ERR_IO, "path too long: %.200s...", path);
    snprintf(rest, sizeof rest, "%s", path);
  } else {
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) return HORA_ERR(HORA_ERR_IO, "getcwd: %s", strerror(errno));
    if ((size_t)snprintf(rest, sizeof rest, "%s/%s", cwd, path) >= sizeof rest)
      return HORA_ERR(HORA_ERR_IO, "path too long: %.200s...", path);
  }
  int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return HORA_ERR(HORA_ERR_IO, "open /: %s", strerror(errno));
  struct stat st;
  hora_result_t rc = fstat(fd, &st) == 0 ? hora__dir_check_stat(&st, "/") : HORA_ERR(HORA_ERR_IO, "stat /");
  int hops = 0;
  while (rc == HORA_SUCCESS) {
    char *p = rest;
    while (*p == '/') p++;
    if (!*p) break;
    char name[NAME_MAX + 1];
    size_t len = strcspn(p, "/");
    if (len > NAME_MAX) {
      rc = HORA_ERR(HORA_ERR_IO, "%s: a path component is longer than %d bytes", path, NAME_MAX);
      break;
    }
    memcpy(name, p, len);
    name[len] = 0;
    memmove(rest, p + len, strlen(p + len) + 1);
    if (strcmp(name, ".") == 0) continue;
    if (strcmp(name, "..") == 0) {
      /* The parent of a checked directory: it was checked on the way down. */
      int pfd = openat(fd, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (pfd < 0) rc = HORA_ERR(HORA_ERR_IO, "open %s/..: %s", cur, strerror(errno));
      else {
        close(fd);
        fd = pfd;
        path_pop(cur);
      }
      continue;
    }
    rc = walk_step(&fd, cur, sizeof cur, name, rest, sizeof rest, create, &hops);
  }
  if (rc == HORA_SUCCESS) {
    int rfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rfd < 0) rc = HORA_ERR(HORA_ERR_IO, "open directory %s: %s", path, strerror(errno));
    else *dirfd = rfd;
  }
  close(fd);
  return rc;
}

hora_result_t hora__subdir_open(int dirfd, const char *dirpath, const char *name, int create, int *fd) {
  char shown[PATH_MAX + 256];
  snprintf(shown, sizeof shown, "%s/%s", dirpath, name);
  if (!*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
    return HORA_ERR(HORA_ERR_IO, "%s: not a plain directory name", shown);
  struct stat st;
  if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) return HORA_ERR(HORA_ERR_IO, "stat %s: %s", shown, strerror(errno));
    if (!create) return HORA_ERR(HORA_ERR_NOT_FOUND, "%s does not exist", shown);
    if (mkdirat(dirfd, name, hora__dir_mode()) != 0 && errno != EEXIST)
      return HORA_ERR(HORA_ERR_IO, "mkdir %s: %s", shown, strerror(errno));
    if (fsync(dirfd) != 0 && errno != EINVAL) return HORA_ERR(HORA_ERR_IO, "fsync %s: %s", dirpath, strerror(errno));
  }
  int sfd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sfd < 0) {
    int e = errno;
    if (e == ELOOP || (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)))
      return HORA_ERR(HORA_ERR_IO, "%s is a symlink: hora never follows one inside its own directories; remove it",
                      shown);
    return HORA_ERR(HORA_ERR_IO, "open directory %s: %s", shown, strerror(e));
  }
  if (fstat(sfd, &st) != 0) {
    close(sfd);
    return HORA_ERR(HORA_ERR_IO, "stat %s: %s", shown, strerror(errno));
  }
  hora_result_t rc = hora__dir_check_stat(&st, shown);
  if (rc != HORA_SUCCESS) {
    close(sfd);
    return rc;
  }
  *fd = sfd;
  return HORA_SUCCESS;
}

int hora__entry_exists(int dirfd, const char *name) {
  struct stat st;
  return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

hora_result_t hora__file_create_excl(int dirfd, const char *dirpath, const char *name, int flags, int *fd) {
  int f = openat(dirfd, name, O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | flags, hora__file_mode());
  if (f < 0) return HORA_ERR(HORA_ERR_IO, "create %s/%s: %s", dirpath, name, strerror(errno));
  *fd = f;
  return HORA_SUCCESS;
}

hora_result_t hora__file_create_tmp(int dirfd, const char *dirpath, const char *base, int flags, char *name,
                                    size_t cap, int *fd) {
  for (int tries = 0; tries < 8; tries++) {
    unsigned char r[8];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
      /* No entropy yet (early boot): O_EXCL still makes the creation safe. */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      uint64_t x = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ ((uint64_t)getpid() << 32) ^ (uint64_t)tries;
      memcpy(r, &x, sizeof r);
    }
    if ((size_t)snprintf(name, cap, HORA_TMP_PREFIX "%s.%02x%02x%02x%02x%02x%02x%02x%02x", base, r[0], r[1], r[2],
                         r[3], r[4], r[5], r[6], r[7]) >= cap)
      return HORA_ERR(HORA_ERR_IO, "%s/%s: temporary name too long", dirpath, base);
    int f = openat(dirfd, name, O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | flags, hora__file_mode());
    if (f >= 0) {
      *fd = f;
      return HORA_SUCCESS;
    }
    if (errno != EEXIST) return HORA_ERR(HORA_ERR_IO, "create %s/%s: %s", dirpath, name, strerror(errno));
  }
  return HORA_ERR(HORA_ERR_IO, "create %s/" HORA_TMP_PREFIX "%s.*: every name tried exists", dirpath, base);
}

hora_result_t hora__file_open_log(int dirfd, const char *dirpath, const char *name, int *fd) {
  int f = openat(dirfd, name, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, hora__file_mode());
  if (f < 0)
    return HORA_ERR(HORA_ERR_IO, "create %s/%s: %s", dirpath, name,
                    errno == ELOOP ? "it is a symlink (never followed)" : strerror(errno));
  struct stat st;
  if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    char owner[300];
    user_name(st.st_uid, owner, sizeof owner);
    close(f);
    return HORA_ERR(HORA_ERR_IO, "%s/%s exists and is %s owned by %s: remove it or choose another name", dirpath, name,
                    S_ISREG(st.st_mode) ? "a file" : "not a regular file", owner);
  }
  int fl = fcntl(f, F_GETFL);
  if (ftruncate(f, 0) != 0 || (fl >= 0 && fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0)) {
    int e = errno;
    close(f);
    return HORA_ERR(HORA_ERR_IO, "truncate %s/%s: %s", dirpath, name, strerror(e));
  }
  *fd = f;
  return HORA_SUCCESS;
}

hora_result_t hora__file_commit(int dirfd, const char *dirpath, const char *tmp, const char *name) {
  if (renameat(dirfd, tmp, dirfd, name) != 0)
    return HORA_ERR(HORA_ERR_IO, "rename %s/%s to %s: %s", dirpath, tmp, name, strerror(errno));
  if (fsync(dirfd) != 0 && errno != EINVAL)
    return HORA_ERR(HORA_ERR_IO, "fsync directory %s: %s", dirpath, strerror(errno));
  return HORA_SUCCESS;
}

hora_result_t hora__write_all(int fd, const void *p, size_t n, const char *what) {
  const unsigned char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return HORA_ERR(HORA_ERR_IO, "write %s: %s", what, strerror(errno));
    if (w == 0) return HORA_ERR(HORA_ERR_IO, "write %s: no progress (disk full?)", what);
    c += w;
    n -= (size_t)w;
  }
  return HORA_SUCCESS;
}

hora_result_t hora__file_write_atomic(int dirfd, const char *dirpath, const char *name, const void *p, size_t n) {
  char tmp[NAME_MAX + 1], what[PATH_MAX + 300];
  int fd;
  HORA_CHECK(hora__file_create_tmp(dirfd, dirpath, name, O_WRONLY, tmp, sizeof tmp, &fd));
  snprintf(what, sizeof what, "%s/%s", dirpath, tmp);
  hora_result_t rc = hora__write_all(fd, p, n, what);
  if (rc == HORA_SUCCESS && fsync(fd) != 0) rc = HORA_ERR(HORA_ERR_IO, "fsync %s: %s", what, strerror(errno));
  if (close(fd) != 0 && rc == HORA_SUCCESS) rc = HORA_ERR(HORA_ERR_IO, "close %s: %s", what, strerror(errno));
  if (rc == HORA_SUCCESS) rc = hora__file_commit(dirfd, dirpath, tmp, name);
  if (rc != HORA_SUCCESS) unlinkat(dirfd, tmp, 0);
  return rc;
}

hora_result_t hora__file_open_read(int dirfd, const char *dirpath, const char *name, int *fd) {
  int f = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (f < 0) {
    int e = errno;
    if (e == ENOENT) return HORA_ERR(HORA_ERR_NOT_FOUND, "open %s/%s: %s", dirpath, name, strerror(e));
    return HORA_ERR(HORA_ERR_IO, "open %s/%s: %s", dirpath, name,
                    e == ELOOP ? "it is a symlink (never followed inside hora's directories)" : strerror(e));
  }
  struct stat st;
  if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(f);
    return HORA_ERR(HORA_ERR_IO, "%s/%s is not a regular file", dirpath, name);
  }
  int fl = fcntl(f, F_GETFL);
  if (fl >= 0) fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
  *fd = f;
  return HORA_SUCCESS;
}

hora_result_t hora__path_split(const char *path, char *dir, size_t dir_cap, char *base, size_t base_cap) {
  if (!path || !*path) return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "empty file path");
  size_t n = strlen(path);
  if (path[n - 1] == '/') return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s names a directory, not a file", path);
  const char *s = strrchr(path, '/');
  const char *b = s ? s + 1 : path;
  if (!strcmp(b, ".") || !strcmp(b, ".."))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "%s names a directory, not a file", path);
  if (strlen(b) >= base_cap || (s && (size_t)(s - path) >= dir_cap))
    return HORA_ERR(HORA_ERR_INVALID_ARGUMENT, "path too long: %.200s", path);
  snprintf(base, base_cap, "%s", b);
  if (!s) snprintf(dir, dir_cap, ".");
  else if (s == path) snprintf(dir, dir_cap, "/");
  else snprintf(dir, dir_cap, "%.*s", (int)(s - path), path);
  return HORA_SUCCESS;
}
