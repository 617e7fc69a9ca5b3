/* SPDX-License-Identifier: Apache-2.0 */
/*
 * disk_backend.c: the disk:///DIR backend, a volume over the slot file of
 * disk.c (io_uring, O_DIRECT, checksummed slot headers, warm restart).
 *
 * The slot file has fixed-size slots addressed by index and knows nothing
 * of keys, so this backend keeps the index: key -> slot (open addressing,
 * linear probing with backward-shift deletion, at most half full), the
 * value's length per slot, and a stack of free slots. A slot's header says
 * whose it is: seq_hash is the key, and the parent field carries the
 * value's length (a volume's blocks have no parents; flag bit 0 is set so
 * the header checksum covers it). The data checksum covers the whole
 * block_bytes, the value and its zero padding. A put's tag (0..255, the
 * manager's KV cache group) rides in the header too (a v2 record when
 * not 0, volume/disk.h) and comes back from keys() after a restart; the
 * config's disk_label (what the tags mean) is the file's superblock
 * label, so a file whose tags meant other groups is refused at open.
 *
 *   put     a free slot is written (header and data in one request); when
 *           it lands, the key points to it and its old slot is freed, so a
 *           crash mid-write leaves the old value (warm restart keeps the
 *           newer write sequence of two slots claiming one key). With no
 *           free slot, a key already stored is rewritten in place; a new
 *           key is KVBM_ENOSPC: the tier above evicts with delete.
 *   get     read and verified (header, key, length, data checksum); any
 *           mismatch is reported corrupt (a counted miss) and the slot is
 *           dropped from the index. A value that is not whole never
 *           reaches the caller as KVBM_OK.
 *   exists  the index alone; delete frees the slot in the index (the
 *           bytes stay on disk until the slot is reused, so after a warm
 *           restart a deleted block may come back: harmless for blocks
 *           named by their content hash).
 *
 * Up to QUEUE_DEPTH requests are in flight; an op on a key that has a
 * request in flight first waits for every one in flight, so ops take
 * effect in order. The core streams batches through this backend
 * (kvbm__volume_disk_stream): the next batch's transfers start while the
 * previous batch's last ones are in flight, so the disk does not idle at
 * the tail of each batch; batches still complete one by one, in order. Data moves without a copy when the
 * caller's buffer is page aligned and the value is the whole block (and the
 * block a multiple of 4096); otherwise through an aligned bounce buffer.
 *
 * Warm restart: with `persist` the file is DIR/kvbm-g3.slots (one process
 * at a time: flock); it is kept only when its geometry and fingerprint
 * match, and the fingerprint is a hash of the key namespace, so another
 * namespace (or block size) starts the file empty. Without `persist` the
 * file is an unlinked temporary. One I/O thread (the slot file is used by
 * one thread at a time).
 *
 * Sums: XXH3 by default; with the config's disk_key, keyed BLAKE3 (the
 * volume derives a key from the secret and forgets the secret), so a slot
 * forged by someone who can write the file is a miss; a file written
 * under another key, or none, starts empty (disk.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "common/clock.h"
#include "volume/disk.h"
#include "volume/internal.h"

_Static_assert(sizeof(((kvbm__volume_ctx *)0)->disk_key) == KVBM_DISK_KEY_LEN,
               "the derived disk key is the slot file's key length");

#define QUEUE_DEPTH 16u
#define NO_SLOT UINT64_MAX
#define FINGERPRINT_SEED 0x6b76626d766f6c31ull /* "kvbmvol1" */

typedef struct slot_info {
  uint64_t key;
  uint64_t len; /* 0: free */
  uint64_t seq; /* write sequence (warm restart only) */
  uint32_t tag; /* the put's kvbm_volume_op.tag, kept in the header */
} slot_info;

typedef struct pending {
  kvbm_volume_op *op; /* NULL: this io is free */
  size_t *left;       /* its batch's count of ops not finished */
  uint64_t slot;
  bool bounce;
  struct iovec piece; /* the caller's buffer, when no bounce */
} pending;

typedef struct dstate {
  kvbm_disk *d;
  uint64_t nslots, block_bytes, max_value;
  slot_info *slots;
  uint64_t *table; /* slot + 1, 0 empty */
  uint64_t mask;
  uint64_t *free_slots;
  uint64_t nfree;
  uint32_t depth;
  kvbm__disk_io *ios;
  void **bufs;
  pending *pend;
  uint32_t inflight;
  uint64_t next_seq; /* our write order (keys() lists oldest first) */
  uint64_t skipped;  /* broken or foreign slots found at open */
  char mode[40];
} dstate;

/* ---- the index ---- */

static uint64_t home(const dstate *s, uint64_t key) {
  return XXH3_64bits(&key, sizeof key) & s->mask;
}

static uint64_t find(const dstate *s, uint64_t key) {
  for (uint64_t i = home(s, key);; i = (i + 1) & s->mask) {
    uint64_t e = s->table[i];
    if (!e) return NO_SLOT;
    if (s->slots[e - 1].key == key) return e - 1;
  }
}

/* Points key at slot (replacing its entry, if any). */
static void map(dstate *s, uint64_t key, uint64_t slot) {
  uint64_t i = home(s, key);
  while (s->table[i] && s->slots[s->table[i] - 1].key != key) i = (i + 1) & s->mask;
  s->table[i] = slot + 1;
}

static void unmap(dstate *s, uint64_t key) {
  uint64_t i = home(s, key);
  while (s->table[i] && s->slots[s->table[i] - 1].key != key) i = (i + 1) & s->mask;
  if (!s->table[i]) return;
  s->table[i] = 0;
  /* Backward shift: entries after the hole move up if it lies on their path. */
  for (uint64_t j = (i + 1) & s->mask; s->table[j]; j = (j + 1) & s->mask) {
    uint64_t h = home(s, s->slots[s->table[j] - 1].key);
    if (((j - h) & s->mask) >= ((j - i) & s->mask)) {
      s->table[i] = s->table[j];
      s->table[j] = 0;
      i = j;
    }
  }
}

static void release(dstate *s, uint64_t slot) {
  s->slots[slot].len = 0;
  s->free_slots[s->nfree++] = slot;
}

/* ---- I/O ---- */

/* Whether the block can move straight between the caller's buffer and the
 * disk: a put of exactly one block, a get with room for one, page aligned. */
static bool zero_copy(const dstate *s, const kvbm_volume_op *op) {
  if (op->kind == KVBM_VOLUME_PUT)
    return op->len == s->block_bytes && kvbm__disk_direct_ok(s->d, op->src, op->len);
  return op->cap >= s->block_bytes && kvbm__disk_direct_ok(s->d, op->dst, s->block_bytes);
}

static void complete(dstate *s, kvbm__disk_io *io) {
  uint32_t i = (uint32_t)(io - s->ios);
  pending *p = &s->pend[i];
  kvbm_volume_op *op = p->op;
  slot_info *si = &s->slots[p->slot];
  if (op->kind == KVBM_VOLUME_PUT) {
    if (io->result) {
      op->status = io->result == -ENOSPC ? KVBM_ENOSPC : KVBM_EIO;
      uint64_t cur = find(s, op->key);
      if (cur == p->slot) unmap(s, op->key); /* rewritten in place: the old value is gone */
      release(s, p->slot);
    } else {
      uint64_t old = find(s, op->key);
      si->key = op->key;
      si->len = op->len;
      si->seq = s->next_seq++;
      si->tag = op->tag;
      map(s, op->key, p->slot);
      if (old != NO_SLOT && old != p->slot) release(s, old);
      op->status = KVBM_OK;
    }
  } else { /* GET */
    kvbm_slot_header h;
    int rc = io->result ? KVBM_EIO
                        : kvbm__disk_check(s->d, io->buf, &io->data, true, &op->key, &h);
    if (rc == KVBM_OK && (!h.has_parent || h.parent_hash != si->len)) rc = KVBM_EFORMAT;
    if (rc == KVBM_OK) {
      if (p->bounce) memcpy(op->dst, io->buf, si->len);
      op->size = si->len;
      op->status = KVBM_OK;
    } else if (rc == KVBM_EIO) {
      op->status = KVBM_EIO;
    } else { /* torn, rotten or someone else's: drop it */
      op->status = KVBM__VOLUME_CORRUPT;
      unmap(s, op->key);
      release(s, p->slot);
    }
  }
  p->op = NULL;
  (*p->left)--;
  s->inflight--;
}

static void reap_one(dstate *s) {
  kvbm__disk_io *io = kvbm__disk_reap(s->d);
  if (io) complete(s, io);
}

static void drain(dstate *s) {
  while (s->inflight) reap_one(s);
}

/* A free io (reaping one if all are busy). */
static uint32_t take_io(dstate *s) {
  while (s->inflight == s->depth) reap_one(s);
  for (uint32_t i = 0; i < s->depth; i++)
    if (!s->pend[i].op) return i;
  return 0; /* unreachable: inflight < depth */
}

static bool in_flight(const dstate *s, uint64_t key) {
  for (uint32_t i = 0; i < s->depth; i++)
    if (s->pend[i].op && s->pend[i].op->key == key) return true;
  return false;
}

static void start(dstate *s, kvbm_volume_op *op, uint64_t slot, size_t *left) {
  uint32_t i = take_io(s);
  kvbm__disk_io *io = &s->ios[i];
  pending *p = &s->pend[i];
  bool put = op->kind == KVBM_VOLUME_PUT;
  p->op = op;
  p->left = left;
  p->slot = slot;
  p->bounce = !zero_copy(s, op);
  io->slot = slot;
  io->buf = s->bufs[i];
  io->write = put;
  io->user = NULL;
  io->result = 0;
  io->data = (kvbm__disk_data){NULL, 0};
  if (!p->bounce) {
    p->piece = (struct iovec){put ? (void *)op->src : op->dst, (size_t)s->block_bytes};
    io->data = (kvbm__disk_data){&p->piece, 1};
  }
  if (put) {
    if (p->bounce) {
      memcpy(io->buf, op->src, op->len);
      memset((uint8_t *)io->buf + op->len, 0, s->block_bytes - op->len);
    }
    kvbm_slot_header h = {.seq_hash = op->key, .parent_hash = op->len, .has_parent = true,
                          .tag = (uint8_t)op->tag}; /* 0..255: checked at submit */
    kvbm__disk_seal(s->d, io->buf, &io->data, &h);
  }
  s->inflight++;
  if (kvbm__disk_begin(s->d, io) != KVBM_OK) { /* cannot happen: slot and pieces checked */
    io->result = -EIO;
    complete(s, io);
  }
}

/* Chooses where a put goes: a free slot, else the key's own slot. */
static uint64_t put_slot(dstate *s, uint64_t key) {
  if (s->nfree) return s->free_slots[--s->nfree];
  return find(s, key);
}

/* Starts a batch's ops in order, after everything started before (the
 * streaming core calls this for the next batch while the previous one's
 * last transfers are in flight). Ops finished here, and later by
 * complete(), decrement *left. */
static void disk_issue(void *state, kvbm_volume_op *ops, size_t n, uint64_t deadline_ns,
                       size_t *left) {
  dstate *s = state;
  for (size_t i = 0; i < n; i++) {
    kvbm_volume_op *op = &ops[i];
    if (kvbm_clock_ns() >= deadline_ns) {
      op->status = KVBM_ETIMEDOUT;
      (*left)--;
      continue;
    }
    if (in_flight(s, op->key)) drain(s); /* ops on one key take effect in order */
    uint64_t slot = find(s, op->key);
    switch (op->kind) {
    case KVBM_VOLUME_PUT:
      if (op->len > s->block_bytes) {
        op->status = KVBM_ETOOLONG;
        break;
      }
      slot = put_slot(s, op->key);
      if (slot == NO_SLOT) {
        op->status = KVBM_ENOSPC;
        break;
      }
      start(s, op, slot, left);
      continue;
    case KVBM_VOLUME_GET:
      if (slot == NO_SLOT) {
        op->status = KVBM_ENOTFOUND;
        break;
      }
      op->size = s->slots[slot].len;
      if (op->size > s->max_value) op->status = KVBM_ETOOLONG;
      else if (op->size > op->cap) op->status = KVBM_ENOSPC;
      else {
        start(s, op, slot, left);
        continue;
      }
      break;
    case KVBM_VOLUME_EXISTS:
      op->status = slot == NO_SLOT ? KVBM_ENOTFOUND : KVBM_OK;
      if (slot != NO_SLOT) op->size = s->slots[slot].len;
      break;
    case KVBM_VOLUME_DELETE:
      op->status = slot == NO_SLOT ? KVBM_ENOTFOUND : KVBM_OK;
      if (slot != NO_SLOT) {
        unmap(s, op->key);
        release(s, slot);
      }
      break;
    }
    (*left)--; /* finished without a transfer */
  }
}

/* Finishes one transfer in flight (waiting for it); false when none is. */
static bool disk_reap(void *state) {
  dstate *s = state;
  if (!s->inflight) return false;
  reap_one(s);
  return true;
}

static void disk_run(void *state, kvbm_volume_op *ops, size_t n, uint64_t deadline_ns) {
  size_t left = n;
  disk_issue(state, ops, n, deadline_ns, &left);
  drain(state);
}

const kvbm__volume_stream kvbm__volume_disk_stream = {disk_issue, disk_reap};

/* ---- warm restart ---- */

typedef struct scan_ctx {
  dstate *s;
  uint64_t bad;
} scan_ctx;

static void restore(void *user, uint64_t slot, const kvbm_slot_header *h) {
  scan_ctx *c = user;
  dstate *s = c->s;
  if (!h->has_parent || h->parent_hash == 0 || h->parent_hash > s->block_bytes) {
    c->bad++; /* a slot of another writer */
    return;
  }
  if (h->write_seq >= s->next_seq) s->next_seq = h->write_seq + 1;
  uint64_t old = find(s, h->seq_hash);
  if (old != NO_SLOT) {
    if (s->slots[old].seq > h->write_seq) return; /* an older copy: stays free */
    s->slots[old].len = 0;
  }
  s->slots[slot] = (slot_info){h->seq_hash, h->parent_hash, h->write_seq, h->tag};
  map(s, h->seq_hash, slot);
}

static int warm_restart(dstate *s, kvbm_error *err) {
  scan_ctx c = {s, 0};
  uint64_t bad = 0;
  int rc = kvbm__disk_scan(s->d, false, restore, &c, &bad, err);
  if (rc) return rc;
  s->skipped = bad + c.bad;
  /* The free stack: every slot not in use, highest first so slot 0 goes
   * first (sequential on a fresh file). */
  s->nfree = 0;
  for (uint64_t i = s->nslots; i-- > 0;)
    if (!s->slots[i].len) s->free_slots[s->nfree++] = i;
  return KVBM_OK;
}

/* ---- open / close ---- */

static void disk_close(void *state) {
  dstate *s = state;
  if (!s) return;
  if (s->d) {
    drain(s);
    kvbm__disk_close(s->d);
  }
  for (uint32_t i = 0; s->bufs && i < s->depth; i++) free(s->bufs[i]);
  free(s->bufs);
  free(s->ios);
  free(s->pend);
  free(s->slots);
  free(s->table);
  free(s->free_slots);
  free(s);
}

static int disk_open(const kvbm_volume_config *cfg, void *user, void **state, kvbm_error *err) {
  const kvbm__volume_ctx *ctx = user;
  if (!cfg->slots || !cfg->block_bytes)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "volume: disk:// needs the config's slots and block_bytes (>= 1)");
  if (cfg->slots > (UINT64_C(1) << 32))
    return kvbm_error_set(err, KVBM_EINVAL, "volume: disk:// slots %llu is above 2^32",
                          (unsigned long long)cfg->slots);
  if (cfg->block_bytes > ctx->max_value_bytes)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "volume: disk:// block_bytes %llu is above max_value_bytes %llu",
                          (unsigned long long)cfg->block_bytes,
                          (unsigned long long)ctx->max_value_bytes);
  dstate *s = calloc(1, sizeof *s);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "volume: out of memory");
  s->nslots = cfg->slots;
  s->block_bytes = cfg->block_bytes;
  s->max_value = ctx->max_value_bytes;
  uint64_t tsize = 2;
  while (tsize < 2 * s->nslots) tsize <<= 1;
  s->mask = tsize - 1;
  s->depth = ctx->url->disk_depth > 0 ? (uint32_t)ctx->url->disk_depth : QUEUE_DEPTH;
  if (s->nslots < s->depth) s->depth = (uint32_t)s->nslots;
  s->next_seq = 1;
  kvbm__disk_config dc = {.dir = ctx->url->path[0] ? ctx->url->path : NULL, /* NULL: private default */
                          .num_slots = s->nslots,
                          .data_bytes = s->block_bytes,
                          .fingerprint = XXH3_64bits_withSeed(ctx->ns, strlen(ctx->ns),
                                                              FINGERPRINT_SEED),
                          .persist = cfg->persist,
                          .direct = ctx->url->disk_direct != 0,
                          .uring = ctx->url->disk_uring != 0,
                          .queue_depth = s->depth,
                          .checksum_key = ctx->disk_keyed ? ctx->disk_key : NULL,
                          .label = cfg->disk_label,
                          .test_refuse = ctx->url->disk_test_refuse};
  int rc = kvbm__disk_open(&dc, &s->d, err);
  if (rc) {
    s->d = NULL;
    disk_close(s);
    return rc;
  }
  s->slots = calloc(s->nslots, sizeof *s->slots);
  s->table = calloc(tsize, sizeof *s->table);
  s->free_slots = malloc(s->nslots * sizeof *s->free_slots);
  s->ios = calloc(s->depth, sizeof *s->ios);
  s->pend = calloc(s->depth, sizeof *s->pend);
  s->bufs = calloc(s->depth, sizeof *s->bufs);
  bool ok = s->slots && s->table && s->free_slots && s->ios && s->pend && s->bufs;
  for (uint32_t i = 0; ok && i < s->depth; i++) ok = (s->bufs[i] = kvbm__disk_buffer(s->d));
  if (!ok) {
    disk_close(s);
    return kvbm_error_set(err, KVBM_ENOMEM, "volume: disk://%s: out of memory for %llu slots",
                          ctx->url->path, (unsigned long long)cfg->slots);
  }
  if ((rc = warm_restart(s, err))) {
    disk_close(s);
    return rc;
  }
  snprintf(s->mode, sizeof s->mode, "%s+%s", kvbm__disk_is_uring(s->d) ? "io_uring" : "pread/pwrite",
           kvbm__disk_is_direct(s->d) ? "O_DIRECT" : "buffered");
  *state = s;
  return KVBM_OK;
}

static int by_seq(const void *a, const void *b) {
  uint64_t x = ((const slot_info *)a)->seq, y = ((const slot_info *)b)->seq;
  return x < y ? -1 : x > y;
}

static int disk_keys(void *state, void (*fn)(void *, uint64_t, size_t, uint32_t), void *user,
                     uint64_t *skipped) {
  dstate *s = state;
  uint64_t n = s->nslots - s->nfree;
  slot_info *v = malloc((n ? n : 1) * sizeof *v);
  if (!v) return KVBM_ENOMEM;
  uint64_t k = 0;
  for (uint64_t i = 0; i < s->nslots && k < n; i++)
    if (s->slots[i].len) v[k++] = s->slots[i];
  qsort(v, k, sizeof *v, by_seq);
  for (uint64_t i = 0; i < k; i++) fn(user, v[i].key, (size_t)v[i].len, v[i].tag);
  free(v);
  *skipped = s->skipped;
  return KVBM_OK;
}

static const char *disk_describe(void *state) { return ((dstate *)state)->mode; }

const kvbm_volume_backend kvbm__volume_disk_backend = {
    .scheme = "disk",
    .max_threads = 1,
    .open = disk_open,
    .run = disk_run,
    .close = disk_close,
    .keys_tagged = disk_keys,
    .describe = disk_describe,
};
