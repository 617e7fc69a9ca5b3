/* SPDX-License-Identifier: Apache-2.0 */
/*
 * index.c: the router's prefix index (see kvbm/router.h).
 *
 * Layout. One open-addressing table per worker maps an index key (a
 * chained sequence hash) to the tiers that worker holds the block in (4
 * bits). Because keys are chained hashes, a flat map per worker is enough
 * for prefix lookups: h[k] present means the worker holds the block whose
 * whole prefix is h[0..k], and a lookup walks h[0], h[1], ... in each
 * worker's table up to that worker's first miss. Beside the tables
 * the writer keeps a private map per worker (wmap.c): extra copies of
 * duplicated blocks and, in recompute mode, the engine-to-index hash
 * translation; readers never see it.
 *
 * Why one table per worker rather than one shared table with a worker
 * mask per key: an event touches one worker's table, which is small
 * (32-byte slots, one cache line per block and one for its parent: 2 MiB
 * for a 16384-block worker, sized at load 1/4 so that probe runs and
 * deletion's backward shifts stay short, and one huge page rather than
 * 512 TLB entries), so a worker's burst of events stays in cache, where
 * a shared table of every worker's blocks is megabytes of random misses
 * (measured: 3-5x slower on W3). Lookups probe each worker's table; for
 * the usual closed tables that is O(log prefix) probes per worker (see
 * "Closure" and bisect_all below), and two for a worker holding the
 * prefix another worker of the lookup was found to hold (see "The guess":
 * W3 at 64 workers, 46,770 -> 17,790 instructions a lookup).
 *
 * Why a single writer with seqlocked slots (and not a lock, RCU copies, or
 * sharded locks): events arrive in one ordered stream per worker and must
 * cost tens of nanoseconds, while lookups walk hundreds of slots. A
 * reader-writer lock would put atomic read-modify-writes on a shared line
 * on every lookup and stall lookups behind batches; copy-on-write tables
 * would copy a table per event. A seqlock per slot costs a reader one
 * extra load of a line it reads anyway and never writes shared memory, so
 * any number of readers scale; the writer pays two extra stores per change.
 *
 * Slot protocol: `meta` holds the tier bits (0..3), a busy bit (4), the occupied bit (5) and a
 * version (6..63). The writer stores meta busy, then the key and the final
 * meta with release stores; a reader loads meta (acquire), the key
 * (acquire) and meta again, and retries unless both metas are equal and
 * not busy. Filling an empty slot and emptying one need no busy phase
 * (slot_fill, slot_clear: a reader that saw the slot empty stops there,
 * one that saw it full finds the version changed): the key, then one
 * release store of meta. The one thing slot seqlocks do not cover is backward-shift
 * deletion, which moves an entry towards its home slot: a reader that
 * passed the destination before the move and reaches the source after it
 * would report a miss for a present key. The writer makes the table's
 * `moves` counter odd during each deletion (and during a clear); a reader
 * believes a miss only if `moves` was even and unchanged around its probe
 * (hits need no check). Growing allocates a table twice the size, fills
 * it, and publishes it with a release store; readers still on the old one
 * finish there (a slightly older view), and old tables are kept until
 * kvbm_index_destroy (sizes double, so they cost less than the live one),
 * so there is no reclamation to race with.
 *
 * Namespaces. Tenants must never match each other's blocks: a block stored
 * with a cache_salt (SGLang) or a LoRA name belongs to the namespace
 * kvbm_index_namespace(salt, lora_name), and only lookups in that
 * namespace see it. The tables are keyed by chained hashes, so a namespace
 * needs no table of its own: it is mixed into the key. With the engine's
 * hashes as keys, a block of namespace ns is kept under fmix64(h ^ ns)
 * (murmur3's finalizer: a bijection, so keys of one namespace stay as
 * distinct as the hashes, and the default namespace 0 keeps h itself, at
 * no cost). A BlockRemoved names no namespace, so a namespaced block's
 * engine hash is remembered in the worker's map (engine hash -> key, as in
 * recompute mode) and removes go through it; the namespace itself is not
 * stored: fmix64 is invertible, ns = fmix64^-1(key) ^ h. A BlockStored
 * without salt or LoRA name under a namespaced parent continues the
 * parent's namespace (SGLang may salt only where a sequence starts). In
 * recompute mode the namespace is the chain's root: a block without a
 * parent chains from ns, so everything under it differs. Lookups turn a
 * request's hashes into its namespace's keys (kvbm_index_keys,
 * kvbm_index_hash_tokens_ns). A separate table per namespace was the
 * alternative; it would multiply tables (and the lookup's probes) by the
 * tenants a worker serves, where the mix costs one multiply per key.
 *
 * Groups (hybrid models, issue 20). A worker may have several KV cache
 * groups (full attention, sliding window, Mamba...): a block of group g
 * is kept under gkey(key, g) in the same table (group 0: the key itself),
 * and a hybrid worker's overlap is kvbm_groups_hit over its groups (see
 * "Groups" below). A single-group worker pays one test of its events'
 * group and nothing in lookups.
 *
 * The writer's cost. An event of W3 is one block (a vLLM step's events
 * come ~1400 to a batch), so what an event costs is what a block costs:
 * two probes (the block's slot, its parent's, for the closure counts;
 * one on the lean path, see "The hint"), the seqlocked slot write, a few
 * counters. The per-block helpers are
 * inlined into one path (the calls were a quarter of the instructions,
 * callgrind on W3), the slots of the events EV_AHEAD ahead are prefetched,
 * with a stored block's parent (named in its event) and a removed block's
 * parent (known from its slot, read EV_NEAR events ahead, after its own
 * prefetch arrived), and `closed` is recomputed only where `broken` or
 * `offdev` moved (a device block under a held parent moves neither).
 * Since issue 22's second pass the usual event (a device block of group
 * 0 without namespace, on a worker with no namespaced block) takes the
 * lean path (see "The lean path"): a slot filled or deleted, the
 * parent's child count, the counters added once per batch; the general
 * path keeps every other case. Callgrind, W3 --limit 400: 157 M
 * instructions before, 98 M after (the peer: 26 M). Since the third
 * pass (session 11) the lean path finds the parent's slot through a hint
 * (see "The hint"), so an event costs one probe, as the peer's does; a
 * delete opens the `moves` window only when an entry moves; the general
 * path's calls are out of line; an event of one block skips the block
 * loop. W3 --limit 400: 98 M -> 70 M; --limit 3000, Ir per operation:
 * 200 -> 137 at 8 workers (the peer 53), 289 -> 220 at 64 (the peer 99).
 * Session 12 cut the loop's own overheads (see lean_batch: two loops,
 * the first prefetching without a test; the worker kept, not its slot;
 * the probe's meta reused; deletion's shift inline): 134 -> 115 at 8
 * workers, 182 -> 161 at 64.
 *
 * Every shared field is a C11 atomic; the protocol uses acquire loads and
 * release stores only, no fences (plain moves on x86-64, ldar/stlr on
 * arm64), so ThreadSanitizer understands it and the compiler cannot tear
 * or cache them.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/bytes.h"
#include "common/vec.h"
#include "kvbm/router.h"
#include "router/wmap.h"

#define T KVBM_TIER_COUNT
#define MAXW KVBM_ROUTER_MAX_WORKERS
#define PREFETCH_AHEAD 12
#define FIRST_DEEP_MAX 8 /* workers up to which a lookup prefetches 3 first probes each */
#define BUSY 16u
#define OCC 32u /* the slot holds an entry (a block, or a ghost: see below) */
#define TIERS_MASK 15u
#define VSHIFT 6
/* The writer's per-block helpers are small and called once or twice per
 * block: inlined, the common event is one straight path (measured: a third
 * of the instructions of the called version, callgrind on W3). */
#define HOT static inline __attribute__((always_inline))

/* The writer's own fields of a slot (never read by readers). */
typedef struct wpriv {
  uint64_t parent;   /* the block's parent key, when has_parent */
  uint32_t nchild;   /* entries in this table whose parent is this key */
  uint16_t has_parent;
  uint16_t group;    /* the KV cache group the block was stored in (for
                        snapshots: its key already tells groups apart) */
} wpriv;

/* 32 bytes: what readers read, then the writer's fields, so that an event
 * touches one cache line per block. */
typedef struct slot {
  _Atomic uint64_t meta; /* version << 6 | occupied << 5 | busy << 4 | tier bits */
  _Atomic uint64_t key;
  wpriv w;
} slot;

typedef struct wtab {
  size_t cap; /* power of two */
  unsigned shift;
  slot *s;
  slot *last; /* s + cap - 1: a delete's next slot wraps after it */
  void *map; /* the mapping behind s, when mapped */
  size_t map_len;
  struct wtab *retired; /* older tables, kept until destroy */
} wtab;

typedef struct worker {
  _Atomic uint64_t wid;
  _Atomic uint32_t rank;
  _Atomic(wtab *) tab;
  _Atomic uint64_t moves;
  size_t entries;    /* writer's count of occupied slots */
  uint64_t broken;   /* held blocks whose parent is not held (see below) */
  uint64_t offdev;   /* (block, tier) holdings outside the device tier */
  _Atomic int closed;/* broken == 0 && offdev == 0: lookups may bisect */
  _Atomic int hybrid;/* its groups are not one full-attention group:
                        lookups take kvbm_groups_hit (see "Groups") */
  bool live;
  kvbm_seqno_tracker seq; /* the order of the worker's ids (see check_id) */
  wmap map;
  uint64_t nmapped;  /* namespaced blocks in map (engine hashes as keys) */
  _Atomic uint64_t held[KVBM_TIER_COUNT]; /* keys with the tier's bit set:
                                           * written by the writer, read by
                                           * kvbm_index_worker_blocks */
  /* groups (see "Groups"): the list readers see, kind << 32 | tokens */
  _Atomic uint32_t ngroups; /* 0: none known, one full group */
  _Atomic uint64_t gspec[KVBM_GROUPS_MAX];
  bool gfixed;              /* configured: not learned, not grown */
  uint32_t glearned;        /* groups whose kind an event described: later
                               kinds of them are not read again */
  uint32_t gused;           /* 1 + the highest group it stored a block in */
} worker;

typedef struct counters {
  _Atomic uint64_t events, stored, removed, cleared, duplicates, gaps, resets, jumps,
      unknown_removed, orphans, entries, slots, grouped, bad_groups, group_conflicts;
} counters;

struct kvbm_index {
  kvbm_index_config cfg;
  kvbm_group_spec groups[KVBM_GROUPS_MAX]; /* cfg.groups, copied */
  _Atomic uint64_t live; /* mask of live worker slots */
  worker w[MAXW];
  uint32_t last_slot; /* writer's cache of the last worker looked up */
  counters c;
};

/* ------------------------------------------------------------ helpers */

/* murmur3's 64-bit finalizer and its inverse (multiplicative inverses of
 * its constants mod 2^64; x ^= x >> 33 is its own inverse). */
static inline uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

static inline uint64_t fmix64_inv(uint64_t k) {
  k ^= k >> 33;
  k *= 0x9cb4b2f8129337dbull;
  k ^= k >> 33;
  k *= 0x4f74430c22a54005ull;
  k ^= k >> 33;
  return k;
}

/* The index key of engine hash h in namespace ns (see the top). */
static inline uint64_t ns_key(uint64_t h, uint64_t ns) { return ns ? fmix64(h ^ ns) : h; }

/* The key of namespace key k in KV cache group g (see "Groups"): group 0
 * keeps k, so single-group workers pay nothing; another group's key is a
 * bijection of k, apart from group 0's as hashes are from each other. */
#define GROUP_MUL 0x9E3779B97F4A7C15ull
static inline uint64_t gkey(uint64_t k, uint32_t g) { return g ? fmix64(k + g * GROUP_MUL) : k; }
static inline uint64_t gkey_inv(uint64_t k, uint32_t g) {
  return g ? fmix64_inv(k) - g * GROUP_MUL : k;
}

#define LD(p) atomic_load_explicit((p), memory_order_relaxed)
#define ST(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define LDA(p) atomic_load_explicit((p), memory_order_acquire)
#define STR(p, v) atomic_store_explicit((p), (v), memory_order_release)

static inline void bump(_Atomic uint64_t *c, uint64_t by) { ST(c, LD(c) + by); }

static inline size_t home(const wtab *t, uint64_t h) {
  return (size_t)((h * 0x9E3779B97F4A7C15ull) >> t->shift);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Tables of 2 MiB and more are mapped fresh, 2 MiB-aligned, and advised to
 * use huge pages (probes are random: with 4 KiB pages each would also be a
 * TLB miss; memory malloc recycles is already faulted in small pages). */
#define HUGE_BYTES ((size_t)2 << 20)

static wtab *wtab_new(size_t cap) {
  wtab *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  size_t bytes = cap * sizeof(slot);
  if (bytes < HUGE_BYTES) {
    t->s = calloc(cap, sizeof(slot));
  } else {
    size_t len = bytes + HUGE_BYTES;
    uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      uint8_t *a = (uint8_t *)(((uintptr_t)p + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
#ifdef MADV_HUGEPAGE
      madvise(a, bytes, MADV_HUGEPAGE); /* advice only */
#endif
      t->map = p;
      t->map_len = len;
      t->s = (slot *)a; /* zero-filled */
    }
  }
  if (!t->s) {
    free(t);
    return NULL;
  }
  t->cap = cap;
  t->last = t->s + cap - 1;
  unsigned bits = 0;
  while (((size_t)1 << bits) < cap) bits++;
  t->shift = 64 - bits;
  return t;
}

static void wtab_free(wtab *t) {
  if (t->map) munmap(t->map, t->map_len);
  else free(t->s);
  free(t);
}

/* ------------------------------------------------------------ reader side */

/* Reads a slot consistently: its key and tier bits. */
static inline unsigned slot_read(const slot *s, uint64_t *key) {
  for (;;) {
    uint64_t m = LDA(&s->meta);
    if (m & BUSY) {
      cpu_relax();
      continue;
    }
    *key = LDA(&s->key); /* acquire: the second meta load stays after it */
    if (LD(&s->meta) == m) return (unsigned)(m & (OCC | TIERS_MASK));
  }
}

/* The tier bits of key h in worker w's table t (0 when absent). *mv is
 * the `moves` value the caller read before (a walk reads it once): a miss
 * is believed only if no deletion started or ran since then. */
static inline unsigned probe_from(const worker *w, const wtab *t, uint64_t h, size_t i0,
                                  uint64_t *mv) {
  size_t mask = t->cap - 1;
  for (;;) {
    for (size_t i = i0;; i = (i + 1) & mask) {
      uint64_t k;
      unsigned m = slot_read(&t->s[i], &k);
      if (!m) break; /* empty */
      if (k == h) return m & TIERS_MASK; /* a ghost holds nothing */
    }
    /* the slot loads above were acquires: this load cannot move before them */
    uint64_t now = LD(&w->moves);
    if (!(*mv & 1) && now == *mv) return 0; /* a real miss */
    cpu_relax();
    *mv = LDA(&w->moves); /* probe again from a fresh start */
  }
}

/* The same from h's home slot, i0, computed by the caller (bisect_all's
 * prefetch computed it already). */
static inline unsigned probe(const worker *w, const wtab *t, uint64_t h, uint64_t *mv) {
  return probe_from(w, t, h, home(t, h), mv);
}

/* Workers whose tables are closed (every held block's parent held) and on
 * device only: "h[k] held" is monotone along a chain (holding h[k] means
 * holding its parent h[k-1], and so on down), so each prefix is found by
 * galloping (blocks 0, 2, 6, 14, ... until a miss) then binary search:
 * O(log prefix) probes instead of O(prefix). Those probes depend on each
 * other within a worker, so all closed workers advance in lockstep, one
 * probe each per round, with the round's probes prefetched together: their
 * cache misses overlap. */
typedef struct bstate {
  const worker *w;
  const wtab *t;
  uint64_t mv;
  size_t lo, hi, step; /* h[0..lo) held; prefix <= hi; step > 0: galloping */
  size_t k, i0;        /* the next probe: block k, its home slot i0 (each
                          computed once a step, not again by the probe) */
  int slot;
} bstate;

static inline size_t bnext(const bstate *b, size_t n) {
  if (b->step) return b->lo + b->step - 1 < n ? b->lo + b->step - 1 : n - 1;
  return b->lo + (b->hi - b->lo + 1) / 2 - 1; /* probe mid - 1 */
}

/* Advances bisect states in lockstep until each has its prefix. */
static void bisect_run(bstate *st, int nb, const uint64_t *hashes, size_t n, kvbm_overlap *out) {
  while (nb) {
    for (int i = 0; i < nb;) {
      bstate *b = &st[i];
      size_t k = b->k;
      bool held = probe_from(b->w, b->t, hashes[k], b->i0, &b->mv) != 0;
      if (b->step) { /* galloping */
        if (held) {
          b->lo = k + 1;
          b->step *= 2;
          if (b->lo == n) b->hi = n, b->step = 0;
        } else {
          b->hi = k;
          b->step = 0;
        }
      } else if (held) {
        b->lo = k + 1;
      } else {
        b->hi = k;
      }
      if (!b->step && b->lo >= b->hi) { /* done: the prefix is lo */
        kvbm_overlap *o = &out[b->slot];
        o->prefix[0] = o->prefix[1] = o->prefix[2] = o->prefix[3] = (uint32_t)b->lo;
        *b = st[--nb];
        continue;
      }
      b->k = bnext(b, n);
      b->i0 = home(b->t, hashes[b->k]);
      __builtin_prefetch(&b->t->s[b->i0]); /* read in the next round */
      i++;
    }
  }
}

static inline void bisect_done(kvbm_overlap *o, size_t p) {
  o->prefix[0] = o->prefix[1] = o->prefix[2] = o->prefix[3] = (uint32_t)p;
}

/* The guess. The workers that hold a prefix of a request mostly hold the
 * same one (a shared system prompt, a conversation's earlier turns).
 * Galloping then bisecting from block 0 finds a prefix of p blocks in
 * some 2 log2(p) probes: on W3 at 64 workers (lookups of 844 blocks on
 * average) a closed worker galloped 7.7 steps, some 15 probes in all. So
 * closed workers are bisected alone, one after the other, until one (the
 * leader) holds a prefix p > 0 (a worker holding none costs one probe);
 * every other one first probes the leader's answer: h[p] held means its
 * prefix is longer (gallop on from p + 1); else h[p - 1] held means it
 * is p (two probes, done); else it is shorter (bisect [0, p - 1)). "h[k]
 * held" is monotone along the chain, so each branch keeps bisect's
 * invariant (h[0..lo) held, prefix <= hi) and the answers are those of a
 * bisect from 0. The guessed probes of all the other workers are
 * prefetched in one pass, their misses overlapping; those left go on in
 * lockstep. Callgrind, W3 --limit 3000: 46,770 -> 17,790 instructions a
 * lookup at 64 workers, 7,650 -> 2,630 at 8; test_bisect_guess takes
 * every branch. */
static void bisect_all(const kvbm_index *idx, uint64_t set, const uint64_t *hashes, size_t n,
                       kvbm_overlap *out) {
  bstate st[MAXW];
  size_t p = 0;
  while (set && !p) { /* leaders until one holds a prefix (a guess of 0 says little) */
    int lead = __builtin_ctzll(set);
    const worker *lw = &idx->w[lead];
    const wtab *lt = LDA(&((worker *)lw)->tab);
    st[0] = (bstate){.w = lw, .t = lt, .mv = LDA(&lw->moves), .lo = 0, .hi = n, .step = 1,
                     .k = 0, .i0 = home(lt, hashes[0]), .slot = lead};
    bisect_run(st, 1, hashes, n, out);
    set &= set - 1;
    p = out[lead].prefix[0];
  }
  if (!set) return;
  int nb = 0;
  for (uint64_t m = set; m; m &= m - 1) { /* the guessed slots, prefetched */
    int s = __builtin_ctzll(m);
    const worker *w = &idx->w[s];
    const wtab *t = LDA(&((worker *)w)->tab);
    bstate *b = &st[nb++];
    *b = (bstate){.w = w, .t = t, .mv = LDA(&w->moves), .slot = s};
    if (p < n) __builtin_prefetch(&t->s[b->k = home(t, hashes[p])]);
    if (p) __builtin_prefetch(&t->s[b->i0 = home(t, hashes[p - 1])]);
  }
  int left = 0;
  for (int i = 0; i < nb; i++) {
    bstate b = st[i]; /* b.k, b.i0: the home slots of h[p], h[p - 1] */
    size_t lo = 0, hi = n;
    if (p < n) {
      if (probe_from(b.w, b.t, hashes[p], b.k, &b.mv)) lo = p + 1;
      else hi = p;
    }
    if (lo) { /* longer than p: gallop on */
      if (lo == n) {
        bisect_done(&out[b.slot], n);
        continue;
      }
      b.lo = lo, b.hi = n, b.step = 1;
    } else if (!hi) { /* p == 0 and h[0] missing */
      bisect_done(&out[b.slot], 0);
      continue;
    } else if (probe_from(b.w, b.t, hashes[hi - 1], b.i0, &b.mv)) { /* h[p - 1] held */
      bisect_done(&out[b.slot], hi);
      continue;
    } else { /* shorter than p: bisect [0, p - 1) */
      b.lo = 0, b.hi = hi - 1, b.step = 0;
      if (!b.hi) {
        bisect_done(&out[b.slot], 0);
        continue;
      }
    }
    b.k = bnext(&b, n);
    b.i0 = home(b.t, hashes[b.k]);
    __builtin_prefetch(&b.t->s[b.i0]);
    st[left++] = b;
  }
  bisect_run(st, left, hashes, n, out);
}

/* One worker's walk: the longest prefix of hashes[0..n) in its table, per
 * cumulative tier. The probes are independent (the hashes are known up
 * front), so prefetching a few blocks ahead overlaps their cache misses;
 * the distance grows from 1, so the common short walk (a miss at block 0
 * or 1) does not pay for prefetches it never uses. */
static void walk(const worker *w, const wtab *t, const uint64_t *hashes, size_t n,
                 kvbm_overlap *o) {
  bool dev = true, host = true, disk = true;
  size_t k = 0;
  uint64_t mv = LDA(&w->moves);
  for (; k < n; k++) {
    size_t dist = k + 1 < PREFETCH_AHEAD ? k + 1 : PREFETCH_AHEAD;
    if (k + dist < n) __builtin_prefetch(&t->s[home(t, hashes[k + dist])]);
    if (dist < PREFETCH_AHEAD && k + dist + 1 < n) /* ramping up: two at once */
      __builtin_prefetch(&t->s[home(t, hashes[k + dist + 1])]);
    unsigned held = probe(w, t, hashes[k], &mv);
    if (dev && !(held & 1)) dev = false, o->prefix[0] = (uint32_t)k;
    if (host && !(held & 3)) host = false, o->prefix[1] = (uint32_t)k;
    if (disk && !(held & 7)) disk = false, o->prefix[2] = (uint32_t)k;
    if (!held) break;
  }
  if (dev) o->prefix[0] = (uint32_t)k;
  if (host) o->prefix[1] = (uint32_t)k;
  if (disk) o->prefix[2] = (uint32_t)k;
  o->prefix[3] = (uint32_t)k;
}

/*
 * Groups. A hybrid worker's blocks of group g live in its one table under
 * gkey(key, g): vLLM's groups share one hash chain, so the group must be
 * part of the key, and mixing it in (as namespaces are) keeps one table,
 * one probe per (block, group), and nothing at all for group 0. Parents
 * are linked within their group, so closure means the same per group.
 * A worker whose list is anything but one full-attention group is looked
 * up by kvbm_groups_hit, vLLM's coordinator rule, with a lookup probing
 * gkey(keys[b], g) under the tier mask of the cumulative tier asked: G4
 * (any tier) first, then each higher tier capped at the hit below it,
 * which is correct because a hit never shrinks when holdings grow. Its
 * cost is O(groups x blocks) probes, worker by worker; single-group
 * workers keep the bisect and the walk.
 */
typedef struct glook {
  const worker *w;
  const wtab *t;
  const uint64_t *keys;
  uint64_t mv;
  unsigned mask;
} glook;

static bool glook_held(void *user, uint32_t g, size_t b) {
  glook *q = user;
  return (probe(q->w, q->t, gkey(q->keys[b], g), &q->mv) & q->mask) != 0;
}

static inline kvbm_group_spec spec_of(uint64_t v) {
  return (kvbm_group_spec){.kind = (kvbm_group_kind)(v >> 32), .tokens = (uint32_t)v};
}
static inline uint64_t spec_bits(kvbm_group_spec g) { return (uint64_t)g.kind << 32 | g.tokens; }

/* The worker's list as readers see it (none known: one full group). */
static size_t groups_read(const worker *w, kvbm_group_spec *out) {
  size_t n = LDA(&((worker *)w)->ngroups);
  if (n > KVBM_GROUPS_MAX) n = KVBM_GROUPS_MAX;
  for (size_t g = 0; g < n; g++) out[g] = spec_of(LD(&((worker *)w)->gspec[g]));
  if (!n) out[n++] = (kvbm_group_spec){KVBM_GROUP_FULL, 0};
  return n;
}

static void hybrid_walk(const kvbm_index *idx, const worker *w, const uint64_t *keys, size_t n,
                        kvbm_overlap *o) {
  kvbm_group_spec gs[KVBM_GROUPS_MAX];
  size_t ng = groups_read(w, gs);
  uint32_t bs = idx->cfg.block_size;
  glook q = {.w = w, .t = LDA(&((worker *)w)->tab), .keys = keys, .mv = LDA(&w->moves)};
  uint64_t cap = (uint64_t)n * bs;
  for (int t = T - 1; t >= 0; t--) {
    q.mask = (2u << t) - 1; /* tiers G1..t */
    cap = cap ? kvbm_groups_hit(gs, ng, bs, cap, glook_held, &q) : 0;
    o->prefix[t] = (uint32_t)(cap / bs);
  }
}

/* Worker by worker (not in lockstep): each walk is a tight loop over one
 * small table, and the probes of one walk already overlap. */
void kvbm_index_lookup(const kvbm_index *idx, const uint64_t *hashes, size_t n,
                       kvbm_overlap *out, uint64_t *workers) {
  memset(out, 0, MAXW * sizeof *out);
  uint64_t live = LDA(&idx->live);
  if (workers) *workers = live;
  if (!n) return;
  /* Every walk starts with a miss or two in a table that may be cold:
   * fetch the first probes of all workers at once (blocks 0, 2, 6: the
   * first gallop steps, and the start of a linear walk) so that their
   * misses overlap instead of coming one after the other. Blocks 2 and 6
   * only with few workers: a core keeps some 20 misses in flight, and
   * with many workers (most of which miss at block 0) the extra lines
   * would queue ahead of the block-0 probes every worker needs. */
  bool deep = __builtin_popcountll(live) <= FIRST_DEEP_MAX;
  for (uint64_t m = live; m; m &= m - 1) {
    int s = __builtin_ctzll(m);
    const wtab *t = LDA(&((kvbm_index *)idx)->w[s].tab);
    __builtin_prefetch(&t->s[home(t, hashes[0])]);
    if (deep && n > 2) __builtin_prefetch(&t->s[home(t, hashes[2])]);
    if (deep && n > 6) __builtin_prefetch(&t->s[home(t, hashes[6])]);
  }
  uint64_t closed = 0;
  for (uint64_t m = live; m; m &= m - 1) {
    int s = __builtin_ctzll(m);
    const worker *w = &idx->w[s];
    if (__builtin_expect(LDA(&((worker *)w)->hybrid), 0)) hybrid_walk(idx, w, hashes, n, &out[s]);
    else if (LDA(&((worker *)w)->closed)) closed |= 1ull << s;
    else walk(w, LDA(&((worker *)w)->tab), hashes, n, &out[s]);
  }
  if (closed) bisect_all(idx, closed, hashes, n, out);
}

size_t kvbm_index_hash_tokens(const kvbm_index *idx, const uint32_t *tokens, size_t n,
                              uint64_t *out, size_t max_out) {
  return kvbm_hash_chain(idx->cfg.scheme, idx->cfg.salt_hash, tokens, n, idx->cfg.block_size,
                         out, max_out);
}

uint64_t kvbm_index_namespace(const char *cache_salt, const char *lora_name) {
  size_t sl = cache_salt ? strlen(cache_salt) : 0, ll = lora_name ? strlen(lora_name) : 0;
  if (!sl && !ll) return 0;
  /* "s" salt NUL "l" lora: neither part can pass for the other */
  char stack[256];
  size_t n = sl + ll + 3;
  char *b = n <= sizeof stack ? stack : malloc(n);
  uint64_t ns;
  if (b) {
    b[0] = 's';
    if (sl) memcpy(b + 1, cache_salt, sl);
    b[1 + sl] = '\0';
    b[2 + sl] = 'l';
    if (ll) memcpy(b + 3 + sl, lora_name, ll);
    ns = kvbm_hash_salt(b, n);
    if (b != stack) free(b);
  } else { /* no memory for a long name: the parts' hashes, combined */
    ns = fmix64(kvbm_hash_salt(cache_salt ? cache_salt : "", sl) * 31 +
                kvbm_hash_salt(lora_name ? lora_name : "", ll));
  }
  return ns ? ns : 1;
}

void kvbm_index_keys(const kvbm_index *idx, uint64_t ns, const uint64_t *hashes, size_t n,
                     uint64_t *keys) {
  for (size_t i = 0; i < n; i++) keys[i] = idx->cfg.recompute ? hashes[i] : ns_key(hashes[i], ns);
}

size_t kvbm_index_hash_tokens_ns(const kvbm_index *idx, uint64_t ns, const uint32_t *tokens,
                                 size_t n, uint64_t *out, size_t max_out) {
  size_t k = 0, bs = idx->cfg.block_size;
  if (!idx->cfg.recompute) {
    k = kvbm_index_hash_tokens(idx, tokens, n, out, max_out);
    kvbm_index_keys(idx, ns, out, k, out);
    return k;
  }
  uint64_t parent = ns; /* recompute: the namespace is the chain's root */
  bool has_parent = ns != 0;
  for (; k < n / bs && k < max_out; k++) {
    out[k] = kvbm_hash_next(idx->cfg.scheme, idx->cfg.salt_hash, parent, has_parent,
                            tokens + k * bs, bs);
    parent = out[k];
    has_parent = true;
  }
  return k;
}

uint64_t kvbm_index_workers(const kvbm_index *idx) { return LDA(&idx->live); }

int kvbm_index_next_id(const kvbm_index *idx, kvbm_worker_key key, uint64_t *next) {
  uint32_t slot;
  if (kvbm_index_worker_slot(idx, key, &slot)) return KVBM_ENOTFOUND;
  const worker *w = &idx->w[slot];
  if (!w->seq.started) return KVBM_ENOTFOUND;
  *next = kvbm_seqno_next(&w->seq);
  return KVBM_OK;
}

bool kvbm_index_slot_worker(const kvbm_index *idx, uint32_t slot, kvbm_worker_key *out) {
  if (slot >= MAXW || !(kvbm_index_workers(idx) >> slot & 1)) return false;
  out->worker_id = LD(&idx->w[slot].wid);
  out->dp_rank = LD(&idx->w[slot].rank);
  return true;
}

int kvbm_index_worker_blocks(const kvbm_index *idx, uint32_t slot,
                             uint64_t out[KVBM_TIER_COUNT]) {
  if (!idx || !out || slot >= MAXW || !(kvbm_index_workers(idx) >> slot & 1))
    return KVBM_ENOTFOUND;
  for (int k = 0; k < KVBM_TIER_COUNT; k++) out[k] = LD(&idx->w[slot].held[k]);
  return KVBM_OK;
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
  o->resets = LD(&c->resets);
  o->jumps = LD(&c->jumps);
  o->unknown_removed = LD(&c->unknown_removed);
  o->orphans = LD(&c->orphans);
  o->entries = LD(&c->entries);
  o->table_slots = LD(&c->slots);
  uint64_t live = kvbm_index_workers(idx);
  o->workers = (uint32_t)__builtin_popcountll(live);
  o->closed_workers = o->hybrid_workers = 0;
  for (uint64_t m = live; m; m &= m - 1) {
    o->closed_workers += (uint32_t)LDA(&((kvbm_index *)idx)->w[__builtin_ctzll(m)].closed);
    o->hybrid_workers += (uint32_t)LDA(&((kvbm_index *)idx)->w[__builtin_ctzll(m)].hybrid);
  }
  o->grouped = LD(&c->grouped);
  o->bad_groups = LD(&c->bad_groups);
  o->group_conflicts = LD(&c->group_conflicts);
}

/* ------------------------------------------------------------ writer side */

/*
 * Closure. To let lookups bisect, the writer tracks per worker whether
 * every held block's parent (as its BlockStored named it) is held too.
 * Each slot's private side keeps the block's parent and the number of
 * entries naming it as parent (nchild). A parent that is not held but has
 * children in the table stays as a "ghost" entry (occupied, no tier bits:
 * readers see a miss), so its children are counted when it comes back.
 * broken = held blocks whose parent is a ghost. A worker is closed when
 * broken == 0 and it holds nothing outside the device tier (tiers do not
 * nest: a block on host may have its parent on device only).
 */

HOT void slot_write(slot *s, uint64_t key, unsigned low) {
  uint64_t m = LD(&s->meta), ver = (m >> VSHIFT) + 1;
  ST(&s->meta, (ver << VSHIFT) | BUSY | (m & (OCC | TIERS_MASK)));
  /* release stores: a reader that sees either sees the busy meta before */
  STR(&s->key, key);
  STR(&s->meta, ((ver + 1) << VSHIFT) | low);
}

/* Fills an empty slot. No busy phase: a reader that loaded the empty meta
 * stops there (an empty slot ends a probe) whatever key it then reads, and
 * one that loads the new meta (acquire) sees the key stored before it. */
HOT void slot_fill_m(slot *s, uint64_t key, unsigned low, uint64_t meta) {
  uint64_t ver = (meta >> VSHIFT) + 1;
  ST(&s->key, key);
  STR(&s->meta, (ver << VSHIFT) | low);
}

/* The same, meta (empty) read here. */
HOT void slot_fill(slot *s, uint64_t key, unsigned low) { slot_fill_m(s, key, low, LD(&s->meta)); }

/* Empties a slot with one store: a reader that loaded the old meta finds
 * the version changed when it loads meta again, and retries; the key and
 * the writer's fields of an empty slot are never read (every fill writes
 * them). */
HOT void slot_clear(slot *s) { STR(&s->meta, ((LD(&s->meta) >> VSHIFT) + 1) << VSHIFT); }

static inline unsigned slot_tiers(const slot *s) { return (unsigned)(LD(&s->meta) & TIERS_MASK); }
static inline bool slot_used(const slot *s) { return (LD(&s->meta) & OCC) != 0; }

/* The writer's slot of key h in t, or the empty slot ending its run;
 * *meta: the slot's meta as the probe read it (the writer is the only
 * one to change it), so that callers test its tiers without loading it
 * again. */
HOT slot *find_slot_m(wtab *t, uint64_t h, bool *found, uint64_t *meta) {
  size_t mask = t->cap - 1;
  for (size_t i = home(t, h);; i = (i + 1) & mask) {
    slot *s = &t->s[i];
    uint64_t m = LD(&s->meta);
    *meta = m;
    if (!(m & OCC)) {
      *found = false;
      return s;
    }
    if (LD(&s->key) == h) {
      *found = true;
      return s;
    }
  }
}

HOT slot *find_slot(wtab *t, uint64_t h, bool *found) {
  uint64_t m;
  return find_slot_m(t, h, found, &m);
}

/* The slot of key h in t: `hint`, a slot of t, when it holds h (keys are
 * unique in a table, so a used slot holding h is h's slot, whatever
 * moved since the hint was taken), else the probe's answer. See "The
 * hint" (the lean path). */
HOT slot *find_hinted(wtab *t, slot *hint, uint64_t h, bool *found, uint64_t *meta) {
  uint64_t m = LD(&hint->meta);
  if (LD(&hint->key) == h && (m & OCC)) {
    *found = true;
    *meta = m;
    return hint;
  }
  return find_slot_m(t, h, found, meta);
}

static inline wpriv *priv(wtab *t, slot *s) {
  (void)t;
  return &s->w;
}

HOT void publish_closed(worker *w) {
  int c = w->broken == 0 && w->offdev == 0;
  if (LD(&w->closed) != c) STR(&w->closed, c);
}

static int worker_table(kvbm_index *idx, worker *w, size_t cap) {
  wtab *t = wtab_new(cap);
  if (!t) return KVBM_ENOMEM;
  wtab *old = LD(&w->tab);
  if (old) {
    for (size_t i = 0; i < old->cap; i++) {
      slot *s = &old->s[i];
      if (!slot_used(s)) continue;
      bool found;
      slot *d = find_slot(t, LD(&s->key), &found);
      ST(&d->key, LD(&s->key));
      ST(&d->meta, (uint64_t)2 << VSHIFT | (LD(&s->meta) & (OCC | TIERS_MASK)));
      d->w = s->w;
    }
    bump(&idx->c.slots, (uint64_t)-old->cap);
  }
  t->retired = old;
  bump(&idx->c.slots, cap);
  STR(&w->tab, t);
  return KVBM_OK;
}

/* Deletes slot s of worker w's table by backward shift. The `moves`
 * window opens only before the first entry that moves: when none does
 * (the usual case at load 1/4: the next slot is empty, or its entry's
 * home lies after s), every entry of the run after s has its home after
 * s, so no probe for one of them passes s, and a probe for the deleted
 * key may miss it (the delete is then already done): one store, no
 * window, and readers need not retry. */
HOT void slot_delete_shift(worker *w, wtab *t, slot *s) {
  size_t mask = t->cap - 1, i = (size_t)(s - t->s), j = i;
  for (;;) { /* the first entry that moves, if any */
    j = (j + 1) & mask;
    uint64_t m = LD(&t->s[j].meta);
    if (!(m & OCC)) {
      slot_clear(s);
      return;
    }
    if (((j - home(t, LD(&t->s[j].key))) & mask) >= ((j - i) & mask)) break;
  }
  uint64_t mv = LD(&w->moves);
  ST(&w->moves, mv + 1); /* ordered before the slots' release stores */
  for (;;) { /* entry j moves to i */
    slot *sj = &t->s[j];
    slot_write(&t->s[i], LD(&sj->key), (unsigned)(LD(&sj->meta) & (OCC | TIERS_MASK)));
    t->s[i].w = sj->w;
    for (i = j;;) {
      j = (j + 1) & mask;
      if (!slot_used(&t->s[j])) goto done;
      if (((j - home(t, LD(&t->s[j].key))) & mask) >= ((j - i) & mask)) break;
    }
  }
done:
  slot_clear(&t->s[i]);
  STR(&w->moves, mv + 2);
}

/* The usual delete (the next slot empty: nothing can move) first; the
 * shift inline too. Out of line, each call saved and restored six
 * registers (40 % of W3's deletes shift); inline, the lean loop has no
 * call left but cold ones, and the compiler keeps its values in
 * registers: callgrind, W3 --limit 3000 at 8 workers, 540.31 M ->
 * 527.80 M. Session 11 had put it out of line when the loop's values
 * were on the stack anyway; an out-of-line copy kept for the general
 * path's deletes made the lean loop 42 M worse (the call left in it). */
HOT void slot_delete(worker *w, wtab *t, slot *s) {
  w->entries--;
  const slot *next = s == t->last ? t->s : s + 1;
  if (!slot_used(next)) slot_clear(s);
  else slot_delete_shift(w, t, s);
}

/* Makes room for two more entries (a block and a ghost parent). */
HOT int reserve2(kvbm_index *idx, worker *w) {
  wtab *t = LD(&w->tab);
  if ((w->entries + 2) * 2 > t->cap) return worker_table(idx, w, t->cap * 2);
  return KVBM_OK;
}

/* Links a newly held block to its parent: counts it as a child, and as
 * broken when the parent is not held (a ghost, made here if need be);
 * true then (`broken` changed). */
HOT bool link_parent_m(worker *w, slot *ps, bool found, uint64_t parent, uint64_t m) {
  if (!found) { /* room was reserved */
    memset(&ps->w, 0, sizeof(wpriv));
    slot_fill(ps, parent, OCC);
    w->entries++;
    m = 0; /* a ghost: no tiers */
  }
  ps->w.nchild++;
  if (m & TIERS_MASK) return false;
  w->broken++;
  return true;
}

/* The same, the parent's slot (or the empty slot ending its run) found here. */
HOT bool link_parent(worker *w, wtab *t, uint64_t parent) {
  bool found;
  uint64_t m;
  slot *ps = find_slot_m(t, parent, &found, &m);
  return link_parent_m(w, ps, found, parent, m);
}

/* Undoes link_parent for a block no longer held (its own slot already
 * changed), the parent's slot ps found by the caller. A ghost parent left
 * without children goes. True when `broken` changed. */
HOT bool unlink_parent_m(worker *w, wtab *t, slot *ps, bool found, uint64_t m) {
  if (!found) return false; /* cannot happen: linked blocks keep their parent's entry */
  wpriv *pp = priv(t, ps);
  pp->nchild--;
  if (m & TIERS_MASK) return false;
  w->broken--;
  if (!pp->nchild) slot_delete(w, t, ps);
  return true;
}

HOT bool unlink_parent(worker *w, wtab *t, uint64_t parent) {
  bool found;
  uint64_t m;
  slot *ps = find_slot_m(t, parent, &found, &m);
  return unlink_parent_m(w, t, ps, found, m);
}

/* Sets tier bit `tier` of key h for worker wi; *was_set says whether it
 * was. `parent` (when has_parent) is the key of the block's parent. */
HOT int tab_hold(kvbm_index *idx, uint32_t wi, uint64_t h, int tier, uint64_t parent,
                    bool has_parent, uint32_t group, bool *was_set) {
  worker *w = &idx->w[wi];
  if (reserve2(idx, w)) return KVBM_ENOMEM;
  wtab *t = LD(&w->tab);
  bool found;
  slot *s = find_slot(t, h, &found);
  unsigned m = found ? slot_tiers(s) : 0;
  *was_set = m >> tier & 1;
  if (*was_set) return KVBM_OK;
  bump(&w->held[tier], 1);
  if (tier != KVBM_TIER_G1) w->offdev++;
  if (m) { /* held already, in another tier: only the bit changes */
    slot_write(s, h, OCC | m | 1u << tier);
    publish_closed(w);
    return KVBM_OK;
  }
  wpriv *sp = priv(t, s);
  if (found) { /* a ghost comes back: its children are no longer broken */
    w->broken -= sp->nchild;
  } else {
    memset(sp, 0, sizeof *sp);
    w->entries++;
    bump(&idx->c.entries, 1);
  }
  if (found) bump(&idx->c.entries, 1);
  sp->parent = parent;
  sp->has_parent = has_parent;
  sp->group = (uint16_t)group;
  slot_write(s, h, OCC | 1u << tier);
  bool broke = false;
  if (has_parent && parent != h) broke = link_parent(w, t, parent);
  else sp->has_parent = 0;
  /* `closed` can change only with `broken` or `offdev` (a device block
   * under a held parent, the usual store, changes neither) */
  if (broke || found || tier != KVBM_TIER_G1) publish_closed(w);
  return KVBM_OK;
}

/* Clears tier bit `tier` of key h for worker wi; false when it was not set. */
HOT bool tab_release(kvbm_index *idx, uint32_t wi, uint64_t h, int tier) {
  worker *w = &idx->w[wi];
  wtab *t = LD(&w->tab);
  bool found;
  slot *s = find_slot(t, h, &found);
  if (!found) return false;
  unsigned m = slot_tiers(s);
  if (!(m >> tier & 1)) return false;
  bump(&w->held[tier], (uint64_t)-1);
  if (tier != KVBM_TIER_G1) w->offdev--;
  m &= ~(1u << tier);
  if (m) {
    slot_write(s, h, OCC | m);
    if (tier != KVBM_TIER_G1) publish_closed(w);
    return true;
  }
  /* no longer held: a ghost if blocks still name it as parent, else gone */
  wpriv sp = *priv(t, s);
  bump(&idx->c.entries, (uint64_t)-1);
  if (sp.nchild) {
    slot_write(s, h, OCC);
    priv(t, s)->has_parent = 0;
    w->broken += sp.nchild;
  } else {
    slot_delete(w, t, s);
  }
  bool mended = sp.has_parent && unlink_parent(w, t, sp.parent);
  if (mended || sp.nchild || tier != KVBM_TIER_G1) publish_closed(w); /* as in tab_hold */
  return true;
}

/*
 * Copies. In recompute mode the worker's map holds every block (engine
 * hash -> index key, count per tier). With the engine's hashes as keys the
 * table's bit says "at least one copy" and the map holds only the extra
 * copies of duplicated blocks (rare), so the common event costs one probe
 * of the worker's table (and one of its parent's, usually just touched).
 * Namespaced blocks are the exception: their key is not their engine
 * hash, so, as in recompute mode, the map holds every copy of them
 * (entries marked MAPPED), and `nmapped` counts them so that a worker
 * without any pays nothing for the check.
 */
#define MAPPED 2u /* wentry.used of a namespaced block (not recompute) */

static inline bool no_copies(const wentry *we) {
  return !(we->cnt[0] | we->cnt[1] | we->cnt[2] | we->cnt[3]);
}

/* The map holds every copy: the table's bit is set with the first. */
static int hold_mapped(kvbm_index *idx, uint32_t w, int tier, uint64_t e, uint64_t r,
                       uint64_t parent, bool has_parent, bool mark, uint32_t group) {
  bool added, was_set;
  wentry *we = kvbm__wmap_upsert(&idx->w[w].map, e, r, &added);
  if (!we) return KVBM_ENOMEM;
  if (added && mark) {
    we->used = MAPPED;
    idx->w[w].nmapped++;
  }
  if (we->cnt[tier]++ == 0) {
    int rc = tab_hold(idx, w, we->rhash, tier, parent, has_parent, group, &was_set);
    if (rc) {
      we->cnt[tier]--;
      if (added) {
        if (mark) idx->w[w].nmapped--;
        kvbm__wmap_erase(&idx->w[w].map, we);
      }
      return rc;
    }
  }
  bump(&idx->c.stored, 1);
  return KVBM_OK;
}

/* The mapped entry of engine hash e (a namespaced block), or NULL. */
static inline wentry *mapped_entry(kvbm_index *idx, uint32_t w, uint64_t e) {
  if (!idx->w[w].nmapped) return NULL;
  wentry *we = kvbm__wmap_find(&idx->w[w].map, e);
  return we && we->used == MAPPED ? we : NULL;
}

/* Stores a copy of engine hash e under index key r (r == e but for
 * recompute mode and namespaced blocks: `mapped`). */
HOT int hold(kvbm_index *idx, uint32_t w, int tier, uint64_t e, uint64_t r,
                uint64_t parent, bool has_parent, bool mapped, uint32_t group) {
  bool added, was_set;
  int rc;
  if (idx->cfg.recompute)
    return hold_mapped(idx, w, tier, e, r, parent, has_parent, false, group);
  wentry *me = mapped_entry(idx, w, e);
  if (mapped || me) /* an engine hash already known keeps its first key */
    return hold_mapped(idx, w, tier, e, me ? me->rhash : r, parent, has_parent, true, group);
  if ((rc = tab_hold(idx, w, e, tier, parent, has_parent, group, &was_set))) return rc;
  if (was_set) {
    wentry *we = kvbm__wmap_upsert(&idx->w[w].map, e, e, &added);
    if (!we) return KVBM_ENOMEM;
    we->cnt[tier]++;
  }
  bump(&idx->c.stored, 1);
  return KVBM_OK;
}

HOT void unhold(kvbm_index *idx, uint32_t w, int tier, uint64_t e) {
  wmap *m = &idx->w[w].map;
  wentry *we = m->n ? kvbm__wmap_find(m, e) : NULL; /* usually empty: no call */
  if (!idx->cfg.recompute && !(we && we->used == MAPPED)) {
    if (we && we->cnt[tier]) { /* an extra copy goes, the bit stays */
      we->cnt[tier]--;
      if (no_copies(we)) kvbm__wmap_erase(m, we);
    } else if (!tab_release(idx, w, e, tier)) {
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
  if (--we->cnt[tier] == 0) tab_release(idx, w, we->rhash, tier);
  if (no_copies(we)) {
    if (we->used == MAPPED) idx->w[w].nmapped--;
    kvbm__wmap_erase(m, we);
  }
  bump(&idx->c.removed, 1);
}

/* Forgets everything worker wi holds: its table is emptied in one `moves`
 * window (a reader's miss meanwhile is retried), its map cleared. */
static void forget_all(kvbm_index *idx, uint32_t wi) {
  worker *w = &idx->w[wi];
  wtab *t = LD(&w->tab);
  uint64_t mv = LD(&w->moves);
  ST(&w->moves, mv + 1);
  uint64_t held = 0;
  for (size_t i = 0; i < t->cap; i++)
    if (slot_used(&t->s[i])) {
      held += slot_tiers(&t->s[i]) != 0;
      slot_write(&t->s[i], 0, 0);
      memset(&t->s[i].w, 0, sizeof t->s[i].w);
    }
  STR(&w->moves, mv + 2);
  bump(&idx->c.entries, (uint64_t)-held);
  w->entries = 0;
  w->broken = w->offdev = 0;
  for (int k = 0; k < KVBM_TIER_COUNT; k++) ST(&w->held[k], 0);
  publish_closed(w);
  kvbm__wmap_clear(&w->map);
  w->nmapped = 0;
  w->glearned = 0; /* a restarted engine may serve another model */
}

/* ------------------------------------------------------------ public */

static int groups_check(const kvbm_group_spec *gs, size_t n, kvbm_error *err);
static void groups_init(kvbm_index *idx, worker *w);

kvbm_index_config kvbm_index_config_default(void) {
  return (kvbm_index_config){.block_size = 16, .scheme = KVBM_HASH_NATIVE, .salt_hash = 0,
                             .recompute = false, .expected_blocks = 16384,
                             .seq = kvbm_seqno_rules_default()};
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
  if (cfg->num_groups) {
    int rc = groups_check(cfg->groups, cfg->num_groups, err);
    if (rc) return rc;
  }
  kvbm_index *idx = calloc(1, sizeof *idx);
  if (!idx) return kvbm_error_set(err, KVBM_ENOMEM, "router index: out of memory");
  idx->cfg = *cfg;
  if (cfg->num_groups) memcpy(idx->groups, cfg->groups, cfg->num_groups * sizeof *cfg->groups);
  idx->cfg.groups = cfg->num_groups ? idx->groups : NULL; /* the caller's may go */
  *out = idx;
  return KVBM_OK;
}

void kvbm_index_destroy(kvbm_index *idx) {
  if (!idx) return;
  for (int s = 0; s < MAXW; s++) {
    for (wtab *t = LD(&idx->w[s].tab), *n; t; t = n) {
      n = t->retired;
      wtab_free(t);
    }
    kvbm__wmap_free(&idx->w[s].map);
  }
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
  if (!LD(&w->tab)) { /* a slot's table stays (emptied) when its worker goes */
    size_t cap = 64;
    while (cap < idx->cfg.expected_blocks * 4) cap *= 2; /* load 1/4 at the expected size */
    if (worker_table(idx, w, cap))
      return kvbm_error_set(err, KVBM_ENOMEM, "router index: out of memory");
  }
  ST(&w->wid, key.worker_id);
  ST(&w->rank, key.dp_rank);
  groups_init(idx, w);
  w->live = true;
  publish_closed(w); /* nothing held: closed (stores keep it up to date) */
  kvbm_seqno_init(&w->seq, &idx->cfg.seq);
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

/* The id rule (the stream's sequence rules, kvbm_seqno_check, for input
 * that may mix live and replayed batches): the id due or a gap (on_gap is
 * called) is applied; a repeat is skipped; a step back further than the
 * rules' max_gap, or below where the worker's ids began, is a restarted
 * engine: the worker's blocks are forgotten and the input applied; an id
 * too far ahead is not believed (skipped, counted in `jumps`) unless
 * `confirm` ids in a row continue it, which re-syncs like a restart.
 * Returns false when the input is to be skipped. */
static bool check_id(kvbm_index *idx, uint32_t s, uint64_t id) {
  worker *w = &idx->w[s];
  if (id == KVBM_INDEX_NO_ID) return true;
  uint64_t due = kvbm_seqno_next(&w->seq);
  switch (kvbm_seqno_check(&w->seq, id, false, NULL)) {
    case KVBM_SEQNO_DUPLICATE:
      bump(&idx->c.duplicates, 1);
      return false;
    case KVBM_SEQNO_HOLD:
      bump(&idx->c.jumps, 1);
      return false;
    case KVBM_SEQNO_RESTART:
    case KVBM_SEQNO_RESYNC:
      bump(&idx->c.resets, 1);
      forget_all(idx, s);
      break;
    case KVBM_SEQNO_GAP:
      bump(&idx->c.gaps, 1);
      if (idx->cfg.on_gap) {
        kvbm_worker_key key = {LD(&w->wid), LD(&w->rank)};
        idx->cfg.on_gap(idx->cfg.gap_user, key, due, id);
      }
      break;
    case KVBM_SEQNO_NEXT:
      break;
  }
  kvbm_seqno_take(&w->seq, id);
  return true;
}

/* A batch marked reset (the subscriber saw its engine restart): every rank
 * of that worker is forgotten, ids included; they come back as they send. */
static void reset_worker(kvbm_index *idx, uint64_t worker_id) {
  for (uint32_t s = 0; s < MAXW; s++) {
    worker *w = &idx->w[s];
    if (!w->live || LD(&w->wid) != worker_id) continue;
    kvbm_worker_key key = {worker_id, LD(&w->rank)};
    kvbm_index_remove_worker(idx, key);
  }
  bump(&idx->c.resets, 1);
}

HOT int check_event(const kvbm_index *idx, const kvbm_event *ev, kvbm_error *err) {
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
  /* token pairs (SGLang's EAGLE bigrams) carry one token past the blocks;
   * each block is hashed from its own tokens */
  size_t want = ev->num_block_hashes * (size_t)bs + (ev->token_pairs ? 1 : 0);
  if (ev->num_tokens != want || (ev->num_tokens && !ev->token_ids))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "router index: BlockStored of %zu blocks carries %zu tokens, not %zu "
                          "(recompute needs every block's tokens)",
                          ev->num_block_hashes, ev->num_tokens, want);
  return KVBM_OK;
}

/* Event application is bound by memory latency (one random slot of a
 * table of megabytes per block), so the slots of blocks a few steps ahead
 * are prefetched to overlap those misses. */
#define EV_AHEAD 16
#define EV_NEAR 6

static inline void prefetch_key(const kvbm_index *idx, uint32_t w, uint64_t h) {
  if (idx->cfg.recompute) {
    const wmap *m = &idx->w[w].map;
    if (m->cap) __builtin_prefetch(&m->e[wmap_home(h, m->cap)], 1);
    return;
  }
  const wtab *t = LD(&((kvbm_index *)idx)->w[w].tab);
  const slot *s = &t->s[home(t, h)];
  __builtin_prefetch(s, 1);
  __builtin_prefetch((const char *)s + sizeof *s, 1); /* the next slot, for deletion's shift */
}

/* The first blocks' slots and, for a BlockStored, its parent's (the
 * parent is linked: link_parent reads its slot). */
static inline void prefetch_event(const kvbm_index *idx, uint32_t w, const kvbm_event *ev) {
  size_t n = ev->num_block_hashes < 4 ? ev->num_block_hashes : 4;
  if (ev->type == KVBM_EVENT_CLEARED || !ev->block_hashes) return;
  for (size_t i = 0; i < n; i++) prefetch_key(idx, w, ev->block_hashes[i]);
  if (ev->type == KVBM_EVENT_STORED && ev->has_parent && !ev->cache_salt && !ev->lora_name)
    prefetch_key(idx, w, ev->parent_hash); /* namespaced: keyed otherwise, left alone */
}

/* A BlockRemoved's parent is known only from its block's slot (prefetched
 * EV_AHEAD events before): a few events ahead, that slot is read and the
 * parent's slot prefetched, for unlink_parent. */
static inline void prefetch_removed_parent(kvbm_index *idx, uint32_t w, const kvbm_event *ev) {
  if (ev->type != KVBM_EVENT_REMOVED || !ev->num_block_hashes || idx->cfg.recompute) return;
  wtab *t = LD(&idx->w[w].tab);
  bool found;
  const slot *s = find_slot(t, ev->block_hashes[0], &found);
  if (found && s->w.has_parent) __builtin_prefetch(&t->s[home(t, s->w.parent)], 1);
}

/* The tier of an event's medium (the usual GPU without a call). */
HOT int ev_tier(const kvbm_event *ev) {
  return ev->medium == KVBM_MEDIUM_GPU ? KVBM_TIER_G1 : (int)kvbm_medium_tier(ev->medium);
}

/* The namespace of a BlockStored: its salt's and LoRA name's, or (with
 * neither) its parent's when the parent is a namespaced block. */
HOT uint64_t stored_ns(kvbm_index *idx, uint32_t s, const kvbm_event *ev) {
  if (ev->cache_salt || ev->lora_name) return kvbm_index_namespace(ev->cache_salt, ev->lora_name);
  const wentry *pe = ev->has_parent ? mapped_entry(idx, s, ev->parent_hash) : NULL;
  return pe ? fmix64_inv(pe->rhash) ^ pe->ehash : 0;
}

HOT int apply_stored(kvbm_index *idx, uint32_t s, const kvbm_event *ev) {
  int tier = ev_tier(ev);
  if (!idx->cfg.recompute) {
    uint64_t ns = stored_ns(idx, s, ev);
    for (size_t i = 0; i < ev->num_block_hashes; i++) {
      if (i + EV_AHEAD < ev->num_block_hashes)
        prefetch_key(idx, s, ns_key(ev->block_hashes[i + EV_AHEAD], ns));
      uint64_t h = ev->block_hashes[i];
      bool hp = i > 0 || ev->has_parent;
      uint64_t parent = ns_key(i ? ev->block_hashes[i - 1] : ev->parent_hash, ns);
      int rc = hold(idx, s, tier, h, ns_key(h, ns), parent, hp, ns != 0, 0);
      if (rc) return rc;
    }
    return KVBM_OK;
  }
  uint64_t parent = 0;
  bool has_parent = ev->has_parent;
  if (has_parent) {
    const wentry *pe = kvbm__wmap_find(&idx->w[s].map, ev->parent_hash);
    if (!pe) {
      bump(&idx->c.orphans, ev->num_block_hashes);
      return KVBM_OK;
    }
    parent = pe->rhash;
  } else {
    /* a sequence's first block chains from its namespace (none: 0) */
    parent = kvbm_index_namespace(ev->cache_salt, ev->lora_name);
    has_parent = parent != 0;
  }
  uint32_t bs = idx->cfg.block_size;
  for (size_t i = 0; i < ev->num_block_hashes; i++) {
    uint64_t r = kvbm_hash_next(idx->cfg.scheme, idx->cfg.salt_hash, parent, has_parent,
                                ev->token_ids + i * bs, bs);
    int rc = hold(idx, s, tier, ev->block_hashes[i], r, parent, has_parent, true, 0);
    if (rc) return rc;
    /* an engine hash already known keeps its first key; chain from it */
    parent = kvbm__wmap_find(&idx->w[s].map, ev->block_hashes[i])->rhash;
    has_parent = true;
  }
  return KVBM_OK;
}

/* ------------------------------------------------------------ groups */

/* Publishes worker w's list (writer side): specs, then its length, then
 * whether lookups must take the hybrid rule. */
static void groups_publish(worker *w, const kvbm_group_spec *gs, size_t n) {
  for (size_t g = 0; g < n; g++) ST(&w->gspec[g], spec_bits(gs[g]));
  STR(&w->ngroups, (uint32_t)n);
  int hy = n > 1 || (n == 1 && gs[0].kind != KVBM_GROUP_FULL);
  if (LD(&w->hybrid) != hy) STR(&w->hybrid, hy);
}

static int groups_check(const kvbm_group_spec *gs, size_t n, kvbm_error *err) {
  if (n == 0 || n > KVBM_GROUPS_MAX || !gs)
    return kvbm_error_set(err, KVBM_EINVAL, "router index: %zu groups (1..%d)", n,
                          KVBM_GROUPS_MAX);
  for (size_t g = 0; g < n; g++) {
    bool param = gs[g].kind == KVBM_GROUP_SLIDING_WINDOW || gs[g].kind == KVBM_GROUP_CHUNKED_LOCAL;
    if ((unsigned)gs[g].kind > KVBM_GROUP_MAMBA_ALIGN)
      return kvbm_error_set(err, KVBM_EINVAL, "router index: group %zu has unknown kind %d", g,
                            (int)gs[g].kind);
    if (param ? (gs[g].tokens == 0 || gs[g].tokens > KVBM_GROUP_MAX_TOKENS) : gs[g].tokens != 0)
      return kvbm_error_set(err, KVBM_EINVAL, "router index: group %zu (%s) has %u tokens", g,
                            kvbm_group_kind_name(gs[g].kind), gs[g].tokens);
  }
  return KVBM_OK;
}

/* The configured list (if any) as a new worker's. */
static void groups_init(kvbm_index *idx, worker *w) {
  w->gfixed = idx->cfg.num_groups != 0;
  w->gused = 0;
  w->glearned = 0;
  for (size_t g = 0; g < KVBM_GROUPS_MAX; g++) ST(&w->gspec[g], 0);
  STR(&w->ngroups, 0);
  STR(&w->hybrid, 0);
  if (w->gfixed) groups_publish(w, idx->groups, idx->cfg.num_groups);
}

/* Makes group g usable for worker s: refused (counted) when out of range
 * or beyond a fixed list; a learned list grows (new groups: full). */
static int group_take(kvbm_index *idx, uint32_t s, int64_t g, kvbm_error *err) {
  worker *w = &idx->w[s];
  uint32_t n = LD(&w->ngroups);
  if (g < 0 || g >= KVBM_GROUPS_MAX || (w->gfixed && (uint64_t)g >= n)) {
    bump(&idx->c.bad_groups, 1);
    return kvbm_error_set(err, KVBM_EINVAL,
                          "router index: group_idx %lld is not a group of worker %llu/%u "
                          "(%u groups%s, at most %d)", (long long)g,
                          (unsigned long long)LD(&w->wid), LD(&w->rank), n,
                          w->gfixed ? ", configured" : "", KVBM_GROUPS_MAX);
  }
  if ((uint64_t)g >= n) {
    kvbm_group_spec gs[KVBM_GROUPS_MAX];
    size_t k = groups_read(w, gs); /* none known reads as one full group */
    while (k <= (size_t)g) gs[k++] = (kvbm_group_spec){KVBM_GROUP_FULL, 0};
    groups_publish(w, gs, k);
  }
  if ((uint32_t)g + 1 > w->gused) w->gused = (uint32_t)g + 1;
  return KVBM_OK;
}

/* The spec a BlockStored describes its group with; false when it names
 * none kvbm can use (an unknown kind, a window missing or out of range). */
static bool event_spec(const kvbm_event *ev, kvbm_group_spec *out) {
  const char *k = ev->kv_cache_spec_kind;
  bool win = ev->has_sliding_window && ev->sliding_window > 0 &&
             ev->sliding_window <= (int64_t)KVBM_GROUP_MAX_TOKENS;
  if (!strcmp(k, "full_attention")) *out = (kvbm_group_spec){KVBM_GROUP_FULL, 0};
  else if (!strcmp(k, "mamba")) *out = (kvbm_group_spec){KVBM_GROUP_MAMBA, 0};
  else if (!strcmp(k, "sliding_window") && win)
    *out = (kvbm_group_spec){KVBM_GROUP_SLIDING_WINDOW, (uint32_t)ev->sliding_window};
  else if (!strcmp(k, "chunked_local_attention") && win)
    *out = (kvbm_group_spec){KVBM_GROUP_CHUNKED_LOCAL, (uint32_t)ev->sliding_window};
  else return false;
  return true;
}

/* Learns (or, for a fixed list, checks) group g's spec from its first
 * BlockStored (since the worker's list was set or its blocks forgotten),
 * when that names its kind. Both Mamba modes match the same way. */
static void group_learn(kvbm_index *idx, uint32_t s, uint32_t g, const kvbm_event *ev) {
  kvbm_group_spec sp;
  worker *w = &idx->w[s];
  if (w->glearned >> g & 1) return;
  w->glearned |= 1u << g; /* a group's first BlockStored: vLLM puts the
                             kind on every one, or on none */
  if (!ev->kv_cache_spec_kind || !event_spec(ev, &sp)) return;
  kvbm_group_spec gs[KVBM_GROUPS_MAX];
  size_t n = groups_read(w, gs);
  kvbm_group_spec old = gs[g];
  bool mamba = (old.kind == KVBM_GROUP_MAMBA || old.kind == KVBM_GROUP_MAMBA_ALIGN) &&
               sp.kind == KVBM_GROUP_MAMBA;
  if (mamba || (old.kind == sp.kind && old.tokens == sp.tokens)) return;
  if (w->gfixed) {
    bump(&idx->c.group_conflicts, 1);
    return;
  }
  gs[g] = sp;
  groups_publish(w, gs, n);
}

/* Group 0's kind, from the first of events[0..n) that is a BlockStored of
 * group 0, unless it was read already (once per worker, list and clear:
 * a batch is scanned only until then). */
static void learn0(kvbm_index *idx, uint32_t s, const kvbm_event *evs, size_t n) {
  if (idx->w[s].glearned & 1) return;
  for (size_t i = 0; i < n; i++)
    if (evs[i].type == KVBM_EVENT_STORED && (!evs[i].has_group_idx || evs[i].group_idx == 0)) {
      group_learn(idx, s, 0, &evs[i]);
      return;
    }
}

/* A STORED or REMOVED of group g != 0: the same
 * as apply_stored and the REMOVED case, with every key in g's space
 * (gkey): engine hashes too, so the writer's map keeps two groups' copies
 * of one hash apart. Not the hot path of single-group workers. */
__attribute__((noinline, cold)) static int apply_grouped(kvbm_index *idx, uint32_t s,
                                                      const kvbm_event *ev, kvbm_error *err) {
  int64_t gi = ev->has_group_idx ? ev->group_idx : 0;
  int rc = group_take(idx, s, gi, err);
  if (rc) return rc;
  uint32_t g = (uint32_t)gi;
  int tier = ev_tier(ev);
  if (ev->type == KVBM_EVENT_REMOVED) {
    for (size_t i = 0; i < ev->num_block_hashes; i++)
      unhold(idx, s, tier, gkey(ev->block_hashes[i], g));
    goto done;
  }
  group_learn(idx, s, g, ev);
  if (!idx->cfg.recompute) {
    /* the namespace: the event's, or its parent's in the same group */
    uint64_t ns = 0;
    if (ev->cache_salt || ev->lora_name) {
      ns = kvbm_index_namespace(ev->cache_salt, ev->lora_name);
    } else if (ev->has_parent) {
      const wentry *pe = mapped_entry(idx, s, gkey(ev->parent_hash, g));
      if (pe) ns = fmix64_inv(gkey_inv(pe->rhash, g)) ^ gkey_inv(pe->ehash, g);
    }
    for (size_t i = 0; i < ev->num_block_hashes && !rc; i++) {
      uint64_t h = ev->block_hashes[i], p = i ? ev->block_hashes[i - 1] : ev->parent_hash;
      rc = hold(idx, s, tier, gkey(h, g), gkey(ns_key(h, ns), g), gkey(ns_key(p, ns), g),
                i > 0 || ev->has_parent, ns != 0, g);
    }
    goto done;
  }
  /* recompute: the chain is computed in group 0's space (what lookups
   * hash), each key then moved to g's */
  uint64_t parent;
  bool hp = ev->has_parent;
  if (hp) {
    const wentry *pe = kvbm__wmap_find(&idx->w[s].map, gkey(ev->parent_hash, g));
    if (!pe) {
      bump(&idx->c.orphans, ev->num_block_hashes);
      goto done;
    }
    parent = gkey_inv(pe->rhash, g);
  } else {
    parent = kvbm_index_namespace(ev->cache_salt, ev->lora_name);
    hp = parent != 0;
  }
  uint32_t bs = idx->cfg.block_size;
  for (size_t i = 0; i < ev->num_block_hashes && !rc; i++) {
    uint64_t r = kvbm_hash_next(idx->cfg.scheme, idx->cfg.salt_hash, parent, hp,
                                ev->token_ids + i * bs, bs);
    uint64_t e = gkey(ev->block_hashes[i], g);
    rc = hold(idx, s, tier, e, gkey(r, g), gkey(parent, g), hp, true, g);
    if (!rc) parent = gkey_inv(kvbm__wmap_find(&idx->w[s].map, e)->rhash, g);
    hp = true;
  }
done:
  if (rc) return kvbm_error_set(err, rc, "router index: out of memory");
  if (g) bump(&idx->c.grouped, 1);
  bump(&idx->c.events, 1);
  return KVBM_OK;
}

HOT int apply_one(kvbm_index *idx, uint32_t s, const kvbm_event *ev, kvbm_error *err) {
  int rc = check_event(idx, ev, err);
  if (rc) return rc;
  /* a group other than 0 (or out of range): the grouped path. Group 0's
   * kind is read before (learn0), so a single-group worker's events pay
   * one test here, of fields on a line ev_tier reads anyway
   * (kv_cache_spec_kind is a line further: reading it on every event cost
   * a miss each, callgrind on W3). */
  int64_t g = ev->has_group_idx ? ev->group_idx : 0;
  if (__builtin_expect(g != 0, 0) && ev->type != KVBM_EVENT_CLEARED)
    return apply_grouped(idx, s, ev, err);
  switch (ev->type) {
    case KVBM_EVENT_STORED:
      rc = apply_stored(idx, s, ev);
      break;
    case KVBM_EVENT_REMOVED:
      for (size_t i = 0, tier = (size_t)ev_tier(ev); i < ev->num_block_hashes; i++) {
        if (i + EV_AHEAD < ev->num_block_hashes) prefetch_key(idx, s, ev->block_hashes[i + EV_AHEAD]);
        unhold(idx, s, (int)tier, ev->block_hashes[i]);
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

static int lean_batch(kvbm_index *idx, worker *w, const kvbm_event_batch *b, kvbm_error *err);
static inline bool lean_worker(const kvbm_index *idx, const worker *w);

int kvbm_index_apply(kvbm_index *idx, kvbm_worker_key worker, uint64_t id,
                     const kvbm_event *ev, kvbm_error *err) {
  if (!idx || !ev) return kvbm_error_set(err, KVBM_EINVAL, "router index: NULL argument");
  int rc = check_event(idx, ev, err); /* before the worker is added */
  if (rc) return rc;
  if (ev->type != KVBM_EVENT_CLEARED && ev->has_group_idx &&
      (ev->group_idx < 0 || ev->group_idx >= KVBM_GROUPS_MAX)) {
    bump(&idx->c.bad_groups, 1);
    return kvbm_error_set(err, KVBM_EINVAL, "router index: group_idx %lld is not in 0..%d",
                          (long long)ev->group_idx, KVBM_GROUPS_MAX - 1);
  }
  uint32_t s;
  if ((rc = kvbm_index_add_worker(idx, worker, &s, err))) return rc;
  if (!check_id(idx, s, id)) return KVBM_OK;
  learn0(idx, s, ev, 1);
  /* a batch of one: the same paths as kvbm_index_apply_batch */
  const kvbm_event_batch one = {.events = ev, .num_events = 1};
  if (lean_worker(idx, &idx->w[s])) return lean_batch(idx, &idx->w[s], &one, err);
  return apply_one(idx, s, ev, err);
}

/*
 * The lean path (issue 22). Nearly every event a router sees is a
 * BlockStored or BlockRemoved of device blocks in group 0 with no salt
 * and no LoRA name, on a worker with no namespaced block outside recompute
 * mode. Such an event's whole effect is a new slot (and a child counted
 * on its parent) or a slot deleted (and its parent's count down): what
 * tab_hold and tab_release do, without the questions the general path
 * asks of every block (recompute? namespace? mapped copies? tier? group?).
 * Anything else (a duplicate, a ghost, another tier, a clear, a group,
 * a namespace) goes through the general path, block by block or event by
 * event, so the two can never disagree on what an event means.
 *
 * The counters of lean events (blocks held on the device, entries,
 * stored, removed, events) are added once per batch (lean_flush), not
 * per block: each is a relaxed load and store of a shared line, five per
 * block before. Readers of those counters (stats, metrics,
 * kvbm_index_worker_blocks) see them at most one batch late, which their
 * contract allows ("a moment stale"). They are flushed before any event
 * of the general path, which may set them (a clear zeroes `held`).
 *
 * The hint. A lean event's second probe is its parent's slot: a stored
 * block's parent gets a child counted, a removed block's parent loses
 * one. Engines store a sequence's blocks in order and evict tail first,
 * so that parent is nearly always a block the previous event touched: a
 * stored block's parent is the block stored just before (W3 merges a
 * chain's blocks into one event, but a remove between two steps splits
 * them), and a removed block's parent is the next block removed. The
 * batch keeps two slot pointers, the slot of the block stored last (hs)
 * and that of the parent of the block removed last (hr); find_hinted
 * takes the hint's slot when it is used and holds the key (keys are
 * unique in a table, so that is the key's slot whatever moved since),
 * else probes. A hint points into the current table: it is reset to the
 * table's first slot when the table grows or a general event runs (it
 * may grow it). W3: 99.8 % of the hints hit, one probe an event instead
 * of two (a store's own slot, a remove's parent); test_lean_hints stores
 * under a parent whose hinted slot was emptied since.
 */
typedef struct lean {
  uint64_t stored, removed, events; /* a lean block stored is a new device
                                       entry, one removed an entry gone:
                                       held and entries move by the same */
  slot *hs, *hr; /* slots of the worker's current table (see "The hint"):
                    the block stored last, the parent of the one removed last */
} lean;

static void lean_flush(kvbm_index *idx, worker *w, lean *a) {
  if (!(a->events | a->stored | a->removed)) return;
  bump(&w->held[KVBM_TIER_G1], a->stored - a->removed);
  bump(&idx->c.entries, a->stored - a->removed);
  bump(&idx->c.stored, a->stored);
  bump(&idx->c.removed, a->removed);
  bump(&idx->c.events, a->events);
  a->stored = a->removed = a->events = 0;
}

/* Whether ev, a BlockStored or BlockRemoved, may take the lean path (its
 * worker permitting: lean_worker): device blocks of group 0, hashes
 * given. A BlockStored must also carry no salt and no LoRA name
 * (lean_salted); a BlockRemoved names no namespace whatever it carries
 * (removes find namespaced blocks through the worker's map, and a worker
 * with a mapped block removes on the general path). The fields read share
 * the event's first two cache lines with those the general path reads. */
HOT bool lean_event(const kvbm_event *ev) {
  return ev->medium == KVBM_MEDIUM_GPU && ev->block_hashes &&
         !(ev->has_group_idx && ev->group_idx);
}

HOT bool lean_salted(const kvbm_event *ev) { return ev->cache_salt || ev->lora_name; }

/* A worker whose stores the lean path may apply: no recompute (blocks are
 * kept under their engine hash) and no namespaced block (a store without
 * salt could continue a namespaced parent's namespace). */
static inline __attribute__((always_inline)) bool lean_worker(const kvbm_index *idx,
                                                              const worker *w) {
  return !idx->cfg.recompute && !w->nmapped;
}

/* The general path's calls from the lean one, out of line: inlined, they
 * made the lean loop one large function whose hot values the compiler
 * kept on the stack (callgrind on W3). */
static __attribute__((noinline, cold)) int cold_hold(kvbm_index *idx, uint32_t wi, uint64_t h,
                                                     uint64_t parent, bool hp) {
  return hold(idx, wi, KVBM_TIER_G1, h, h, parent, hp, false, 0);
}

static __attribute__((noinline, cold)) void cold_unhold(kvbm_index *idx, uint32_t wi,
                                                        uint64_t h) {
  unhold(idx, wi, KVBM_TIER_G1, h);
}

static __attribute__((noinline, cold)) int cold_apply(kvbm_index *idx, uint32_t s,
                                                      const kvbm_event *ev, kvbm_error *err) {
  return apply_one(idx, s, ev, err);
}

static __attribute__((noinline, cold)) int cold_grow(kvbm_index *idx, worker *w) {
  return worker_table(idx, w, LD(&w->tab)->cap * 2);
}

/* The slot number of worker w: the lean path keeps w only (not its slot
 * as well, which the compiler kept by recomputing w from it, a multiply
 * an event) and computes the slot where a general call needs it. */
static inline uint32_t wslot(const kvbm_index *idx, const worker *w) {
  return (uint32_t)(w - idx->w);
}

/* One block of a lean BlockStored: a block not in the table yet becomes
 * a new device entry under its parent; one already there (a copy,
 * another tier, a ghost) takes the general path. */
HOT int lean_store_one(kvbm_index *idx, worker *w, uint64_t h, uint64_t parent, bool hp,
                       bool chain, lean *a) {
  wtab *t = LD(&w->tab);
  if (__builtin_expect((w->entries + 2) * 2 > t->cap, 0)) { /* as reserve2 */
    if (cold_grow(idx, w)) return KVBM_ENOMEM;
    t = LD(&w->tab);
    a->hs = a->hr = t->s;
  }
  bool found;
  uint64_t m;
  slot *s = find_slot_m(t, h, &found, &m);
  if (__builtin_expect(found, 0)) {
    int rc = cold_hold(idx, wslot(idx, w), h, parent, hp);
    a->hs = a->hr = LD(&w->tab)->s;
    return rc;
  }
  s->w = (wpriv){.parent = parent, .has_parent = hp};
  slot_fill_m(s, h, OCC | 1u << KVBM_TIER_G1, m);
  w->entries++;
  a->stored++;
  if (chain && a->hs != t->s) { /* the block before in the event, just
                                   * stored on the device (a->hs: its slot) */
    a->hs->w.nchild++;
  } else if (hp) { /* usually the block stored just before: the hint */
    slot *ps = find_hinted(t, a->hs, parent, &found, &m);
    if (link_parent_m(w, ps, found, parent, m)) publish_closed(w);
  }
  a->hs = s; /* the next block's parent, if it continues this sequence */
  return KVBM_OK;
}

/* A lean BlockStored of several blocks, each under the one before. */
static int lean_stored(kvbm_index *idx, worker *w, const kvbm_event *ev, lean *a) {
  const uint64_t *hs = ev->block_hashes;
  for (size_t i = 0; i < ev->num_block_hashes; i++) {
    if (i + EV_AHEAD < ev->num_block_hashes) {
      const wtab *t = LD(&w->tab);
      __builtin_prefetch(&t->s[home(t, hs[i + EV_AHEAD])], 1);
    }
    uint64_t h = hs[i], parent = i ? hs[i - 1] : ev->parent_hash;
    bool hp = (i > 0 || ev->has_parent) && parent != h;
    /* block i > 0: its parent is block i - 1, whose slot is the hint when
     * it was stored here (a->hs is reset to the table's first slot when
     * it was not, or the table grew) */
    int rc = lean_store_one(idx, w, h, parent, hp, i > 0 && hp, a);
    if (rc) return rc;
  }
  return KVBM_OK;
}

/* One block of a lean BlockRemoved: a block held on the device only with
 * no children is deleted and its parent's count goes down; anything else
 * (an unknown block, extra copies in the map, other tiers, children that
 * make it a ghost) takes the general path. */
HOT void lean_remove_one(kvbm_index *idx, worker *w, uint64_t h, lean *a) {
  wtab *t = LD(&w->tab); /* removes never grow it */
  bool found = false;
  /* engines evict tail first: usually the parent of the block removed
   * just before, the hint */
  uint64_t m = 0;
  slot *s = w->map.n ? NULL : find_hinted(t, a->hr, h, &found, &m);
  if (__builtin_expect(!found || (m & TIERS_MASK) != 1u << KVBM_TIER_G1 || s->w.nchild, 0)) {
    cold_unhold(idx, wslot(idx, w), h);
    return;
  }
  uint64_t parent = s->w.parent;
  bool hp = s->w.has_parent;
  slot_delete(w, t, s);
  a->removed++;
  if (hp) {
    slot *ps = find_slot_m(t, parent, &found, &m);
    a->hr = ps; /* the next block removed, if the eviction goes on up this chain */
    if (unlink_parent_m(w, t, ps, found, m)) publish_closed(w);
  }
}

/* A lean BlockRemoved of several blocks. */
static void lean_removed(kvbm_index *idx, worker *w, const kvbm_event *ev, lean *a) {
  const uint64_t *hs = ev->block_hashes;
  for (size_t i = 0; i < ev->num_block_hashes; i++) {
    if (i + EV_AHEAD < ev->num_block_hashes) {
      const wtab *t = LD(&w->tab);
      __builtin_prefetch(&t->s[home(t, hs[i + EV_AHEAD])], 1);
    }
    lean_remove_one(idx, w, hs[i], a);
  }
}

/* What the lean path will touch for an event EV_AHEAD ahead: the line
 * of its first block's slot and the line after it, where a probe run or
 * deletion's shift goes on (W3: 40 % of deletes shift). Slots are 32
 * bytes, so slot p + 2 is always on the next line; p + 1, prefetched
 * before, shares p's line half the time (bench_router, 8 workers: kvbm
 * 1.08x faster side by side, docs/areas/router.md, Session 18). Not a
 * BlockStored's parent: that is nearly always the block stored just
 * before (the hint, in cache; W3: 99.8 % of stored blocks),
 * and its test and probe cost 7 instructions an event for the first
 * block of each request. Nor a removed block's parent: tail first, it is
 * the next remove's block, prefetched as that event's. Reads only the
 * event's first cache line; a prefetch of a slot the event will not use
 * (a namespaced key, another group) costs nothing but the line. */
HOT void lean_prefetch(const wtab *t, const kvbm_event *ev) {
  if (!ev->num_block_hashes || !ev->block_hashes) return;
  const slot *p = &t->s[home(t, ev->block_hashes[0])];
  _Static_assert(sizeof(slot) == 32, "p + 2 is the line after p's");
  __builtin_prefetch(p, 1);
  __builtin_prefetch(p + 2, 1); /* past the table's end at its last slots: prefetches never fault */
}

/* Events from..n of a batch of worker s, on the general path, each event
 * prefetched as prefetch_event says. */
static int general_batch(kvbm_index *idx, uint32_t s, const kvbm_event_batch *b, size_t from,
                         kvbm_error *err) {
  for (size_t i = from; i < from + EV_AHEAD && i < b->num_events; i++)
    prefetch_event(idx, s, &b->events[i]);
  for (size_t i = from; i < b->num_events; i++) {
    if (i + EV_AHEAD < b->num_events) prefetch_event(idx, s, &b->events[i + EV_AHEAD]);
    if (i + EV_NEAR < b->num_events) prefetch_removed_parent(idx, s, &b->events[i + EV_NEAR]);
    int rc = apply_one(idx, s, &b->events[i], err);
    if (rc) return rc;
  }
  return KVBM_OK;
}

/* One event of a lean worker's batch on the lean path: KVBM_OK, an error
 * (KVBM_ENOMEM), or LEAN_NOT when the event is not lean (the caller
 * applies it on the general path). One block (W3 at 8 workers: most
 * events) inline, more in a loop. */
#define LEAN_NOT 1
HOT int lean_one(kvbm_index *idx, worker *w, const kvbm_event *ev, lean *a) {
  if (ev->type == KVBM_EVENT_STORED) {
    if (__builtin_expect(!lean_event(ev) || lean_salted(ev), 0)) return LEAN_NOT;
    if (ev->num_block_hashes != 1) return lean_stored(idx, w, ev, a);
    uint64_t h = ev->block_hashes[0];
    return lean_store_one(idx, w, h, ev->parent_hash, ev->has_parent & (ev->parent_hash != h),
                          false, a);
  }
  if (ev->type != KVBM_EVENT_REMOVED || __builtin_expect(!lean_event(ev), 0)) return LEAN_NOT;
  if (ev->num_block_hashes == 1) lean_remove_one(idx, w, ev->block_hashes[0], a);
  else lean_removed(idx, w, ev, a);
  return KVBM_OK;
}

/* The same out of line, for a batch's last EV_AHEAD events (one copy of
 * the lean path inline is enough). */
static __attribute__((noinline)) int lean_one_tail(kvbm_index *idx, worker *w,
                                                   const kvbm_event *ev, lean *a) {
  return lean_one(idx, w, ev, a);
}

/* A batch of a lean worker: lean events on the lean path, others on the
 * general one (the counters flushed first); should the worker stop being
 * lean (a namespaced store), the rest of the batch goes the general way. */
static int lean_batch(kvbm_index *idx, worker *w, const kvbm_event_batch *b, kvbm_error *err) {
  const kvbm_event *ev = b->events, *end = ev + b->num_events;
  /* stop: the first event with no event EV_AHEAD after it to prefetch;
   * the loop up to it prefetches without a test, the one after it does
   * not prefetch (two loops: the test and a second pointer cost 5
   * instructions an event, callgrind on W3). counted: the first lean
   * event not yet counted in a.events (counted by their number at each
   * flush, not one by one). */
  const kvbm_event *stop = b->num_events > EV_AHEAD ? end - EV_AHEAD : ev, *counted = ev;
  lean a = {.hs = LD(&w->tab)->s, .hr = LD(&w->tab)->s};
  int rc = KVBM_OK;
  for (const kvbm_event *p = ev; p < end && p < b->events + EV_AHEAD; p++)
    lean_prefetch(LD(&w->tab), p);
  for (;;) {
    for (; ev < stop; ev++) {
      /* The batch itself is not prefetched: a subscriber decodes one
       * message into buffers it reuses, so the events and their hashes
       * are in cache (session 16 prefetched them, three steps ahead, when
       * bench_router streamed 3.7 GB of events from memory; with each
       * batch staged as a decoder leaves it, those five prefetches an
       * event cost kvbm 7 % of its rate: docs/areas/router.md, Session
       * 18). */
      lean_prefetch(LD(&w->tab), ev + EV_AHEAD);
      if (__builtin_expect((rc = lean_one(idx, w, ev, &a)) != 0, 0)) goto other;
    }
    for (; ev < end; ev++)
      if ((rc = lean_one_tail(idx, w, ev, &a))) goto other;
    break;
  other:
    if (rc != LEAN_NOT) break; /* an error: ev (not applied) is not counted */
    a.events += (uint64_t)(ev - counted);
    counted = ev + 1;
    lean_flush(idx, w, &a);
    uint32_t s = wslot(idx, w);
    if ((rc = cold_apply(idx, s, ev, err))) return rc;
    a.hs = a.hr = LD(&w->tab)->s; /* a store there may have grown the table */
    if (!lean_worker(idx, w)) return general_batch(idx, s, b, (size_t)(ev + 1 - b->events), err);
    ev++;
  }
  a.events += (uint64_t)(ev - counted);
  lean_flush(idx, w, &a);
  if (rc) return kvbm_error_set(err, rc, "router index: out of memory");
  return KVBM_OK;
}

int kvbm_index_apply_batch(kvbm_index *idx, uint64_t worker_id, const kvbm_event_batch *b,
                           kvbm_error *err) {
  if (!idx || !b || (b->num_events && !b->events))
    return kvbm_error_set(err, KVBM_EINVAL, "router index: NULL argument");
  kvbm_worker_key key = {worker_id, b->has_dp_rank ? (uint32_t)b->dp_rank : 0};
  uint32_t s;
  if (b->reset) reset_worker(idx, worker_id);
  int rc = kvbm_index_add_worker(idx, key, &s, err);
  if (rc) return rc;
  if (!check_id(idx, s, b->seq)) return KVBM_OK;
  learn0(idx, s, b->events, b->num_events);
  if (lean_worker(idx, &idx->w[s])) return lean_batch(idx, &idx->w[s], b, err);
  return general_batch(idx, s, b, 0, err);
}

int kvbm_index_store(kvbm_index *idx, uint32_t slot, kvbm_tier tier,
                     const uint64_t *hashes, size_t n) {
  if (!idx || slot >= MAXW || !idx->w[slot].live || (unsigned)tier >= T || (n && !hashes))
    return KVBM_EINVAL;
  for (size_t i = 0; i < n; i++) {
    int rc = hold(idx, slot, tier, hashes[i], hashes[i], i ? hashes[i - 1] : 0, i > 0, false, 0);
    if (rc) return rc;
  }
  /* a hybrid worker: the blocks stand for every group's (approximate
   * routing records a whole request) */
  for (uint32_t g = 1, ng = LD(&idx->w[slot].ngroups); g < ng; g++) {
    int rc = kvbm_index_store_group(idx, slot, tier, g, hashes, n);
    if (rc) return rc;
  }
  return KVBM_OK;
}

int kvbm_index_remove(kvbm_index *idx, uint32_t slot, kvbm_tier tier,
                      const uint64_t *hashes, size_t n) {
  if (!idx || slot >= MAXW || !idx->w[slot].live || (unsigned)tier >= T || (n && !hashes))
    return KVBM_EINVAL;
  for (size_t i = 0; i < n; i++) unhold(idx, slot, tier, hashes[i]);
  for (uint32_t g = 1, ng = LD(&idx->w[slot].ngroups); g < ng; g++)
    kvbm_index_remove_group(idx, slot, tier, g, hashes, n);
  return KVBM_OK;
}

int kvbm_index_store_group(kvbm_index *idx, uint32_t slot, kvbm_tier tier, uint32_t group,
                           const uint64_t *hashes, size_t n) {
  if (!idx || slot >= MAXW || !idx->w[slot].live || (unsigned)tier >= T || (n && !hashes) ||
      group_take(idx, slot, group, NULL))
    return KVBM_EINVAL;
  for (size_t i = 0; i < n; i++) {
    uint64_t h = gkey(hashes[i], group), p = i ? gkey(hashes[i - 1], group) : 0;
    int rc = hold(idx, slot, tier, h, h, p, i > 0, false, group);
    if (rc) return rc;
  }
  return KVBM_OK;
}

int kvbm_index_remove_group(kvbm_index *idx, uint32_t slot, kvbm_tier tier, uint32_t group,
                            const uint64_t *hashes, size_t n) {
  if (!idx || slot >= MAXW || !idx->w[slot].live || (unsigned)tier >= T || (n && !hashes) ||
      group_take(idx, slot, group, NULL))
    return KVBM_EINVAL;
  for (size_t i = 0; i < n; i++) unhold(idx, slot, tier, gkey(hashes[i], group));
  return KVBM_OK;
}

int kvbm_index_worker_groups_set(kvbm_index *idx, kvbm_worker_key key,
                                 const kvbm_group_spec *specs, size_t n, kvbm_error *err) {
  if (!idx) return kvbm_error_set(err, KVBM_EINVAL, "router index: NULL argument");
  int rc = groups_check(specs, n, err);
  if (rc) return rc;
  uint32_t s;
  bool known = !find_worker(idx, key, &s);
  if (known && idx->w[s].gused > n)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "router index: worker %llu/%u holds blocks of group %u; a list of %zu "
                          "groups would orphan them", (unsigned long long)key.worker_id,
                          key.dp_rank, idx->w[s].gused - 1, n);
  if (!known && (rc = kvbm_index_add_worker(idx, key, &s, err))) return rc;
  worker *w = &idx->w[s];
  for (size_t g = n; g < KVBM_GROUPS_MAX; g++) ST(&w->gspec[g], 0);
  groups_publish(w, specs, n);
  w->gfixed = true;
  w->glearned = 0; /* the events' kinds are checked against it, once each */
  return KVBM_OK;
}

int kvbm_index_worker_groups(const kvbm_index *idx, uint32_t slot, kvbm_group_spec *out,
                             size_t max, size_t *n) {
  if (!idx || slot >= MAXW || !(kvbm_index_workers(idx) >> slot & 1)) return KVBM_ENOTFOUND;
  const worker *w = &idx->w[slot];
  size_t k = LDA(&((worker *)w)->ngroups);
  for (size_t g = 0; g < k && g < max && out; g++) out[g] = spec_of(LD(&((worker *)w)->gspec[g]));
  if (n) *n = k;
  return KVBM_OK;
}

/* ------------------------------------------------------------ snapshots */

/*
 * A snapshot is the index as bytes: what each worker holds, its map, and
 * where its input stood, so that a router that restarts loads it and
 * applies only the input after it. The bytes are canonical: workers in
 * (worker id, rank) order, blocks and map entries sorted by key, no ghost
 * entries (restoring re-creates them), so two indexes that hold the same
 * blocks have byte-equal snapshots: replicas and a restarted router can
 * be compared byte for byte.
 *
 *   header   "KVBMIDX\1", u32 version 2, u32 flags (1 = recompute),
 *            u32 block size, u32 scheme, u64 salt hash, u32 workers, u32 0
 *   worker   u64 id, u32 rank, u32 flags (1 = its ids started, 2 = it saw
 *            a live one), and its sequence tracker (kvbm_seqno_tracker): u64
 *            next, floor, last live, first held, next held, u32 held, u32
 *            0; then u64 blocks, u64 map entries; then (version 2) u32
 *            groups (0..16), u32 1 if configured, and 16 x (u32 kind, u32
 *            tokens), unused ones 0
 *   block    u64 key, u64 parent, u8 tiers (1..15), u8 has parent, u8
 *            group (version 2; below the worker's groups, or 0 when it
 *            has none), 5 x 0
 *   entry    u64 engine hash, u64 key, u32 copies[4], u32 kind, u32 0
 *   trailer  u64 XXH3 (kvbm_hash_salt) of everything before
 *
 * A block's key already carries its group (gkey), so the group byte is
 * there to be checked and to keep the writer's record of it. Version 1
 * snapshots (before groups) still load: every block in group 0, every
 * worker with no list (learned again, or the configured one).
 *
 * Little-endian, fixed sizes. Restoring checks the sum, every count
 * against the bytes left before it sizes anything, and every value's
 * range: a hostile file is an error, never a crash or a wrong index.
 */
#define SNAP_MAGIC "KVBMIDX\1"
#define SNAP_HEADER 40
#define SNAP_WORKER 80
#define SNAP_GROUPS (8 + 8 * KVBM_GROUPS_MAX) /* version 2's group list */
#define SNAP_VERSION 2
#define SNAP_BLOCK 24
#define SNAP_ENTRY 40

typedef struct sbuf {
  uint8_t *p;
  size_t n, cap;
  bool oom;
} sbuf;

static uint8_t *sb_take(sbuf *b, size_t n) {
  if (b->oom) return NULL;
  if (n > SIZE_MAX / 2 - b->n ||
      kvbm__vec_reserve_of(&b->p, &b->cap, b->n + n, 4096, KVBM__VEC_NO_LIMIT)) {
    b->oom = true;
    return NULL;
  }
  uint8_t *r = b->p + b->n;
  b->n += n;
  return r;
}

typedef struct snap_block {
  uint64_t key, parent;
  uint8_t tiers, has_parent, group;
} snap_block;

static int cmp_block(const void *a, const void *b) {
  uint64_t x = ((const snap_block *)a)->key, y = ((const snap_block *)b)->key;
  return (x > y) - (x < y);
}

static int cmp_entry(const void *a, const void *b) {
  uint64_t x = ((const wentry *)a)->ehash, y = ((const wentry *)b)->ehash;
  return (x > y) - (x < y);
}

static int cmp_slot(const void *a, const void *b, void *arg) {
  const kvbm_index *idx = arg;
  const worker *x = &idx->w[*(const uint32_t *)a], *y = &idx->w[*(const uint32_t *)b];
  uint64_t xi = LD(&((worker *)x)->wid), yi = LD(&((worker *)y)->wid);
  if (xi != yi) return (xi > yi) - (xi < yi);
  uint32_t xr = LD(&((worker *)x)->rank), yr = LD(&((worker *)y)->rank);
  return (xr > yr) - (xr < yr);
}

/* One worker: its header, sorted blocks, sorted map entries. */
static int snap_worker(const kvbm_index *idx, uint32_t s, sbuf *b) {
  worker *w = (worker *)&idx->w[s];
  wtab *t = LD(&w->tab);
  snap_block *blk = malloc((w->entries ? w->entries : 1) * sizeof *blk);
  wentry *ent = malloc((w->map.n ? w->map.n : 1) * sizeof *ent);
  if (!blk || !ent) {
    free(blk);
    free(ent);
    return KVBM_ENOMEM;
  }
  size_t nb = 0, ne = 0;
  for (size_t i = 0; i < t->cap && nb < w->entries; i++) {
    slot *sl = &t->s[i];
    unsigned tiers = slot_tiers(sl);
    if (!slot_used(sl) || !tiers) continue; /* ghosts come back by themselves */
    blk[nb++] = (snap_block){LD(&sl->key), sl->w.parent, (uint8_t)tiers,
                             (uint8_t)(sl->w.has_parent != 0), (uint8_t)sl->w.group};
  }
  for (size_t i = 0; i < w->map.cap; i++)
    if (w->map.e[i].used) ent[ne++] = w->map.e[i];
  qsort(blk, nb, sizeof *blk, cmp_block);
  qsort(ent, ne, sizeof *ent, cmp_entry);
  uint8_t *h = sb_take(b, SNAP_WORKER + SNAP_GROUPS);
  if (h) {
    uint32_t ng = LD(&w->ngroups);
    kvbm__put_le(h + SNAP_WORKER, ng, 4);
    kvbm__put_le(h + SNAP_WORKER + 4, w->gfixed ? 1 : 0, 4);
    for (uint32_t g = 0; g < KVBM_GROUPS_MAX; g++) {
      kvbm_group_spec sp = spec_of(g < ng ? LD(&w->gspec[g]) : 0);
      kvbm__put_le(h + SNAP_WORKER + 8 + 8 * g, (uint32_t)sp.kind, 4);
      kvbm__put_le(h + SNAP_WORKER + 12 + 8 * g, sp.tokens, 4);
    }
    const kvbm_seqno_tracker *q = &w->seq;
    kvbm__put_le(h, LD(&w->wid), 8);
    kvbm__put_le(h + 8, LD(&w->rank), 4);
    kvbm__put_le(h + 12, (q->started ? 1u : 0u) | (q->have_live ? 2u : 0u), 4);
    kvbm__put_le(h + 16, q->next, 8);
    kvbm__put_le(h + 24, q->floor, 8);
    kvbm__put_le(h + 32, q->live_last, 8);
    kvbm__put_le(h + 40, q->held_first, 8);
    kvbm__put_le(h + 48, q->held_next, 8);
    kvbm__put_le(h + 56, q->held, 4);
    kvbm__put_le(h + 60, 0, 4);
    kvbm__put_le(h + 64, nb, 8);
    kvbm__put_le(h + 72, ne, 8);
  }
  for (size_t i = 0; i < nb; i++) {
    uint8_t *p = sb_take(b, SNAP_BLOCK);
    if (!p) break;
    memset(p, 0, SNAP_BLOCK);
    kvbm__put_le(p, blk[i].key, 8);
    kvbm__put_le(p + 8, blk[i].parent, 8);
    p[16] = blk[i].tiers;
    p[17] = blk[i].has_parent;
    p[18] = blk[i].group;
  }
  for (size_t i = 0; i < ne; i++) {
    uint8_t *p = sb_take(b, SNAP_ENTRY);
    if (!p) break;
    kvbm__put_le(p, ent[i].ehash, 8);
    kvbm__put_le(p + 8, ent[i].rhash, 8);
    for (int k = 0; k < T; k++) kvbm__put_le(p + 16 + 4 * k, ent[i].cnt[k], 4);
    kvbm__put_le(p + 32, ent[i].used, 4);
    kvbm__put_le(p + 36, 0, 4);
  }
  free(blk);
  free(ent);
  return b->oom ? KVBM_ENOMEM : KVBM_OK;
}

int kvbm_index_snapshot(const kvbm_index *idx, uint8_t **out, size_t *len, kvbm_error *err) {
  if (!idx || !out || !len) return kvbm_error_set(err, KVBM_EINVAL, "router index: snapshot: NULL argument");
  uint32_t slots[MAXW], nw = 0;
  uint64_t live = kvbm_index_workers(idx);
  for (uint32_t s = 0; s < MAXW; s++)
    if (live >> s & 1) slots[nw++] = s;
  qsort_r(slots, nw, sizeof *slots, cmp_slot, (void *)idx);
  sbuf b = {0};
  uint8_t *h = sb_take(&b, SNAP_HEADER);
  if (h) {
    memcpy(h, SNAP_MAGIC, 8);
    kvbm__put_le(h + 8, SNAP_VERSION, 4);
    kvbm__put_le(h + 12, idx->cfg.recompute ? 1 : 0, 4);
    kvbm__put_le(h + 16, idx->cfg.block_size, 4);
    kvbm__put_le(h + 20, (uint64_t)idx->cfg.scheme, 4);
    kvbm__put_le(h + 24, idx->cfg.salt_hash, 8);
    kvbm__put_le(h + 32, nw, 4);
    kvbm__put_le(h + 36, 0, 4);
  }
  int rc = KVBM_OK;
  for (uint32_t i = 0; i < nw && !rc; i++) rc = snap_worker(idx, slots[i], &b);
  uint8_t *sum = rc ? NULL : sb_take(&b, 8);
  if (rc || !sum) {
    free(b.p);
    return kvbm_error_set(err, KVBM_ENOMEM, "router index: snapshot: out of memory");
  }
  kvbm__put_le(sum, kvbm_hash_salt(b.p, b.n - 8), 8);
  *out = b.p;
  *len = b.n;
  return KVBM_OK;
}

/* Restores one worker from [p, end); *p moves past it. */
/* Version 2's group list of a worker (at p): checked, into gs / *ng. */
static int restore_groups(const uint8_t *p, kvbm_group_spec *gs, uint32_t *ng, bool *fixed,
                          kvbm_error *err) {
  uint32_t n = (uint32_t)kvbm__get_le(p, 4), fx = (uint32_t)kvbm__get_le(p + 4, 4);
  if (n > KVBM_GROUPS_MAX || fx > 1 || (fx && !n))
    return kvbm_error_set(err, KVBM_EFORMAT, "router index: snapshot: a worker of %u groups "
                          "(at most %d), configured flag %u", n, KVBM_GROUPS_MAX, fx);
  for (uint32_t g = 0; g < KVBM_GROUPS_MAX; g++) {
    uint64_t kind = kvbm__get_le(p + 8 + 8 * g, 4), tok = kvbm__get_le(p + 12 + 8 * g, 4);
    gs[g] = (kvbm_group_spec){(kvbm_group_kind)kind, (uint32_t)tok};
    if (g >= n && (kind || tok))
      return kvbm_error_set(err, KVBM_EFORMAT, "router index: snapshot: unused group %u set", g);
  }
  if (n && groups_check(gs, n, err)) return KVBM_EFORMAT; /* err names the group */
  *ng = n;
  *fixed = fx;
  return KVBM_OK;
}

static int restore_worker(kvbm_index *idx, const uint8_t **pp, const uint8_t *end,
                          uint32_t version, kvbm_error *err) {
  const uint8_t *p = *pp;
  size_t wsize = SNAP_WORKER + (version >= 2 ? SNAP_GROUPS : 0);
  if ((size_t)(end - p) < wsize)
    return kvbm_error_set(err, KVBM_ETRUNCATED, "router index: snapshot ends inside a worker");
  kvbm_group_spec gs[KVBM_GROUPS_MAX];
  uint32_t ng = 0;
  bool gfixed = false;
  if (version >= 2) {
    int rc = restore_groups(p + SNAP_WORKER, gs, &ng, &gfixed, err);
    if (rc) return rc;
  }
  kvbm_worker_key key = {kvbm__get_le(p, 8), (uint32_t)kvbm__get_le(p + 8, 4)};
  uint32_t flags = (uint32_t)kvbm__get_le(p + 12, 4), held = (uint32_t)kvbm__get_le(p + 56, 4);
  uint64_t nb = kvbm__get_le(p + 64, 8), ne = kvbm__get_le(p + 72, 8);
  const uint8_t *tr = p;
  p += wsize;
  size_t left = (size_t)(end - p);
  if (flags > 3 || kvbm__get_le(tr + 60, 4) || nb > left / SNAP_BLOCK ||
      ne > (left - nb * SNAP_BLOCK) / SNAP_ENTRY)
    return kvbm_error_set(err, KVBM_EFORMAT,
                          "router index: snapshot: worker %llu/%u declares %llu blocks and "
                          "%llu entries in %zu bytes (flags %u)", (unsigned long long)key.worker_id,
                          key.dp_rank, (unsigned long long)nb, (unsigned long long)ne, left, flags);
  if (!kvbm_index_worker_slot(idx, key, NULL))
    return kvbm_error_set(err, KVBM_EFORMAT, "router index: snapshot: worker %llu/%u twice",
                          (unsigned long long)key.worker_id, key.dp_rank);
  uint32_t s;
  int rc = kvbm_index_add_worker(idx, key, &s, err);
  if (rc) return rc;
  worker *w = &idx->w[s];
  if (ng) { /* the snapshot's list; none: the configured one (add_worker) */
    for (size_t g = ng; g < KVBM_GROUPS_MAX; g++) ST(&w->gspec[g], 0);
    groups_publish(w, gs, ng);
    w->gfixed = gfixed;
  }
  /* the rules are this index's; the state the snapshot's */
  w->seq.started = flags & 1;
  w->seq.have_live = flags >> 1 & 1;
  w->seq.next = kvbm__get_le(tr + 16, 8);
  w->seq.floor = kvbm__get_le(tr + 24, 8);
  w->seq.live_last = kvbm__get_le(tr + 32, 8);
  w->seq.held_first = kvbm__get_le(tr + 40, 8);
  w->seq.held_next = kvbm__get_le(tr + 48, 8);
  w->seq.held = held;
  for (uint64_t i = 0; i < nb; i++, p += SNAP_BLOCK) {
    uint64_t k = kvbm__get_le(p, 8), parent = kvbm__get_le(p + 8, 8);
    unsigned tiers = p[16], hp = p[17], grp = p[18];
    if (!tiers || tiers > TIERS_MASK || hp > 1)
      return kvbm_error_set(err, KVBM_EFORMAT,
                            "router index: snapshot: block %llu has tiers %u, parent flag %u",
                            (unsigned long long)k, tiers, hp);
    if (grp >= (ng ? ng : 1) || (version < 2 && grp))
      return kvbm_error_set(err, KVBM_EFORMAT,
                            "router index: snapshot: block %llu of group %u; its worker has %u",
                            (unsigned long long)k, grp, ng ? ng : 1);
    if (grp + 1 > w->gused) w->gused = grp + 1;
    for (int t = 0; t < T; t++) {
      bool was;
      if ((tiers >> t & 1) && tab_hold(idx, s, k, t, parent, hp, grp, &was))
        return kvbm_error_set(err, KVBM_ENOMEM, "router index: snapshot: out of memory");
    }
  }
  for (uint64_t i = 0; i < ne; i++, p += SNAP_ENTRY) {
    uint32_t kind = (uint32_t)kvbm__get_le(p + 32, 4);
    if (kind != 1 && kind != MAPPED)
      return kvbm_error_set(err, KVBM_EFORMAT, "router index: snapshot: map entry of kind %u",
                            kind);
    bool added;
    wentry *we = kvbm__wmap_upsert(&w->map, kvbm__get_le(p, 8), kvbm__get_le(p + 8, 8), &added);
    if (!we) return kvbm_error_set(err, KVBM_ENOMEM, "router index: snapshot: out of memory");
    if (!added)
      return kvbm_error_set(err, KVBM_EFORMAT, "router index: snapshot: map entry twice");
    for (int t = 0; t < T; t++) we->cnt[t] = (uint32_t)kvbm__get_le(p + 16 + 4 * t, 4);
    we->used = kind;
    if (kind == MAPPED) w->nmapped++;
  }
  *pp = p;
  return KVBM_OK;
}

int kvbm_index_restore(kvbm_index *idx, const void *data, size_t len, kvbm_error *err) {
  if (!idx || (!data && len))
    return kvbm_error_set(err, KVBM_EINVAL, "router index: restore: NULL argument");
  if (kvbm_index_workers(idx))
    return kvbm_error_set(err, KVBM_ESTATE, "router index: restore into an index that has workers");
  const uint8_t *p = data, *end = p + len;
  if (len < SNAP_HEADER + 8)
    return kvbm_error_set(err, KVBM_ETRUNCATED, "router index: snapshot of %zu bytes", len);
  if (memcmp(p, SNAP_MAGIC, 8))
    return kvbm_error_set(err, KVBM_EMAGIC, "router index: not a snapshot (bad magic)");
  uint32_t version = (uint32_t)kvbm__get_le(p + 8, 4);
  if (version != 1 && version != SNAP_VERSION)
    return kvbm_error_set(err, KVBM_EVERSION, "router index: snapshot version %u (1 or %d)",
                          version, SNAP_VERSION);
  if (kvbm__get_le(end - 8, 8) != kvbm_hash_salt(p, len - 8))
    return kvbm_error_set(err, KVBM_ECHECKSUM, "router index: snapshot checksum mismatch");
  const kvbm_index_config *c = &idx->cfg;
  if (kvbm__get_le(p + 12, 4) != (c->recompute ? 1u : 0u) || kvbm__get_le(p + 16, 4) != c->block_size ||
      kvbm__get_le(p + 20, 4) != (uint64_t)c->scheme || kvbm__get_le(p + 24, 8) != c->salt_hash)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "router index: the snapshot was taken with recompute %u, block size "
                          "%u, scheme %u, salt %llx; this index has %u, %u, %u, %llx",
                          (unsigned)kvbm__get_le(p + 12, 4), (unsigned)kvbm__get_le(p + 16, 4),
                          (unsigned)kvbm__get_le(p + 20, 4), (unsigned long long)kvbm__get_le(p + 24, 8),
                          c->recompute ? 1u : 0u, c->block_size, (unsigned)c->scheme,
                          (unsigned long long)c->salt_hash);
  uint64_t nw = kvbm__get_le(p + 32, 4);
  if (nw > MAXW)
    return kvbm_error_set(err, KVBM_EFORMAT, "router index: snapshot of %llu workers (at most %d)",
                          (unsigned long long)nw, MAXW);
  p += SNAP_HEADER;
  end -= 8;
  int rc = KVBM_OK;
  for (uint64_t i = 0; i < nw && !rc; i++) rc = restore_worker(idx, &p, end, version, err);
  if (!rc && p != end)
    rc = kvbm_error_set(err, KVBM_ETOOLONG, "router index: %zu bytes after the snapshot's workers",
                        (size_t)(end - p));
  if (rc) { /* nothing half-restored stays */
    for (uint32_t s = 0; s < MAXW; s++) {
      kvbm_worker_key k;
      if (kvbm_index_slot_worker(idx, s, &k)) kvbm_index_remove_worker(idx, k);
    }
  }
  return rc;
}

int kvbm_index_save(const kvbm_index *idx, const char *path, kvbm_error *err) {
  if (!path) return kvbm_error_set(err, KVBM_EINVAL, "router index: save: NULL path");
  uint8_t *buf;
  size_t len;
  int rc = kvbm_index_snapshot(idx, &buf, &len, err);
  if (rc) return rc;
  /* a new file beside the old, synced, then renamed over it: a crash
   * leaves the old snapshot or the new one, never half of one */
  size_t pl = strlen(path);
  char *tmp = malloc(pl + 16);
  if (!tmp) {
    free(buf);
    return kvbm_error_set(err, KVBM_ENOMEM, "router index: save: out of memory");
  }
  snprintf(tmp, pl + 16, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp);
  rc = KVBM_OK;
  if (fd < 0) {
    rc = kvbm_error_set(err, KVBM_EIO, "router index: save %s: %s", tmp, strerror(errno));
  } else {
    size_t off = 0;
    while (off < len && !rc) {
      ssize_t wr = write(fd, buf + off, len - off);
      if (wr < 0 && errno == EINTR) continue;
      if (wr <= 0) rc = kvbm_error_set(err, KVBM_EIO, "router index: save %s: %s", tmp, strerror(errno));
      else off += (size_t)wr;
    }
    if (!rc && fsync(fd))
      rc = kvbm_error_set(err, KVBM_EIO, "router index: save %s: fsync: %s", tmp, strerror(errno));
    if (close(fd) && !rc)
      rc = kvbm_error_set(err, KVBM_EIO, "router index: save %s: close: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path))
      rc = kvbm_error_set(err, KVBM_EIO, "router index: save %s: %s", path, strerror(errno));
    if (rc) unlink(tmp);
  }
  free(tmp);
  free(buf);
  return rc;
}

int kvbm_index_load(kvbm_index *idx, const char *path, kvbm_error *err) {
  if (!path) return kvbm_error_set(err, KVBM_EINVAL, "router index: load: NULL path");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return kvbm_error_set(err, errno == ENOENT ? KVBM_ENOTFOUND : KVBM_EIO,
                          "router index: load %s: %s", path, strerror(errno));
  struct stat st;
  int rc = KVBM_OK;
  uint8_t *buf = NULL;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    rc = kvbm_error_set(err, KVBM_EIO, "router index: load %s: not a regular file", path);
  } else if ((uint64_t)st.st_size > ((uint64_t)1 << 40)) {
    rc = kvbm_error_set(err, KVBM_ETOOLONG, "router index: load %s: %lld bytes", path,
                        (long long)st.st_size);
  } else if (!(buf = malloc(st.st_size ? (size_t)st.st_size : 1))) {
    rc = kvbm_error_set(err, KVBM_ENOMEM, "router index: load %s: out of memory", path);
  }
  size_t len = 0;
  while (!rc && len < (size_t)st.st_size) {
    ssize_t r = read(fd, buf + len, (size_t)st.st_size - len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) rc = kvbm_error_set(err, KVBM_EIO, "router index: load %s: short read", path);
    else len += (size_t)r;
  }
  close(fd);
  if (!rc) rc = kvbm_index_restore(idx, buf, len, err);
  free(buf);
  return rc;
}

/* ------------------------------------------------------------- listing */

/* Every block a worker holds, for a router's GET /index (the cluster run
 * compares it with the worker's own /blocks). The table is walked in slot
 * order; ghosts (no tier) are not blocks. A block of group g is given back
 * under its engine hash (gkey_inv), so single-group workers list exactly the
 * hashes of their events; a namespaced block keeps its namespace key (the
 * namespace is a key mix the listing does not undo: see "Namespaces"). */
int kvbm_index_worker_each(const kvbm_index *idx, uint32_t s, kvbm_index_block_fn fn, void *user) {
  if (!idx || !fn || s >= MAXW || !(kvbm_index_workers(idx) >> s & 1)) return KVBM_ENOTFOUND;
  const worker *w = &idx->w[s];
  const wtab *t = LD(&((worker *)w)->tab);
  for (size_t i = 0; t && i < t->cap; i++) {
    const slot *sl = &t->s[i];
    unsigned tiers = slot_tiers(sl);
    if (!slot_used(sl) || !tiers) continue;
    uint32_t g = sl->w.group;
    int rc = fn(user, gkey_inv(LD(&((slot *)sl)->key), g), tiers, g);
    if (rc) return rc;
  }
  return KVBM_OK;
}
