/* SPDX-License-Identifier: Apache-2.0 */
/*
 * file.c: the file:///DIR backend, one file per block, for directories
 * that several processes or machines share (a local disk, NFS, Lustre).
 *
 * Layout: DIR/<namespace>/<16 hex digits of the key>, mode 0600, the
 * namespace folder 0700 (with the empty namespace the files lie in DIR).
 * A file holds the value's bytes and nothing else: the size is the file's.
 *
 * Design. Every put writes a fresh temporary in the same folder, named
 * ".<key>.<128 random bits as hex, one token per I/O thread>.<count>.tmp"
 * and created with O_CREAT|O_EXCL (never an existing file, never through a
 * planted symlink), then renames it over the key. rename() is atomic within
 * a folder on POSIX file systems and on NFS, so a reader sees the old value
 * or the new one, whole, never a mix: two writers of one key (two workers
 * storing the same block at once) each rename a complete file and the last
 * one wins. A writer that dies leaves a ".*.tmp" file that no reader ever
 * opens (an operator may remove old ones); nothing else is left half-done.
 * No fsync: this is a cache, a block lost in a crash is a miss, and the
 * tier above checks every value it reads (MRDN frames).
 *
 * Everything is relative to a folder descriptor opened at register
 * (openat, renameat, unlinkat), so a path is resolved once and a rename of
 * DIR's parents cannot redirect writes. Reads open with O_NOFOLLOW and
 * O_NONBLOCK (a FIFO planted under a key cannot block the thread) and
 * refuse anything but a regular file: such an entry is reported as
 * corrupt, a counted miss. A value larger than max_value_bytes is refused
 * from its size before a byte is read.
 *
 * Deadlines: file I/O cannot be interrupted, so the deadline is checked
 * before each operation; on a hung NFS server a single operation can
 * outlast it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "volume/internal.h"

typedef struct fstate {
  int dirfd;
  uint64_t max_value;
  char token[33]; /* this state's random part of temporary names */
  uint64_t count;
} fstate;

static int open_dir(const kvbm__volume_ctx *ctx, fstate *f, kvbm_error *err) {
  const char *dir = ctx->url->path;
  int top = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  /* EEXIST: another process (a TP rank opening the same store) made it first */
  if (top < 0 && errno == ENOENT && (mkdir(dir, 0700) == 0 || errno == EEXIST))
    top = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (top < 0)
    return kvbm_error_set(err, KVBM_EIO, "volume: file://%s: cannot open the directory: %s", dir,
                          strerror(errno));
  if (!ctx->ns[0]) {
    f->dirfd = top;
    return KVBM_OK;
  }
  if (mkdirat(top, ctx->ns, 0700) != 0 && errno != EEXIST) {
    int e = errno;
    close(top);
    return kvbm_error_set(err, KVBM_EIO, "volume: file://%s: cannot create %s/: %s", dir,
                          ctx->ns, strerror(e));
  }
  f->dirfd = openat(top, ctx->ns, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  int e = errno;
  close(top);
  if (f->dirfd < 0)
    return kvbm_error_set(err, KVBM_EIO,
                          "volume: file://%s: cannot open %s/ (a directory, not a link): %s", dir,
                          ctx->ns, strerror(e));
  return KVBM_OK;
}

static int file_open(const kvbm_volume_config *cfg, void *user, void **state, kvbm_error *err) {
  (void)cfg;
  const kvbm__volume_ctx *ctx = user;
  fstate *f = calloc(1, sizeof *f);
  if (!f) return kvbm_error_set(err, KVBM_ENOMEM, "volume: out of memory");
  uint64_t r[2];
  if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
    /* No entropy source: the pid, the time and the state's address still
     * differ between live writers on one machine. */
    r[0] = (uint64_t)getpid() << 32 ^ kvbm_clock_ns();
    r[1] = (uint64_t)(uintptr_t)f;
  }
  kvbm__volume_hex(r[0], f->token);
  kvbm__volume_hex(r[1], f->token + 16);
  f->max_value = ctx->max_value_bytes;
  int rc = open_dir(ctx, f, err);
  if (rc) {
    free(f);
    return rc;
  }
  *state = f;
  return KVBM_OK;
}

static void file_close(void *state) {
  fstate *f = state;
  if (!f) return;
  close(f->dirfd);
  free(f);
}

static int errno_status(int e) {
  return e == ENOSPC || e == EDQUOT || e == EFBIG ? KVBM_ENOSPC : KVBM_EIO;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int do_put(fstate *f, const char *name, const kvbm_volume_op *op) {
  char tmp[96];
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 4; tries++) {
    snprintf(tmp, sizeof tmp, ".%s.%s.%llu.tmp", name, f->token, (unsigned long long)f->count++);
    fd = openat(f->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) return errno_status(errno);
  }
  if (fd < 0) return KVBM_EIO;
  int e = -write_all(fd, op->src, op->len);
  /* NFS reports a failed write back at close. */
  if (close(fd) != 0 && !e) e = errno;
  if (!e && renameat(f->dirfd, tmp, f->dirfd, name) != 0) e = errno;
  if (e) {
    unlinkat(f->dirfd, tmp, 0);
    return errno_status(e);
  }
  return KVBM_OK;
}

static int read_all(int fd, uint8_t *p, size_t n) {
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return KVBM_EIO;
    }
    if (r == 0) return KVBM_EIO; /* shrank under us: not this backend's files */
    p += r;
    n -= (size_t)r;
  }
  return KVBM_OK;
}

static int do_get(fstate *f, const char *name, kvbm_volume_op *op) {
  int fd = openat(f->dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return KVBM_ENOTFOUND;
    return errno == ELOOP || errno == ENXIO || errno == EISDIR ? KVBM__VOLUME_CORRUPT : KVBM_EIO;
  }
  struct stat st;
  int rc = KVBM_OK;
  if (fstat(fd, &st) != 0) rc = KVBM_EIO;
  else if (!S_ISREG(st.st_mode)) rc = KVBM__VOLUME_CORRUPT;
  else {
    op->size = (size_t)st.st_size;
    if ((uint64_t)st.st_size > f->max_value) rc = KVBM_ETOOLONG;
    else if ((size_t)st.st_size > op->cap) rc = KVBM_ENOSPC;
    else rc = read_all(fd, op->dst, (size_t)st.st_size);
  }
  close(fd);
  return rc;
}

static int do_exists(fstate *f, const char *name, kvbm_volume_op *op) {
  struct stat st;
  if (fstatat(f->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
    return errno == ENOENT ? KVBM_ENOTFOUND : KVBM_EIO;
  if (!S_ISREG(st.st_mode)) return KVBM__VOLUME_CORRUPT;
  op->size = (size_t)st.st_size;
  return KVBM_OK;
}

static int do_delete(fstate *f, const char *name) {
  if (unlinkat(f->dirfd, name, 0) == 0) return KVBM_OK;
  return errno == ENOENT ? KVBM_ENOTFOUND : KVBM_EIO;
}

static void file_run(void *state, kvbm_volume_op *ops, size_t n, uint64_t deadline_ns) {
  fstate *f = state;
  for (size_t i = 0; i < n; i++) {
    kvbm_volume_op *op = &ops[i];
    if (kvbm_clock_ns() >= deadline_ns) {
      op->status = KVBM_ETIMEDOUT;
      continue;
    }
    char name[17];
    kvbm__volume_hex(op->key, name);
    switch (op->kind) {
    case KVBM_VOLUME_PUT: op->status = do_put(f, name, op); break;
    case KVBM_VOLUME_GET: op->status = do_get(f, name, op); break;
    case KVBM_VOLUME_EXISTS: op->status = do_exists(f, name, op); break;
    case KVBM_VOLUME_DELETE: op->status = do_delete(f, name); break;
    }
  }
}

const kvbm_volume_backend kvbm__volume_file_backend = {
    .scheme = "file",
    .max_threads = 0,
    .open = file_open,
    .run = file_run,
    .close = file_close,
};
