/* SPDX-License-Identifier: Apache-2.0 */
/*
 * manager.c: the tiered block manager's set-up and accessors (see
 * kvbm/manager.h; the other concerns live in config.c, copy.c, workers.c
 * and request.c, their shared internals in internal.h).
 *
 * Design. Each tier is a kvbm_pool (index, LRU, refcounts) plus a byte per
 * block saying whether the block's bytes are there yet (READY), on their
 * way (PENDING) or lost (FAILED). Indexing is synchronous, bytes are not:
 * a block is registered in its target pool the moment a copy is decided, so
 * every later decision (present? evict whom?) is made in the order of the
 * engine's calls, and the worker threads only move bytes of blocks that
 * their job pins with a pool reference. That keeps every tier's contents a
 * function of the sequence of uses (what W2's monotonicity rests on), keeps
 * the lock short (no copy runs under it), and makes a failed copy a state
 * change rather than an index repair: a FAILED block is a miss for lookups
 * and is rewritten in place by the next use that wants it there.
 *
 * Pins. An offload pins its source G1 block (released when its copy is done)
 * and its target blocks through a "batch" (all blocks one commit used, in
 * order); the batch releases them in use order when its last job is done,
 * so recency in G2/G3 is the order of use, not of copy completion. An
 * onboard pins its source and its G1 destination until it lands.
 *
 * Set-up, here: every tier is one kvbm__tier, a pool over a store. G1 and
 * G2 are host (or device) memory in a kvbm_layout of the tier's kind,
 * large ones advised huge. G3 and G4 are volumes registered from a URL
 * (kvbm/volume.h): G3's by default the local slot file in g3_dir, G4's
 * whatever g4_url names, shared with other engines. A volume tier that
 * cannot be opened does not fail create: the manager serves without it,
 * counts what it skips and says why (kvbm_manager_tier_error). G3's slot
 * file is the disk:// volume built from g3_dir and the g3_* settings; the
 * G3 pool has exactly its slot count, so a slot is free for every put once
 * the evicted block's value is deleted (a warm restart indexes the keys
 * the file kept, oldest first). The pools report to
 * on_pool_event first (a removed block's bytes are gone; a block
 * registered in G1 has no KV until its request commits; an exclusive
 * volume drops an evicted block's value), then to the caller's listener.
 *
 * Device G1 (a CUDA build, g1_memory DEVICE): the same jobs, but every
 * copy that touches G1 is a cudaMemcpyAsync on the worker's own stream
 * (gpu.c). A CUDA error fails that job only: its target is FAILED and
 * copy_errors counts it, as any lost copy. The tests run this path without
 * a GPU through gpu.c's emulated streams (kvbm__manager_testing.g1_emulate).
 *
 * Engine-owned G1 (g1_storage, and g2_storage): the engine's own KV
 * memory, adopted (kvbm_storage_adopt), is the tier's bytes in place. The
 * tier is set up as if kvbm had allocated it, with the storage's memory
 * type and device in the config, so adopted device memory takes exactly
 * the path of kvbm's own device G1 (streams, copy_now) and nothing
 * downstream needs to know; the only differences are that it is not
 * zeroed or advised (the engine's bytes are not ours to touch; the pool
 * starts empty, so their contents mean nothing to kvbm) and that destroy
 * does not release it. Its layout is checked against the tier's with
 * kvbm_storage_check_layout, so an engine tensor too small or misaligned
 * is refused at create, not found by a copy.
 *
 * Trade-off: one lock for everything is simple and correct; with many
 * engine threads it would become the bottleneck long before the copies do.
 */
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/msgpack.h"
#include "kvbm/storage_events.h"
#include "tier/internal.h"

/* A storage event's extra_metadata in a manager of several groups:
 * {"tier": "Gn", "group_idx": g, "kv_cache_spec_kind": kind} and, for a
 * sliding window, "kv_cache_spec_sliding_window": W, the names vLLM's KV
 * events use (the advisor reads group_idx: advisor.c, "Groups"). A
 * one-group manager sends no metadata (the publisher writes the tier):
 * its bytes are those before groups. Returns the length written. */
#define META_MAX 128 /* the longest map above is 88 bytes */
static size_t group_meta(const kvbm_manager *m, int tier, uint32_t g, uint8_t *buf) {
  const kvbm_group_spec *spec = &m->groups[g];
  const char *kind = kvbm_group_kind_name(spec->kind);
  bool window = spec->kind == KVBM_GROUP_SLIDING_WINDOW;
  uint8_t *p = kvbm__mp_put_hdr(buf, window ? 4 : 3, true);
  p = kvbm__mp_put_str(p, "tier", 4);
  p = kvbm__mp_put_str(p, kvbm_tier_name(tier), strlen(kvbm_tier_name(tier)));
  p = kvbm__mp_put_str(p, "group_idx", 9);
  p = kvbm__mp_put_uint(p, g);
  p = kvbm__mp_put_str(p, "kv_cache_spec_kind", 18);
  p = kvbm__mp_put_str(p, kind, strlen(kind));
  if (window) {
    p = kvbm__mp_put_str(p, "kv_cache_spec_sliding_window", 28);
    p = kvbm__mp_put_uint(p, spec->tokens);
  }
  return (size_t)(p - buf);
}

/* The seed's storage events for a volume tier's pool event (the
 * config's storage_events). A Store's prefix_hash is the family of the
 * commit registering it (m->ev_prefix, set around use_block); a CLEARED
 * pool says nothing per block, so nothing is sent for it: the advisor
 * ages such blocks out. A full publisher queue drops (counted there):
 * the engine's path never waits on a storage provider. */
static void storage_event(kvbm_manager *m, const kvbm__tier *t, const kvbm_pool_event *ev) {
  if (ev->kind == KVBM_POOL_CLEARED) return;
  const char *loc = kvbm_manager_volume_id(m, t->id);
  if (!loc) return;
  uint8_t meta[META_MAX];
  size_t meta_len = m->ngroups > 1 ? group_meta(m, (int)t->id, ev->group, meta) : 0;
  kvbm_storage_event se = {
      .extra_metadata = meta_len ? meta : NULL,
      .extra_metadata_len = meta_len,
      .type = ev->kind == KVBM_POOL_STORED ? KVBM_STORAGE_STORE : KVBM_STORAGE_REMOVE,
      .sequence_hash = ev->seq_hash,
      .prefix_hash = ev->kind == KVBM_POOL_STORED ? m->ev_prefix : 0,
      .block_size = m->block_bytes,
      .location = loc,
      .location_len = strlen(loc),
      .tier = (int)t->id,
  };
  (void)kvbm_storage_publish(m->cfg.storage_events, &se, NULL, NULL);
}

/* What the user's listener and the storage events see of a pool event in
 * a manager of several groups: the block's own sequence hash and parent
 * and its group (vLLM's (block_hash, group_idx)), not the mixed key the
 * tier registers it under (kvbm__group_key), which would be a garbage
 * hash to a router. The group of a STORED block is the registration's
 * (reg_grp), kept for its REMOVED. Our own bookkeeping keeps the key. */
static kvbm_pool_event as_published(kvbm__tier *t, const kvbm_pool_event *ev) {
  kvbm_pool_event pub = *ev;
  if (ev->kind == KVBM_POOL_CLEARED) return pub;
  if (ev->kind == KVBM_POOL_STORED) t->grp[ev->block_id] = t->reg_grp;
  uint32_t g = t->grp[ev->block_id];
  pub.group = g;
  pub.seq_hash = kvbm__group_unkey(ev->seq_hash, g);
  if (ev->kind == KVBM_POOL_STORED && ev->has_parent)
    pub.parent_hash = kvbm__group_unkey(ev->parent_hash, g);
  return pub;
}

/* The pools report to us first: an evicted block's bytes are gone, so a
 * FAILED mark must not outlive it (track, on the pool's own event); then
 * the storage events and the user's listener (deliver, on what they are
 * to see: the pool's event with one group, as_published's with groups). */
static inline __attribute__((always_inline)) void track(kvbm_manager *m, int tier,
                                                        const kvbm_pool_event *ev) {
  kvbm__tier *t = &m->t[tier];
  /* A registration begins or ends: the block's kept checksum (copy.c) was
   * of other bytes. */
  if (ev->kind == KVBM_POOL_CLEARED) kvbm__sums_clear_all(t);
  else kvbm__sum_clear(t, ev->block_id);
  if (ev->kind == KVBM_POOL_REMOVED) {
    t->state[ev->block_id] = KVBM__READY;
    /* The index is the store's eviction too, unless others share it. */
    if (t->store == KVBM__STORE_VOLUME && !t->shared && t->usable)
      kvbm__queue_delete(m, t, ev->seq_hash);
  }
  if (ev->kind == KVBM_POOL_STORED && tier == KVBM_TIER_G1) {
    /* Registered before its KV exists: not a hit for anyone until its
     * request commits (an onboard turns it PENDING right after). */
    m->t[tier].state[ev->block_id] = KVBM__UNCOMPUTED;
    const kvbm_mreq *r = ev->context; /* the registering request (NULL: none) */
    m->g1_owner[ev->block_id] = r ? r->serial : 0;
  }
  /* Peers told that we hold the block are told that we no longer do. */
  if (ev->kind != KVBM_POOL_STORED) kvbm__disagg_block_gone(m, tier, ev);
}
static inline __attribute__((always_inline)) void deliver(kvbm_manager *m, int tier,
                                                          const kvbm_pool_event *ev) {
  if (m->cfg.storage_events && tier != KVBM_TIER_G1) storage_event(m, &m->t[tier], ev);
  if (m->cfg.listener[tier]) m->cfg.listener[tier](m->cfg.listener_user[tier], ev);
}
static void on_pool_event(kvbm_manager *m, int tier, const kvbm_pool_event *ev) {
  track(m, tier, ev);
  deliver(m, tier, ev);
}
static void on_g1(void *u, const kvbm_pool_event *ev) { on_pool_event(u, KVBM_TIER_G1, ev); }
static void on_g2(void *u, const kvbm_pool_event *ev) { on_pool_event(u, KVBM_TIER_G2, ev); }
static void on_g3(void *u, const kvbm_pool_event *ev) { on_pool_event(u, KVBM_TIER_G3, ev); }
static void on_g4(void *u, const kvbm_pool_event *ev) { on_pool_event(u, KVBM_TIER_G4, ev); }
static const kvbm_pool_listener on_tier[KVBM_TIER_COUNT] = {on_g1, on_g2, on_g3, on_g4};
/* A manager of several groups listens with these, so the translation
 * costs a one-group manager nothing, not even a test per event (a test in
 * on_pool_event was +0.9% instructions of a W2 replay, ~1 M pool events;
 * an extra argument +0.45%). */
static void on_grouped(kvbm_manager *m, int tier, const kvbm_pool_event *ev) {
  track(m, tier, ev);
  kvbm_pool_event pub = as_published(&m->t[tier], ev);
  deliver(m, tier, &pub);
}
static void on_g1g(void *u, const kvbm_pool_event *ev) { on_grouped(u, KVBM_TIER_G1, ev); }
static void on_g2g(void *u, const kvbm_pool_event *ev) { on_grouped(u, KVBM_TIER_G2, ev); }
static void on_g3g(void *u, const kvbm_pool_event *ev) { on_grouped(u, KVBM_TIER_G3, ev); }
static void on_g4g(void *u, const kvbm_pool_event *ev) { on_grouped(u, KVBM_TIER_G4, ev); }
static const kvbm_pool_listener on_tier_grouped[KVBM_TIER_COUNT] = {on_g1g, on_g2g, on_g3g, on_g4g};

/* ---- create / destroy ---- */

/* Large host tiers are backed by transparent huge pages where the kernel
 * allows it (MADV_HUGEPAGE; an error or THP "never" leaves 4 KiB pages).
 * Why: an O_DIRECT request is built from the physical segments of its
 * memory, at most max_segments (254 on virtio) per request. A 2 MiB block
 * in scattered 4 KiB pages (recycled memory, typical after a while) then
 * goes to the disk as two ~1 MiB requests plus a fragment, ~20% slower
 * for reads here; on a huge page it is one 2 MiB request. It also cuts
 * TLB misses of the G1<->G2 copies. Zeroed after the advice, so the pages
 * are faulted in huge. */
#define HUGE_PAGE ((uint64_t)2 << 20)

static void advise_huge(void *p, uint64_t len) {
  if (!p) return;
  (void)madvise(p, (size_t)len, MADV_HUGEPAGE);
  memset(p, 0, (size_t)len);
}

/* The tier's index: a pool of n blocks reporting to on_pool_event, and a
 * state byte per block. */
static int tier_pool(kvbm_manager *m, kvbm__tier *t, uint64_t n, kvbm_error *err) {
  if (!(t->state = calloc(n, 1))) return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  if (m->ngroups > 1 && !(t->grp = calloc(n, 1)))
    return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  /* G1 and G2 keep a checksum per block for peers (copy.c, "Kept checksums"). */
  if (t->id <= KVBM_TIER_G2 && kvbm__sums_create(t, n))
    return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  kvbm_pool_config pc = kvbm_pool_config_default((uint32_t)n, m->cfg.block_size);
  pc.scheme = m->cfg.scheme;
  /* G1 keeps its blocks' tokens: a block offloaded to a peer carries them,
   * and the peer checks its sequence hash against them. */
  pc.keep_tokens = t->id == KVBM_TIER_G1;
  pc.fill_only = t->id != KVBM_TIER_G1; /* below G1 blocks are filled whole, never appended to */
  pc.listener = t->grp ? on_tier_grouped[t->id] : on_tier[t->id];
  pc.listener_user = m;
  int rc = kvbm_pool_create(&pc, &t->pool, err);
  if (!rc) t->present = true;
  return rc;
}

/* An engine-owned tier's storage (g1_storage, g2_storage): it must have
 * addresses and hold the tier's layout. Its memory type was put in the
 * config by adopt_config. */
static int adopted_tier(kvbm__tier *t, kvbm_storage *st, kvbm_error *err) {
  const char *field = t->id == KVBM_TIER_G1 ? "g1_storage" : "g2_storage";
  kvbm_error e = {0};
  if (kvbm_storage_check_layout(st, &t->layout, &e))
    return kvbm_error_set(err, KVBM_EINVAL, "manager: %s does not hold %s's layout: %s", field,
                          kvbm_tier_name(t->id), e.msg);
  for (uint64_t r = 0; r < t->layout.num_regions; r++)
    if (!kvbm_storage_region_base(st, r))
      return kvbm_error_set(err, KVBM_EINVAL, "manager: %s (%s storage) has no addresses",
                            field, kvbm_storage_name(st));
  t->storage = st;
  return KVBM_OK;
}

static int host_tier(kvbm_manager *m, int ti, uint32_t nblocks, kvbm_layout_kind kind,
                     kvbm_memory_type memory, kvbm_error *err) {
  kvbm__tier *t = &m->t[ti];
  kvbm_layout_config lc = m->cfg.layout;
  lc.num_blocks = nblocks;
  int rc = kvbm_layout_init(&t->layout, kind, &lc, err);
  kvbm_storage *adopted = ti == KVBM_TIER_G1 ? m->cfg.g1_storage : m->cfg.g2_storage;
  bool emu = memory == KVBM_MEMORY_DEVICE && ti == KVBM_TIER_G1 && m->testing.g1_emulate;
  if (!rc && memory != KVBM_MEMORY_SYSTEM && !emu && !kvbm__gpu_compiled())
    return kvbm_error_set(err, KVBM_EUNSUPPORTED, "manager: %s memory for %s needs a CUDA build",
                          kvbm_memory_type_name(memory), kvbm_tier_name(ti));
  /* Zero-filled: every page is touched now, not on the first copy into it
   * (what pinned memory would give; the cost moves to create). */
  kvbm_storage_config so = {.zero = 1, .device_id = m->cfg.g1_device};
  kvbm_memory_type alloc = emu ? KVBM_MEMORY_SYSTEM : memory;
  bool huge = alloc == KVBM_MEMORY_SYSTEM && !rc && t->layout.region_size >= HUGE_PAGE;
  if (huge) { /* we zero it ourselves, after the advice */
    so.zero = 0;
    so.alignment = t->layout.config.alignment > HUGE_PAGE ? 0 : HUGE_PAGE;
  }
  if (adopted) {
    emu = false; /* the engine's memory is what it says it is */
    huge = false;
    if (!rc) rc = adopted_tier(t, adopted, err);
  } else if (!rc) {
    rc = kvbm_storage_create(alloc, &t->layout, &so, &t->storage, err);
  }
  if (rc) return rc;
  for (uint64_t r = 0; huge && r < t->layout.num_regions; r++)
    advise_huge(kvbm_storage_region_base(t->storage, r), t->layout.region_size);
  t->memory = memory;
  t->device = memory == KVBM_MEMORY_DEVICE;
  if (t->device) m->emu = emu;
  t->region = calloc(t->layout.num_regions, sizeof *t->region);
  if (!t->region) return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  for (uint64_t r = 0; r < t->layout.num_regions; r++)
    t->region[r] = kvbm_storage_region_base(t->storage, r);
  t->store = KVBM__STORE_MEMORY;
  snprintf(t->mode, sizeof t->mode, "memory");
  if ((rc = tier_pool(m, t, nblocks, err))) return rc;
  t->usable = true;
  return KVBM_OK;
}

/* ---- G3's warm restart ---- */

typedef struct restore_ctx {
  kvbm_manager *m;
  kvbm__tier *t;
  uint64_t bad; /* slots of a group this manager does not have */
} restore_ctx;

/* One key the slot file holds, oldest first: indexed READY, so the LRU
 * order is the write order, under the group its slot's tag names (the
 * put's kvbm_volume_op.tag, workers.c), so its events carry the block's
 * own hash and group again (as_published). A tag past the manager's
 * groups cannot come from a file of the same label (volume_tier): such
 * a slot is forged or damaged, skipped and counted. (The file keeps no
 * parent hash: restored blocks report none, and zero tokens, in their
 * BlockStored events.) */
static void restore_key(void *user, uint64_t key, size_t size, uint32_t tag) {
  restore_ctx *c = user;
  kvbm__tier *t = c->t;
  uint32_t id, got;
  if (tag >= c->m->ngroups) {
    c->bad++;
    return;
  }
  if (size != c->m->block_bytes || kvbm_pool_contains(t->pool, key)) return;
  if (kvbm_pool_alloc(t->pool, 1, &id)) return;
  KVBM__MUST(kvbm__fill_grp(t, tag, id, 0, 0, false, c->m->zero_tokens, key, &got));
  t->state[got] = KVBM__READY;
  t->st.restored_blocks++;
  KVBM__MUST(kvbm_block_release(t->pool, got, 0));
}

/* Warm restart: index what the slot file kept (disk:// lists its keys;
 * other stores cannot be listed and start cold). */
static void restore(kvbm_manager *m, kvbm__tier *t) {
  restore_ctx c = {m, t, 0};
  uint64_t skipped = 0;
  if (kvbm_volume_keys_tagged(t->vol, restore_key, &c, &skipped, NULL) == KVBM_OK)
    t->st.restore_skipped = skipped + c.bad;
}

/* The slot file's label (volume/disk.h): a manager of several groups
 * names its group list and their layouts' fingerprint, so a file whose
 * slots' tags (groups) meant another list is refused at create instead of
 * serving one group's blocks as another's; one group: none (the file as
 * before groups, readable by any kvbm). */
static void g3_label(const kvbm_manager *m, char *out, size_t cap) {
  out[0] = 0;
  if (m->ngroups < 2) return;
  char list[160];
  kvbm_groups_format(m->groups, m->ngroups, list, sizeof list);
  uint64_t fp = 0;
  for (uint32_t g = 0; g < m->ngroups; g++) fp = kvbm__group_key(fp ^ m->gfp[g], g + 1);
  snprintf(out, cap, "groups %s layouts %016llx", list, (unsigned long long)fp);
}

/* G3's default store: the slot file in g3_dir as a disk:// volume, with
 * the config's I/O settings in its query (none when all are defaults). The
 * path is made absolute and percent-encoded (a URL takes no spaces, '?' or
 * '%' as they are); without g3_dir it is empty: the volume's private
 * default directory, as the slot file's own. */
static int disk_url(const kvbm_manager *m, char **out, kvbm_error *err) {
  char *abs = m->g3_dir ? realpath(m->g3_dir, NULL) : NULL;
  char cwd[4096];
  const char *dir = abs ? abs : m->g3_dir ? m->g3_dir : "";
  if (!abs && dir[0] && dir[0] != '/' && getcwd(cwd, sizeof cwd)) { /* missing: register says why */
    size_t n = strlen(cwd) + strlen(dir) + 2;
    if ((abs = malloc(n))) snprintf(abs, n, "%s/%s", cwd, dir);
    dir = abs ? abs : dir;
  }
  size_t cap = 3 * strlen(dir) + 128;
  char *u = malloc(cap);
  if (!u) {
    free(abs);
    return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  }
  size_t k = (size_t)snprintf(u, cap, "disk://");
  for (const char *p = dir; *p; p++) {
    unsigned char ch = (unsigned char)*p;
    bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                 (ch >= '0' && ch <= '9') || strchr("/._-~", ch);
    k += (size_t)snprintf(u + k, cap - k, plain ? "%c" : "%%%02X", ch);
  }
  uint32_t refuse = m->testing.g3_refuse;
  bool defaults = m->cfg.g3_direct && m->cfg.g3_uring && m->cfg.g3_queue_depth == 8 && !refuse;
  if (!defaults)
    snprintf(u + k, cap - k, "?direct=%d&uring=%d&depth=%u%s%s%s", m->cfg.g3_direct,
           m->cfg.g3_uring, m->cfg.g3_queue_depth, refuse ? "&test_refuse=" : "",
           refuse & KVBM_DISK_REFUSE_O_DIRECT ? "direct" : "",
           refuse == (KVBM_DISK_REFUSE_O_DIRECT | KVBM_DISK_REFUSE_URING)
               ? ",uring"
               : refuse == KVBM_DISK_REFUSE_URING ? "uring" : "");
  free(abs);
  *out = u;
  return KVBM_OK;
}

/* A volume tier: its index, then its store, registered from url. A URL
 * the volume refuses as malformed or of an unknown scheme is the caller's
 * mistake (create fails, naming the field); a store that cannot be opened
 * leaves the tier configured but unusable (create goes on, err says why). */
static int volume_tier(kvbm_manager *m, kvbm_tier ti, const char *field, const char *url,
                       uint64_t nblocks, kvbm_error *err) {
  kvbm__tier *t = &m->t[ti];
  t->store = KVBM__STORE_VOLUME;
  t->shared = ti == KVBM_TIER_G4;
  t->framed = strncmp(url, "disk:", 5) != 0; /* the slot file checks its own */
  t->depth = ti == KVBM_TIER_G4 ? m->cfg.g4_queue_depth : m->cfg.g3_queue_depth;
  int rc = tier_pool(m, t, nblocks, err);
  if (rc) return rc;
  if (kvbm__value_len(m, t) > (size_t)1 << 30)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: a block of %llu bytes is too large for %s",
                          (unsigned long long)m->block_bytes, field);
  if (t->shared && (rc = kvbm__value_key_init(m, t, err))) return rc;
  kvbm_volume_config vc = kvbm_volume_config_default(url);
  vc.key_namespace = m->ns;
  vc.timeout_ms = ti == KVBM_TIER_G4 ? m->cfg.g4_timeout_ms : 30000;
  /* Enough threads for the operations in flight to overlap in the store
   * (each thread has its own connection or file state). */
  vc.threads = t->depth < 8 ? t->depth : 8;
  t->batch_ops = (t->depth + vc.threads - 1) / vc.threads;
  if (!t->framed) {
    /* The slot file: one I/O thread keeps g3_queue_depth transfers in
     * flight and runs batches in order, starting the next queued one
     * while the last transfers of the previous are in flight; so batches
     * are large and two are queued, and the disk never waits for us.
     * (Staging memory is bounded: at most 2 x 64 MiB of blocks.) */
    uint64_t fit = ((uint64_t)64 << 20) / kvbm__value_len(m, t);
    uint32_t per = 4 * m->cfg.g3_queue_depth;
    if (per > fit) per = fit > m->cfg.g3_queue_depth ? (uint32_t)fit : m->cfg.g3_queue_depth;
    if (per > m->cfg.batch_max) per = m->cfg.batch_max;
    vc.threads = 1;
    t->batch_ops = per;
    t->depth = 2 * per;
  }
  vc.queue_capacity = t->depth + 16;
  vc.max_value_bytes = kvbm__value_len(m, t);
  vc.slots = nblocks;
  vc.block_bytes = m->block_bytes;
  vc.persist = m->cfg.g3_persist;
  vc.backend = ti == KVBM_TIER_G4 ? m->cfg.g4_backend : m->cfg.g3_backend;
  char label[256];
  if (ti == KVBM_TIER_G3) { /* the secret is read here and kept by no one */
    vc.disk_key = m->cfg.g3_key;
    vc.disk_key_len = m->cfg.g3_key_len;
    g3_label(m, label, sizeof label);
    vc.disk_label = label;
  }
  vc.backend_user = ti == KVBM_TIER_G4 ? m->cfg.g4_backend_user : m->cfg.g3_backend_user;
  kvbm_error e = {0};
  rc = kvbm_volume_register(&vc, &t->vol, &e);
  /* KVBM_EFORMAT: a slot file of another group list (g3_label): the
   * caller's to resolve, not a tier quietly left out. */
  if (rc == KVBM_EINVAL || rc == KVBM_EUNSUPPORTED || rc == KVBM_EFORMAT)
    return kvbm_error_set(err, rc, "manager: %s: %s", field, e.msg);
  if (rc) {
    snprintf(t->err, sizeof t->err, "%s", e.msg);
    return KVBM_OK;
  }
  t->usable = true;
  const char *mode = kvbm_volume_mode(t->vol);
  snprintf(t->mode, sizeof t->mode, "%s", mode[0] ? mode : kvbm_volume_url(t->vol));
  if (!t->shared && m->cfg.g3_persist) restore(m, t);
  if (t->shared && m->cfg.g4_lookup_timeout_ms > 0) {
    /* Lookups have their own connection and their deadline: a lookup the
     * prefill gave up on expires in the volume instead of piling up. */
    vc.threads = 1;
    vc.timeout_ms = m->cfg.g4_lookup_timeout_ms;
    vc.queue_capacity = 64;
    if (kvbm_volume_register(&vc, &t->lookup_vol, &e)) t->lookup_vol = NULL; /* no lookups */
  }
  return KVBM_OK;
}

static int filters(kvbm_manager *m, kvbm_error *err) {
  const kvbm_manager_config *c = &m->cfg;
  m->t[KVBM_TIER_G2].policy = c->g2_policy;
  m->t[KVBM_TIER_G3].policy = c->g3_policy;
  m->t[KVBM_TIER_G4].policy = c->g4_policy;
  for (int ti = KVBM_TIER_G2; ti < KVBM_TIER_COUNT; ti++) {
    kvbm__tier *t = &m->t[ti];
    if (t->policy != KVBM_OFFLOAD_FREQUENCY) continue;
    int rc = kvbm__freq_filter_init(&t->filter, c->freq_threshold, c->freq_decay_uses,
                                    c->freq_max_entries);
    if (rc) return kvbm_error_set(err, rc, "manager: cannot create the frequency filter");
    t->filter_on = true;
  }
  return KVBM_OK;
}

/* Device G1: every worker that copies into or out of G1 gets its own
 * stream (the host worker with an event per job of a batch). */
static int gpu_streams(kvbm_manager *m, kvbm_error *err) {
  if (!m->t[KVBM_TIER_G1].device) return KVBM_OK;
  for (int ti = KVBM_TIER_G2; ti < KVBM_TIER_COUNT; ti++) {
    kvbm__tier *t = &m->t[ti];
    if (!t->present || !t->usable) continue;
    uint32_t nev = ti == KVBM_TIER_G2 ? m->cfg.batch_max : 0;
    int rc = m->emu ? kvbm__gpu_stream_emulated(nev, &m->emu_copies, m->testing.g1_fail_copy,
                                                &t->gs, err)
                    : kvbm__gpu_stream_create(m->cfg.g1_device, nev, &t->gs, err);
    if (rc) return rc;
  }
  return KVBM_OK;
}

static char *dup_opt(const char *s, bool *oom) {
  if (!s) return NULL;
  char *d = strdup(s);
  if (!d) *oom = true;
  return d;
}

/* Engine-owned tiers: the storage's memory and device become the tier's
 * config, so the rest of the manager sees an ordinary tier of that memory. */
static int adopt_config(kvbm_manager *m, kvbm_error *err) {
  kvbm_manager_config *c = &m->cfg;
  if (c->g1_storage && c->g1_storage == c->g2_storage)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g1_storage and g2_storage are the same storage");
  if (c->g2_storage && !c->g2_blocks)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g2_storage given but g2_blocks is 0");
  if (c->g1_storage) {
    kvbm_memory_type mt = kvbm_storage_memory_type(c->g1_storage);
    if (mt != KVBM_MEMORY_SYSTEM && mt != KVBM_MEMORY_PINNED && mt != KVBM_MEMORY_DEVICE)
      return kvbm_error_set(err, KVBM_EINVAL, "manager: g1_storage is %s memory, not system, pinned or device",
                            kvbm_memory_type_name(mt));
    c->g1_memory = mt;
    if (mt == KVBM_MEMORY_DEVICE) c->g1_device = kvbm_storage_device_id(c->g1_storage);
  }
  if (c->g2_storage) {
    kvbm_memory_type mt = kvbm_storage_memory_type(c->g2_storage);
    if (mt != KVBM_MEMORY_SYSTEM && mt != KVBM_MEMORY_PINNED)
      return kvbm_error_set(err, KVBM_EINVAL, "manager: g2_storage is %s memory, not system or pinned",
                            kvbm_memory_type_name(mt));
    c->g2_memory = mt;
  }
  return KVBM_OK;
}

/* The config's strings become the manager's own; the block format. */
static int own_config(kvbm_manager *m, const kvbm_manager_config *cfg, kvbm_error *err) {
  bool oom = false;
  m->cfg = *cfg;
  int arc = adopt_config(m, err);
  if (arc) {
    m->cfg.g1_storage = m->cfg.g2_storage = NULL; /* destroy must not take them for ours */
    return arc;
  }
  m->g3_dir = dup_opt(cfg->g3_dir ? cfg->g3_dir : "/tmp", &oom);
  m->g3_url = dup_opt(cfg->g3_url, &oom);
  m->g4_url = dup_opt(cfg->g4_url, &oom);
  m->model_id = dup_opt(cfg->model_id, &oom);
  m->g2_name = dup_opt(cfg->g2_volume_name ? cfg->g2_volume_name : "g2", &oom);
  m->cfg.g2_volume_name = m->g2_name;
  m->cfg.g3_dir = m->g3_dir;
  m->cfg.g3_url = m->g3_url;
  m->cfg.g4_url = m->g4_url;
  m->cfg.model_id = m->model_id;
  m->zero_tokens = calloc(cfg->block_size, sizeof *m->zero_tokens);
  m->g1_owner = calloc(cfg->g1_blocks, sizeof *m->g1_owner);
  if (oom || !m->zero_tokens || !m->g1_owner)
    return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  kvbm_layout_config lc = cfg->layout;
  lc.num_blocks = 1;
  int rc = kvbm_layout_init(&m->slot_layout, KVBM_LAYOUT_FULLY_CONTIGUOUS, &lc, err);
  if (rc) return rc;
  m->block_bytes = lc.num_layers * m->slot_layout.layer_stride;
  m->fingerprint = kvbm_layout_fingerprint(&m->slot_layout);
  rc = kvbm__groups_check(cfg, m->block_bytes, err); /* sizes need the block's */
  if (rc) return rc;
  kvbm__groups_init(m);
  return kvbm__namespace_init(m, err);
}

static int tiers(kvbm_manager *m, kvbm_error *err) {
  const kvbm_manager_config *c = &m->cfg;
  for (int ti = 0; ti < KVBM_TIER_COUNT; ti++) m->t[ti].id = (kvbm_tier)ti;
  int rc = host_tier(m, KVBM_TIER_G1, c->g1_blocks, c->g1_kind, c->g1_memory, err);
  if (!rc && c->g2_blocks)
    rc = host_tier(m, KVBM_TIER_G2, c->g2_blocks, c->g2_kind, c->g2_memory, err);
  if (!rc) rc = filters(m, err);
  if (!rc && c->g3_blocks && c->g3_url) {
    rc = volume_tier(m, KVBM_TIER_G3, "g3_url", c->g3_url, c->g3_blocks, err);
  } else if (!rc && c->g3_blocks) {
    char *url = NULL;
    rc = disk_url(m, &url, err);
    if (!rc) rc = volume_tier(m, KVBM_TIER_G3, "g3_dir", url, c->g3_blocks, err);
    free(url);
  }
  if (!rc && c->g4_url) rc = volume_tier(m, KVBM_TIER_G4, "g4_url", c->g4_url, c->g4_blocks, err);
  if (!rc) rc = gpu_streams(m, err);
  return rc;
}

int kvbm_manager_create(const kvbm_manager_config *cfg, kvbm_manager **out, kvbm_error *err) {
  return kvbm__manager_create_testing(cfg, NULL, out, err);
}

int kvbm__manager_create_testing(const kvbm_manager_config *cfg, const kvbm__manager_testing *t,
                                 kvbm_manager **out, kvbm_error *err) {
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "manager: NULL argument");
  int rc = kvbm__manager_check_config(cfg, err);
  if (rc) return rc;
  kvbm_manager *m = calloc(1, sizeof *m);
  if (!m) return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  if (t) m->testing = *t;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&m->mu, NULL);
  pthread_mutex_init(&m->peers_mu, NULL);
  pthread_cond_init(&m->done_cv, &ca);
  pthread_condattr_destroy(&ca);
  m->mu_ready = true;
  rc = own_config(m, cfg, err);
  if (!rc) rc = tiers(m, err);
  m->cfg.g3_key = NULL; /* the volume derived its key; the secret is not kept */
  m->cfg.g3_key_len = 0;
  m->cfg.g4_key = NULL; /* likewise: store.c derived the MAC key */
  m->cfg.g4_key_len = 0;
  m->cfg.g4_key_file = NULL;
  if (!rc && kvbm__tier_metrics_init(&m->tm))
    rc = kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  if (!rc) rc = kvbm__workers_start(m, err);
  if (!rc) rc = kvbm__manager_endpoint_start(m, &cfg->metrics, &m->mx, err);
  if (rc) {
    kvbm_manager_destroy(m);
    return rc;
  }
  *out = m;
  return KVBM_OK;
}

void kvbm_manager_destroy(kvbm_manager *m) {
  if (!m) return;
  kvbm__manager_endpoint_stop(&m->mx); /* no scrape reads the manager from here on */
  /* The peers' link threads use the tiers: they stop first. */
  if (m->mu_ready) kvbm__disagg_stop(m);
  kvbm__workers_stop(m);
  for (int ti = 0; ti < KVBM_TIER_COUNT; ti++) {
    kvbm__tier *t = &m->t[ti];
    /* Every operation has completed: the workers waited for them. */
    kvbm_volume_unregister(t->lookup_vol);
    kvbm_volume_unregister(t->vol);
    explicit_bzero(t->mac_key, sizeof t->mac_key);
    explicit_bzero(t->aead_key, sizeof t->aead_key);
    kvbm__gpu_stream_destroy(t->gs);
    kvbm_pool_destroy(t->pool);
    /* An engine-owned tier's storage is the engine's to release. */
    if (t->storage != m->cfg.g1_storage && t->storage != m->cfg.g2_storage)
      kvbm_storage_release(t->storage);
    free(t->region);
    free(t->state);
    free(t->grp);
    kvbm__sums_destroy(t);
    if (t->filter_on) kvbm__freq_filter_destroy(&t->filter);
  }
  free(m->zero_tokens);
  free(m->g1_owner);
  free(m->g3_dir);
  free(m->g3_url);
  free(m->g4_url);
  free(m->model_id);
  kvbm__tier_metrics_free(&m->tm);
  free(m->g2_name);
  if (m->mu_ready) {
    pthread_mutex_destroy(&m->peers_mu);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->done_cv);
  }
  free(m);
}

static bool tier_ok(const kvbm_manager *m, kvbm_tier ti) {
  return m && ti >= 0 && ti < KVBM_TIER_COUNT;
}

const char *kvbm_manager_tier_error(const kvbm_manager *m, kvbm_tier ti) {
  return tier_ok(m, ti) ? m->t[ti].err : "";
}

const char *kvbm_manager_tier_mode(const kvbm_manager *m, kvbm_tier ti) {
  return tier_ok(m, ti) && m->t[ti].present && m->t[ti].usable ? m->t[ti].mode : "";
}

const char *kvbm_manager_g3_error(const kvbm_manager *m) {
  return kvbm_manager_tier_error(m, KVBM_TIER_G3);
}
const char *kvbm_manager_g3_mode(const kvbm_manager *m) {
  return kvbm_manager_tier_mode(m, KVBM_TIER_G3);
}
uint64_t kvbm_manager_block_bytes(const kvbm_manager *m) { return m ? m->block_bytes : 0; }

const kvbm_layout *kvbm_manager_layout(const kvbm_manager *m, kvbm_tier ti) {
  if (!tier_ok(m, ti) || !m->t[ti].present || !m->t[ti].usable) return NULL;
  if (m->t[ti].store != KVBM__STORE_MEMORY) return &m->slot_layout;
  return &m->t[ti].layout;
}

int kvbm_manager_block_layer(const kvbm_manager *m, kvbm_tier ti, uint32_t block,
                             uint32_t layer, void **ptr, size_t *size) {
  if (!m || !ptr) return KVBM_EINVAL;
  if (ti != KVBM_TIER_G1 && ti != KVBM_TIER_G2) return KVBM_ETIER;
  const kvbm__tier *t = &m->t[ti];
  if (!t->present || t->store != KVBM__STORE_MEMORY) return KVBM_ETIER;
  if (block >= t->layout.config.num_blocks || layer >= t->layout.config.num_layers)
    return KVBM_ERANGE;
  *ptr = kvbm__layer_ptr(t, block, layer);
  if (size) *size = t->layout.layer_stride;
  return KVBM_OK;
}

static int block_io(const kvbm_manager *m, kvbm_tier ti, uint32_t block, uint32_t layer,
                    void *host, size_t n, bool to_block, kvbm_error *err) {
  void *p;
  size_t sz;
  int rc = kvbm_manager_block_layer(m, ti, block, layer, &p, &sz);
  if (rc)
    return kvbm_error_set(err, rc, "manager: no block %u layer %u in %s", block, layer,
                          kvbm_tier_name(ti));
  if (!host && n) return kvbm_error_set(err, KVBM_EINVAL, "manager: NULL buffer");
  if (n > sz)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: %zu bytes do not fit a layer of %zu", n, sz);
  if (m->t[ti].device && !m->emu) return kvbm__gpu_copy_now(m->cfg.g1_device, to_block ? p : host,
                                                to_block ? host : p, n, err);
  if (n) memcpy(to_block ? p : host, to_block ? host : p, n);
  return KVBM_OK;
}

int kvbm_manager_block_write(const kvbm_manager *m, kvbm_tier tier, uint32_t block,
                             uint32_t layer, const void *src, size_t n, kvbm_error *err) {
  return block_io(m, tier, block, layer, (void *)(uintptr_t)src, n, true, err);
}

int kvbm_manager_block_read(const kvbm_manager *m, kvbm_tier tier, uint32_t block,
                            uint32_t layer, void *dst, size_t n, kvbm_error *err) {
  return block_io(m, tier, block, layer, dst, n, false, err);
}

kvbm_memory_type kvbm_manager_memory(const kvbm_manager *m, kvbm_tier ti) {
  if (!tier_ok(m, ti) || !m->t[ti].present || !m->t[ti].usable) return (kvbm_memory_type)0;
  if (m->t[ti].store != KVBM__STORE_MEMORY) return KVBM_MEMORY_DISK;
  return m->t[ti].memory;
}

/* Lock held. */
static void stats_locked(kvbm_manager *m, kvbm_tier ti, kvbm_tier_stats *out) {
  kvbm__tier *t = &m->t[ti];
  *out = t->st;
  out->present = t->present && t->usable;
  if (t->pool) {
    kvbm_pool_stats ps;
    kvbm_pool_stats_get(t->pool, &ps);
    out->num_blocks = ps.num_blocks;
    out->free = ps.free;
    out->cached = ps.cached;
    out->active = ps.active;
    out->evictions = ps.evicted;
    out->allocated = ps.allocated;
  }
}

int kvbm_manager_stats_get(kvbm_manager *m, kvbm_tier ti, kvbm_tier_stats *out) {
  if (!m || !out || ti < 0 || ti >= KVBM_TIER_COUNT) return KVBM_EINVAL;
  pthread_mutex_lock(&m->mu);
  stats_locked(m, ti, out);
  pthread_mutex_unlock(&m->mu);
  return KVBM_OK;
}

/* All the counters of kvbm_manager_metrics_collect, in one hold of the
 * lock (tier/metrics.h); the volumes' counters are atomics, read after. */
int kvbm__manager_snapshot(kvbm_manager *m, kvbm__manager_snap *out) {
  if (!m || !out) return KVBM_EINVAL;
  pthread_mutex_lock(&m->mu);
  for (int t = 0; t < KVBM_TIER_COUNT; t++) stats_locked(m, t, &out->tier[t]);
  out->block_size = m->cfg.block_size;
  out->block_bytes = m->block_bytes;
  out->tm = m->tm.s;
  pthread_mutex_unlock(&m->mu);
  for (int t = 0; t < KVBM_TIER_COUNT; t++) {
    const kvbm__tier *x = &m->t[t]; /* vol, mode: set at create, fixed after */
    out->has_volume[t] = x->vol != NULL;
    if (x->vol) kvbm_volume_stats_get(x->vol, &out->volume[t]);
    snprintf(out->mode[t], sizeof out->mode[t], "%s", kvbm_manager_tier_mode(m, t));
  }
  return KVBM_OK;
}

kvbm_metrics *kvbm_manager_metrics(kvbm_manager *m) { return m ? m->mx.reg : NULL; }

uint16_t kvbm_manager_metrics_port(const kvbm_manager *m) {
  return m ? kvbm_metrics_server_port(m->mx.srv) : 0;
}

