/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tracegen.c: the synthetic trace generator (see workload/tracegen.h).
 *
 * Design. An event-driven simulation in trace time: a min-heap of pending
 * session turns keyed by their arrival time, and the next session arrival
 * drawn from an exponential. The earliest of the two happens next: a new
 * session is created (and its first turn happens at once), or a pending
 * turn is written and the session's next turn scheduled. A session keeps
 * its hash ids (a growing array) and how many tokens its context holds;
 * the only randomness is one xoshiro256** stream seeded by splitmix64, so
 * the output depends on the config alone. Memory: the live sessions'
 * contexts (ids of 512-token blocks), never the whole trace.
 */
#include "workload/tracegen.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"
#include "workload/trace.h"

typedef struct rng {
  uint64_t s[4];
} rng;

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(rng *r) {
  uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

/* Uniform in (0, 1). */
static double uniform(rng *r) { return ((double)(next_u64(r) >> 11) + 0.5) / 9007199254740992.0; }

static double exponential(rng *r, double mean) { return -mean * log(uniform(r)); }

static double normal(rng *r) {
  return sqrt(-2 * log(uniform(r))) * cos(6.283185307179586 * uniform(r));
}

/* Lognormal with the given mean and sigma 0.8, at least 1. */
static uint32_t lognormal_tokens(rng *r, double mean) {
  const double sigma = 0.8;
  double v = exp(log(mean) - sigma * sigma / 2 + sigma * normal(r));
  return v < 1 ? 1 : v > 1e7 ? 10000000u : (uint32_t)v;
}

/* Turns: geometric on 1, 2, ... with the given mean. */
static uint32_t geometric(rng *r, double mean) {
  if (mean <= 1) return 1;
  double p = 1 / mean, v = ceil(log(uniform(r)) / log(1 - p));
  return v < 1 ? 1 : v > 1e6 ? 1000000u : (uint32_t)v;
}

typedef struct session {
  uint32_t *ids;
  uint32_t nids, cap;
  uint64_t tokens;    /* context so far (prompt + answers) */
  uint32_t turns_left;
  double next_ms;
} session;

typedef struct gen {
  const kvsim_tracegen_config *cfg;
  rng r;
  double *zipf_cdf;
  uint32_t next_id;
  session **heap;
  size_t nheap, heap_cap;
  kvsim_tracegen_stats st;
} gen;

static int check(const kvsim_tracegen_config *c, kvbm_error *err) {
#define BAD(cond, what)                                                                        \
  if (cond) return kvbm_error_set(err, KVBM_EINVAL, "trace-gen: %s is out of range", what)
  BAD(c->requests == 0 || c->requests > (1ull << 32), "requests (1..2^32)");
  BAD(!(c->session_rate > 0 && c->session_rate <= 1e6), "session rate (0..1e6]");
  BAD(!(c->turns >= 1 && c->turns <= 1e6), "turns (1..1e6)");
  BAD(!(c->think_s >= 0 && c->think_s <= 1e7), "think time (0..1e7 s)");
  BAD(c->system_prompts == 0 || c->system_prompts > 1000000, "system prompts (1..1e6)");
  BAD(c->system_tokens > (1u << 24), "system tokens (0..2^24)");
  BAD(!(c->zipf >= 0 && c->zipf <= 10), "zipf exponent (0..10)");
  BAD(!(c->user_tokens >= 1 && c->user_tokens <= 1e6), "user tokens (1..1e6)");
  BAD(!(c->output_tokens >= 1 && c->output_tokens <= 65535), "output tokens (1..65535)");
  BAD(c->max_context < 1 || c->max_context > (1u << 26), "max context (1..2^26)");
  BAD(c->system_tokens >= c->max_context, "system tokens (must be below max context)");
#undef BAD
  return KVBM_OK;
}

static bool heap_push(gen *g, session *s) {
  if (kvbm__vec_reserve_of(&g->heap, &g->heap_cap, g->nheap + 1, 64, KVBM__VEC_NO_LIMIT))
    return false;
  size_t i = g->nheap++;
  while (i && g->heap[(i - 1) / 2]->next_ms > s->next_ms) {
    g->heap[i] = g->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  g->heap[i] = s;
  return true;
}

static session *heap_pop(gen *g) {
  session *top = g->heap[0], *last = g->heap[--g->nheap];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, m = i;
    double v = last->next_ms;
    if (l < g->nheap && g->heap[l]->next_ms < v) m = l, v = g->heap[l]->next_ms;
    if (l + 1 < g->nheap && g->heap[l + 1]->next_ms < v) m = l + 1;
    if (m == i) break;
    g->heap[i] = g->heap[m];
    i = m;
  }
  if (g->nheap) g->heap[i] = last;
  return top;
}

static void session_free(session *s) {
  if (s) free(s->ids);
  free(s);
}

static int too_many_ids(kvbm_error *err) {
  return kvbm_error_set(err, KVBM_ERANGE,
                        "trace-gen: the trace needs more than %u hash ids (fewer requests or "
                        "longer blocks of shared text)",
                        KVSIM_TRACE_MAX_HASH_ID + 1);
}

/* Grows a context by n tokens: the partial last block keeps its id, new
 * blocks take fresh ones. */
static int grow(gen *g, session *s, uint64_t n, kvbm_error *err) {
  uint64_t tokens = s->tokens + n;
  uint64_t need = tokens / KVSIM_TRACE_BLOCK + (tokens % KVSIM_TRACE_BLOCK != 0);
  if (need > s->cap) {
    /* From 16, doubling (common/vec.h). A session past UINT32_MAX blocks
     * would take more fresh ids than the reader's limit: that error. */
    size_t cap = s->cap;
    int rc = need > UINT32_MAX ? KVBM_EOVERFLOW
                               : kvbm__vec_reserve_of(&s->ids, &cap, (size_t)need, 16, UINT32_MAX);
    if (rc == KVBM_ENOMEM) return kvbm_error_set(err, KVBM_ENOMEM, "trace-gen: out of memory");
    if (rc) return too_many_ids(err);
    s->cap = (uint32_t)cap;
  }
  while (s->nids < need) {
    if (g->next_id > KVSIM_TRACE_MAX_HASH_ID) return too_many_ids(err);
    s->ids[s->nids++] = g->next_id++;
  }
  s->tokens = tokens;
  return KVBM_OK;
}

static uint32_t zipf_pick(gen *g) {
  double u = uniform(&g->r);
  uint32_t lo = 0, hi = g->cfg->system_prompts - 1;
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (g->zipf_cdf[mid] < u) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static int new_session(gen *g, double now_ms, session **out, kvbm_error *err) {
  const kvsim_tracegen_config *c = g->cfg;
  session *s = calloc(1, sizeof *s);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "trace-gen: out of memory");
  uint32_t p = zipf_pick(g);
  uint32_t sys_blocks = c->system_tokens / KVSIM_TRACE_BLOCK + (c->system_tokens % KVSIM_TRACE_BLOCK != 0);
  int rc = KVBM_OK;
  if (sys_blocks) {
    /* Prompt p's ids are p * sys_blocks + 0 .. sys_blocks - 1. */
    s->cap = sys_blocks < 16 ? 16 : sys_blocks;
    s->ids = malloc(s->cap * sizeof *s->ids);
    if (!s->ids) rc = kvbm_error_set(err, KVBM_ENOMEM, "trace-gen: out of memory");
    for (uint32_t b = 0; !rc && b < sys_blocks; b++) s->ids[b] = p * sys_blocks + b;
    s->nids = sys_blocks;
    /* A system prompt ending inside a block: the session's text goes on
     * in a block of its own (other sessions' continuations differ). */
    if (c->system_tokens % KVSIM_TRACE_BLOCK && !rc) {
      s->nids--;
      s->tokens = (uint64_t)(sys_blocks - 1) * KVSIM_TRACE_BLOCK;
      rc = grow(g, s, c->system_tokens % KVSIM_TRACE_BLOCK, err);
    } else {
      s->tokens = c->system_tokens;
    }
  }
  s->turns_left = geometric(&g->r, c->turns);
  s->next_ms = now_ms;
  g->st.sessions++;
  if (rc) {
    session_free(s);
    return rc;
  }
  *out = s;
  return KVBM_OK;
}

/* Writes one turn of s; returns whether the session goes on. */
static int turn(gen *g, session *s, FILE *f, bool *more, kvbm_error *err) {
  const kvsim_tracegen_config *c = g->cfg;
  *more = false;
  uint32_t user = lognormal_tokens(&g->r, c->user_tokens);
  uint32_t out = lognormal_tokens(&g->r, c->output_tokens);
  if (out > 65535) out = 65535;
  if (s->tokens + user > c->max_context) return KVBM_OK; /* context full: the session ends */
  int rc = grow(g, s, user, err);
  if (rc) return rc;
  fprintf(f, "{\"timestamp\": %.0f, \"input_length\": %llu, \"output_length\": %u, \"hash_ids\": [",
          s->next_ms, (unsigned long long)s->tokens, out);
  for (uint32_t i = 0; i < s->nids; i++) fprintf(f, i ? ", %u" : "%u", s->ids[i]);
  fputs("]}\n", f);
  g->st.requests++;
  g->st.input_tokens += s->tokens;
  g->st.output_tokens += out;
  g->st.duration_s = s->next_ms / 1000;
  if (--s->turns_left == 0 || s->tokens + out >= c->max_context) return KVBM_OK;
  if ((rc = grow(g, s, out, err))) return rc;
  s->next_ms += exponential(&g->r, c->think_s * 1000);
  *more = true;
  return KVBM_OK;
}

static int zipf_table(gen *g) {
  const kvsim_tracegen_config *c = g->cfg;
  g->zipf_cdf = malloc(c->system_prompts * sizeof *g->zipf_cdf);
  if (!g->zipf_cdf) return KVBM_ENOMEM;
  double sum = 0;
  for (uint32_t k = 0; k < c->system_prompts; k++) sum += pow(k + 1, -c->zipf);
  double acc = 0;
  for (uint32_t k = 0; k < c->system_prompts; k++) {
    acc += pow(k + 1, -c->zipf) / sum;
    g->zipf_cdf[k] = acc;
  }
  g->zipf_cdf[c->system_prompts - 1] = 1.0;
  return KVBM_OK;
}

int kvsim_tracegen_write(const kvsim_tracegen_config *cfg, FILE *f, kvsim_tracegen_stats *stats,
                        kvbm_error *err) {
  if (!cfg || !f) return kvbm_error_set(err, KVBM_EINVAL, "trace-gen: NULL argument");
  int rc = check(cfg, err);
  if (rc) return rc;
  gen g;
  memset(&g, 0, sizeof g);
  g.cfg = cfg;
  uint64_t x = cfg->seed;
  for (int i = 0; i < 4; i++) g.r.s[i] = splitmix(&x);
  uint32_t sys_blocks = cfg->system_tokens / KVSIM_TRACE_BLOCK + (cfg->system_tokens % KVSIM_TRACE_BLOCK != 0);
  if ((uint64_t)sys_blocks * cfg->system_prompts > KVSIM_TRACE_MAX_HASH_ID)
    return kvbm_error_set(err, KVBM_ERANGE, "trace-gen: the system prompts alone need too many hash ids");
  g.next_id = sys_blocks * cfg->system_prompts;
  if (zipf_table(&g)) return kvbm_error_set(err, KVBM_ENOMEM, "trace-gen: out of memory");
  double next_session = 0;
  while (!rc && g.st.requests < cfg->requests) {
    session *s = NULL;
    if (!g.nheap || next_session <= g.heap[0]->next_ms) {
      rc = new_session(&g, next_session, &s, err);
      next_session += exponential(&g.r, 1000 / cfg->session_rate);
      if (rc) break;
    } else {
      s = heap_pop(&g);
    }
    bool more;
    rc = turn(&g, s, f, &more, err);
    if (!rc && more && !heap_push(&g, s)) {
      rc = kvbm_error_set(err, KVBM_ENOMEM, "trace-gen: out of memory");
      more = false;
    }
    if (!more) session_free(s);
  }
  while (g.nheap) session_free(heap_pop(&g));
  free(g.heap);
  free(g.zipf_cdf);
  g.st.hash_ids = g.next_id;
  if (!rc && (fflush(f) || ferror(f))) rc = kvbm_error_set(err, KVBM_EIO, "trace-gen: write failed");
  if (stats) *stats = g.st;
  return rc;
}

kvsim_tracegen_config kvsim_tracegen_chat(void) {
  return (kvsim_tracegen_config){.requests = 10000, .seed = 1, .session_rate = 2, .turns = 4,
                                .think_s = 60, .system_prompts = 16, .system_tokens = 1500,
                                .zipf = 1.0, .user_tokens = 1500, .output_tokens = 400,
                                .max_context = 32768};
}

kvsim_tracegen_config kvsim_tracegen_agent(void) {
  return (kvsim_tracegen_config){.requests = 10000, .seed = 1, .session_rate = 2, .turns = 20,
                                .think_s = 4, .system_prompts = 8, .system_tokens = 6000,
                                .zipf = 1.2, .user_tokens = 700, .output_tokens = 120,
                                .max_context = 65536};
}
