/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secret.c: a shared secret read from a file (see common/secret.h).
 *
 * The file is opened first and checked through its descriptor (fstat), so
 * the checks and the read are of one and the same file; O_NONBLOCK keeps a
 * FIFO someone put at the path from hanging the caller (it is then refused
 * as not a regular file). A file that grows between fstat and read is still
 * bounded by cap.
 */
#include "common/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *secret_file_check(int fd, size_t cap) {
  struct stat st;
  if (fstat(fd, &st) != 0) return strerror(errno);
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (st.st_uid != geteuid()) return "owned by another user";
  if (st.st_mode & 077) return "other users can read or write it (chmod 600 it)";
  if ((uint64_t)st.st_size > cap) return "too long";
  return NULL;
}

int kvbm__secret_file_read(const char *path, uint8_t *buf, size_t cap, size_t *len,
                           kvbm_error *err) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return kvbm_error_set(err, KVBM_EINVAL, "key file %s: %s", path,
                          errno == ELOOP ? "is a symbolic link (refused)" : strerror(errno));
  const char *bad = secret_file_check(fd, cap);
  size_t got = 0;
  while (!bad && got < cap) {
    ssize_t n = read(fd, buf + got, cap - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) bad = strerror(errno);
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  if (bad && !strcmp(bad, "too long"))
    return kvbm_error_set(err, KVBM_EINVAL, "key file %s: longer than %zu bytes", path, cap);
  if (bad) return kvbm_error_set(err, KVBM_EINVAL, "key file %s: %s", path, bad);
  if (got && buf[got - 1] == '\n') got--;
  if (got && buf[got - 1] == '\r') got--;
  *len = got;
  return KVBM_OK;
}
