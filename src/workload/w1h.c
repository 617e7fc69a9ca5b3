/* SPDX-License-Identifier: Apache-2.0 */
/*
 * w1h.c: workload W1-hybrid (see workload/w1h.h).
 *
 * What: W1 with several KV cache groups over one pool, each request a
 * hybrid request of the library (kvbm/hybrid.h, src/sequence/hseq.c) that
 * this file drives as vLLM's scheduler drives its KVCacheManager: the
 * prompt appended, the hit found, the prompt computed in one step or in
 * chunks, one step per output token, the tables released. The stepping
 * rules live in the library (an engine needs them too); this file is the
 * scheduler's part only: the chunk sizes (vLLM's token budget, and with a
 * Mamba align group the cut at block boundaries), the refusal of a request
 * that cannot fit, and the counts. tests/workload/hybrid_ref.py is the
 * slow statement the counts must equal.
 *
 * A request is refused, changing nothing, when one of its steps would need
 * more blocks than the pool has (only it runs, so every other block is free
 * or cached): the request's steps run first on counts alone (a dry request,
 * sequence/hseq_internal.h) when a full table per group would not fit, and
 * decide.
 *
 * The request's buffers are sized once for the longest request of the
 * trace, and the trace's tokens are decoded straight into them
 * (kvbm__hseq_tail); the loop allocates and copies nothing.
 */
#include "workload/w1h.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "kvbm/hybrid.h"
#include "sequence/hseq_internal.h"

typedef struct w1h {
  const kvsim_w1h_config *cfg;
  kvbm_hseq *seq;
  uint32_t bs;
  size_t ng;
  bool has_mamba;   /* a Mamba align group: the aligned split */
  uint32_t L;       /* prompt length of the running request */
} w1h;

static uint64_t cdiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* The scheduler's next prefill chunk from `start` (vLLM's token budget, and
 * with a Mamba group _mamba_block_aligned_split). */
static uint64_t chunk_len(const w1h *w, uint64_t start) {
  uint64_t n = w->L - start;
  if (w->cfg->max_num_batched_tokens && n > w->cfg->max_num_batched_tokens)
    n = w->cfg->max_num_batched_tokens;
  if (w->has_mamba) {
    uint64_t last = w->L - w->L % w->bs;
    if (start + n < last)
      n = n / w->bs * w->bs;
    else if (start < last && last < start + n)
      n = last - start;
  }
  return n;
}

/* Every step of the request (prefill chunks, then one per output token). */
static int run_steps(w1h *w, uint64_t hit, uint32_t out_len) {
  uint64_t computed = hit;
  while (computed < w->L) {
    uint64_t n = chunk_len(w, computed);
    int rc = kvbm_hseq_step(w->seq, NULL, 0, n, NULL);
    if (rc) return rc;
    computed += n;
  }
  /* one step per output token (kvbm__hseq_decode: the steps that only
   * count their token counted without a call each) */
  return kvbm__hseq_decode(w->seq, out_len, NULL);
}

/* Whether every prefill chunk computes something (a Mamba model cuts at
 * block boundaries: a budget below one block never advances). */
static bool schedule_advances(const w1h *w, uint64_t hit) {
  for (uint64_t c = hit; c < w->L;) {
    uint64_t n = chunk_len(w, c);
    if (n == 0) return false;
    c += n;
  }
  return true;
}

static void refuse(w1h *w, size_t idx, const char *why, kvsim_w1h_result *res) {
  res->refused++;
  if (w->cfg->on_refused) w->cfg->on_refused(w->cfg->refused_user, idx, why);
}

static int run_request(w1h *w, const kvsim_trace_request *r, size_t idx, kvsim_w1h_result *res,
                       kvbm_error *err) {
  res->requests++;
  res->prompt_tokens += r->input_length;
  if (r->input_length == 0) return KVBM_OK;
  w->L = r->input_length;
  const uint64_t total = (uint64_t)r->input_length + r->output_length;
  /* the tokens decoded straight into the request's buffer (sized for the
   * longest request: there is room), no copy */
  uint32_t *tokens = kvbm__hseq_tail(w->seq, (size_t)total + 1);
  if (!tokens) return kvbm_error_set(err, KVBM_ESTATE, "replay: request %zu: no room", idx);
  kvsim_trace_prompt_tokens(r, tokens);
  kvsim_trace_output_tokens(r, idx, tokens + r->input_length);
  /* the hit over the prompt (vLLM looks up L - 1 tokens at most), then the
   * output tokens known too: the steps compute them one by one */
  uint64_t hit = 0;
  int rc = kvbm_hseq_append(w->seq, tokens, w->L, err);
  if (!rc) rc = kvbm_hseq_find_hit(w->seq, &hit, err);
  if (!rc) rc = kvbm_hseq_append(w->seq, tokens + w->L, r->output_length, err);
  if (rc) return rc;
  if (!schedule_advances(w, hit)) {
    refuse(w, idx, "--max-num-batched-tokens is below one block: a Mamba model's chunk never advances", res);
    return kvbm_hseq_reset(w->seq, 0);
  }
  if (w->ng * cdiv(total, w->bs) > w->cfg->capacity) {
    kvbm__hseq_set_dry(w->seq, true, w->cfg->capacity);
    rc = run_steps(w, hit, r->output_length);
    kvbm__hseq_set_dry(w->seq, false, 0);
    kvbm__hseq_rewind(w->seq);
    if (rc) {
      refuse(w, idx, "its blocks do not fit in the pool", res);
      return kvbm_hseq_reset(w->seq, 0);
    }
  }
  rc = run_steps(w, hit, r->output_length);
  res->hit_tokens += hit;
  for (uint32_t gi = 0; gi < w->ng && !rc; gi++) {
    kvbm_hseq_group_stats st;
    kvbm_hseq_group_stats_get(w->seq, gi, &st);
    res->blocks_allocated_per_group[gi] += st.allocated;
    res->blocks_allocated += st.allocated;
    if (st.peak_held > res->peak_blocks_held_per_group[gi]) res->peak_blocks_held_per_group[gi] = st.peak_held;
  }
  if (!rc && kvbm_hseq_peak_held(w->seq) > res->peak_blocks_held) res->peak_blocks_held = kvbm_hseq_peak_held(w->seq);
  if (!rc) rc = kvbm_hseq_reset(w->seq, 0);
  if (rc) return kvbm_error_set(err, rc, "replay: request %zu: %s", idx, kvbm_strerror(rc));
  return KVBM_OK;
}

kvsim_w1h_config kvsim_w1h_config_default(void) {
  kvsim_w1h_config c;
  memset(&c, 0, sizeof c);
  c.groups[0].kind = KVBM_GROUP_FULL;
  c.num_groups = 1;
  c.block_size = 16;
  c.capacity = 16384;
  c.scheme = KVBM_HASH_NATIVE;
  return c;
}

static int check_config(const kvsim_w1h_config *c, kvbm_error *err) {
  if (c->num_groups == 0 || c->num_groups > KVBM_GROUPS_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "replay: %zu groups: 1..%u", c->num_groups, KVBM_GROUPS_MAX);
  if (c->block_size == 0 || c->block_size > KVBM_POOL_MAX_BLOCK_SIZE || c->capacity == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "replay: block size %u, capacity %u", c->block_size, c->capacity);
  if (c->num_groups > c->capacity)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "replay: %zu groups cannot share %u blocks: each needs at least one",
                          c->num_groups, c->capacity);
  for (size_t i = 0; i < c->num_groups; i++) {
    const kvbm_group_spec *g = &c->groups[i];
    bool param = g->kind == KVBM_GROUP_SLIDING_WINDOW || g->kind == KVBM_GROUP_CHUNKED_LOCAL;
    if ((unsigned)g->kind > KVBM_GROUP_MAMBA_ALIGN || (param && (g->tokens == 0 || g->tokens > KVBM_GROUP_MAX_TOKENS)))
      return kvbm_error_set(err, KVBM_EINVAL, "replay: group %zu is not a valid spec", i);
  }
  return KVBM_OK;
}

int kvsim_w1h_run(const kvsim_trace *trace, const kvsim_w1h_config *cfg, kvsim_w1h_result *out,
                 kvbm_error *err) {
  if (!trace || !cfg || !out) return kvbm_error_set(err, KVBM_EINVAL, "replay: NULL argument");
  int rc = check_config(cfg, err);
  if (rc) return rc;
  size_t n = kvsim_trace_count(trace);
  if (cfg->limit && cfg->limit < n) n = cfg->limit;
  w1h w;
  memset(&w, 0, sizeof w);
  w.cfg = cfg;
  w.bs = cfg->block_size;
  w.ng = cfg->num_groups;
  for (size_t i = 0; i < w.ng; i++) w.has_mamba |= cfg->groups[i].kind == KVBM_GROUP_MAMBA_ALIGN;
  kvbm_pool_config pc = kvbm_pool_config_default(cfg->capacity, cfg->block_size);
  pc.scheme = cfg->scheme;
  pc.keep_tokens = false;
  pc.num_groups = (uint32_t)w.ng;
  pc.listener = cfg->listener;
  pc.listener_user = cfg->listener_user;
  kvbm_pool *pool = NULL;
  rc = kvbm_pool_create(&pc, &pool, err);
  if (rc) return rc;
  size_t max_in, max_out;
  kvsim_trace_max_lengths(trace, n, &max_in, &max_out);
  size_t max_tok = max_in + max_out;
  rc = kvbm_hseq_create(pool, cfg->groups, w.ng, 0, max_tok + 1, &w.seq, err);
  if (!rc) rc = kvbm_hseq_set_retention(w.seq, cfg->retention);
  kvsim_w1h_result res;
  memset(&res, 0, sizeof res);
  double t0 = kvbm_clock_seconds();
  for (size_t i = 0; i < n && !rc; i++) rc = run_request(&w, kvsim_trace_get(trace, i), i, &res, err);
  res.seconds = kvbm_clock_seconds() - t0;
  if (!rc) *out = res;
  kvbm_hseq_destroy(w.seq);
  kvbm_pool_destroy(pool);
  return rc;
}
