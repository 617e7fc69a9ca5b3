/*
 * index.c: the router's prefix index (see kvbm/router.h).
 *
 * Layout. One shared open-addressing table maps an index key (a chained
 * sequence hash) to three 64-bit masks, one per tier: bit s set = the worker
 * in slot s holds the block in that tier. Because keys are chained hashes,
 * a flat map is enough for prefix lookups: h[k] present for a worker means
 * that worker holds the block whose whole prefix is h[0..k], and the walk
 * h[0], h[1], ... stops for a worker at its first miss. Beside it, the
 * writer keeps one private map per worker (wmap.c) with counts and the
 * engine-to-index hash translation; readers never see those.
 *
 * Why a single writer with seqlocked slots (and not a lock, RCU copies, or
 * sharded locks): events arrive in one ordered stream per worker and are
 * cheap to apply (a few hundred ns would be too slow at 10M/s), while
 * lookups walk hundreds of slots. A reader-writer lock would put two atomic
 * read-modify-writes on a shared line on every lookup and stall lookups
 * behind batches; copy-on-write tables would copy megabytes per event. A
 * seqlock per slot costs a reader two extra loads of a line it reads anyway
 * and never writes shared memory, so any number of readers scale; the
 * writer pays two extra stores per change.
 *
 * The one thing slot seqlocks do not cover is backward-shift deletion, which
 * moves an entry towards its home slot: a reader that passed the destination
 * before the move and reaches the source after it would report a miss for a
 * present key. The writer makes a table-wide `moves` counter odd during each
 * deletion; a reader believes a miss only if `moves` was even and unchanged
 * around its probe (hits need no check). Growing allocates a table twice
 * the size, fills it, and publishes it with a release store; readers still
 * on the old one finish there (a slightly older view), and the old one is
 * kept until kvbm_index_destroy, so there is no reclamation to race with.
 *
 * Every shared field is a C11 atomic; the protocol uses acquire loads and
 * release stores only, no fences (plain moves on x86-64, ldar/stlr on
 * arm64), so ThreadSanitizer understands it and the compiler cannot tear
 * or cache them.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kvbm/router.h"
#include "router/wmap.h"

#define T KVBM_ROUTER_TIERS
#define MAXW KVBM_ROUTER_MAX_WORKERS
#define PREFETCH_AHEAD 16

typedef struct slot {
  _Atomic uint64_t seq; /* odd while the writer changes the slot */
  _Atomic uint64_t key;
  _Atomic uint64_t mask[T]; /* all zero: the slot is empty */
} slot;

typedef struct stab {
  size_t cap; /* power of two */
  unsigned shift;
  slot *s;
  void *map; /* the mapping behind s, when mapped */
  size_t map_len;
  struct stab *retired; /* older tables, kept until destroy */
} stab;

typedef struct worker {
  _Atomic uint64_t wid;
  _Atomic uint32_t rank;
  bool live, have_id;
  uint64_t next_id;
  wmap map;
} worker;

typedef struct counters {
  _Atomic uint64_t events, stored, removed, cleared, duplicates, gaps, unknown_removed,
      orphans, entries;
} counters;

struct kvbm_index {
  kvbm_index_config cfg;
  _Atomic(stab *) tab;
  _Atomic uint64_t moves;
  _Atomic uint64_t live; /* mask of live worker slots */
  worker w[MAXW];
  uint32_t last_slot; /* writer's cache of the last worker looked up */
  counters c;
};

/* ------------------------------------------------------------ helpers */

#define LD(p) atomic_load_explicit((p), memory_order_relaxed)
#define ST(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)

static inline void bump(_Atomic uint64_t *c, uint64_t by) { ST(c, LD(c) + by); }

static inline size_t home(const stab *t, uint64_t h) {
  return (size_t)((h * 0x9E3779B97F4A7C15ull) >> t->shift);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Tables of 2 MiB and more are mapped fresh, 2 MiB-aligned, and advised to
 * use huge pages: a lookup touches one random slot per block, and with
 * 4 KiB pages each of those would also be a TLB miss. (Fresh mappings:
 * memory malloc recycles is already faulted in small pages.) */
#define HUGE_BYTES ((size_t)2 << 20)

static slot *slots_alloc(size_t cap, void **map, size_t *map_len) {
  size_t bytes = cap * sizeof(slot);
  *map = NULL;
  *map_len = 0;
  if (bytes < HUGE_BYTES) return calloc(cap, sizeof(slot));
  size_t len = bytes + HUGE_BYTES;
  uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  uint8_t *a = (uint8_t *)(((uintptr_t)p + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
#ifdef MADV_HUGEPAGE
  madvise(a, bytes, MADV_HUGEPAGE); /* advice only: failure changes nothing */
#endif
  *map = p;
  *map_len = len;
  return (slot *)a; /* zero-filled by mmap */
}

static void stab_free(stab *t) {
  if (t->map) munmap(t->map, t->map_len);
  else free(t->s);
  free(t);
}

static stab *stab_new(size_t cap) {
  stab *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->s = slots_alloc(cap, &t->map, &t->map_len);
  if (!t->s) {
    free(t);
    return NULL;
  }
  t->cap = cap;
  unsigned bits = 0;
  while (((size_t)1 << bits) < cap) bits++;
  t->shift = 64 - bits;
  return t;
}

/* ------------------------------------------------------------ reader side */

/* Reads slot i consistently. */
static inline void slot_read(const slot *s, uint64_t *key, uint64_t m[T]) {
  for (;;) {
    uint64_t q = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (q & 1) {
      cpu_relax();
      continue;
    }
    /* acquire loads keep the second seq load after them (no fence: GCC's
     * ThreadSanitizer does not model fences) */
    *key = atomic_load_explicit(&s->key, memory_order_acquire);
    for (int t = 0; t < T; t++) m[t] = atomic_load_explicit(&s->mask[t], memory_order_acquire);
    if (LD(&s->seq) == q) return;
  }
}

/* The masks of key h (zeros when absent). */
static inline void probe(const kvbm_index *idx, const stab *t, uint64_t h, uint64_t m[T]) {
  size_t mask = t->cap - 1;
  for (;;) {
    uint64_t mv = atomic_load_explicit(&idx->moves, memory_order_acquire);
    for (size_t i = home(t, h);; i = (i + 1) & mask) {
      uint64_t k;
      slot_read(&t->s[i], &k, m);
      if (!(m[0] | m[1] | m[2])) break;
      if (k == h) return;
    }
    /* the slot loads above were acquires: this load cannot move before them */
    if (!(mv & 1) && LD(&idx->moves) == mv) return; /* a real miss (m is zero) */
    cpu_relax();
  }
}

static inline void drop_bits(kvbm_overlap *out, uint64_t gone, int tier, uint32_t k) {
  while (gone) {
    int s = __builtin_ctzll(gone);
    gone &= gone - 1;
    out[s].prefix[tier] = k;
  }
}

void kvbm_index_lookup(const kvbm_index *idx, const uint64_t *hashes, size_t n,
                       kvbm_overlap *out, uint64_t *workers) {
  memset(out, 0, MAXW * sizeof *out);
  uint64_t live = atomic_load_explicit(&idx->live, memory_order_acquire);
  if (workers) *workers = live;
  const stab *t = atomic_load_explicit(&((kvbm_index *)idx)->tab, memory_order_acquire);
  uint64_t a[T] = {live, live, live};
  size_t k = 0;
  for (size_t p = 0; p < PREFETCH_AHEAD && p < n; p++)
    __builtin_prefetch(&t->s[home(t, hashes[p])]);
  for (; k < n && a[T - 1]; k++) {
    if (k + PREFETCH_AHEAD < n) __builtin_prefetch(&t->s[home(t, hashes[k + PREFETCH_AHEAD])]);
    uint64_t m[T];
    probe(idx, t, hashes[k], m);
    uint64_t held = 0;
    for (int tier = 0; tier < T; tier++) {
      held |= m[tier]; /* cumulative: device, device+host, any */
      uint64_t keep = a[tier] & held;
      if (keep != a[tier]) drop_bits(out, a[tier] & ~keep, tier, (uint32_t)k);
      a[tier] = keep;
    }
  }
  for (int tier = 0; tier < T; tier++) drop_bits(out, a[tier], tier, (uint32_t)k);
}

size_t kvbm_index_hash_tokens(const kvbm_index *idx, const uint32_t *tokens, size_t n,
                              uint64_t *out, size_t max_out) {
  return kvbm_hash_chain(idx->cfg.scheme, idx->cfg.salt_hash, tokens, n, idx->cfg.block_size,
                         out, max_out);
}

uint64_t kvbm_index_workers(const kvbm_index *idx) {
  return atomic_load_explicit(&idx->live, memory_order_acquire);
}

bool kvbm_index_slot_worker(const kvbm_index *idx, uint32_t slot, kvbm_worker_key *out) {
  if (slot >= MAXW || !(kvbm_index_workers(idx) >> slot & 1)) return false;
  out->worker_id = LD(&idx->w[slot].wid);
  out->dp_rank = LD(&idx->w[slot].rank);
  return true;
}

int kvbm_index_worker_slot(const kvbm_index *idx, kvbm_worker_key key, uint32_t *slot) {
  uint64_t live = kvbm_index_workers(idx);
  for (uint32_t s = 0; s < MAXW; s++)
    if ((live >> s & 1) && LD(&idx->w[s].wid) == key.worker_id &&
        LD(&idx->w[s].rank) == key.dp_rank) {
      if (slot) *slot = s;
      return KVBM_OK;
    }
  return KVBM_ENOTFOUND;
}

void kvbm_index_stats_get(const kvbm_index *idx, kvbm_index_stats *o) {
  const counters *c = &idx->c;
  o->events = LD(&c->events);
  o->stored = LD(&c->stored);
  o->removed = LD(&c->removed);
  o->cleared = LD(&c->cleared);
  o->duplicates = LD(&c->duplicates);
  o->gaps = LD(&c->gaps);
  o->unknown_removed = LD(&c->unknown_removed);
  o->orphans = LD(&c->orphans);
  o->entries = LD(&c->entries);
  o->table_slots = atomic_load_explicit(&((kvbm_index *)idx)->tab, memory_order_acquire)->cap;
  o->workers = (uint32_t)__builtin_popcountll(kvbm_index_workers(idx));
}

/* ------------------------------------------------------------ writer side */

static void slot_write(slot *s, uint64_t key, const uint64_t m[T]) {
  uint64_t q = LD(&s->seq);
  ST(&s->seq, q + 1);
  /* release stores: a reader that sees any of them sees the odd seq (and an
   * odd `moves`) written before */
  atomic_store_explicit(&s->key, key, memory_order_release);
  for (int t = 0; t < T; t++) atomic_store_explicit(&s->mask[t], m[t], memory_order_release);
  atomic_store_explicit(&s->seq, q + 2, memory_order_release);
}

static inline bool slot_empty(const slot *s) {
  return !(LD(&s->mask[0]) | LD(&s->mask[1]) | LD(&s->mask[2]));
}

/* The writer's own slot of key h, or the empty slot ending its probe run. */
static slot *find_slot(stab *t, uint64_t h, bool *found) {
  size_t mask = t->cap - 1;
  for (size_t i = home(t, h);; i = (i + 1) & mask) {
    slot *s = &t->s[i];
    if (slot_empty(s)) {
      *found = false;
      return s;
    }
    if (LD(&s->key) == h) {
      *found = true;
      return s;
    }
  }
}

static bool grow(kvbm_index *idx) {
  stab *old = LD(&idx->tab);
  stab *t = stab_new(old->cap * 2);
  if (!t) return false;
  for (size_t i = 0; i < old->cap; i++) {
    slot *s = &old->s[i];
    if (slot_empty(s)) continue;
    uint64_t key = LD(&s->key), m[T];
    for (int k = 0; k < T; k++) m[k] = LD(&s->mask[k]);
    bool found;
    slot *d = find_slot(t, key, &found);
    ST(&d->key, key);
    for (int k = 0; k < T; k++) ST(&d->mask[k], m[k]);
  }
  t->retired = old;
  atomic_store_explicit(&idx->tab, t, memory_order_release);
  return true;
}

/* Sets bit `w` of tier `tier` of key h; *was_set says whether it was. */
static int shared_hold(kvbm_index *idx, uint64_t h, uint32_t w, int tier, bool *was_set) {
  stab *t = LD(&idx->tab);
  bool found;
  slot *s = find_slot(t, h, &found);
  if (!found && (LD(&idx->c.entries) + 1) * 2 > t->cap) {
    if (!grow(idx)) return KVBM_ENOMEM;
    t = LD(&idx->tab);
    s = find_slot(t, h, &found);
  }
  uint64_t m[T] = {0, 0, 0};
  if (found)
    for (int k = 0; k < T; k++) m[k] = LD(&s->mask[k]);
  else
    bump(&idx->c.entries, 1);
  *was_set = m[tier] >> w & 1;
  if (*was_set) return KVBM_OK;
  m[tier] |= 1ull << w;
  slot_write(s, h, m);
  return KVBM_OK;
}

/* Deletes slot s by backward shift, inside a `moves` window. */
static void slot_delete(kvbm_index *idx, stab *t, slot *s) {
  uint64_t mv = LD(&idx->moves);
  ST(&idx->moves, mv + 1); /* ordered before the slots' release stores */
  size_t mask = t->cap - 1, i = (size_t)(s - t->s), j = i;
  for (;;) {
    j = (j + 1) & mask;
    slot *sj = &t->s[j];
    if (slot_empty(sj)) break;
    uint64_t key = LD(&sj->key);
    size_t k = home(t, key);
    if (((j - k) & mask) >= ((j - i) & mask)) {
      uint64_t m[T];
      for (int x = 0; x < T; x++) m[x] = LD(&sj->mask[x]);
      slot_write(&t->s[i], key, m);
      i = j;
    }
  }
  static const uint64_t zero[T] = {0, 0, 0};
  slot_write(&t->s[i], 0, zero);
  atomic_store_explicit(&idx->moves, mv + 2, memory_order_release);
  bump(&idx->c.entries, (uint64_t)-1);
}

/* Clears the bits `bits` of tier `tier` in slot s; false when none was set. */
static bool slot_clear(kvbm_index *idx, stab *t, slot *s, uint64_t bits, int tier) {
  uint64_t m[T];
  for (int k = 0; k < T; k++) m[k] = LD(&s->mask[k]);
  if (!(m[tier] & bits)) return false;
  m[tier] &= ~bits;
  if (m[0] | m[1] | m[2])
    slot_write(s, LD(&s->key), m);
  else
    slot_delete(idx, t, s);
  return true;
}

/* Clears bit `w` of tier `tier` of key h; false when it was not set. */
static bool shared_release(kvbm_index *idx, uint64_t h, uint32_t w, int tier) {
  stab *t = LD(&idx->tab);
  bool found;
  slot *s = find_slot(t, h, &found);
  return found && slot_clear(idx, t, s, 1ull << w, tier);
}

/*
 * Copies. In recompute mode the worker's map holds every block (engine
 * hash -> index key, count per tier). With the engine's hashes as keys the
 * shared bit says "at least one copy" and the map holds only the extra
 * copies of duplicated blocks (rare), so the common event costs one probe
 * of the shared table and nothing else.
 */
static int hold(kvbm_index *idx, uint32_t w, int tier, uint64_t e, uint64_t r) {
  bool added, was_set;
  int rc;
  if (!idx->cfg.recompute) {
    if ((rc = shared_hold(idx, e, w, tier, &was_set))) return rc;
    if (was_set) {
      wentry *we = wmap_upsert(&idx->w[w].map, e, e, &added);
      if (!we) return KVBM_ENOMEM;
      we->cnt[tier]++;
    }
    bump(&idx->c.stored, 1);
    return KVBM_OK;
  }
  wentry *we = wmap_upsert(&idx->w[w].map, e, r, &added);
  if (!we) return KVBM_ENOMEM;
  if (we->cnt[tier]++ == 0) {
    rc = shared_hold(idx, we->rhash, w, tier, &was_set);
    if (rc) {
      we->cnt[tier]--;
      if (added) wmap_erase(&idx->w[w].map, we);
      return rc;
    }
  }
  bump(&idx->c.stored, 1);
  return KVBM_OK;
}

static void unhold(kvbm_index *idx, uint32_t w, int tier, uint64_t e) {
  wmap *m = &idx->w[w].map;
  wentry *we = wmap_find(m, e);
  if (!idx->cfg.recompute) {
    if (we && we->cnt[tier]) { /* an extra copy goes, the bit stays */
      we->cnt[tier]--;
      if (!(we->cnt[0] | we->cnt[1] | we->cnt[2])) wmap_erase(m, we);
    } else if (!shared_release(idx, e, w, tier)) {
      bump(&idx->c.unknown_removed, 1);
      return;
    }
    bump(&idx->c.removed, 1);
    return;
  }
  if (!we || we->cnt[tier] == 0) {
    bump(&idx->c.unknown_removed, 1);
    return;
  }
  if (--we->cnt[tier] == 0) shared_release(idx, we->rhash, w, tier);
  if (!(we->cnt[0] | we->cnt[1] | we->cnt[2])) wmap_erase(m, we);
  bump(&idx->c.removed, 1);
}

/* Forgets everything slot w holds. */
static void forget_all(kvbm_index *idx, uint32_t w) {
  wmap *m = &idx->w[w].map;
  if (idx->cfg.recompute) {
    for (size_t i = 0; i < m->cap; i++) {
      wentry *we = &m->e[i];
      if (!we->used) continue;
      for (int t = 0; t < T; t++)
        if (we->cnt[t]) shared_release(idx, we->rhash, w, t);
    }
  } else {
    /* No list of the worker's blocks: sweep the table (clears and worker
     * departures are rare). A deletion shifts later entries back into
     * slot i, so slot i is looked at again; entries only move backwards,
     * and one wrapping from the start to the end was already swept. */
    stab *t = LD(&idx->tab);
    uint64_t bit = 1ull << w;
    for (size_t i = 0; i < t->cap;) {
      slot *s = &t->s[i];
      uint64_t mk[T], any = 0;
      for (int k = 0; k < T; k++) any |= (mk[k] = LD(&s->mask[k]));
      if (!(any & bit)) {
        i++;
        continue;
      }
      for (int k = 0; k < T; k++) mk[k] &= ~bit;
      if (mk[0] | mk[1] | mk[2])
        slot_write(s, LD(&s->key), mk);
      else
        slot_delete(idx, t, s); /* slot i now holds a later entry or nothing */
    }
  }
  wmap_clear(m);
}

/* ------------------------------------------------------------ public */

kvbm_router_tier kvbm_router_tier_of(kvbm_medium m) {
  switch (m) {
    case KVBM_MEDIUM_NONE:
    case KVBM_MEDIUM_GPU:
      return KVBM_ROUTER_DEVICE;
    case KVBM_MEDIUM_CPU:
      return KVBM_ROUTER_HOST;
    default:
      return KVBM_ROUTER_DISK;
  }
}

kvbm_index_config kvbm_index_config_default(void) {
  return (kvbm_index_config){.block_size = 16, .scheme = KVBM_HASH_NATIVE, .salt_hash = 0,
                             .recompute = false, .expected_blocks = 65536};
}

int kvbm_index_create(const kvbm_index_config *cfg, kvbm_index **out, kvbm_error *err) {
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "router index: NULL argument");
  if (cfg->block_size == 0 || cfg->block_size > KVBM_POOL_MAX_BLOCK_SIZE)
    return kvbm_error_set(err, KVBM_EINVAL, "router index: block size %u is not in 1..%u",
                          cfg->block_size, KVBM_POOL_MAX_BLOCK_SIZE);
  if (cfg->scheme != KVBM_HASH_NATIVE && cfg->scheme != KVBM_HASH_DYNAMO)
    return kvbm_error_set(err, KVBM_EINVAL, "router index: unknown hash scheme %d",
                          (int)cfg->scheme);
  if (cfg->expected_blocks > ((size_t)1 << 32))
    return kvbm_error_set(err, KVBM_EINVAL, "router index: expected_blocks %zu is above 2^32",
                          cfg->expected_blocks);
  kvbm_index *idx = calloc(1, sizeof *idx);
  size_t cap = 64;
  while (cap < cfg->expected_blocks * 2) cap *= 2;
  stab *t = idx ? stab_new(cap) : NULL;
  if (!t) {
    free(idx);
    return kvbm_error_set(err, KVBM_ENOMEM, "router index: out of memory");
  }
  idx->cfg = *cfg;
  atomic_init(&idx->tab, t);
  *out = idx;
  return KVBM_OK;
}

void kvbm_index_destroy(kvbm_index *idx) {
  if (!idx) return;
  for (stab *t = LD(&idx->tab), *n; t; t = n) {
    n = t->retired;
    stab_free(t);
  }
  for (int s = 0; s < MAXW; s++) wmap_free(&idx->w[s].map);
  free(idx);
}

const kvbm_index_config *kvbm_index_config_get(const kvbm_index *idx) { return &idx->cfg; }

static int find_worker(kvbm_index *idx, kvbm_worker_key key, uint32_t *slot) {
  worker *c = &idx->w[idx->last_slot];
  if (c->live && LD(&c->wid) == key.worker_id && LD(&c->rank) == key.dp_rank) {
    *slot = idx->last_slot;
    return KVBM_OK;
  }
  for (uint32_t s = 0; s < MAXW; s++) {
    worker *w = &idx->w[s];
    if (w->live && LD(&w->wid) == key.worker_id && LD(&w->rank) == key.dp_rank) {
      *slot = idx->last_slot = s;
      return KVBM_OK;
    }
  }
  return KVBM_ENOTFOUND;
}

int kvbm_index_add_worker(kvbm_index *idx, kvbm_worker_key key, uint32_t *slot,
                          kvbm_error *err) {
  uint32_t s;
  if (!find_worker(idx, key, &s)) {
    if (slot) *slot = s;
    return KVBM_OK;
  }
  for (s = 0; s < MAXW && idx->w[s].live; s++) {
  }
  if (s == MAXW)
    return kvbm_error_set(err, KVBM_ENOSPC, "router index: already %d workers",
                          KVBM_ROUTER_MAX_WORKERS);
  worker *w = &idx->w[s];
  ST(&w->wid, key.worker_id);
  ST(&w->rank, key.dp_rank);
  w->live = true;
  w->have_id = false;
  atomic_fetch_or_explicit(&idx->live, 1ull << s, memory_order_release);
  if (slot) *slot = s;
  return KVBM_OK;
}

int kvbm_index_remove_worker(kvbm_index *idx, kvbm_worker_key key) {
  uint32_t s;
  if (find_worker(idx, key, &s)) return KVBM_ENOTFOUND;
  /* Out of the live mask first: new lookups stop counting it at once. */
  atomic_fetch_and_explicit(&idx->live, ~(1ull << s), memory_order_release);
  forget_all(idx, s);
  idx->w[s].live = false;
  return KVBM_OK;
}

/* The id rule; returns false when the input is a duplicate to skip. */
static bool check_id(kvbm_index *idx, uint32_t s, uint64_t id) {
  worker *w = &idx->w[s];
  if (id == KVBM_INDEX_NO_ID) return true;
  if (!w->have_id) {
    w->have_id = true;
  } else if (id < w->next_id) {
    bump(&idx->c.duplicates, 1);
    return false;
  } else if (id > w->next_id) {
    bump(&idx->c.gaps, 1);
    if (idx->cfg.on_gap) {
      kvbm_worker_key key = {LD(&w->wid), LD(&w->rank)};
      idx->cfg.on_gap(idx->cfg.gap_user, key, w->next_id, id);
    }
  }
  w->next_id = id + 1;
  return true;
}

static int check_event(const kvbm_index *idx, const kvbm_event *ev, kvbm_error *err) {
  switch (ev->type) {
    case KVBM_EVENT_STORED:
    case KVBM_EVENT_REMOVED:
      if (ev->num_block_hashes && !ev->block_hashes)
        return kvbm_error_set(err, KVBM_EINVAL, "router index: %s without its hashes",
                              kvbm_event_type_name(ev->type));
      break;
    case KVBM_EVENT_CLEARED:
      return KVBM_OK;
    default:
      return kvbm_error_set(err, KVBM_EINVAL, "router index: unknown event type %d",
                            (int)ev->type);
  }
  if (ev->type != KVBM_EVENT_STORED || !idx->cfg.recompute) return KVBM_OK;
  uint32_t bs = idx->cfg.block_size;
  if (ev->block_size && ev->block_size != bs)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "router index: BlockStored has block size %u, the index %u",
                          ev->block_size, bs);
  if (ev->num_tokens != ev->num_block_hashes * (size_t)bs || (ev->num_tokens && !ev->token_ids))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "router index: BlockStored of %zu blocks carries %zu tokens, not %zu "
                          "(recompute needs every block's tokens)",
                          ev->num_block_hashes, ev->num_tokens,
                          ev->num_block_hashes * (size_t)bs);
  return KVBM_OK;
}

/* Event application is bound by memory latency (one random slot of a
 * table of megabytes per block), so the slots of blocks a few steps ahead
 * are prefetched to overlap those misses. */
#define EV_AHEAD 16

static inline void prefetch_key(const kvbm_index *idx, uint32_t w, uint64_t h) {
  if (idx->cfg.recompute) {
    const wmap *m = &idx->w[w].map;
    if (m->cap) __builtin_prefetch(&m->e[wmap_home(h, m->cap)], 1);
    return;
  }
  const stab *t = atomic_load_explicit(&((kvbm_index *)idx)->tab, memory_order_relaxed);
  const slot *s = &t->s[home(t, h)];
  __builtin_prefetch(s, 1);
  __builtin_prefetch((const char *)s + sizeof *s, 1); /* the next slot, for deletion's shift */
}

static inline void prefetch_event(const kvbm_index *idx, uint32_t w, const kvbm_event *ev) {
  size_t n = ev->num_block_hashes < 4 ? ev->num_block_hashes : 4;
  if (ev->type == KVBM_EVENT_CLEARED || !ev->block_hashes) return;
  for (size_t i = 0; i < n; i++) prefetch_key(idx, w, ev->block_hashes[i]);
}

static int apply_stored(kvbm_index *idx, uint32_t s, const kvbm_event *ev) {
  int tier = kvbm_router_tier_of(ev->medium);
  if (!idx->cfg.recompute) {
    for (size_t i = 0; i < ev->num_block_hashes; i++) {
      if (i + EV_AHEAD < ev->num_block_hashes) prefetch_key(idx, s, ev->block_hashes[i + EV_AHEAD]);
      int rc = hold(idx, s, tier, ev->block_hashes[i], ev->block_hashes[i]);
      if (rc) return rc;
    }
    return KVBM_OK;
  }
  uint64_t parent = 0;
  bool has_parent = ev->has_parent;
  if (has_parent) {
    const wentry *pe = wmap_find(&idx->w[s].map, ev->parent_hash);
    if (!pe) {
      bump(&idx->c.orphans, ev->num_block_hashes);
      return KVBM_OK;
    }
    parent = pe->rhash;
  }
  uint32_t bs = idx->cfg.block_size;
  for (size_t i = 0; i < ev->num_block_hashes; i++) {
    uint64_t r = kvbm_hash_next(idx->cfg.scheme, idx->cfg.salt_hash, parent, has_parent,
                                ev->token_ids + i * bs, bs);
    int rc = hold(idx, s, tier, ev->block_hashes[i], r);
    if (rc) return rc;
    /* an engine hash already known keeps its first key; chain from it */
    parent = wmap_find(&idx->w[s].map, ev->block_hashes[i])->rhash;
    has_parent = true;
  }
  return KVBM_OK;
}

static int apply_one(kvbm_index *idx, uint32_t s, const kvbm_event *ev, kvbm_error *err) {
  int rc = check_event(idx, ev, err);
  if (rc) return rc;
  switch (ev->type) {
    case KVBM_EVENT_STORED:
      rc = apply_stored(idx, s, ev);
      break;
    case KVBM_EVENT_REMOVED:
      for (size_t i = 0; i < ev->num_block_hashes; i++) {
        if (i + EV_AHEAD < ev->num_block_hashes) prefetch_key(idx, s, ev->block_hashes[i + EV_AHEAD]);
        unhold(idx, s, kvbm_router_tier_of(ev->medium), ev->block_hashes[i]);
      }
      break;
    default:
      forget_all(idx, s);
      bump(&idx->c.cleared, 1);
      break;
  }
  if (rc) return kvbm_error_set(err, rc, "router index: out of memory");
  bump(&idx->c.events, 1);
  return KVBM_OK;
}

int kvbm_index_apply(kvbm_index *idx, kvbm_worker_key worker, uint64_t id,
                     const kvbm_event *ev, kvbm_error *err) {
  if (!idx || !ev) return kvbm_error_set(err, KVBM_EINVAL, "router index: NULL argument");
  int rc = check_event(idx, ev, err); /* before the worker is added */
  if (rc) return rc;
  uint32_t s;
  if ((rc = kvbm_index_add_worker(idx, worker, &s, err))) return rc;
  if (!check_id(idx, s, id)) return KVBM_OK;
  return apply_one(idx, s, ev, err);
}

int kvbm_index_apply_batch(kvbm_index *idx, uint64_t worker_id, const kvbm_event_batch *b,
                           kvbm_error *err) {
  if (!idx || !b || (b->num_events && !b->events))
    return kvbm_error_set(err, KVBM_EINVAL, "router index: NULL argument");
  kvbm_worker_key key = {worker_id, b->has_dp_rank ? (uint32_t)b->dp_rank : 0};
  uint32_t s;
  int rc = kvbm_index_add_worker(idx, key, &s, err);
  if (rc) return rc;
  if (!check_id(idx, s, b->seq)) return KVBM_OK;
  for (size_t i = 0; i < EV_AHEAD && i < b->num_events; i++)
    prefetch_event(idx, s, &b->events[i]);
  for (size_t i = 0; i < b->num_events; i++) {
    if (i + EV_AHEAD < b->num_events) prefetch_event(idx, s, &b->events[i + EV_AHEAD]);
    if ((rc = apply_one(idx, s, &b->events[i], err))) return rc;
  }
  return KVBM_OK;
}

int kvbm_index_store(kvbm_index *idx, uint32_t slot, kvbm_router_tier tier,
                     const uint64_t *hashes, size_t n) {
  if (!idx || slot >= MAXW || !idx->w[slot].live || (unsigned)tier >= T || (n && !hashes))
    return KVBM_EINVAL;
  for (size_t i = 0; i < n; i++) {
    int rc = hold(idx, slot, tier, hashes[i], hashes[i]);
    if (rc) return rc;
  }
  return KVBM_OK;
}

int kvbm_index_remove(kvbm_index *idx, uint32_t slot, kvbm_router_tier tier,
                      const uint64_t *hashes, size_t n) {
  if (!idx || slot >= MAXW || !idx->w[slot].live || (unsigned)tier >= T || (n && !hashes))
    return KVBM_EINVAL;
  for (size_t i = 0; i < n; i++) unhold(idx, slot, tier, hashes[i]);
  return KVBM_OK;
}
