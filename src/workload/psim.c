/* SPDX-License-Identifier: Apache-2.0 */
/*
 * psim.c: the policy simulator (see workload/psim.h).
 *
 * Design. A trace is turned once into a stream: per request the dense ids
 * of its full blocks (prompt and output, hashed exactly as the manager
 * hashes them, so equal ids are equal chained hashes), how many of them
 * the prefill may match, and how many blocks the request occupies in G1.
 * Interning hashes as ids lets every policy index arrays; the stream also
 * keeps each id's 64-bit hash for the frequency filter, which is the
 * manager's own code (tier/filter.c) fed the same hashes in the same order.
 *
 * A run then replays the manager's decisions request by request, in the
 * order kvbm_manager_prefill / commit / destroy make them (tier/manager.c):
 *
 *   walk   block k < K from the fastest tier holding it (G1, G2, G3), up
 *          to the first held nowhere; if G1 cannot take the onboards plus
 *          the rest of the prompt, only the G1 prefix counts.
 *   G1     the hits are taken out of the cache, then every onboard and
 *          every other block is allocated in order (free blocks first,
 *          then an eviction), each full block registered or, when its
 *          hash is cached, deduplicated onto the cached block.
 *   commit every full block is used once in G2 then in G3.
 *   free   the request's blocks join G1's cache tail first.
 *
 * G1 is modelled as W1's pool: a count of free blocks, a state per id
 * (absent, held by the running request, cached) and the cached ids in a
 * kvsim_psim_cache whose evict() chooses the victim. Nothing is pinned in G1's
 * cache: the running request's blocks are simply not in it.
 *
 * Clairvoyance. A block's next use is the next request that may match it
 * (a position below that request's K), with its position: key = request <<
 * 32 | position, so among blocks next used by one request the deeper one
 * is the later, and Belady evicts a prefix from its tail. Uses at
 * positions a prefill never matches (the last prompt block, outputs) do
 * not count: they cannot be hits. --eta-noise blurs these keys (analysis
 * of how exact the "when" must be).
 *
 * Online TTL (evict ttl). Without next uses, a ttl tier keys a request's
 * blocks by an expiry the simulator makes when the request runs (its
 * time + a TTL) with a rank in front (none, a random one per request, or
 * one minus the return rate of its turn class) and its depth behind:
 * kvsim_psim_cache takes overdue blocks first, then the highest key. "sticky"
 * admission is Belady's rule on those keys (write only into room or over
 * a victim that would go later), so a full cache with nothing overdue
 * holds what it has: a fill-and-hold TTL cache. Turns are learned online:
 * a request continues the one that last committed the deepest block it
 * shares (at least 1024 tokens), and per turn class the simulator counts
 * requests and those that were continued.
 */
#include "workload/psim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/tier.h"
#include "common/vec.h"
#include "kvbm/advisor.h"
#include "tier/filter.h"

/* ---- names and presets ---- */

static const char *const kAdmit[KVSIM_PSIM_ADMIT_COUNT] = {
    "all", "frequency", "never", "clairvoyant", "reused", "victim", "sticky", "turn"};

const char *kvsim_psim_admit_name(int a) {
  return a >= 0 && a < KVSIM_PSIM_ADMIT_COUNT ? kAdmit[a] : "?";
}

bool kvsim_psim_admit_parse(const char *s, kvsim_psim_admit *out) {
  for (int a = 0; s && a < KVSIM_PSIM_ADMIT_COUNT; a++)
    if (!strcmp(s, kAdmit[a])) {
      *out = (kvsim_psim_admit)a;
      return true;
    }
  return false;
}

static const char *const kRank[KVSIM_PSIM_RANK_COUNT] = {"none", "random", "turn"};

const char *kvsim_psim_rank_name(int k) {
  return k >= 0 && k < KVSIM_PSIM_RANK_COUNT ? kRank[k] : "?";
}

bool kvsim_psim_rank_parse(const char *s, kvsim_psim_rank *out) {
  for (int k = 0; s && k < KVSIM_PSIM_RANK_COUNT; k++)
    if (!strcmp(s, kRank[k])) {
      *out = (kvsim_psim_rank)k;
      return true;
    }
  return false;
}

kvsim_psim_config kvsim_psim_config_default(void) {
  kvsim_psim_config c;
  memset(&c, 0, sizeof c);
  c.tier[0] = (kvsim_psim_tier_config){16384, KVSIM_PSIM_EVICT_LRU, KVSIM_PSIM_ADMIT_ALL, false};
  c.tier[1] = (kvsim_psim_tier_config){65536, KVSIM_PSIM_EVICT_LRU, KVSIM_PSIM_ADMIT_ALL, false};
  c.tier[2] = (kvsim_psim_tier_config){262144, KVSIM_PSIM_EVICT_LRU, KVSIM_PSIM_ADMIT_FREQUENCY, false};
  c.freq_threshold = 2;
  c.freq_decay_uses = 65536;
  c.freq_max_entries = 1u << 20;
  c.g2_freq_threshold = 3;
  c.g2_freq_decay_uses = 1u << 26;
  c.g2_freq_max_entries = 1u << 22;
  c.victim_min_uses = 2;
  c.advisor_period_ms = 10000;
  c.advisor_promote_min_uses = 2;
  c.advisor_demote_min_uses = 2;
  c.advisor_demote_fraction = 0.7;
  c.ttl_s = 120;
  return c;
}

const char *const kvsim_psim_preset_names[] = {"today",  "lru-tail", "arc",     "s3fifo",
                                              "wtinylfu", "victim", "g2-freq", "advisor",
                                              "belady", NULL};

static void set_lower(kvsim_psim_config *c, kvsim_psim_evict e2, kvsim_psim_admit a2, kvsim_psim_evict e3,
                      kvsim_psim_admit a3, bool tail_first) {
  c->tier[1].evict = e2;
  c->tier[1].admit = a2;
  c->tier[2].evict = e3;
  c->tier[2].admit = a3;
  c->tier[1].tail_first = c->tier[2].tail_first = tail_first;
}

bool kvsim_psim_preset(const char *name, kvsim_psim_config *c) {
  if (!name || !c) return false;
  const kvsim_psim_admit ALL = KVSIM_PSIM_ADMIT_ALL, FREQ = KVSIM_PSIM_ADMIT_FREQUENCY;
  if (!strcmp(name, "today")) {
    set_lower(c, KVSIM_PSIM_EVICT_LRU, ALL, KVSIM_PSIM_EVICT_LRU, FREQ, false);
  } else if (!strcmp(name, "lru-tail")) {
    set_lower(c, KVSIM_PSIM_EVICT_LRU, ALL, KVSIM_PSIM_EVICT_LRU, FREQ, true);
  } else if (!strcmp(name, "arc")) {
    set_lower(c, KVSIM_PSIM_EVICT_ARC, ALL, KVSIM_PSIM_EVICT_ARC, FREQ, true);
  } else if (!strcmp(name, "s3fifo")) {
    set_lower(c, KVSIM_PSIM_EVICT_S3FIFO, ALL, KVSIM_PSIM_EVICT_S3FIFO, FREQ, true);
  } else if (!strcmp(name, "wtinylfu")) {
    set_lower(c, KVSIM_PSIM_EVICT_WTINYLFU, ALL, KVSIM_PSIM_EVICT_LRU, FREQ, true);
  } else if (!strcmp(name, "victim")) {
    set_lower(c, KVSIM_PSIM_EVICT_LRU, ALL, KVSIM_PSIM_EVICT_LRU, KVSIM_PSIM_ADMIT_VICTIM, true);
  } else if (!strcmp(name, "g2-freq")) {
    set_lower(c, KVSIM_PSIM_EVICT_LRU, FREQ, KVSIM_PSIM_EVICT_LRU, FREQ, true);
  } else if (!strcmp(name, "advisor")) {
    set_lower(c, KVSIM_PSIM_EVICT_LRU, ALL, KVSIM_PSIM_EVICT_LRU, FREQ, true);
  } else if (!strcmp(name, "belady")) {
    set_lower(c, KVSIM_PSIM_EVICT_BELADY, KVSIM_PSIM_ADMIT_CLAIRVOYANT, KVSIM_PSIM_EVICT_BELADY,
              KVSIM_PSIM_ADMIT_CLAIRVOYANT, true);
  } else {
    return false;
  }
  c->tier[0].evict = strcmp(name, "belady") ? KVSIM_PSIM_EVICT_LRU : KVSIM_PSIM_EVICT_BELADY;
  c->advisor = !strcmp(name, "advisor");
  return true;
}

/* ---- the stream ---- */

typedef struct sreq {
  uint64_t off;        /* first id in ids[] */
  uint32_t nfull;      /* full blocks (prompt and output) */
  uint32_t nblocks;    /* blocks held in G1 (the partial tail included) */
  uint32_t matchable;  /* K: blocks the prefill may match */
  uint32_t prefill;    /* blocks the prefill allocates at most (ceil(n / B)) */
  uint32_t prompt;     /* input_length */
  double ts_ms;
} sreq;

struct kvsim_psim_stream {
  uint32_t block_size;
  size_t nreq;
  sreq *req;
  uint32_t *ids;   /* per block position */
  uint64_t *next;  /* per block position: next use key, or NULL */
  uint64_t *hash;  /* per id */
  uint32_t universe;
  uint64_t max_blocks;
};

typedef struct intern {
  uint32_t *slot; /* id + 1, 0 = empty */
  uint64_t mask;
  uint64_t *hash;
  uint32_t n, cap;
} intern;

static uint64_t imix(uint64_t h) { return (h ^ (h >> 29)) * 0xBF58476D1CE4E5B9ull; }

static int intern_grow(intern *t) {
  uint64_t size = (t->mask + 1) * 2;
  uint32_t *ns = calloc(size, sizeof *ns);
  if (!ns) return KVBM_ENOMEM;
  for (uint32_t id = 0; id < t->n; id++) {
    uint64_t j = imix(t->hash[id]) & (size - 1);
    while (ns[j]) j = (j + 1) & (size - 1);
    ns[j] = id + 1;
  }
  free(t->slot);
  t->slot = ns;
  t->mask = size - 1;
  return KVBM_OK;
}

/* The id of hash h, a new one if unseen; UINT32_MAX on ENOMEM. */
static uint32_t intern_id(intern *t, uint64_t h) {
  uint64_t j = imix(h) & t->mask;
  for (; t->slot[j]; j = (j + 1) & t->mask)
    if (t->hash[t->slot[j] - 1] == h) return t->slot[j] - 1;
  if (t->n == UINT32_MAX - 1) return UINT32_MAX;
  if (t->n == t->cap) {
    /* Doubling from the 2^16 it starts with; ids stay below UINT32_MAX. */
    size_t cap = t->cap;
    if (kvbm__vec_reserve_of(&t->hash, &cap, (size_t)t->n + 1, 1u << 16, UINT32_MAX - 1)) return UINT32_MAX;
    t->cap = (uint32_t)cap;
  }
  t->hash[t->n] = h;
  t->slot[j] = t->n + 1;
  uint32_t id = t->n++;
  if ((uint64_t)t->n * 2 > t->mask && intern_grow(t)) return UINT32_MAX;
  return id;
}

/* Per request: its shape, then its blocks' ids. tok has room for the
 * request's tokens. */
static int stream_request(kvsim_psim_stream *s, intern *t, const kvsim_trace_request *q, size_t i,
                          kvbm_hash_scheme scheme, uint32_t *tok, uint64_t *pos, size_t *pos_cap,
                          kvbm_error *err) {
  const uint32_t B = s->block_size;
  uint64_t L = q->input_length, M = q->output_length, T = L + M;
  sreq *r = &s->req[i];
  memset(r, 0, sizeof *r);
  r->off = *pos;
  r->prompt = q->input_length;
  r->ts_ms = q->timestamp_ms;
  if (T == 0) return KVBM_OK;
  uint64_t n = L ? L : 1; /* an empty prompt: the first output token opens it (W2) */
  uint64_t nblocks = T / B + (T % B != 0);
  if (nblocks > (1u << 24))
    return kvbm_error_set(err, KVBM_ENOSPC, "policy-sim: request %zu has %llu blocks (at most 2^24)",
                          i, (unsigned long long)nblocks);
  r->nfull = (uint32_t)(T / B);
  r->nblocks = (uint32_t)nblocks;
  r->matchable = (uint32_t)((n - 1) / B);
  r->prefill = (uint32_t)(n / B + (n % B != 0));
  if (kvbm__vec_reserve_of(&s->ids, pos_cap, *pos + r->nfull, 1u << 20, KVBM__VEC_NO_LIMIT))
    return kvbm_error_set(err, KVBM_ENOMEM, "policy-sim: out of memory");
  kvsim_trace_prompt_tokens(q, tok);
  kvsim_trace_output_tokens(q, i, tok + L);
  uint64_t parent = 0;
  for (uint32_t k = 0; k < r->nfull; k++) {
    parent = kvbm_hash_next(scheme, 0, parent, k > 0, tok + (size_t)k * B, B);
    uint32_t id = intern_id(t, parent);
    if (id == UINT32_MAX) return kvbm_error_set(err, KVBM_ENOMEM, "policy-sim: out of memory");
    s->ids[*pos + k] = id;
  }
  *pos += r->nfull;
  if (r->nblocks > s->max_blocks) s->max_blocks = r->nblocks;
  return KVBM_OK;
}

/* Each position's next use: scanned backwards, remembering per id the
 * nearest later request that may match it. */
static int stream_next_uses(kvsim_psim_stream *s, uint64_t npos) {
  s->next = malloc((npos ? npos : 1) * sizeof *s->next);
  uint64_t *last = malloc((size_t)(s->universe ? s->universe : 1) * sizeof *last);
  if (!s->next || !last) {
    free(last);
    return KVBM_ENOMEM;
  }
  memset(last, 0xff, (size_t)s->universe * sizeof *last);
  for (size_t i = s->nreq; i-- > 0;) {
    const sreq *r = &s->req[i];
    for (uint32_t k = 0; k < r->nfull; k++) s->next[r->off + k] = last[s->ids[r->off + k]];
    for (uint32_t k = 0; k < r->matchable; k++)
      last[s->ids[r->off + k]] = (uint64_t)i << 32 | k;
  }
  free(last);
  return KVBM_OK;
}

int kvsim_psim_stream_build(const kvsim_trace *trace, size_t limit, uint32_t block_size,
                           kvbm_hash_scheme scheme, bool next_use, kvsim_psim_stream **out,
                           kvbm_error *err) {
  if (!trace || !out) return kvbm_error_set(err, KVBM_EINVAL, "policy-sim: NULL argument");
  if (block_size == 0 || block_size > (1u << 16))
    return kvbm_error_set(err, KVBM_EINVAL, "policy-sim: block size %u is not in 1..65536",
                          block_size);
  size_t n = kvsim_trace_count(trace);
  if (limit && limit < n) n = limit;
  size_t max_in, max_out;
  kvsim_trace_max_lengths(trace, n, &max_in, &max_out);
  kvsim_psim_stream *s = calloc(1, sizeof *s);
  intern t = {0};
  uint32_t *tok = malloc((max_in + max_out) * sizeof *tok);
  if (s) {
    s->block_size = block_size;
    s->nreq = n;
    s->req = malloc((n ? n : 1) * sizeof *s->req);
  }
  t.cap = 1u << 16;
  t.hash = malloc(t.cap * sizeof *t.hash);
  t.mask = (1u << 17) - 1;
  t.slot = calloc(t.mask + 1, sizeof *t.slot);
  int rc = s && s->req && tok && t.hash && t.slot
               ? KVBM_OK
               : kvbm_error_set(err, KVBM_ENOMEM, "policy-sim: out of memory");
  uint64_t pos = 0;
  size_t pos_cap = 0;
  for (size_t i = 0; i < n && !rc; i++)
    rc = stream_request(s, &t, kvsim_trace_get(trace, i), i, scheme, tok, &pos, &pos_cap, err);
  free(tok);
  free(t.slot);
  if (!rc) {
    s->hash = t.hash;
    s->universe = t.n;
    t.hash = NULL;
    if (next_use && stream_next_uses(s, pos))
      rc = kvbm_error_set(err, KVBM_ENOMEM, "policy-sim: out of memory (next uses)");
  }
  free(t.hash);
  if (rc) {
    kvsim_psim_stream_destroy(s);
    return rc;
  }
  *out = s;
  return KVBM_OK;
}

void kvsim_psim_stream_destroy(kvsim_psim_stream *s) {
  if (!s) return;
  free(s->req);
  free(s->ids);
  free(s->next);
  free(s->hash);
  free(s);
}

size_t kvsim_psim_stream_requests(const kvsim_psim_stream *s) { return s ? s->nreq : 0; }
uint32_t kvsim_psim_stream_universe(const kvsim_psim_stream *s) { return s ? s->universe : 0; }
uint64_t kvsim_psim_stream_max_blocks(const kvsim_psim_stream *s) { return s ? s->max_blocks : 0; }
bool kvsim_psim_stream_has_next_use(const kvsim_psim_stream *s) { return s && s->next; }

/* ---- a run ---- */

enum { G1_ABSENT = 0, G1_HELD, G1_CACHED };

/* The advisor-guided policy: what the manager would publish, batched as
 * its publishers batch it, and the hints applied as it would apply them. */
typedef struct adv {
  kvbm_advisor *a;
  uint32_t *by_hash; /* hash -> id + 1 (open addressing over the stream's hashes) */
  uint64_t mask;
  kvbm_storage_event *st; /* storage events of the current period */
  size_t nst, stcap;
  kvbm_event *kv;         /* KV events of the current request */
  uint64_t *kvh;
  size_t nkv, kvcap;
  double next_ms;         /* end of the current period (trace time) */
  uint64_t prefix;        /* the running request's prefix hash */
  kvbm_hint *hints;
  size_t hcap;
  bool oom;
} adv;

#define TURN_CLASSES 8      /* turns 0..6, and 7 and later */
#define TURN_MIN_TOKENS 1024 /* a continuation shares at least this prefix */

typedef struct run {
  const kvsim_psim_stream *s;
  const kvsim_psim_config *cfg;
  kvsim_psim_result *res;
  kvsim_psim_cache *c[KVSIM_PSIM_TIERS]; /* G1: its cached blocks; G2, G3: residents */
  kvbm_freq_filter filter[KVSIM_PSIM_TIERS];
  bool filter_on[KVSIM_PSIM_TIERS];
  uint8_t *g1;       /* per id: G1_* */
  uint8_t *uses;     /* per id: commits that used it (saturating) */
  uint64_t g1_free;  /* G1 blocks holding nothing */
  uint8_t *src;      /* walk: tier of each matched block */
  size_t cur;        /* the request being replayed */
  uint64_t okey;     /* its blocks' key in the ttl tiers, depth 0 (psim_cache.h) */
  bool admit_req;    /* turn admission: the request's class returns often enough */
  /* Turns, learned online (turn admission): a request continues the last
   * request that committed the deepest block of its prompt, if that
   * shares at least TURN_MIN_TOKENS with it. */
  uint32_t *owner;   /* per id: the last request that committed it (UINT32_MAX: none) */
  uint8_t *turn;     /* per request: 0 opens a session, then +1 per continuation */
  uint8_t *returned; /* per request: a later request continued it */
  uint64_t cls_n[TURN_CLASSES], cls_ret[TURN_CLASSES];
  adv ad;
} run;

static uint64_t mix64(uint64_t x) {
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 32);
}

/* A standard normal drawn from a seed (Box-Muller on two hashes of it):
 * the same seed gives the same draw in every run. */
static double normal_of(uint64_t seed) {
  uint64_t x = mix64(seed * 0x9E3779B97F4A7C15ull + 1), y = mix64(x ^ 0xD6E8FEB86659FD93ull);
  double u1 = (double)((x >> 11) + 1) * (1.0 / 9007199254740993.0);
  double u2 = (double)(y >> 11) * (1.0 / 9007199254740992.0);
  return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* --eta-noise: the next use n of a key seen at request c becomes
 * c + (n - c) * exp(sigma * z), one z per (n, c), so every block of the
 * chain that request n will match moves together (noise per block would
 * break chains, which measures something else: a chain cut in the middle
 * loses its tail). The position stays in the low bits. */
static uint64_t noisy_key(const run *r, uint64_t k) {
  uint64_t n = k >> 32, c = r->cur;
  double gap = (double)(n > c ? n - c : 1);
  double g = gap * exp(r->cfg->eta_noise * normal_of(n * 1000003u + c));
  if (!(g < 4e9)) g = 4e9; /* also catches an overflow to infinity */
  uint64_t q = c + (uint64_t)g;
  if (q >= 0xffffffffull) q = 0xfffffffeull;
  return q << 32 | (k & 0xffffffffu);
}

static uint64_t key_at(const run *r, uint64_t pos) {
  uint64_t k = r->s->next ? r->s->next[pos] : KVSIM_PSIM_KEY_NEVER;
  return k == KVSIM_PSIM_KEY_NEVER || r->cfg->eta_noise == 0 ? k : noisy_key(r, k);
}

/* The key a tier gets for the block at pos of the current request: its
 * own online expiry for a ttl tier, the next use otherwise. */
static uint64_t tier_key(const run *r, int t, uint64_t pos, uint32_t depth) {
  if (r->cfg->tier[t].evict != KVSIM_PSIM_EVICT_TTL) return key_at(r, pos);
  return r->okey | (depth < KVSIM_PSIM_TTL_DEPTH_MAX ? depth : KVSIM_PSIM_TTL_DEPTH_MAX);
}

/* Turn admission's bookkeeping for request i, before its commit: its
 * parent (the request that last committed the deepest of its blocks,
 * when that prefix is long enough) has returned; i's turn is the
 * parent's + 1. Then whether i's class returns at least as often as all
 * requests do (both with one return in two requests as a prior). */
static void turn_learn(run *r, size_t i, const sreq *q, const uint32_t *ids) {
  uint32_t min_blocks = TURN_MIN_TOKENS / r->s->block_size;
  uint32_t p = UINT32_MAX;
  for (uint32_t k = q->nfull; k-- > 0 && k + 1 >= min_blocks;)
    if ((p = r->owner[ids[k]]) != UINT32_MAX) break;
  uint32_t turn = 0;
  if (p != UINT32_MAX) {
    turn = r->turn[p] < UINT8_MAX ? r->turn[p] + 1u : UINT8_MAX;
    if (!r->returned[p]) {
      r->returned[p] = 1;
      r->cls_ret[r->turn[p] < TURN_CLASSES ? r->turn[p] : TURN_CLASSES - 1]++;
    }
  }
  r->turn[i] = (uint8_t)turn;
  uint32_t c = turn < TURN_CLASSES ? turn : TURN_CLASSES - 1;
  uint64_t n = 0, ret = 0;
  for (int k = 0; k < TURN_CLASSES; k++) n += r->cls_n[k], ret += r->cls_ret[k];
  /* (ret_c + 1) / (n_c + 2) >= (ret + 1) / (n + 2), in integers */
  r->admit_req = (r->cls_ret[c] + 1) * (n + 2) >= (ret + 1) * (r->cls_n[c] + 2);
  r->cls_n[c]++;
  for (uint32_t k = 0; k < q->nfull; k++) r->owner[ids[k]] = (uint32_t)i;
}

/* The ttl tiers' key for request i's blocks (depth 0): its rank and
 * expiry in ms (49 days fit), packed as KVSIM_PSIM_TTL_KEY. */
static void ttl_key(run *r, size_t i, const sreq *q) {
  const kvsim_psim_config *c = r->cfg;
  double now = q->ts_ms > 0 ? floor(q->ts_ms) : 0;
  double ttl = c->ttl_s * 1000 * (c->ttl_sigma ? exp(c->ttl_sigma * normal_of(i)) : 1);
  double at = ceil(now + ttl);
  uint64_t expiry = at < KVSIM_PSIM_TTL_EXPIRY_MAX ? (uint64_t)at : KVSIM_PSIM_TTL_EXPIRY_MAX, rank = 0;
  if (c->ttl_rank == KVSIM_PSIM_RANK_RANDOM) {
    rank = mix64(i + 1) % (KVSIM_PSIM_TTL_RANK_MAX + 1);
  } else if (c->ttl_rank == KVSIM_PSIM_RANK_TURN && r->turn) {
    uint32_t k = r->turn[i] < TURN_CLASSES ? r->turn[i] : TURN_CLASSES - 1;
    double rate = (double)(r->cls_ret[k] + 1) / (double)(r->cls_n[k] + 2);
    rank = (uint64_t)((1 - rate) * KVSIM_PSIM_TTL_RANK_MAX);
  }
  r->okey = KVSIM_PSIM_TTL_KEY(rank, expiry, 0);
  for (int t = 1; t < KVSIM_PSIM_TIERS; t++)
    if (r->c[t]) kvsim_psim_cache_set_now(r->c[t], (uint64_t)now);
}

/* ---- advisor glue ---- */

static void adv_storage(run *r, int t, kvbm_storage_event_type type, uint32_t id, uint64_t prefix) {
  adv *d = &r->ad;
  if (!d->a || d->oom) return;
  if (kvbm__vec_reserve_of(&d->st, &d->stcap, d->nst + 1, 4096, KVBM__VEC_NO_LIMIT)) {
    d->oom = true;
    return;
  }
  d->st[d->nst++] = (kvbm_storage_event){.type = type, .event_id = 0,
                                         .sequence_hash = r->s->hash[id], .prefix_hash = prefix,
                                         .block_size = 256, .location = kvbm__tier_key(t),
                                         .location_len = 2, .tier = t};
}

static void adv_kv(run *r, kvbm_event_type type, uint32_t id) {
  adv *d = &r->ad;
  if (!d->a || d->oom) return;
  /* The hashes and the events share one capacity: each grows from a copy
   * of it (to the same new one); kvcap moves when both hold it. */
  size_t ch = d->kvcap, ce = d->kvcap;
  if (kvbm__vec_reserve_of(&d->kvh, &ch, d->nkv + 1, 4096, KVBM__VEC_NO_LIMIT) ||
      kvbm__vec_reserve_of(&d->kv, &ce, d->nkv + 1, 4096, KVBM__VEC_NO_LIMIT)) {
    d->oom = true;
    return;
  }
  d->kvcap = ch;
  d->kvh[d->nkv] = r->s->hash[id];
  d->kv[d->nkv] = (kvbm_event){.type = type, .num_block_hashes = 1, .medium = KVBM_MEDIUM_GPU};
  d->nkv++;
}

/* One G1 block for the request: a free one, else an eviction. */
static void g1_take(run *r) {
  r->res->g1_allocated++;
  if (r->g1_free) {
    r->g1_free--;
    return;
  }
  uint32_t v = kvsim_psim_cache_evict(r->c[0]);
  if (v != KVSIM_PSIM_NONE) {
    r->g1[v] = G1_ABSENT;
    r->res->tier[0].evictions++;
    adv_kv(r, KVBM_EVENT_REMOVED, v);
  }
}

/* Registers a freshly taken block as id, or deduplicates onto the cached
 * block of the same hash (the taken block goes back to the free list). */
static void g1_register(run *r, uint32_t id) {
  if (r->g1[id] == G1_CACHED) {
    r->g1_free++;
    kvsim_psim_cache_remove(r->c[0], id);
  } else {
    adv_kv(r, KVBM_EVENT_STORED, id);
  }
  r->g1[id] = G1_HELD;
}

/* A G1 hit: the running request holds the block now. */
static void g1_acquire(run *r, uint32_t id) {
  if (r->g1[id] == G1_CACHED) kvsim_psim_cache_remove(r->c[0], id);
  r->g1[id] = G1_HELD;
}

/* The prefill's walk; returns the blocks matched and fills r->src. */
static uint32_t walk(run *r, const sreq *q, const uint32_t *ids) {
  uint32_t w = 0, onboards = 0, g1_cached = 0;
  for (; w < q->matchable; w++) {
    uint32_t id = ids[w];
    if (r->g1[id] != G1_ABSENT) {
      r->src[w] = 0;
      g1_cached += r->g1[id] == G1_CACHED;
    } else if (r->c[1] && kvsim_psim_cache_has(r->c[1], id)) {
      r->src[w] = 1;
      onboards++;
    } else if (r->c[2] && kvsim_psim_cache_has(r->c[2], id)) {
      r->src[w] = 2;
      onboards++;
    } else {
      break;
    }
  }
  uint64_t avail = r->g1_free + kvsim_psim_cache_size(r->c[0]);
  if (onboards && (uint64_t)q->prefill - w + onboards > avail - g1_cached) {
    uint32_t g1_prefix = 0;
    while (g1_prefix < w && r->src[g1_prefix] == 0) g1_prefix++;
    w = g1_prefix;
  }
  return w;
}

/* Writes a block leaving G2 into G3 (victim admission). */
static void demote(run *r, uint32_t id) {
  kvsim_psim_tier_result *tr = &r->res->tier[2];
  if (kvsim_psim_cache_has(r->c[2], id)) return;
  uint32_t ev;
  if (!kvsim_psim_cache_insert(r->c[2], id, KVSIM_PSIM_KEY_NEVER, &ev)) {
    tr->skipped_space++;
    return;
  }
  tr->written_blocks++;
  r->res->tier[1].demoted++;
  adv_storage(r, 2, KVBM_STORAGE_STORE, id, r->ad.prefix);
  if (ev != KVSIM_PSIM_NONE) {
    tr->evictions++;
    adv_storage(r, 2, KVBM_STORAGE_REMOVE, ev, 0);
  }
}

/* A commit's use of the block at depth k of the request (position pos of
 * the stream) in tier t (G2 or G3). */
static void use(run *r, int t, uint32_t id, uint64_t pos, uint32_t k) {
  kvsim_psim_tier_result *tr = &r->res->tier[t];
  uint64_t key = tier_key(r, t, pos, k);
  kvsim_psim_cache *c = r->c[t];
  bool want = r->cfg->tier[t].admit == KVSIM_PSIM_ADMIT_ALL;
  if (r->filter_on[t]) want = kvbm__freq_filter_use(&r->filter[t], r->s->hash[id]);
  if (kvsim_psim_cache_has(c, id)) {
    kvsim_psim_cache_access(c, id, key);
    return;
  }
  kvsim_psim_admit a = r->cfg->tier[t].admit;
  if (a == KVSIM_PSIM_ADMIT_CLAIRVOYANT || a == KVSIM_PSIM_ADMIT_STICKY || a == KVSIM_PSIM_ADMIT_TURN)
    want = key != KVSIM_PSIM_KEY_NEVER && (a != KVSIM_PSIM_ADMIT_TURN || r->admit_req) &&
           (kvsim_psim_cache_size(c) < kvsim_psim_cache_capacity(c) || key < kvsim_psim_cache_victim_key(c));
  if (a == KVSIM_PSIM_ADMIT_REUSED) /* noise never turns a next use into none: the raw key */
    want = r->s->next && r->s->next[pos] != KVSIM_PSIM_KEY_NEVER;
  if (!want) {
    tr->filtered++;
    return;
  }
  uint32_t ev;
  if (!kvsim_psim_cache_insert(c, id, key, &ev)) {
    tr->skipped_space++;
    return;
  }
  tr->written_blocks++;
  adv_storage(r, t, KVBM_STORAGE_STORE, id, r->ad.prefix);
  if (ev == KVSIM_PSIM_NONE) return;
  tr->evictions++;
  adv_storage(r, t, KVBM_STORAGE_REMOVE, ev, 0);
  if (t == 1 && r->c[2] && r->cfg->tier[2].admit == KVSIM_PSIM_ADMIT_VICTIM &&
      r->uses[ev] >= r->cfg->victim_min_uses)
    demote(r, ev);
}

/* ---- advisor periods ---- */

static uint32_t id_of(const run *r, uint64_t h) {
  const adv *d = &r->ad;
  for (uint64_t j = (h * 0x9E3779B97F4A7C15ull >> 17) & d->mask; d->by_hash[j]; j = (j + 1) & d->mask)
    if (r->s->hash[d->by_hash[j] - 1] == h) return d->by_hash[j] - 1;
  return KVSIM_PSIM_NONE;
}

/* Writes id into tier t outside a commit (a hint), with its events. */
static bool hint_write(run *r, int t, uint32_t id, uint64_t prefix) {
  uint32_t ev;
  if (!kvsim_psim_cache_insert(r->c[t], id, KVSIM_PSIM_KEY_NEVER, &ev)) {
    r->res->tier[t].skipped_space++;
    return false;
  }
  r->res->tier[t].written_blocks++;
  adv_storage(r, t, KVBM_STORAGE_STORE, id, prefix);
  if (ev != KVSIM_PSIM_NONE) {
    r->res->tier[t].evictions++;
    adv_storage(r, t, KVBM_STORAGE_REMOVE, ev, 0);
  }
  return true;
}

/* Applies one hint as the manager would: promote copies G3 -> G2, demote
 * moves G2 -> G3, drop removes from G2. */
static void apply_hint(run *r, const kvbm_hint *h) {
  if (h->kind == KVBM_HINT_COMPACT) return; /* no bytes here: nothing moves */
  uint32_t id = id_of(r, h->sequence_hash);
  kvsim_psim_cache *g2 = r->c[1], *g3 = r->c[2];
  if (id == KVSIM_PSIM_NONE || !g2) return;
  if (h->kind == KVBM_HINT_PROMOTE) {
    if (g3 && kvsim_psim_cache_has(g3, id) && !kvsim_psim_cache_has(g2, id) && hint_write(r, 1, id, h->prefix_hash))
      r->res->tier[1].promoted++;
    return;
  }
  if (!kvsim_psim_cache_has(g2, id)) return;
  if (h->kind == KVBM_HINT_DEMOTE && g3 && !kvsim_psim_cache_has(g3, id) && !hint_write(r, 2, id, h->prefix_hash))
    return; /* no room below: keep it */
  kvsim_psim_cache_remove(g2, id);
  adv_storage(r, 1, KVBM_STORAGE_REMOVE, id, 0);
  if (h->kind == KVBM_HINT_DEMOTE) r->res->tier[1].demoted++;
  else r->res->tier[1].dropped++;
}

/* The KV events of one request reach the advisor at once (the KV
 * publisher's batches leave within a millisecond). */
static void adv_flush_kv(run *r, uint64_t now) {
  adv *d = &r->ad;
  for (size_t k = 0; k < d->nkv; k++) d->kv[k].block_hashes = &d->kvh[k];
  kvbm_event_batch b = {.events = d->kv, .num_events = d->nkv};
  kvbm_advisor_kv(d->a, &b, now);
  r->res->advisor_events += d->nkv;
  d->nkv = 0;
}

/* A period ends: its storage batch reaches the advisor, whose hints the
 * manager applies before the next request. */
static void adv_period(run *r, uint64_t now) {
  adv *d = &r->ad;
  kvbm_storage_batch b = {.events = d->st, .num_events = d->nst};
  kvbm_advisor_storage(d->a, &b, now);
  r->res->advisor_events += d->nst;
  d->nst = 0;
  size_t n = 0;
  kvbm_advisor_hints(d->a, now, d->hints, d->hcap, &n);
  r->res->advisor_hints += n;
  for (int t = 1; t < KVSIM_PSIM_TIERS; t++)
    if (r->c[t]) kvsim_psim_cache_begin(r->c[t], false);
  for (size_t k = 0; k < n; k++) apply_hint(r, &d->hints[k]);
}

static int adv_init(run *r, kvbm_error *err) {
  adv *d = &r->ad;
  const kvsim_psim_config *c = r->cfg;
  kvbm_advisor_config ac = kvbm_advisor_config_default();
  ac.max_blocks = 4u << 20;
  ac.demote_min_uses = c->advisor_demote_min_uses;
  ac.demote_fraction = c->advisor_demote_fraction;
  ac.promote_min_score = c->advisor_promote_min_uses;
  int rc = kvbm_advisor_create(&ac, &d->a, err);
  if (rc) return rc;
  kvbm_advisor_volume_tier(d->a, "g2", KVBM_TIER_G2, NULL);
  kvbm_advisor_volume_tier(d->a, "g3", KVBM_TIER_G3, NULL);
  uint64_t size = 16;
  while (size < 2ull * r->s->universe) size *= 2;
  d->mask = size - 1;
  d->by_hash = calloc(size, sizeof *d->by_hash);
  d->hcap = 1u << 16;
  d->hints = malloc(d->hcap * sizeof *d->hints);
  if (!d->by_hash || !d->hints) return kvbm_error_set(err, KVBM_ENOMEM, "policy-sim: out of memory");
  for (uint32_t id = 0; id < r->s->universe; id++) {
    uint64_t j = (r->s->hash[id] * 0x9E3779B97F4A7C15ull >> 17) & d->mask;
    while (d->by_hash[j]) j = (j + 1) & d->mask;
    d->by_hash[j] = id + 1;
  }
  d->next_ms = (r->s->nreq ? r->s->req[0].ts_ms : 0) + c->advisor_period_ms;
  return KVBM_OK;
}

static void adv_free(adv *d) {
  kvbm_advisor_destroy(d->a);
  free(d->by_hash);
  free(d->st);
  free(d->kv);
  free(d->kvh);
  free(d->hints);
}

static int one_request(run *r, size_t i) {
  const kvsim_psim_stream *s = r->s;
  const sreq *q = &s->req[i];
  const uint32_t *ids = s->ids + q->off;
  const uint32_t B = s->block_size;
  r->cur = i;
  if (!q->nblocks) return KVBM_OK;
  if (r->owner) turn_learn(r, i, q, ids);
  ttl_key(r, i, q);
  uint32_t w = walk(r, q, ids);
  for (uint32_t k = 0; k < w; k++) {
    r->res->tier[r->src[k]].hit_tokens += B;
    if (r->src[k] == 0) g1_acquire(r, ids[k]); /* taken out of the cache first */
  }
  /* An onboard reads its source: the manager releases the source block
   * when the copy lands, in queue order, which makes it the newest there
   * before the commit writes anything (what the commit evicts depends on
   * it). */
  for (int t = 1; t < KVSIM_PSIM_TIERS; t++)
    if (r->c[t]) kvsim_psim_cache_begin(r->c[t], false);
  for (uint32_t k = 0; k < w; k++)
    if (r->src[k] != 0) {
      kvsim_psim_cache_access(r->c[r->src[k]], ids[k], tier_key(r, r->src[k], q->off + k, k));
      g1_take(r);
      g1_register(r, ids[k]);
    }
  for (uint32_t k = w; k < q->nblocks; k++) {
    g1_take(r);
    if (k < q->nfull) g1_register(r, ids[k]);
  }
  /* Commit: every full block used once, G2 then G3. */
  /* prefix_hash: the first block the request added (past its match). */
  r->ad.prefix = q->nfull ? s->hash[ids[w < q->nfull ? w : q->nfull - 1]] : 0;
  for (int t = 1; t < KVSIM_PSIM_TIERS; t++)
    if (r->c[t]) kvsim_psim_cache_begin(r->c[t], r->cfg->tier[t].tail_first);
  for (uint32_t k = 0; k < q->nfull; k++) {
    if (r->uses[ids[k]] < UINT8_MAX) r->uses[ids[k]]++;
    for (int t = 1; t < KVSIM_PSIM_TIERS; t++)
      if (r->c[t]) use(r, t, ids[k], q->off + k, k);
  }
  /* Free, tail first. */
  for (uint32_t k = q->nblocks; k-- > 0;) {
    if (k >= q->nfull) {
      r->g1_free++;
      continue;
    }
    r->g1[ids[k]] = G1_CACHED;
    kvsim_psim_cache_insert(r->c[0], ids[k], key_at(r, q->off + k), NULL);
  }
  r->res->prompt_tokens += q->prompt;
  r->res->hit_tokens += (uint64_t)w * B;
  return KVBM_OK;
}

static int check_config(const kvsim_psim_stream *s, const kvsim_psim_config *c, kvbm_error *err) {
  const kvsim_psim_tier_config *g1 = &c->tier[0];
  if (!(c->eta_noise >= 0 && c->eta_noise <= 64)) /* NaN fails both */
    return kvbm_error_set(err, KVBM_EINVAL, "policy-sim: eta noise %g is not in 0..64",
                          c->eta_noise);
  if ((unsigned)c->ttl_rank >= KVSIM_PSIM_RANK_COUNT)
    return kvbm_error_set(err, KVBM_EINVAL, "policy-sim: unknown ttl rank");
  if (!(c->ttl_s > 0 && c->ttl_s <= 1e6) || !(c->ttl_sigma >= 0 && c->ttl_sigma <= 16))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "policy-sim: ttl %g s / sigma %g not in (0, 1e6] / [0, 16]", c->ttl_s,
                          c->ttl_sigma);
  if (g1->capacity == 0 || g1->capacity > (1u << 30))
    return kvbm_error_set(err, KVBM_EINVAL, "policy-sim: G1 needs 1..2^30 blocks");
  if (g1->evict != KVSIM_PSIM_EVICT_LRU && g1->evict != KVSIM_PSIM_EVICT_BELADY)
    return kvbm_error_set(err, KVBM_EINVAL, "policy-sim: G1 evicts by lru or belady, not %s",
                          kvsim_psim_evict_name(g1->evict));
  for (int t = 0; t < KVSIM_PSIM_TIERS; t++) {
    const kvsim_psim_tier_config *x = &c->tier[t];
    if (x->capacity > (1u << 30))
      return kvbm_error_set(err, KVBM_EINVAL, "policy-sim: G%d capacity above 2^30 blocks", t + 1);
    if ((unsigned)x->evict >= KVSIM_PSIM_EVICT_COUNT || (unsigned)x->admit >= KVSIM_PSIM_ADMIT_COUNT)
      return kvbm_error_set(err, KVBM_EINVAL, "policy-sim: G%d: unknown policy", t + 1);
    bool clair = x->evict == KVSIM_PSIM_EVICT_BELADY ||
                 (t && (x->admit == KVSIM_PSIM_ADMIT_CLAIRVOYANT || x->admit == KVSIM_PSIM_ADMIT_REUSED));
    if (clair && !s->next)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "policy-sim: G%d's %s policy needs a stream built with next uses",
                            t + 1, x->evict == KVSIM_PSIM_EVICT_BELADY ? "belady" : "clairvoyant");
    bool online = x->admit == KVSIM_PSIM_ADMIT_STICKY || x->admit == KVSIM_PSIM_ADMIT_TURN;
    if (online && (t == 0 || x->evict != KVSIM_PSIM_EVICT_TTL))
      return kvbm_error_set(err, KVBM_EINVAL, "policy-sim: G%d: %s admission needs ttl eviction",
                            t + 1, kvsim_psim_admit_name(x->admit));
    if (x->admit == KVSIM_PSIM_ADMIT_VICTIM && t != 2)
      return kvbm_error_set(err, KVBM_EINVAL, "policy-sim: victim admission is for G3 only");
    if (x->admit == KVSIM_PSIM_ADMIT_VICTIM && x->evict == KVSIM_PSIM_EVICT_BELADY)
      return kvbm_error_set(err, KVBM_EINVAL, "policy-sim: G3: victim admission has no next uses for belady");
    if (t && x->admit == KVSIM_PSIM_ADMIT_CLAIRVOYANT && x->evict != KVSIM_PSIM_EVICT_BELADY && x->capacity)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "policy-sim: G%d: clairvoyant admission needs belady eviction", t + 1);
  }
  return KVBM_OK;
}

static void run_free(run *r) {
  for (int t = 0; t < KVSIM_PSIM_TIERS; t++) {
    kvsim_psim_cache_destroy(r->c[t]);
    if (r->filter_on[t]) kvbm__freq_filter_destroy(&r->filter[t]);
  }
  adv_free(&r->ad);
  free(r->g1);
  free(r->uses);
  free(r->src);
  free(r->owner);
  free(r->turn);
  free(r->returned);
}

static int run_init(run *r, const kvsim_psim_stream *s, const kvsim_psim_config *cfg,
                    kvsim_psim_result *res, kvbm_error *err) {
  memset(r, 0, sizeof *r);
  r->s = s;
  r->cfg = cfg;
  r->res = res;
  uint32_t U = s->universe ? s->universe : 1;
  r->g1 = calloc(U, 1);
  r->uses = calloc(U, 1);
  r->src = malloc(s->max_blocks ? s->max_blocks : 1);
  r->g1_free = cfg->tier[0].capacity;
  int rc = r->g1 && r->uses && r->src ? KVBM_OK : KVBM_ENOMEM;
  bool turns = false;
  for (int t = 1; t < KVSIM_PSIM_TIERS; t++) turns |= cfg->tier[t].admit == KVSIM_PSIM_ADMIT_TURN;
  turns |= cfg->ttl_rank == KVSIM_PSIM_RANK_TURN;
  if (!rc && turns) {
    r->owner = malloc((size_t)U * sizeof *r->owner);
    r->turn = malloc(s->nreq ? s->nreq : 1);
    r->returned = calloc(s->nreq ? s->nreq : 1, 1);
    if (!r->owner || !r->turn || !r->returned) rc = KVBM_ENOMEM;
    else memset(r->owner, 0xff, (size_t)U * sizeof *r->owner);
  }
  for (int t = 0; t < KVSIM_PSIM_TIERS && !rc; t++) {
    if (!cfg->tier[t].capacity) continue;
    rc = kvsim_psim_cache_create(cfg->tier[t].evict, (uint32_t)cfg->tier[t].capacity, U, &r->c[t]);
    if (!rc && t && cfg->tier[t].admit == KVSIM_PSIM_ADMIT_FREQUENCY) {
      rc = t == 1 ? kvbm__freq_filter_init(&r->filter[t], cfg->g2_freq_threshold,
                                           cfg->g2_freq_decay_uses, cfg->g2_freq_max_entries)
                  : kvbm__freq_filter_init(&r->filter[t], cfg->freq_threshold,
                                           cfg->freq_decay_uses, cfg->freq_max_entries);
      r->filter_on[t] = rc == KVBM_OK;
      if (rc == KVBM_EINVAL)
        return kvbm_error_set(err, rc, "policy-sim: frequency filter settings out of range");
    }
  }
  if (rc) return kvbm_error_set(err, rc, "policy-sim: %s", kvbm_strerror(rc));
  return cfg->advisor ? adv_init(r, err) : KVBM_OK;
}

int kvsim_psim_run(const kvsim_psim_stream *s, const kvsim_psim_config *cfg, kvsim_psim_result *out,
                  kvbm_error *err) {
  if (!s || !cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "policy-sim: NULL argument");
  int rc = check_config(s, cfg, err);
  if (rc) return rc;
  if (s->max_blocks > cfg->tier[0].capacity)
    return kvbm_error_set(err, KVBM_ENOSPC,
                          "policy-sim: a request of %llu blocks does not fit in G1 (%llu blocks)",
                          (unsigned long long)s->max_blocks,
                          (unsigned long long)cfg->tier[0].capacity);
  kvsim_psim_result res;
  memset(&res, 0, sizeof res);
  run r;
  rc = run_init(&r, s, cfg, &res, err);
  size_t n = s->nreq;
  if (cfg->limit && cfg->limit < n) n = cfg->limit;
  double t0 = kvbm_clock_seconds();
  for (size_t i = 0; i < n && !rc; i++) {
    double ts = s->req[i].ts_ms;
    while (r.ad.a && ts >= r.ad.next_ms) {
      adv_period(&r, (uint64_t)r.ad.next_ms);
      r.ad.next_ms += cfg->advisor_period_ms;
    }
    rc = one_request(&r, i);
    if (r.ad.a) adv_flush_kv(&r, (uint64_t)(ts > 0 ? ts : 0));
    res.requests++;
  }
  if (!rc && r.ad.oom) rc = kvbm_error_set(err, KVBM_ENOMEM, "policy-sim: out of memory (advisor)");
  res.seconds = kvbm_clock_seconds() - t0;
  run_free(&r);
  if (!rc) *out = res;
  return rc;
}
