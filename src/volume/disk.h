/* SPDX-License-Identifier: Apache-2.0 */
/*
 * volume/disk.h: the file of checksummed slots under the G3 tier (disk://).
 *
 * One file, preallocated with fallocate, of a 4096-byte superblock followed
 * by `num_slots` slots of `slot_size` bytes (a multiple of 4096, so every
 * slot is O_DIRECT-aligned). A slot holds the block's bytes at offset 0 and
 * a 64-byte header right after them (at offset data_bytes), written
 * together by one request; data first so that, when data_bytes is a
 * multiple of 4096, the data can move straight between the tier's memory
 * and the disk (no bounce copy) and the header rides in its own page:
 *
 *   off size  field (header, from offset data_bytes)
 *     0   8   magic "KVBMSLT1" (record v1) or "KVBMSLT2" (v2)
 *     8   8   sequence hash
 *    16   8   parent hash
 *    24   4   flags (bit 0: has parent; v2: bits 8..15 the tag, 1..255)
 *    28   4   data length
 *    32   8   layout fingerprint (kvbm_layout_fingerprint)
 *    40   8   write sequence (grows with every write: recency at restart)
 *    48   8   sum of the data bytes
 *    56   8   sum of bytes 0..56 of the header
 *
 * all little-endian. Record versions: a slot whose tag is 0 is written as
 * v1, byte for byte what kvbm wrote before tags existed (so a file of
 * tag-0 slots still reads in older kvbm); a tagged slot is v2, whose only
 * difference is the tag in flags bits 8..15. v1 with any flag bit but 0,
 * v2 with a tag of 0 or a bit outside 0 and 8..15 are refused
 * (KVBM_EFORMAT): one encoding per header. The tag is the writer's label
 * of the block (the manager's KV cache group).
 *
 * Superblock (offset 0, 4096 bytes): magic "KVBMG3F1", version, slot
 * size, slot count, data bytes, fingerprint, their XXH3, the key id
 * (bytes 0..64: the geometry; any difference starts the file anew); then
 * the writer's label (`label`: the manager's group list): at 64 its
 * length (le32, <= KVBM_DISK_LABEL_MAX), at 68 its bytes, at 68 + 256 the
 * XXH3 of bytes 64..324. A file whose label area is all zero (written
 * before labels existed, or under no label) is reused by any writer and
 * takes the new label; a valid label that differs from the writer's is
 * refused (KVBM_EFORMAT naming both: the slots' tags would mean something
 * else); a damaged one starts the file anew like a damaged geometry.
 *
 * A read whose header does not check (magic, header
 * checksum, fingerprint, length, the expected hash) or whose data does not
 * match the data checksum is rejected: the caller gets an error, never the
 * bytes. The sums are XXH3-64 by default: that guards against torn writes
 * and bit rot, at memory speed. It does not guard against someone who can
 * write the file: XXH3 has no key, so a forged slot can carry valid sums.
 * With `checksum_key` the sums are keyed BLAKE3 (a MAC, first 64 bits):
 * without the key nobody can make a slot that checks, so a forged slot is
 * a miss like a torn one. It costs BLAKE3's speed (about 2-3 GB/s a core
 * here) on every write and read. The superblock names the key (a keyed
 * hash of a fixed string), so a file written under another key, or none,
 * starts cold.
 *
 * I/O: io_uring with up to `queue_depth` requests in flight; without
 * io_uring (kernel too old, seccomp) plain pread/pwrite. O_DIRECT unless
 * disabled or refused by the filesystem (tmpfs): then buffered I/O.
 *
 * Persistence: with `persist` the file is `<dir>/kvbm-g3.slots`, locked
 * (flock) by one process at a time, and kept; kvbm__disk_open() on an
 * existing file of the same geometry and fingerprint keeps its slots so
 * kvbm__disk_scan() can rebuild an index. Otherwise the file is a fresh
 * temporary in `dir`, unlinked as soon as it is created.
 *
 * Files and who may touch them (threat model in docs/areas/tiers.md):
 * every file is created exclusively (O_EXCL, never through a link) with
 * mode 0600; a new persistent file is made under a temporary name, set
 * up, locked, and renamed into place without replacing anything. An
 * existing persistent file is used only if it is a regular file owned by
 * this user with a single name (not a link: O_NOFOLLOW); a looser mode is
 * tightened to 0600. The default directory (dir NULL) is
 * KVBM_DISK_DEFAULT_PARENT/kvbm-<uid>, created 0700, never followed
 * through a link, owned by this user (else refused) and kept 0700. A
 * persistent file in a given `dir` needs a directory owned by this user
 * that nobody else can write (no group/other write bit).
 *
 * Threads: a kvbm_disk is used by one thread at a time.
 */
#ifndef KVBM_DISK_H
#define KVBM_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/uio.h>

#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVBM_DISK_ALIGN 4096u
#define KVBM_DISK_HEADER 64u
#define KVBM_DISK_FILE_NAME "kvbm-g3.slots"
#define KVBM_DISK_DEFAULT_PARENT "/tmp" /* default dir: /tmp/kvbm-<uid> */
#define KVBM_DISK_KEY_LEN 32u
#define KVBM_DISK_LABEL_MAX 255u

typedef struct kvbm_disk kvbm_disk;

typedef struct kvbm__disk_config {
  const char *dir;        /* directory of the file; NULL: the private
                             default /tmp/kvbm-<uid> (see above) */
  uint64_t num_slots;     /* >= 1 */
  uint64_t data_bytes;    /* bytes of one block, >= 1 */
  uint64_t fingerprint;   /* layout fingerprint written in every slot */
  bool persist;           /* keep and reuse <dir>/kvbm-g3.slots */
  bool direct;            /* try O_DIRECT */
  bool uring;             /* try io_uring */
  uint32_t queue_depth;   /* 1 .. 256 */
  const uint8_t *checksum_key; /* NULL: XXH3 sums. Else KVBM_DISK_KEY_LEN
                                  bytes (copied): keyed-BLAKE3 sums that a
                                  forger without the key cannot make */
  uint32_t test_refuse;   /* testing only (0 otherwise): KVBM_DISK_REFUSE_*
                             bits make the kernel's answer a refusal, so
                             the fallbacks run where the kernel would not
                             refuse (this one takes O_DIRECT even on tmpfs) */
  const char *label;      /* the writer's label kept in the superblock
                             (NULL or "": none; at most KVBM_DISK_LABEL_MAX
                             bytes): see the superblock above */
  const char *test_default_parent; /* testing only (NULL otherwise): the
                             default directory's parent instead of
                             KVBM_DISK_DEFAULT_PARENT, so tests can plant
                             things there */
} kvbm__disk_config;

/* kvbm__disk_config.test_refuse bits. */
#define KVBM_DISK_REFUSE_O_DIRECT 1u /* open(O_DIRECT) fails with EINVAL */
#define KVBM_DISK_REFUSE_URING 2u    /* io_uring setup fails with ENOSYS */

/* Opens (creates) the file. Failures name the path and errno text:
 * KVBM_EIO (cannot create/open/lock; a file or directory refused by the
 * rules above, with the reason), KVBM_EINVAL (bad config), KVBM_EFORMAT
 * (a persistent file written under another label, naming both),
 * KVBM_EOVERFLOW (file size overflows). A failed preallocation (disk full,
 * RLIMIT_FSIZE) is not an error: the file then grows as slots are written
 * and writes past the limit fail (kvbm__disk_preallocated() says which).
 * *out is freed with kvbm__disk_close(). */
int kvbm__disk_open(const kvbm__disk_config *cfg, kvbm_disk **out, kvbm_error *err);
void kvbm__disk_close(kvbm_disk *d); /* NULL: no-op */

uint64_t kvbm__disk_slot_size(const kvbm_disk *d);
uint64_t kvbm__disk_num_slots(const kvbm_disk *d);
bool kvbm__disk_is_direct(const kvbm_disk *d);
bool kvbm__disk_is_uring(const kvbm_disk *d);
bool kvbm__disk_preallocated(const kvbm_disk *d);
/* Whether open found a valid existing file whose slots were kept. */
bool kvbm__disk_reused(const kvbm_disk *d);
/* The file's path ("" for an unlinked temporary). */
const char *kvbm__disk_path(const kvbm_disk *d);

/* Allocates a buffer for one slot (slot_size bytes, aligned for O_DIRECT);
 * free with free(). NULL on ENOMEM. */
void *kvbm__disk_buffer(const kvbm_disk *d);

/* Where a slot's data is: in the slot buffer itself (iov NULL: data at
 * buf[0 .. data_bytes), header at buf + data_bytes), or in caller memory
 * (iov[0..iovcnt) totalling data_bytes: zero-copy; the header then lives in
 * buf[0 .. 64) and the buffer's first slot_size - data_bytes bytes are the
 * slot's tail). Zero-copy needs kvbm__disk_direct_ok() of every piece. */
typedef struct kvbm__disk_data {
  const struct iovec *iov;
  int iovcnt;
} kvbm__disk_data;

/* Whether memory [p, p + len) can be a zero-copy piece of a slot: the slot
 * tail is a whole page (data_bytes a multiple of 4096), p and len are
 * 4096-aligned, and the piece count stays within the limit. */
bool kvbm__disk_direct_ok(const kvbm_disk *d, const void *p, size_t len);
#define KVBM_DISK_MAX_IOV 1023

typedef struct kvbm_slot_header {
  uint64_t seq_hash;
  uint64_t parent_hash;
  bool has_parent;
  uint8_t tag;            /* the writer's label of the block (0: none;
                             v1 records read as 0) */
  uint64_t write_seq;     /* set by kvbm__disk_seal */
} kvbm_slot_header;

/* Writes the header for `h` over the data (see kvbm__disk_data), zeroes the
 * padding, and assigns the next write sequence. */
void kvbm__disk_seal(kvbm_disk *d, void *buf, const kvbm__disk_data *data,
                    const kvbm_slot_header *h);

/* Checks a slot read into buf (and data): KVBM_EMAGIC (no slot there),
 * KVBM_ECHECKSUM (header or data checksum mismatch), KVBM_EFORMAT
 * (fingerprint or length of another layout, flag bits its version does
 * not have), KVBM_ENOTFOUND (a valid slot
 * of another hash when expect_hash is given). check_data false checks the
 * header only. On success fills *h (may be NULL). data may be NULL. */
int kvbm__disk_check(const kvbm_disk *d, const void *buf, const kvbm__disk_data *data,
                    bool check_data, const uint64_t *expect_hash, kvbm_slot_header *h);

/* One slot transfer. `result` receives 0 or a negative errno (-EIO for a
 * short read, -ENOSPC for a short write). */
typedef struct kvbm__disk_io {
  uint64_t slot;
  void *buf;           /* from kvbm__disk_buffer */
  kvbm__disk_data data; /* {NULL, 0}: all in buf */
  bool write;
  int result;
  void *user;
  struct iovec iov[KVBM_DISK_MAX_IOV + 1]; /* used by the disk */
} kvbm__disk_io;

/* Starts an I/O: with io_uring it is submitted at once (if queue_depth are
 * in flight, one is reaped first: it is then returned by the next
 * kvbm__disk_reap); without io_uring it runs now. The io must stay valid
 * until it is reaped. KVBM_EINVAL: slot out of range or bad data pieces;
 * KVBM_EAGAIN: 2 * queue_depth + 1 requests are already pending (reap
 * first). */
int kvbm__disk_begin(kvbm_disk *d, kvbm__disk_io *io);

/* Requests started and not yet reaped. */
uint32_t kvbm__disk_pending(const kvbm_disk *d);

/* Returns one finished I/O (its result set), waiting for one if needed;
 * NULL when none is pending. */
kvbm__disk_io *kvbm__disk_reap(kvbm_disk *d);

/* Waits until every started I/O has finished (their results set). */
void kvbm__disk_finish(kvbm_disk *d);

/* Reads every slot (whole, checking headers, and data when check_data) and
 * calls fn for each valid one, then returns the number of slots that held a
 * header but failed a check (torn or corrupt) in *bad. Sequential, for warm
 * restart. */
int kvbm__disk_scan(kvbm_disk *d, bool check_data,
                   void (*fn)(void *user, uint64_t slot, const kvbm_slot_header *h),
                   void *user, uint64_t *bad, kvbm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_DISK_H */
