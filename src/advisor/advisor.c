/* SPDX-License-Identifier: Apache-2.0 */
/*
 * advisor.c: the storage advisor's index and hints (see kvbm/advisor.h).
 *
 * Design. One table of blocks keyed by sequence hash serves every volume's
 * index: an entry carries a bitmask of the volumes holding the block, so
 * "the blocks volume v holds" is the entries with bit v, a block held in
 * two volumes (G2 and G3) costs one entry, and a GPU store finds in one
 * probe whether the block lives below (an onboard: a use). Entries are 64
 * bytes in an open-addressing table with linear probing and backward-shift
 * deletion (no tombstones to sweep), grown by doubling up to what
 * max_blocks needs. A prefix-family table (keyed by prefix_hash) keeps a
 * decayed activity score and the family's indexed blocks per volume, for
 * promotion and GET /prefix.
 *
 * Bounds. When the block table holds max_blocks entries, an insert first
 * forgets one: of 16 consecutive slots from a pseudo-random point, the
 * entry held by no volume and least recently used, else the least recently
 * used (sampled LRU, as Redis evicts: O(1), no list to keep). The family
 * table does the same with the least active family. Volumes and sources
 * are small fixed arrays; what does not fit is refused and counted.
 *
 * Groups. A hybrid model's KV cache groups (full attention, sliding
 * window, Mamba; kvbm/group.h) share one hash chain in vLLM, so the same
 * sequence hash names one block per group. The key is (hash, namespace,
 * group): two groups' blocks are two entries, stored, removed, used and
 * hinted apart. A KV event names its group (group_idx, absent = 0), a
 * storage event in its extra_metadata ("group_idx", an integer; absent =
 * 0), and a GPU removal goes to that group's entry. A group_idx outside
 * 0..KVBM_GROUPS_MAX-1 is refused and counted (bad_groups). Families stay
 * per (prefix, namespace): a prefix's groups are one family's activity.
 *
 * Hints are derived by one scan of the block table: per fast volume the
 * idle threshold is (1 - demote_fraction) of its eviction age (a moving
 * average of the idle time of the blocks it removes, removals the advisor
 * itself asked for excluded), per slow volume the live / high-water ratio;
 * the best candidates of each kind are kept in a bounded min-heap, so a
 * scan of millions of entries allocates only the caller's cap.
 */
#include "kvbm/advisor.h"
#include "kvbm/router.h" /* kvbm_index_namespace: the router's namespaces */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/msgpack.h"

#define SAMPLE 16
#define TICK_MS 10 /* entry times: 10 ms ticks, 32 bits (497 days) */

typedef struct ent {
  uint64_t hash;
  uint8_t used, g1;
  uint16_t uses;
  uint32_t vmask;
  uint64_t prefix;
  uint32_t last_use, stored;
  uint32_t hinted, bytes;
  uint32_t group;   /* its KV cache group (0 for one-group models) */
  uint64_t ns;      /* its namespace (cache_salt, LoRA name; 0: none) */
  uint64_t fam;     /* its family's key: prefix in namespace ns */
} ent;

typedef struct fam {
  uint64_t key;
  uint8_t used;
  uint32_t last;
  double score;
  uint64_t events;
  uint32_t blocks[KVBM_ADVISOR_MAX_VOLUMES];
} fam;

typedef struct vol {
  char *name;
  int tier;
  uint64_t live_blocks, live_bytes, stores, removes, high_water, indexed;
  double ema; /* eviction age, ms */
} vol;

typedef struct src {
  char name[KVBM_STORAGE_MAX_LOCATION];
  size_t len;
  uint64_t next_id;
} src;

struct kvbm_advisor {
  kvbm_advisor_config cfg;
  ent *e;
  size_t emask, en; /* table size - 1, entries */
  fam *f;
  size_t fmask, fn;
  vol v[KVBM_ADVISOR_MAX_VOLUMES];
  size_t nv;
  src s[KVBM_ADVISOR_MAX_SOURCES];
  size_t ns;
  uint64_t epoch_ms, last_ms;
  bool started;
  uint64_t rng;
  kvbm_advisor_stats st;
};

kvbm_advisor_config kvbm_advisor_config_default(void) {
  return (kvbm_advisor_config){.max_blocks = 1u << 20, .max_prefixes = 65536, .max_volumes = 32,
                               .promote_min_score = 2, .promote_window_ms = 60000,
                               .demote_min_uses = 2, .demote_fraction = 0.7, .drop_cold = true,
                               .compact_live_ratio = 0.5, .compact_min_blocks = 1024,
                               .rehint_ms = 30000};
}

const char *kvbm_hint_kind_name(int k) {
  static const char *const n[] = {"?", "Promote", "Demote", "Drop", "Compact"};
  return k >= 1 && k <= 4 ? n[k] : "?";
}

/* ---- time ---- */

static uint64_t clamp_now(kvbm_advisor *a, uint64_t now) {
  if (!a->started) {
    a->started = true;
    a->epoch_ms = a->last_ms = now;
  }
  if (now < a->last_ms) now = a->last_ms;
  a->last_ms = now;
  return now;
}

static uint32_t tick(const kvbm_advisor *a, uint64_t now) {
  uint64_t t = (now - a->epoch_ms) / TICK_MS;
  return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

static uint64_t ms_of(const kvbm_advisor *a, uint32_t t) { return a->epoch_ms + (uint64_t)t * TICK_MS; }

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static size_t home(uint64_t key, size_t mask) {
  return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}

/* ---- the block table ---- */

/* Entries are keyed by (hash, namespace, group) and placed by hash alone:
 * the same hash in several namespaces shares a probe run, which is what
 * lets a GPU removal (vLLM's BlockRemoved names no namespace) find its
 * block. */
static size_t ent_find(const kvbm_advisor *a, uint64_t h, uint64_t ns, uint32_t g) {
  if (!a->e) return SIZE_MAX;
  for (size_t i = home(h, a->emask);; i = (i + 1) & a->emask) {
    if (!a->e[i].used) return SIZE_MAX;
    if (a->e[i].hash == h && a->e[i].ns == ns && a->e[i].group == g) return i;
  }
}

/* The entry of h in group g, any namespace, one held in G1 first (a GPU
 * removal). */
static size_t ent_find_g1(const kvbm_advisor *a, uint64_t h, uint32_t g) {
  size_t any = SIZE_MAX;
  if (!a->e) return SIZE_MAX;
  for (size_t i = home(h, a->emask);; i = (i + 1) & a->emask) {
    if (!a->e[i].used) return any;
    if (a->e[i].hash != h || a->e[i].group != g) continue;
    if (a->e[i].g1) return i;
    if (any == SIZE_MAX) any = i;
  }
}

/* A family's key: the prefix hash mixed with the namespace (murmur3's
 * finalizer, as the router mixes its keys), so two tenants' families with
 * the same first block stay apart. */
static uint64_t fam_key(uint64_t prefix, uint64_t ns) {
  if (!prefix || !ns) return prefix;
  uint64_t k = prefix ^ ns;
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k ? k : 1;
}

/* The namespace a storage event names in its extra_metadata: string
 * entries "cache_salt" and "lora_name" (what the KV events carry), 0 when
 * neither is there; and its group: an integer entry "group_idx" (*group;
 * 0 when absent, UINT32_MAX when it is not an integer in 0..
 * KVBM_GROUPS_MAX-1). The codec checked the map already; anything odd
 * here reads as no namespace. */
static uint64_t meta_ns(const kvbm_storage_event *e, uint32_t *group) {
  *group = 0;
  if (!e->extra_metadata || !e->extra_metadata_len) return 0;
  kvbm__mpr r = {e->extra_metadata, e->extra_metadata + e->extra_metadata_len};
  uint32_t n;
  char salt[KVBM_STORAGE_MAX_LOCATION + 1] = "", lora[KVBM_STORAGE_MAX_LOCATION + 1] = "";
  if (kvbm__mpr_map(&r, &n)) return 0;
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *k, *v;
    size_t kn, vn;
    if (kvbm__mpr_bytes(&r, false, &k, &kn)) return 0;
    char *dst = kn == 10 && !memcmp(k, "cache_salt", 10) ? salt
              : kn == 9 && !memcmp(k, "lora_name", 9)   ? lora
                                                        : NULL;
    if (kn == 9 && !memcmp(k, "group_idx", 9)) {
      uint64_t u;
      bool neg;
      if (kvbm__mpr_int(&r, &u, &neg)) return *group = UINT32_MAX, 0;
      *group = neg || u >= KVBM_GROUPS_MAX ? UINT32_MAX : (uint32_t)u;
    } else if (dst && !kvbm__mpr_bytes(&r, false, &v, &vn)) {
      if (vn > KVBM_STORAGE_MAX_LOCATION || memchr(v, 0, vn)) return 0;
      memcpy(dst, v, vn);
      dst[vn] = 0;
    } else if (kvbm__mpr_skip(&r)) {
      return 0;
    }
  }
  return kvbm_index_namespace(salt[0] ? salt : NULL, lora[0] ? lora : NULL);
}

static int ent_grow(kvbm_advisor *a) {
  size_t size = a->e ? 2 * (a->emask + 1) : 1024;
  ent *t = calloc(size, sizeof *t);
  if (!t) return KVBM_ENOMEM;
  for (size_t i = 0; a->e && i <= a->emask; i++) {
    if (!a->e[i].used) continue;
    size_t j = home(a->e[i].hash, size - 1);
    while (t[j].used) j = (j + 1) & (size - 1);
    t[j] = a->e[i];
  }
  free(a->e);
  a->e = t;
  a->emask = size - 1;
  return KVBM_OK;
}

static fam *fam_get(kvbm_advisor *a, uint64_t key);

/* Volume bit v of entry x set or cleared, with the counts that follow it. */
static void ent_set_vol(kvbm_advisor *a, ent *x, size_t v, bool on) {
  uint32_t bit = 1u << v;
  if (!!(x->vmask & bit) == on) return;
  x->vmask ^= bit;
  if (on) a->v[v].indexed++;
  else if (a->v[v].indexed) a->v[v].indexed--;
  size_t fi;
  if (x->fam && a->f) {
    for (fi = home(x->fam, a->fmask); a->f[fi].used; fi = (fi + 1) & a->fmask)
      if (a->f[fi].key == x->fam) {
        uint32_t *b = &a->f[fi].blocks[v];
        if (on) (*b)++;
        else if (*b) (*b)--;
        break;
      }
  }
}

static void ent_delete(kvbm_advisor *a, size_t i) {
  ent *x = &a->e[i];
  for (size_t v = 0; v < a->nv; v++)
    if (x->vmask & (1u << v)) ent_set_vol(a, x, v, false);
  /* Backward shift: pull later entries of the run into the hole. */
  size_t hole = i, j = i;
  for (;;) {
    j = (j + 1) & a->emask;
    if (!a->e[j].used) break;
    size_t h = home(a->e[j].hash, a->emask);
    bool movable = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j);
    if (movable) {
      a->e[hole] = a->e[j];
      hole = j;
    }
  }
  memset(&a->e[hole], 0, sizeof a->e[hole]);
  a->en--;
}

/* Forgets one entry (sampled LRU, unheld first). */
static void ent_forget(kvbm_advisor *a) {
  size_t start = (size_t)xorshift(&a->rng) & a->emask, best = SIZE_MAX, seen = 0;
  for (size_t k = 0; k <= a->emask && seen < SAMPLE; k++) {
    size_t i = (start + k) & a->emask;
    if (!a->e[i].used) continue;
    seen++;
    if (best == SIZE_MAX) {
      best = i;
      continue;
    }
    const ent *x = &a->e[i], *b = &a->e[best];
    bool xh = x->vmask || x->g1, bh = b->vmask || b->g1;
    if ((!xh && bh) || (xh == bh && x->last_use < b->last_use)) best = i;
  }
  if (best == SIZE_MAX) return;
  a->st.forgotten_blocks++;
  if (a->e[best].vmask) a->st.forgotten_held++;
  ent_delete(a, best);
}

/* The entry of h, created if absent (NULL only on ENOMEM). */
static ent *ent_get(kvbm_advisor *a, uint64_t h, uint64_t ns, uint32_t g, bool *created) {
  size_t i = ent_find(a, h, ns, g);
  *created = false;
  if (i != SIZE_MAX) return &a->e[i];
  if (a->en >= a->cfg.max_blocks) ent_forget(a);
  if (!a->e || (a->en + 1) * 10 > (a->emask + 1) * 7)
    if (ent_grow(a)) return NULL;
  for (i = home(h, a->emask); a->e[i].used; i = (i + 1) & a->emask) {
  }
  ent *x = &a->e[i];
  memset(x, 0, sizeof *x);
  x->hash = h;
  x->ns = ns;
  x->group = g;
  x->used = 1;
  x->last_use = tick(a, a->last_ms);
  a->en++;
  *created = true;
  return x;
}

/* ---- prefix families ---- */

static double decayed(const kvbm_advisor *a, const fam *f, uint64_t now) {
  double dt = (double)(now - ms_of(a, f->last));
  return f->score * exp2(-dt / (double)a->cfg.promote_window_ms);
}

static int fam_grow(kvbm_advisor *a) {
  size_t size = a->f ? 2 * (a->fmask + 1) : 256;
  fam *t = calloc(size, sizeof *t);
  if (!t) return KVBM_ENOMEM;
  for (size_t i = 0; a->f && i <= a->fmask; i++) {
    if (!a->f[i].used) continue;
    size_t j = home(a->f[i].key, size - 1);
    while (t[j].used) j = (j + 1) & (size - 1);
    t[j] = a->f[i];
  }
  free(a->f);
  a->f = t;
  a->fmask = size - 1;
  return KVBM_OK;
}

static void fam_delete(kvbm_advisor *a, size_t i) {
  size_t hole = i, j = i;
  for (;;) {
    j = (j + 1) & a->fmask;
    if (!a->f[j].used) break;
    size_t h = home(a->f[j].key, a->fmask);
    bool movable = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j);
    if (movable) {
      a->f[hole] = a->f[j];
      hole = j;
    }
  }
  memset(&a->f[hole], 0, sizeof a->f[hole]);
  a->fn--;
}

static fam *fam_get(kvbm_advisor *a, uint64_t key) {
  if (a->f)
    for (size_t i = home(key, a->fmask); a->f[i].used; i = (i + 1) & a->fmask)
      if (a->f[i].key == key) return &a->f[i];
  if (a->fn >= a->cfg.max_prefixes) { /* forget the least active of a sample */
    size_t start = (size_t)xorshift(&a->rng) & a->fmask, best = SIZE_MAX, seen = 0;
    for (size_t k = 0; k <= a->fmask && seen < SAMPLE; k++) {
      size_t i = (start + k) & a->fmask;
      if (!a->f[i].used) continue;
      seen++;
      if (best == SIZE_MAX || decayed(a, &a->f[i], a->last_ms) < decayed(a, &a->f[best], a->last_ms))
        best = i;
    }
    if (best != SIZE_MAX) {
      fam_delete(a, best);
      a->st.forgotten_prefixes++;
    }
  }
  if (!a->f || (a->fn + 1) * 10 > (a->fmask + 1) * 7)
    if (fam_grow(a)) return NULL;
  size_t i = home(key, a->fmask);
  while (a->f[i].used) i = (i + 1) & a->fmask;
  fam *f = &a->f[i];
  memset(f, 0, sizeof *f);
  f->key = key;
  f->used = 1;
  f->last = tick(a, a->last_ms);
  a->fn++;
  return f;
}

/* Family p was active at now: activity += 1 after decay, once per time
 * point (one request stores hundreds of blocks of its family at once, and
 * that is one use of the family, not hundreds). */
static void fam_touch(kvbm_advisor *a, uint64_t p, uint64_t now) {
  if (!p) return;
  fam *f = fam_get(a, p);
  if (!f) return;
  f->events++;
  uint32_t t = tick(a, now);
  if (f->score > 0 && t == f->last) return;
  f->score = decayed(a, f, now) + 1;
  f->last = t;
}

/* ---- volumes and sources ---- */

static int vol_find(const kvbm_advisor *a, const char *name, size_t len) {
  for (size_t i = 0; i < a->nv; i++)
    if (strlen(a->v[i].name) == len && !memcmp(a->v[i].name, name, len)) return (int)i;
  return -1;
}

static int vol_get(kvbm_advisor *a, const char *name, size_t len) {
  int i = vol_find(a, name, len);
  if (i >= 0) return i;
  if (a->nv >= a->cfg.max_volumes) return -1;
  char *n = malloc(len + 1);
  if (!n) return -1;
  memcpy(n, name, len);
  n[len] = 0;
  memset(&a->v[a->nv], 0, sizeof a->v[a->nv]);
  a->v[a->nv].name = n;
  a->v[a->nv].tier = -1;
  return (int)a->nv++;
}

static void source_ids(kvbm_advisor *a, const kvbm_storage_batch *b) {
  size_t len = b->source ? b->source_len : 0;
  src *s = NULL;
  for (size_t i = 0; i < a->ns && !s; i++)
    if (a->s[i].len == len && (!len || !memcmp(a->s[i].name, b->source, len))) s = &a->s[i];
  if (!s) {
    if (a->ns == KVBM_ADVISOR_MAX_SOURCES || len > sizeof a->s[0].name) {
      a->st.refused_source++;
      return;
    }
    s = &a->s[a->ns++];
    if (len) memcpy(s->name, b->source, len);
    s->len = len;
    s->next_id = 0;
  }
  for (size_t i = 0; i < b->num_events; i++) {
    uint64_t id = b->events[i].event_id;
    if (!id) continue;
    if (s->next_id && id > s->next_id) a->st.lost_events += id - s->next_id;
    if (s->next_id && id < s->next_id) a->st.source_restarts++;
    s->next_id = id + 1;
  }
}

/* ---- create ---- */

int kvbm_advisor_create(const kvbm_advisor_config *cfg, kvbm_advisor **out, kvbm_error *err) {
  if (!cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "advisor: NULL argument");
  const kvbm_advisor_config *c = cfg;
  if (c->max_blocks < 16 || c->max_blocks > (1u << 28))
    return kvbm_error_set(err, KVBM_EINVAL, "advisor: max_blocks %zu is not in 16..2^28", c->max_blocks);
  if (c->max_prefixes < 16 || c->max_prefixes > (1u << 24))
    return kvbm_error_set(err, KVBM_EINVAL, "advisor: max_prefixes %u is not in 16..2^24", c->max_prefixes);
  if (c->max_volumes < 1 || c->max_volumes > KVBM_ADVISOR_MAX_VOLUMES)
    return kvbm_error_set(err, KVBM_EINVAL, "advisor: max_volumes %u is not in 1..%d", c->max_volumes,
                          KVBM_ADVISOR_MAX_VOLUMES);
  if (!(c->demote_fraction > 0 && c->demote_fraction < 1))
    return kvbm_error_set(err, KVBM_EINVAL, "advisor: demote_fraction is not in (0, 1)");
  if (!(c->compact_live_ratio >= 0 && c->compact_live_ratio < 1))
    return kvbm_error_set(err, KVBM_EINVAL, "advisor: compact_live_ratio is not in [0, 1)");
  if (!(c->promote_min_score > 0 && c->promote_min_score < 1e12) || !c->promote_window_ms ||
      c->promote_window_ms > (1ull << 40))
    return kvbm_error_set(err, KVBM_EINVAL, "advisor: promote settings out of range");
  if (c->demote_min_uses > 65535)
    return kvbm_error_set(err, KVBM_EINVAL, "advisor: demote_min_uses above 65535");
  kvbm_advisor *a = calloc(1, sizeof *a);
  if (!a) return kvbm_error_set(err, KVBM_ENOMEM, "advisor: out of memory");
  a->cfg = *c;
  a->rng = 0x9E3779B97F4A7C15ull;
  *out = a;
  return KVBM_OK;
}

void kvbm_advisor_destroy(kvbm_advisor *a) {
  if (!a) return;
  for (size_t i = 0; i < a->nv; i++) free(a->v[i].name);
  free(a->e);
  free(a->f);
  free(a);
}

int kvbm_advisor_volume_tier(kvbm_advisor *a, const char *name, kvbm_tier tier, kvbm_error *err) {
  if (!a || !name) return kvbm_error_set(err, KVBM_EINVAL, "advisor: NULL argument");
  size_t len = strlen(name);
  if (!len || len > KVBM_STORAGE_MAX_LOCATION)
    return kvbm_error_set(err, KVBM_EINVAL, "advisor: volume name is empty or longer than %d bytes",
                          KVBM_STORAGE_MAX_LOCATION);
  if ((int)tier < 0 || tier >= KVBM_TIER_COUNT)
    return kvbm_error_set(err, KVBM_EINVAL, "advisor: tier %d is not G1..G4", (int)tier);
  int v = vol_get(a, name, len);
  if (v < 0) return kvbm_error_set(err, KVBM_ENOSPC, "advisor: more than %u volumes", a->cfg.max_volumes);
  a->v[v].tier = (int)tier;
  return KVBM_OK;
}

/* ---- events ---- */

static void on_store(kvbm_advisor *a, size_t v, const kvbm_storage_event *e, uint64_t now) {
  vol *vo = &a->v[v];
  vo->stores++;
  bool created;
  uint32_t g;
  uint64_t ns = meta_ns(e, &g), fk = fam_key(e->prefix_hash, ns);
  if (g == UINT32_MAX) {
    a->st.bad_groups++;
    return;
  }
  ent *x = ent_get(a, e->sequence_hash, ns, g, &created);
  bool was = x && (x->vmask & (1u << v));
  if (!was) {
    vo->live_blocks++;
    vo->live_bytes += e->block_size;
    if (vo->live_blocks > vo->high_water) vo->high_water = vo->live_blocks;
  }
  if (fk && !fam_get(a, fk)) {
    /* out of memory: the family is simply not tracked */
  }
  if (!x) return;
  if (!x->prefix) x->prefix = e->prefix_hash, x->fam = fk;
  x->stored = tick(a, now);
  x->bytes = e->block_size > UINT32_MAX ? UINT32_MAX : (uint32_t)e->block_size;
  if (created) x->last_use = x->stored;
  ent_set_vol(a, x, v, true);
}

static void on_remove(kvbm_advisor *a, size_t v, const kvbm_storage_event *e, uint64_t now) {
  vol *vo = &a->v[v];
  uint32_t g;
  uint64_t ns = meta_ns(e, &g);
  if (g == UINT32_MAX) {
    a->st.bad_groups++;
    return;
  }
  vo->removes++;
  size_t i = ent_find(a, e->sequence_hash, ns, g);
  ent *x = i == SIZE_MAX ? NULL : &a->e[i];
  if (!x || !(x->vmask & (1u << v))) {
    a->st.unknown_removes++;
    if (vo->live_blocks) vo->live_blocks--;
    vo->live_bytes = vo->live_bytes > e->block_size ? vo->live_bytes - e->block_size : 0;
    return;
  }
  vo->live_blocks--;
  vo->live_bytes = vo->live_bytes > e->block_size ? vo->live_bytes - e->block_size : 0;
  /* The eviction age learns from evictions, not from removals it asked for. */
  bool asked = x->hinted && (uint64_t)(tick(a, now) - x->hinted) * TICK_MS <= a->cfg.rehint_ms;
  if (!asked) {
    double idle = x->g1 ? 0 : (double)(now - ms_of(a, x->last_use));
    vo->ema = vo->ema > 0 ? 0.95 * vo->ema + 0.05 * idle : idle;
  }
  ent_set_vol(a, x, v, false);
}

int kvbm_advisor_storage(kvbm_advisor *a, const kvbm_storage_batch *b, uint64_t now_ms) {
  if (!a || !b || (b->num_events && !b->events)) return KVBM_EINVAL;
  uint64_t now = clamp_now(a, now_ms);
  source_ids(a, b);
  for (size_t i = 0; i < b->num_events; i++) {
    const kvbm_storage_event *e = &b->events[i];
    a->st.storage_events++;
    int v = e->location && e->location_len ? vol_get(a, e->location, e->location_len) : -1;
    if (v < 0) {
      a->st.refused_volume++;
      continue;
    }
    if (e->tier >= KVBM_TIER_G2 && e->tier < KVBM_TIER_COUNT) a->v[v].tier = e->tier;
    if (e->type == KVBM_STORAGE_STORE) on_store(a, (size_t)v, e, now);
    else if (e->type == KVBM_STORAGE_REMOVE) on_remove(a, (size_t)v, e, now);
  }
  return KVBM_OK;
}

static void gpu_store(kvbm_advisor *a, uint64_t h, uint64_t ns, uint32_t g, uint64_t now) {
  bool created;
  ent *x = ent_get(a, h, ns, g, &created);
  a->st.uses++;
  if (!x) return;
  if (x->vmask) a->st.onboard_uses++;
  if (x->uses < UINT16_MAX) x->uses++;
  if (x->g1 < UINT8_MAX) x->g1++;
  x->last_use = tick(a, now);
  fam_touch(a, x->fam, now);
}

static void gpu_remove(kvbm_advisor *a, uint64_t h, uint32_t g, uint64_t now) {
  size_t i = ent_find_g1(a, h, g);
  if (i == SIZE_MAX) return;
  if (a->e[i].g1) a->e[i].g1--;
  a->e[i].last_use = tick(a, now);
}

int kvbm_advisor_kv(kvbm_advisor *a, const kvbm_event_batch *b, uint64_t now_ms) {
  if (!a || !b || (b->num_events && !b->events)) return KVBM_EINVAL;
  uint64_t now = clamp_now(a, now_ms);
  for (size_t i = 0; i < b->num_events; i++) {
    const kvbm_event *ev = &b->events[i];
    a->st.kv_events++;
    if (ev->type == KVBM_EVENT_CLEARED) {
      for (size_t k = 0; a->e && k <= a->emask; k++)
        if (a->e[k].used && a->e[k].g1) a->e[k].g1 = 0, a->e[k].last_use = tick(a, now);
      continue;
    }
    if (kvbm_medium_tier(ev->medium) != KVBM_TIER_G1) {
      a->st.kv_other_media++;
      continue;
    }
    if (!ev->block_hashes) continue;
    if (ev->has_group_idx && (ev->group_idx < 0 || ev->group_idx >= KVBM_GROUPS_MAX)) {
      a->st.bad_groups++;
      continue;
    }
    uint32_t g = ev->has_group_idx ? (uint32_t)ev->group_idx : 0;
    /* The namespace: the event's salt and LoRA name, else its parent's
     * (SGLang may salt only where a sequence starts), as the router does;
     * the parent is in the block's own group. */
    uint64_t ns = 0;
    if (ev->type == KVBM_EVENT_STORED) {
      if (ev->cache_salt || ev->lora_name) {
        ns = kvbm_index_namespace(ev->cache_salt, ev->lora_name);
      } else if (ev->has_parent) {
        size_t pi = ent_find_g1(a, ev->parent_hash, g);
        if (pi != SIZE_MAX) ns = a->e[pi].ns;
      }
    }
    for (size_t k = 0; k < ev->num_block_hashes; k++) {
      if (ev->type == KVBM_EVENT_STORED) gpu_store(a, ev->block_hashes[k], ns, g, now);
      else if (ev->type == KVBM_EVENT_REMOVED) gpu_remove(a, ev->block_hashes[k], g, now);
    }
  }
  return KVBM_OK;
}

/* ---- hints ---- */

typedef struct cand {
  double score;
  kvbm_hint h;
  size_t slot;
} cand;

typedef struct heap {
  cand *c;
  size_t n, cap;
} heap;

/* Keeps the cap best candidates: a min-heap on score. */
static void heap_offer(heap *hp, const cand *x) {
  if (!hp->cap) return;
  if (hp->n == hp->cap) {
    if (x->score <= hp->c[0].score) return;
    size_t i = 0;
    for (;;) { /* replace the root and sift down */
      size_t l = 2 * i + 1, m = i;
      double mv = x->score;
      if (l < hp->n && hp->c[l].score < mv) m = l, mv = hp->c[l].score;
      if (l + 1 < hp->n && hp->c[l + 1].score < mv) m = l + 1;
      if (m == i) break;
      hp->c[i] = hp->c[m];
      i = m;
    }
    hp->c[i] = *x;
    return;
  }
  size_t i = hp->n++;
  while (i && hp->c[(i - 1) / 2].score > x->score) {
    hp->c[i] = hp->c[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  hp->c[i] = *x;
}

static int by_score_desc(const void *x, const void *y) {
  double a = ((const cand *)x)->score, b = ((const cand *)y)->score;
  return a < b ? 1 : a > b ? -1 : 0;
}

/* The first volume of a tier (G2 for "fast", G3 then G4 for "slow"). */
static int first_volume(const kvbm_advisor *a, bool fast) {
  for (int t = fast ? KVBM_TIER_G2 : KVBM_TIER_G3; t <= (fast ? KVBM_TIER_G2 : KVBM_TIER_G4); t++)
    for (size_t v = 0; v < a->nv; v++)
      if (a->v[v].tier == t) return (int)v;
  return -1;
}

static void scan(kvbm_advisor *a, uint64_t now, heap *down, heap *up) {
  uint32_t fast = 0, slow = 0;
  double thr[KVBM_ADVISOR_MAX_VOLUMES];
  for (size_t v = 0; v < a->nv; v++) {
    if (a->v[v].tier == KVBM_TIER_G2) fast |= 1u << v;
    if (a->v[v].tier == KVBM_TIER_G3 || a->v[v].tier == KVBM_TIER_G4) slow |= 1u << v;
    thr[v] = a->v[v].ema > 0 ? (1 - a->cfg.demote_fraction) * a->v[v].ema : INFINITY;
  }
  int target = first_volume(a, false), dest = first_volume(a, true);
  uint32_t nowt = tick(a, now), rehint = (uint32_t)(a->cfg.rehint_ms / TICK_MS);
  for (size_t i = 0; a->e && i <= a->emask; i++) {
    ent *x = &a->e[i];
    if (!x->used || !(x->vmask & (fast | slow))) continue;
    if (x->hinted && nowt - x->hinted <= rehint) continue;
    double idle = x->g1 ? 0 : (double)(now - ms_of(a, x->last_use));
    cand c = {.slot = i};
    c.h.sequence_hash = x->hash;
    c.h.prefix_hash = x->prefix;
    c.h.ns = x->ns;
    c.h.group = x->group;
    c.h.uses = x->uses;
    c.h.idle_ms = (uint64_t)idle;
    if (x->vmask & fast) {
      int v = __builtin_ctz(x->vmask & fast);
      if (!(idle >= thr[v])) continue;
      c.h.from_volume = v;
      if (x->uses >= a->cfg.demote_min_uses && target >= 0) {
        c.h.kind = KVBM_HINT_DEMOTE;
        c.h.to_volume = target;
        c.score = 1e9 + x->uses * 1e3 + idle / 1e6; /* demotes before drops, most used first */
      } else if (a->cfg.drop_cold) {
        c.h.kind = KVBM_HINT_DROP;
        c.h.to_volume = -1;
        c.score = idle / 1e3;
      } else {
        continue;
      }
      heap_offer(down, &c);
    } else if (dest >= 0 && x->fam) {
      const fam *f = NULL;
      for (size_t k = home(x->fam, a->fmask); a->f && a->f[k].used; k = (k + 1) & a->fmask)
        if (a->f[k].key == x->fam) {
          f = &a->f[k];
          break;
        }
      double s = f ? decayed(a, f, now) : 0;
      if (s < a->cfg.promote_min_score) continue;
      c.h.kind = KVBM_HINT_PROMOTE;
      c.h.from_volume = __builtin_ctz(x->vmask & slow);
      c.h.to_volume = dest;
      c.score = s;
      heap_offer(up, &c);
    }
  }
}

int kvbm_advisor_hints(kvbm_advisor *a, uint64_t now_ms, kvbm_hint *out, size_t cap, size_t *n) {
  if (!a || !n || (cap && !out)) return KVBM_EINVAL;
  uint64_t now = clamp_now(a, now_ms);
  size_t k = 0;
  *n = 0;
  /* Compactions first: one per slow volume at most. */
  for (size_t v = 0; v < a->nv && k < cap; v++) {
    vol *vo = &a->v[v];
    if (vo->tier != KVBM_TIER_G3 && vo->tier != KVBM_TIER_G4) continue;
    if (vo->high_water < a->cfg.compact_min_blocks) continue;
    if ((double)vo->live_blocks >= a->cfg.compact_live_ratio * (double)vo->high_water) continue;
    out[k++] = (kvbm_hint){.kind = KVBM_HINT_COMPACT, .from_volume = (int)v, .to_volume = -1,
                           .live_blocks = vo->live_blocks, .high_water = vo->high_water};
    vo->high_water = vo->live_blocks; /* asked once; again only if it thins out again */
  }
  size_t room = cap - k;
  heap down = {calloc(room ? room : 1, sizeof(cand)), 0, room};
  heap up = {calloc(room ? room : 1, sizeof(cand)), 0, room};
  if (!down.c || !up.c) {
    free(down.c);
    free(up.c);
    *n = k;
    return KVBM_ENOMEM;
  }
  scan(a, now, &down, &up);
  qsort(down.c, down.n, sizeof(cand), by_score_desc);
  qsort(up.c, up.n, sizeof(cand), by_score_desc);
  uint32_t nowt = tick(a, now);
  for (size_t i = 0; i < down.n && k < cap; i++) {
    out[k++] = down.c[i].h;
    a->e[down.c[i].slot].hinted = nowt ? nowt : 1;
  }
  for (size_t i = 0; i < up.n && k < cap; i++) {
    out[k++] = up.c[i].h;
    a->e[up.c[i].slot].hinted = nowt ? nowt : 1;
  }
  for (size_t i = 0; i < k; i++) a->st.hints[out[i].kind]++;
  free(down.c);
  free(up.c);
  *n = k;
  return KVBM_OK;
}

/* ---- queries ---- */

size_t kvbm_advisor_volume_count(const kvbm_advisor *a) { return a ? a->nv : 0; }

int kvbm_advisor_volume_get(const kvbm_advisor *a, size_t i, kvbm_advisor_volume_info *out) {
  if (!a || !out || i >= a->nv) return KVBM_ENOTFOUND;
  const vol *v = &a->v[i];
  *out = (kvbm_advisor_volume_info){.name = v->name, .tier = v->tier, .live_blocks = v->live_blocks,
                                    .live_bytes = v->live_bytes, .stores = v->stores,
                                    .removes = v->removes, .high_water = v->high_water,
                                    .indexed = v->indexed, .eviction_age_ms = v->ema};
  return KVBM_OK;
}

int kvbm_advisor_prefix_get(const kvbm_advisor *a, uint64_t p, uint64_t ns, uint64_t now_ms,
                            kvbm_advisor_prefix_info *out) {
  if (!a || !out || !a->f) return KVBM_ENOTFOUND;
  p = fam_key(p, ns);
  for (size_t i = home(p, a->fmask); a->f[i].used; i = (i + 1) & a->fmask) {
    const fam *f = &a->f[i];
    if (f->key != p) continue;
    uint64_t now = now_ms < a->last_ms ? a->last_ms : now_ms;
    memset(out, 0, sizeof *out);
    out->prefix_hash = p;
    out->score = decayed(a, f, now);
    out->last_ms = ms_of(a, f->last);
    out->events = f->events;
    memcpy(out->blocks, f->blocks, sizeof out->blocks);
    return KVBM_OK;
  }
  return KVBM_ENOTFOUND;
}

void kvbm_advisor_stats_get(const kvbm_advisor *a, kvbm_advisor_stats *out) {
  if (!a || !out) return;
  *out = a->st;
  out->entries = a->en;
  out->prefixes = a->fn;
  out->memory_bytes = (a->e ? (a->emask + 1) * sizeof(ent) : 0) +
                      (a->f ? (a->fmask + 1) * sizeof(fam) : 0) + sizeof *a;
}
