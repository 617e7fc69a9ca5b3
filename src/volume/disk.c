/* SPDX-License-Identifier: Apache-2.0 */
/*
 * disk.c: the G3 slot file (see volume/disk.h).
 *
 * Design: one file, fixed geometry, slots addressed by index, so the index
 * of what is stored lives in memory (the manager's G3 pool) and the file
 * needs no allocator of its own. Every slot write carries its own header
 * and checksums, written in the same request as the data, so a slot is
 * either whole or detectably broken: no separate journal, no fsync
 * ordering to get right. The price is a header's worth of padding per slot
 * (the slot is rounded up to 4096 for O_DIRECT) and that the index must be
 * rebuilt by a scan after a restart (sequential reads of the whole file).
 *
 * I/O goes through one io_uring whose depth bounds the requests in flight;
 * where io_uring cannot be set up we fall back to pread/pwrite, and where
 * O_DIRECT is refused (tmpfs) to the page cache. A slot is data then header,
 * so when the block size is a multiple of the page the data moves straight
 * between the tier's (aligned) memory and the disk with a vectored request
 * whose last piece is the header page; otherwise the caller stages the
 * whole slot in an aligned buffer, so O_DIRECT's rules hold for any block
 * size. Finished requests are handed back one at a time (kvbm__disk_reap) so
 * the caller can check one slot while the next ones are still in flight.
 */
#include "volume/disk.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvbm/blake3.h"
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#include "common/bytes.h"

#define SLOT_MAGIC "KVBMSLT1"  /* record v1: untagged */
#define SLOT_MAGIC2 "KVBMSLT2" /* record v2: a tag in flags bits 8..15 */
#define LABEL_OFF 64u           /* the superblock's label area */
#define LABEL_SUM_OFF (LABEL_OFF + 4u + 256u)
#define LABEL_END (LABEL_SUM_OFF + 8u)
#define FILE_MAGIC "KVBMG3F1"
#define FILE_VERSION 1u

struct kvbm_disk {
  int fd;
  uint64_t num_slots, data_bytes, slot_size, fingerprint;
  uint64_t next_seq;
  bool direct, uring, prealloc, reused;
  struct io_uring ring;
  uint32_t depth, inflight;
  kvbm__disk_io **done; /* finished, not yet reaped: a ring of 2 * depth + 2 */
  uint32_t done_head, done_count, done_cap;
  bool keyed;                 /* keyed BLAKE3 sums with key[] (else XXH3) */
  uint8_t key[KVBM_DISK_KEY_LEN];
  char label[KVBM_DISK_LABEL_MAX + 1]; /* the writer's ("" none) */
  char dir[PATH_MAX];
  char path[PATH_MAX + 32];
};


uint64_t kvbm__disk_slot_size(const kvbm_disk *d) { return d->slot_size; }
uint64_t kvbm__disk_num_slots(const kvbm_disk *d) { return d->num_slots; }
bool kvbm__disk_is_direct(const kvbm_disk *d) { return d->direct; }
bool kvbm__disk_is_uring(const kvbm_disk *d) { return d->uring; }
bool kvbm__disk_preallocated(const kvbm_disk *d) { return d->prealloc; }
bool kvbm__disk_reused(const kvbm_disk *d) { return d->reused; }
const char *kvbm__disk_path(const kvbm_disk *d) { return d->path; }

void *kvbm__disk_buffer(const kvbm_disk *d) {
  void *p = NULL;
  if (posix_memalign(&p, KVBM_DISK_ALIGN, d->slot_size)) return NULL;
  return p;
}

static uint64_t slot_offset(const kvbm_disk *d, uint64_t slot) {
  return KVBM_DISK_ALIGN + slot * d->slot_size;
}

/* Whole-buffer pread/pwrite; short or failed transfers become -errno. */
static int sync_io(int fd, void *buf, size_t len, uint64_t off, bool write) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = write ? pwrite(fd, (char *)buf + done, len - done, (off_t)(off + done))
                      : pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO; /* read past the end: the slot was never written */
    done += (size_t)n;
  }
  return 0;
}

/* Whole vectored transfer: a short one is an error (a full disk or a size
 * limit for a write, the end of the file for a read). */
static int sync_iov(int fd, const struct iovec *iov, int cnt, size_t len, uint64_t off, bool write) {
  ssize_t n;
  do n = write ? pwritev(fd, iov, cnt, (off_t)off) : preadv(fd, iov, cnt, (off_t)off);
  while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  if ((size_t)n != len) return write ? -ENOSPC : -EIO;
  return 0;
}

/* A 64-bit sum of bytes: keyed BLAKE3 (a MAC) with a key, else XXH3. */
static uint64_t sum64(const kvbm_disk *d, const void *p, size_t n) {
  if (!d->keyed) return XXH3_64bits(p, n);
  uint8_t out[8];
  kvbm_blake3_keyed_hash(d->key, p, n, out, sizeof out);
  return kvbm__get_le64(out);
}

/* Names the key in the superblock without revealing it, so that a file
 * written under another key (or none) starts cold instead of failing every
 * slot. 0 without a key. */
static uint64_t key_id(const kvbm_disk *d) {
  if (!d->keyed) return 0;
  static const char tag[] = "kvbm g3 slot key id";
  uint64_t id = sum64(d, tag, sizeof tag - 1);
  return id ? id : 1;
}

static void encode_super(const kvbm_disk *d, uint8_t *sb) {
  memset(sb, 0, KVBM_DISK_ALIGN);
  memcpy(sb, FILE_MAGIC, 8);
  kvbm__put_le32(sb + 8, FILE_VERSION);
  kvbm__put_le64(sb + 16, d->slot_size);
  kvbm__put_le64(sb + 24, d->num_slots);
  kvbm__put_le64(sb + 32, d->data_bytes);
  kvbm__put_le64(sb + 40, d->fingerprint);
  kvbm__put_le64(sb + 48, XXH3_64bits(sb, 48));
  kvbm__put_le64(sb + 56, key_id(d));
  size_t n = strlen(d->label);
  if (n) { /* no label: the area stays zero, the superblock as before labels */
    kvbm__put_le32(sb + LABEL_OFF, (uint32_t)n);
    memcpy(sb + LABEL_OFF + 4, d->label, n);
    kvbm__put_le64(sb + LABEL_SUM_OFF, XXH3_64bits(sb + LABEL_OFF, LABEL_SUM_OFF - LABEL_OFF));
  }
}

/* What an existing superblock's label area says. */
typedef enum { LABEL_NONE, LABEL_VALID, LABEL_DAMAGED } label_state;

static bool all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return false;
  return true;
}

/* Reads the label of superblock sb into out (KVBM_DISK_LABEL_MAX + 1
 * bytes): all zero is none; a length in range, the bytes after it zero
 * (one encoding), no NUL inside and the sum right is a label; anything
 * else is damage. The bytes are the file's: nothing is trusted before
 * these checks. */
static label_state read_label(const uint8_t *sb, char *out) {
  out[0] = 0;
  if (all_zero(sb + LABEL_OFF, LABEL_END - LABEL_OFF)) return LABEL_NONE;
  uint32_t n = kvbm__get_le32(sb + LABEL_OFF);
  const uint8_t *p = sb + LABEL_OFF + 4;
  if (n == 0 || n > KVBM_DISK_LABEL_MAX || memchr(p, 0, n) || !all_zero(p + n, 256 - n) ||
      kvbm__get_le64(sb + LABEL_SUM_OFF) != XXH3_64bits(sb + LABEL_OFF, LABEL_SUM_OFF - LABEL_OFF))
    return LABEL_DAMAGED;
  memcpy(out, p, n);
  out[n] = 0;
  return LABEL_VALID;
}

/* ---- Where the file lives (see "Files and who may touch them" above) ---- */

/* Opens the directory: cfg->dir, or the default private one, created 0700
 * if missing and never followed through a link. `strict`: nobody else may
 * add, remove or replace entries in it (owner us, no group/other write);
 * the default directory must besides be private (0700; ours is tightened). */
static int open_dir(kvbm_disk *d, const kvbm__disk_config *cfg, int *out, kvbm_error *err) {
  bool dflt = !cfg->dir, strict = dflt || cfg->persist;
  if (dflt) {
    const char *parent = cfg->test_default_parent ? cfg->test_default_parent : KVBM_DISK_DEFAULT_PARENT;
    if (snprintf(d->dir, sizeof d->dir, "%s/kvbm-%u", parent, (unsigned)geteuid()) >= (int)sizeof d->dir)
      return kvbm_error_set(err, KVBM_EINVAL, "disk: directory path too long");
    if (mkdir(d->dir, 0700) != 0 && errno != EEXIST)
      return kvbm_error_set(err, KVBM_EIO, "disk: cannot create %s: %s", d->dir, strerror(errno));
  } else if (snprintf(d->dir, sizeof d->dir, "%s", cfg->dir) >= (int)sizeof d->dir) {
    return kvbm_error_set(err, KVBM_EINVAL, "disk: directory path too long");
  }
  int fd = open(d->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (dflt ? O_NOFOLLOW : 0));
  if (fd < 0) {
    int e = errno;
    struct stat ls;
    bool link = dflt && lstat(d->dir, &ls) == 0 && S_ISLNK(ls.st_mode); /* ENOTDIR or ELOOP */
    return kvbm_error_set(err, KVBM_EIO, "disk: cannot open the directory %s: %s", d->dir,
                          link ? "it is a symbolic link (refused)" : strerror(e));
  }
  struct stat st;
  const char *bad = NULL;
  char why[160];
  if (fstat(fd, &st) != 0) {
    bad = strerror(errno);
  } else if (strict && st.st_uid != geteuid()) {
    snprintf(why, sizeof why, "owned by uid %u, not by this user (uid %u)", (unsigned)st.st_uid,
             (unsigned)geteuid());
    bad = why;
  } else if (dflt && (st.st_mode & 077) && fchmod(fd, 0700) != 0) {
    bad = "not private (0700) and cannot be made so";
  } else if (!dflt && strict && (st.st_mode & 022)) {
    snprintf(why, sizeof why, "writable by other users (mode %04o): a persistent file needs a directory "
             "only its owner can change", (unsigned)(st.st_mode & 07777));
    bad = why;
  }
  if (bad) {
    close(fd);
    return kvbm_error_set(err, KVBM_EIO, "disk: refusing the directory %s: %s", d->dir, bad);
  }
  *out = fd;
  return KVBM_OK;
}

/* Turns on O_DIRECT for fd when asked and possible (fcntl, so that a
 * refusal never leaves a half-created file behind). */
static void try_direct(kvbm_disk *d, const kvbm__disk_config *cfg) {
  d->direct = false;
  if (!cfg->direct || (cfg->test_refuse & KVBM_DISK_REFUSE_O_DIRECT)) return;
  int fl = fcntl(d->fd, F_GETFL);
  d->direct = fl >= 0 && fcntl(d->fd, F_SETFL, fl | O_DIRECT) == 0;
}

/* Creates a new file of a fresh random name in dfd, exclusively (O_EXCL:
 * never an existing file or a link), mode 0600. */
static int create_excl(int dfd, const char *prefix, char *name, size_t cap, int *out, kvbm_error *err) {
  for (int tries = 0; tries < 64; tries++) {
    uint8_t r[6];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
      return kvbm_error_set(err, KVBM_EIO, "disk: getrandom: %s", strerror(errno));
    snprintf(name, cap, "%s%02x%02x%02x%02x%02x%02x", prefix, r[0], r[1], r[2], r[3], r[4], r[5]);
    int fd = openat(dfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      *out = fd;
      return KVBM_OK;
    }
    if (errno != EEXIST) return kvbm_error_set(err, KVBM_EIO, "disk: cannot create a file: %s", strerror(errno));
  }
  return kvbm_error_set(err, KVBM_EIO, "disk: cannot find a free file name");
}

/* An existing persistent file is used only if it is a regular file of
 * ours with no other name; a looser mode (0644 from older versions) is
 * tightened to 0600. */
static int check_existing(kvbm_disk *d, kvbm_error *err) {
  struct stat st;
  const char *bad = NULL;
  char why[128];
  if (fstat(d->fd, &st) != 0) {
    bad = strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    bad = "not a regular file";
  } else if (st.st_uid != geteuid()) {
    snprintf(why, sizeof why, "owned by uid %u, not by this user (uid %u)", (unsigned)st.st_uid,
             (unsigned)geteuid());
    bad = why;
  } else if (st.st_nlink != 1) {
    bad = "it has other names (hard links)";
  } else if ((st.st_mode & 077) && fchmod(d->fd, 0600) != 0) {
    bad = "readable by other users and cannot be made private";
  }
  if (bad) return kvbm_error_set(err, KVBM_EIO, "disk: refusing %s: %s", d->path, bad);
  return KVBM_OK;
}

static int lock_file(kvbm_disk *d, kvbm_error *err) {
  if (flock(d->fd, LOCK_EX | LOCK_NB) != 0)
    return kvbm_error_set(err, KVBM_EIO, "disk: %s is in use by another process: %s", d->path, strerror(errno));
  return KVBM_OK;
}

static int init_file(kvbm_disk *d, kvbm_error *err);

/* Puts the new file `tmp` in place under the persistent name, never over
 * an existing one (RENAME_NOREPLACE, or link + unlink where the filesystem
 * lacks it). EEXIST when another process got there first. */
static int publish(int dfd, const char *tmp) {
  if (renameat2(dfd, tmp, dfd, KVBM_DISK_FILE_NAME, RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return errno;
  if (linkat(dfd, tmp, dfd, KVBM_DISK_FILE_NAME, 0) != 0) return errno;
  unlinkat(dfd, tmp, 0);
  return 0;
}

/* The persistent file: the existing one (checked), or a new one created
 * exclusively under a temporary name, initialised, locked, and only then
 * renamed into place, so the name never shows a half-made file and is
 * never opened through a link. */
static int open_persistent(kvbm_disk *d, const kvbm__disk_config *cfg, int dfd, kvbm_error *err) {
  if (snprintf(d->path, sizeof d->path, "%s/%s", d->dir, KVBM_DISK_FILE_NAME) >= (int)sizeof d->path)
    return kvbm_error_set(err, KVBM_EINVAL, "disk: directory path too long");
  for (int attempt = 0; attempt < 2; attempt++) {
    d->fd = openat(dfd, KVBM_DISK_FILE_NAME, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (d->fd >= 0) {
      int rc = check_existing(d, err);
      if (!rc) rc = lock_file(d, err);
      if (rc) return rc;
      try_direct(d, cfg);
      return init_file(d, err);
    }
    if (errno == ELOOP)
      return kvbm_error_set(err, KVBM_EIO, "disk: refusing %s: it is a symbolic link", d->path);
    if (errno != ENOENT) return kvbm_error_set(err, KVBM_EIO, "disk: cannot open %s: %s", d->path, strerror(errno));
    char tmp[64];
    int rc = create_excl(dfd, "." KVBM_DISK_FILE_NAME ".", tmp, sizeof tmp, &d->fd, err);
    if (rc) return rc;
    rc = lock_file(d, err);
    if (!rc) {
      try_direct(d, cfg);
      rc = init_file(d, err);
    }
    int e = rc ? 0 : publish(dfd, tmp);
    if (rc || e) {
      unlinkat(dfd, tmp, 0);
      close(d->fd);
      d->fd = -1;
    }
    if (rc) return rc;
    if (!e) return KVBM_OK;
    if (e != EEXIST) return kvbm_error_set(err, KVBM_EIO, "disk: cannot name %s: %s", d->path, strerror(e));
    /* someone created it meanwhile: open theirs (and find it locked) */
  }
  return kvbm_error_set(err, KVBM_EIO, "disk: %s keeps changing under us", d->path);
}

/* Opens the file: the persistent name, or a fresh file unlinked at once. */
static int open_file(kvbm_disk *d, const kvbm__disk_config *cfg, kvbm_error *err) {
  int dfd = -1;
  d->fd = -1;
  int rc = open_dir(d, cfg, &dfd, err);
  if (rc) return rc;
  if (cfg->persist) {
    rc = open_persistent(d, cfg, dfd, err);
  } else {
    char tmp[64];
    rc = create_excl(dfd, "kvbm-g3-", tmp, sizeof tmp, &d->fd, err);
    if (!rc) {
      unlinkat(dfd, tmp, 0);
      d->path[0] = 0;
      try_direct(d, cfg);
      rc = init_file(d, err);
    }
  }
  close(dfd);
  return rc;
}

/* Whether the existing superblock `old` can be kept under ours (`sb`):
 * the same geometry (bytes 0..64, nothing after the label area) and a
 * label that is ours or none. A valid label of another writer is refused
 * (KVBM_EFORMAT): its slots' tags mean something else, and starting anew
 * would destroy them without a word. *relabel: keep it but write ours. */
static int may_reuse(const kvbm_disk *d, const uint8_t *old, const uint8_t *sb, bool *reuse,
                     bool *relabel, kvbm_error *err) {
  char theirs[KVBM_DISK_LABEL_MAX + 1];
  *reuse = *relabel = false;
  if (memcmp(old, sb, LABEL_OFF) || !all_zero(old + LABEL_END, KVBM_DISK_ALIGN - LABEL_END))
    return KVBM_OK; /* another geometry, or not ours: anew */
  label_state ls = read_label(old, theirs);
  if (ls == LABEL_DAMAGED) return KVBM_OK; /* anew, as a damaged geometry */
  if (ls == LABEL_VALID && strcmp(theirs, d->label))
    return kvbm_error_set(err, KVBM_EFORMAT,
                          "disk: %s was written under \"%s\", not \"%s\": its blocks' tags mean "
                          "something else (remove the file or use another directory)",
                          d->path, theirs, d->label[0] ? d->label : "(no label)");
  *reuse = true;
  *relabel = ls == LABEL_NONE && d->label[0];
  return KVBM_OK;
}

/* Keeps an existing file of the same geometry; otherwise starts it anew. */
static int init_file(kvbm_disk *d, kvbm_error *err) {
  uint8_t *sb = NULL, *old = NULL;
  if (posix_memalign((void **)&sb, KVBM_DISK_ALIGN, KVBM_DISK_ALIGN) ||
      posix_memalign((void **)&old, KVBM_DISK_ALIGN, KVBM_DISK_ALIGN)) {
    free(sb);
    return kvbm_error_set(err, KVBM_ENOMEM, "disk: out of memory");
  }
  encode_super(d, sb);
  bool relabel = false;
  int rc = KVBM_OK;
  d->reused = false;
  if (sync_io(d->fd, old, KVBM_DISK_ALIGN, 0, false) == 0)
    rc = may_reuse(d, old, sb, &d->reused, &relabel, err);
  uint64_t size = slot_offset(d, d->num_slots);
  if (!rc && !d->reused) {
    /* A different or broken file: drop every old slot before reuse. */
    if (ftruncate(d->fd, 0) != 0)
      rc = kvbm_error_set(err, KVBM_EIO, "disk: cannot truncate %s: %s", d->path, strerror(errno));
  }
  if (!rc && (!d->reused || relabel)) {
    int w = sync_io(d->fd, sb, KVBM_DISK_ALIGN, 0, true);
    if (w) rc = kvbm_error_set(err, KVBM_EIO, "disk: cannot write the superblock: %s", strerror(-w));
  }
  if (!rc) {
    /* Disk full or a file size limit is not fatal: the file grows as
     * slots are written and writes past the limit fail one by one. */
    d->prealloc = fallocate(d->fd, 0, 0, (off_t)size) == 0;
  }
  free(sb);
  free(old);
  return rc;
}

int kvbm__disk_open(const kvbm__disk_config *cfg, kvbm_disk **out, kvbm_error *err) {
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "disk: NULL argument");
  if (cfg->num_slots == 0 || cfg->data_bytes == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "disk: num_slots and data_bytes must be >= 1");
  if (cfg->queue_depth == 0 || cfg->queue_depth > 256)
    return kvbm_error_set(err, KVBM_EINVAL, "disk: queue_depth %u is not in 1..256",
                          cfg->queue_depth);
  if (cfg->data_bytes > (UINT64_C(1) << 40))
    return kvbm_error_set(err, KVBM_EOVERFLOW, "disk: data_bytes too large");
  if (cfg->label && (strlen(cfg->label) > KVBM_DISK_LABEL_MAX))
    return kvbm_error_set(err, KVBM_EINVAL, "disk: a label of %zu bytes (at most %u)",
                          strlen(cfg->label), KVBM_DISK_LABEL_MAX);
  uint64_t slot = (cfg->data_bytes + KVBM_DISK_HEADER + KVBM_DISK_ALIGN - 1) &
                  ~(uint64_t)(KVBM_DISK_ALIGN - 1);
  if (cfg->num_slots > (uint64_t)(INT64_MAX / 2) / slot)
    return kvbm_error_set(err, KVBM_EOVERFLOW, "disk: %llu slots of %llu bytes overflow",
                          (unsigned long long)cfg->num_slots, (unsigned long long)slot);
  kvbm_disk *d = calloc(1, sizeof *d);
  if (!d) return kvbm_error_set(err, KVBM_ENOMEM, "disk: out of memory");
  d->num_slots = cfg->num_slots;
  d->data_bytes = cfg->data_bytes;
  d->slot_size = slot;
  d->fingerprint = cfg->fingerprint;
  d->next_seq = 1;
  d->depth = cfg->queue_depth;
  if (cfg->label) snprintf(d->label, sizeof d->label, "%s", cfg->label);
  if (cfg->checksum_key) {
    d->keyed = true;
    memcpy(d->key, cfg->checksum_key, sizeof d->key);
  }
  int rc = open_file(d, cfg, err);
  if (rc) {
    if (d->fd >= 0) close(d->fd);
    explicit_bzero(d->key, sizeof d->key);
    free(d);
    return rc;
  }
  d->done_cap = 2 * d->depth + 2;
  d->done = calloc(d->done_cap, sizeof *d->done);
  if (!d->done) {
    close(d->fd);
    free(d);
    return kvbm_error_set(err, KVBM_ENOMEM, "disk: out of memory");
  }
  /* No io_uring (old kernel, seccomp, or test_refuse): pread/pwrite. */
  d->uring = cfg->uring && !(cfg->test_refuse & KVBM_DISK_REFUSE_URING) &&
             io_uring_queue_init(d->depth, &d->ring, 0) == 0;
  *out = d;
  return KVBM_OK;
}

void kvbm__disk_close(kvbm_disk *d) {
  if (!d) return;
  kvbm__disk_finish(d);
  if (d->uring) io_uring_queue_exit(&d->ring);
  close(d->fd);
  free(d->done);
  explicit_bzero(d->key, sizeof d->key);
  free(d);
}

bool kvbm__disk_direct_ok(const kvbm_disk *d, const void *p, size_t len) {
  return d->data_bytes % KVBM_DISK_ALIGN == 0 && (uintptr_t)p % KVBM_DISK_ALIGN == 0 &&
         len % KVBM_DISK_ALIGN == 0 && len > 0;
}

/* The header's place: after the data in the buffer, or the buffer's start
 * when the data is elsewhere. */
static uint8_t *hdr_of(const kvbm_disk *d, const void *buf, const kvbm__disk_data *data) {
  return (uint8_t *)buf + (data && data->iov ? 0 : d->data_bytes);
}

static uint64_t data_sum(const kvbm_disk *d, const void *buf, const kvbm__disk_data *data) {
  if (!data || !data->iov) return sum64(d, buf, d->data_bytes);
  if (d->keyed) {
    kvbm_blake3_hasher h;
    kvbm_blake3_hasher_init_keyed(&h, d->key);
    for (int i = 0; i < data->iovcnt; i++) kvbm_blake3_hasher_update(&h, data->iov[i].iov_base, data->iov[i].iov_len);
    uint8_t out[8];
    kvbm_blake3_hasher_finalize(&h, out, sizeof out);
    explicit_bzero(&h, sizeof h);
    return kvbm__get_le64(out);
  }
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  for (int i = 0; i < data->iovcnt; i++)
    XXH3_64bits_update(&st, data->iov[i].iov_base, data->iov[i].iov_len);
  return XXH3_64bits_digest(&st);
}

/* Bytes of the slot after the data that the buffer supplies. */
static size_t tail_len(const kvbm_disk *d) { return (size_t)(d->slot_size - d->data_bytes); }

void kvbm__disk_seal(kvbm_disk *d, void *buf, const kvbm__disk_data *data,
                    const kvbm_slot_header *h) {
  uint8_t *p = hdr_of(d, buf, data);
  memcpy(p, h->tag ? SLOT_MAGIC2 : SLOT_MAGIC, 8); /* untagged: v1, as before tags */
  kvbm__put_le64(p + 8, h->seq_hash);
  kvbm__put_le64(p + 16, h->has_parent ? h->parent_hash : 0);
  kvbm__put_le32(p + 24, (h->has_parent ? 1u : 0u) | (uint32_t)h->tag << 8);
  kvbm__put_le32(p + 28, (uint32_t)d->data_bytes);
  kvbm__put_le64(p + 32, d->fingerprint);
  kvbm__put_le64(p + 40, d->next_seq++);
  kvbm__put_le64(p + 48, data_sum(d, buf, data));
  kvbm__put_le64(p + 56, sum64(d, p, 56));
  memset(p + KVBM_DISK_HEADER, 0, tail_len(d) - KVBM_DISK_HEADER);
}

int kvbm__disk_check(const kvbm_disk *d, const void *buf, const kvbm__disk_data *data,
                    bool check_data, const uint64_t *expect_hash, kvbm_slot_header *h) {
  const uint8_t *p = hdr_of(d, buf, data);
  bool v2 = memcmp(p, SLOT_MAGIC2, 8) == 0;
  if (!v2 && memcmp(p, SLOT_MAGIC, 8) != 0) return KVBM_EMAGIC;
  if (kvbm__get_le64(p + 56) != sum64(d, p, 56)) return KVBM_ECHECKSUM;
  uint32_t flags = kvbm__get_le32(p + 24), tag = (flags >> 8) & 0xFFu;
  /* One encoding per header: v1 has bit 0 only, v2 a tag 1..255 besides. */
  bool flags_ok = v2 ? (flags & ~0xFF01u) == 0 && tag != 0 : (flags & ~1u) == 0;
  if (kvbm__get_le64(p + 32) != d->fingerprint || kvbm__get_le32(p + 28) != d->data_bytes || !flags_ok)
    return KVBM_EFORMAT;
  if (expect_hash && kvbm__get_le64(p + 8) != *expect_hash) return KVBM_ENOTFOUND;
  if (check_data && kvbm__get_le64(p + 48) != data_sum(d, buf, data)) return KVBM_ECHECKSUM;
  if (h) {
    h->seq_hash = kvbm__get_le64(p + 8);
    h->parent_hash = kvbm__get_le64(p + 16);
    h->has_parent = flags & 1u;
    h->tag = (uint8_t)tag;
    h->write_seq = kvbm__get_le64(p + 40);
  }
  return KVBM_OK;
}

static void push_done(kvbm_disk *d, kvbm__disk_io *io) {
  d->done[(d->done_head + d->done_count) % d->done_cap] = io;
  d->done_count++;
}

/* Moves one finished request from the ring to the done list (blocking). */
static void reap_one(kvbm_disk *d) {
  struct io_uring_cqe *cqe;
  kvbm__disk_io *io;
  for (;;) {
    int r;
    do r = io_uring_wait_cqe(&d->ring, &cqe);
    while (r == -EINTR);
    if (r < 0) return; /* cannot happen with requests in flight */
    io = io_uring_cqe_get_data(cqe);
    if ((void *)io != (void *)d) break;
    io_uring_cqe_seen(&d->ring, cqe); /* a no-op left by a refused submission */
  }
  int res = cqe->res;
  if (res < 0)
    io->result = res;
  else /* short: a write stopped by a full disk or a size limit, a read past the end */
    io->result = (uint64_t)res == d->slot_size ? 0 : io->write ? -ENOSPC : -EIO;
  io_uring_cqe_seen(&d->ring, cqe);
  d->inflight--;
  push_done(d, io);
}

/* Fills io->iov with the slot's pieces; returns their count or -1. */
static int build_iov(const kvbm_disk *d, kvbm__disk_io *io) {
  if (!io->data.iov) {
    io->iov[0] = (struct iovec){io->buf, (size_t)d->slot_size};
    return 1;
  }
  if (io->data.iovcnt < 1 || io->data.iovcnt > KVBM_DISK_MAX_IOV) return -1;
  size_t total = 0;
  for (int i = 0; i < io->data.iovcnt; i++) {
    if (!kvbm__disk_direct_ok(d, io->data.iov[i].iov_base, io->data.iov[i].iov_len)) return -1;
    io->iov[i] = io->data.iov[i];
    total += io->data.iov[i].iov_len;
  }
  if (total != d->data_bytes) return -1;
  io->iov[io->data.iovcnt] = (struct iovec){io->buf, tail_len(d)};
  return io->data.iovcnt + 1;
}

int kvbm__disk_begin(kvbm_disk *d, kvbm__disk_io *io) {
  if (!d || !io || !io->buf || io->slot >= d->num_slots) return KVBM_EINVAL;
  int cnt = build_iov(d, io);
  if (cnt < 0) return KVBM_EINVAL;
  uint64_t off = slot_offset(d, io->slot);
  if (d->inflight + d->done_count >= d->done_cap - 1) return KVBM_EAGAIN; /* reap first */
  if (d->uring && d->inflight == d->depth) reap_one(d);
  struct io_uring_sqe *sqe = d->uring ? io_uring_get_sqe(&d->ring) : NULL;
  if (!sqe) { /* no io_uring (or no free entry): do it now */
    io->result = sync_iov(d->fd, io->iov, cnt, (size_t)d->slot_size, off, io->write);
    push_done(d, io);
    return KVBM_OK;
  }
  if (io->write)
    io_uring_prep_writev(sqe, d->fd, io->iov, (unsigned)cnt, off);
  else
    io_uring_prep_readv(sqe, d->fd, io->iov, (unsigned)cnt, off);
  io_uring_sqe_set_data(sqe, io);
  if (io_uring_submit(&d->ring) < 1) {
    /* Submission refused: the entry becomes a no-op (marked with the disk
     * itself, ignored by the reaper) and the transfer runs synchronously. */
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, d);
    io->result = sync_iov(d->fd, io->iov, cnt, (size_t)d->slot_size, off, io->write);
    push_done(d, io);
    return KVBM_OK;
  }
  d->inflight++;
  return KVBM_OK;
}

uint32_t kvbm__disk_pending(const kvbm_disk *d) { return d ? d->inflight + d->done_count : 0; }

kvbm__disk_io *kvbm__disk_reap(kvbm_disk *d) {
  if (!d) return NULL;
  if (!d->done_count && d->inflight) reap_one(d);
  if (!d->done_count) return NULL;
  kvbm__disk_io *io = d->done[d->done_head];
  d->done_head = (d->done_head + 1) % d->done_cap;
  d->done_count--;
  return io;
}

void kvbm__disk_finish(kvbm_disk *d) {
  while (d && kvbm__disk_reap(d)) {
  }
}

int kvbm__disk_scan(kvbm_disk *d, bool check_data,
                   void (*fn)(void *user, uint64_t slot, const kvbm_slot_header *h),
                   void *user, uint64_t *bad, kvbm_error *err) {
  if (!d || !fn) return kvbm_error_set(err, KVBM_EINVAL, "disk: NULL argument");
  uint64_t nbad = 0;
  if (d->reused) {
    void *buf = kvbm__disk_buffer(d);
    if (!buf) return kvbm_error_set(err, KVBM_ENOMEM, "disk: out of memory");
    for (uint64_t s = 0; s < d->num_slots; s++) {
      if (sync_io(d->fd, buf, d->slot_size, slot_offset(d, s), false) != 0) continue;
      kvbm_slot_header h;
      int rc = kvbm__disk_check(d, buf, NULL, check_data, NULL, &h);
      if (rc == KVBM_EMAGIC && ((uint8_t *)buf)[d->data_bytes] == 0) continue; /* never written */
      if (rc) {
        nbad++;
        continue;
      }
      if (h.write_seq >= d->next_seq) d->next_seq = h.write_seq + 1;
      fn(user, s, &h);
    }
    free(buf);
  }
  if (bad) *bad = nbad;
  return KVBM_OK;
}
