/* Directories and files hora creates or writes into on the job's behalf (checkpoints, timeline,
 * TensorBoard events, GPU monitor logs, record files). On a shared node other users share /tmp
 * and $TMPDIR, so every such directory is checked the way OpenSSH (StrictModes) and PostgreSQL
 * (the data directory) check theirs, and every file is created so that no path component can be
 * swapped between the check and the write:
 *   - each directory on the way, the last one included, is owned by the job's user (effective
 *     uid) or root, and is not writable by group or others unless it has the sticky bit (/tmp);
 *     a symlink on the way must be owned by the user or root, and its target is checked the same
 *     way;
 *   - the check returns an open directory fd; files are then created with openat(O_CREAT |
 *     O_EXCL | O_NOFOLLOW) under an unpredictable temporary name (".tmp-<base>.<16 random hex
 *     digits>") and renamed with renameat inside that same directory;
 *   - directories hora creates get hora__dir_mode() (0700) and files hora__file_mode() (0600),
 *     widened by HORA_FILE_MODE (0640/0644: group- or world-readable, never writable).
 * Every failure is HORA_ERR_IO with a message naming the path, its owner and mode, and what to do.
 * Depends on libc only (and core's errors and params). */
#ifndef HORA_CORE_SAFEFS_H
#define HORA_CORE_SAFEFS_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "core/internal.h"

#define HORA_TMP_PREFIX ".tmp-"

/* HORA_FILE_MODE (0600 by default, or 0640, 0644), and the directory mode that goes with it
 * (0700, 0750, 0755). The process umask may narrow both further. */
mode_t hora__file_mode(void);
mode_t hora__dir_mode(void);

/* The ownership and mode rule for one directory whose stat is *st (path only names it in the
 * message). HORA_ERR_IO when it fails. */
hora_result_t hora__dir_check_stat(const struct stat *st, const char *path);

/* Walk `path` from / (relative paths from the working directory), checking every directory and
 * symlink on the way; with `create`, missing directories are made (hora__dir_mode(), each new
 * entry fsynced into its parent). On success *dirfd is an O_RDONLY|O_DIRECTORY fd of the checked
 * directory (the caller closes it). HORA_ERR_NOT_FOUND when a component is missing and !create;
 * HORA_ERR_IO for a failed check, a non-directory or a system error; HORA_ERR_INVALID_ARGUMENT for
 * an empty path. */
hora_result_t hora__dir_open(const char *path, int create, int *dirfd);

/* The entry `name` (no '/') of an already checked directory dirfd (dirpath names it in
 * messages) as a checked directory: never a symlink; created when missing and `create`
 * (hora__dir_mode(), parent fsynced). *fd as for hora__dir_open. HORA_ERR_NOT_FOUND when missing
 * and !create. */
hora_result_t hora__subdir_open(int dirfd, const char *dirpath, const char *name, int create, int *fd);

/* 1 when `name` exists in dirfd (any type, symlinks not followed), else 0; logs nothing (for
 * entries whose absence is normal, before hora__subdir_open(..., 0, ...)). */
int hora__entry_exists(int dirfd, const char *name);

/* Create a new file in dirfd with an unpredictable name ".tmp-<base>.<16 hex digits>" (written
 * to name, cap bytes), O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC|flags (flags: O_WRONLY or O_RDWR,
 * optionally O_APPEND), mode hora__file_mode(). HORA_ERR_IO naming dirpath/name. */
hora_result_t hora__file_create_tmp(int dirfd, const char *dirpath, const char *base, int flags, char *name,
                                    size_t cap, int *fd);

/* Create `name` itself (no temporary name) in dirfd, failing if it exists; as above otherwise. */
hora_result_t hora__file_create_excl(int dirfd, const char *dirpath, const char *name, int flags, int *fd);

/* Open `name` of dirfd for writing from its start, creating it (mode hora__file_mode()) or
 * truncating it, for a log that is read while it grows (no temporary name): never through a
 * symlink (O_NOFOLLOW), and an existing file must be a regular file owned by the caller
 * (checked before truncating). HORA_ERR_IO naming the file otherwise. */
hora_result_t hora__file_open_log(int dirfd, const char *dirpath, const char *name, int *fd);

/* renameat(dirfd, tmp, dirfd, name), then fsync dirfd so the rename is durable. */
hora_result_t hora__file_commit(int dirfd, const char *dirpath, const char *tmp, const char *name);

/* A small file written atomically in dirfd: temporary file, write, fsync, rename, fsync dir. */
hora_result_t hora__file_write_atomic(int dirfd, const char *dirpath, const char *name, const void *p, size_t n);

/* Open the regular file `name` of dirfd for reading, never through a symlink (O_NOFOLLOW).
 * HORA_ERR_NOT_FOUND when missing, HORA_ERR_IO otherwise (a symlink or not a regular file). */
hora_result_t hora__file_open_read(int dirfd, const char *dirpath, const char *name, int *fd);

/* write() all n bytes (retrying EINTR and short writes); HORA_ERR_IO naming `what`. */
hora_result_t hora__write_all(int fd, const void *p, size_t n, const char *what);

/* Split a file path into its directory ("." when none) and last component; HORA_ERR_INVALID_ARGUMENT
 * when the path is empty or ends with '/'. */
hora_result_t hora__path_split(const char *path, char *dir, size_t dir_cap, char *base, size_t base_cap);

#endif
