/* SPDX-License-Identifier: Apache-2.0 */
/*
 * w2.c: workload W2 (see workload/w2.h).
 *
 * The replay is the engine: it writes every block it computes with a
 * pattern keyed by the block's sequence hash, and checks every block it is
 * handed by an onboard against the same pattern, so a wrong byte anywhere
 * on the way G1 -> G2 -> G3 -> G1 is caught, not assumed away. The
 * manager's copies stay asynchronous; the replay waits for them after each
 * request (kvbm_manager_flush) so that counts do not depend on thread
 * timing, and sizes the queues for the largest request so that nothing is
 * skipped for lack of queue room.
 */
#include "workload/w2.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "workload/trace.h"
#include "common/clock.h"
#include "common/mix.h"

kvsim_w2_config kvsim_w2_config_default(void) {
  kvsim_w2_config o;
  memset(&o, 0, sizeof o);
  o.w1 = kvsim_w1_config_default();
  o.g3_direct = true;
  o.g1_memory = KVBM_MEMORY_SYSTEM;
  o.block_bytes = 256;
  o.g2_policy = KVBM_OFFLOAD_ALL;
  o.g3_policy = KVBM_OFFLOAD_FREQUENCY;
  o.g4_policy = KVBM_OFFLOAD_ALL;
  o.g4_lookup_timeout_ms = 1000;
  return o;
}

/* The pattern of layer l of the block with hash h: 8 bytes at a time from
 * a counter-mode mix, so that every byte depends on hash, layer and
 * position. Layers are multiples of 8 bytes here. Returns whether the
 * bytes match (check) or 1 (fill). */
static int pattern(uint8_t *p, size_t n, uint64_t h, uint32_t l, bool check) {
  uint64_t key = kvbm__mix64(h ^ ((uint64_t)l << 56));
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = kvbm__mix64(key + i);
    if (check) {
      if (memcmp(p + i, &v, 8)) return 0;
    } else {
      memcpy(p + i, &v, 8);
    }
  }
  return 1;
}

/* Device G1 is not host memory: the pattern goes through a host buffer
 * and kvbm_manager_block_write/read. */
static int block_pattern(kvbm_manager *m, uint32_t id, uint64_t h, bool check) {
  uint32_t layers = (uint32_t)kvbm_manager_layout(m, KVBM_TIER_G1)->config.num_layers;
  bool dev = kvbm_manager_memory(m, KVBM_TIER_G1) == KVBM_MEMORY_DEVICE;
  for (uint32_t l = 0; l < layers; l++) {
    void *p;
    size_t sz;
    if (kvbm_manager_block_layer(m, KVBM_TIER_G1, id, l, &p, &sz)) return 0;
    if (!dev) {
      if (!pattern(p, sz, h, l, check)) return 0;
      continue;
    }
    uint8_t *buf = malloc(sz);
    int ok = buf && (!check || !kvbm_manager_block_read(m, KVBM_TIER_G1, id, l, buf, sz, NULL)) &&
             pattern(buf, sz, h, l, check) &&
             (check || !kvbm_manager_block_write(m, KVBM_TIER_G1, id, l, buf, sz, NULL));
    free(buf);
    if (!ok) return 0;
  }
  return 1;
}

typedef struct run_ctx {
  kvbm_manager *m;
  uint32_t B;
  uint32_t *prompt, *output;
  /* With groups: the request's tokens so far, its full blocks' hashes. */
  uint32_t ngroups;
  bool stepwise;     /* a group releases blocks as the request runs (not
                        full attention): decode a block a step, committed */
  kvbm_hash_scheme scheme;
  uint32_t *seq;
  uint64_t *hashes;
  kvsim_w2_result *res;
  void (*on_call)(void *, kvsim_w2_call, double); /* the config's, or NULL */
  void *user;
} run_ctx;

/* Timing of the engine-facing calls for on_call: the clock is read only
 * when someone observes, so a plain replay pays nothing. */
static uint64_t call_start(const run_ctx *c) { return c->on_call ? kvbm_clock_ns() : 0; }

static void call_end(const run_ctx *c, kvsim_w2_call call, uint64_t t0) {
  if (c->on_call) c->on_call(c->user, call, (double)(kvbm_clock_ns() - t0) * 1e-9);
}

/* Computes the blocks [from, full) the request must write (and those
 * below `settled` that the replay refused). */
static void compute(run_ctx *c, kvbm_mreq *r, size_t from, size_t refused_until) {
  const uint32_t *ids;
  size_t nb;
  kvbm_mreq_blocks(r, &ids, &nb);
  kvbm_mreq_info info;
  kvbm_mreq_poll(r, &info);
  size_t full = info.num_tokens / c->B;
  for (size_t k = from; k < full; k++) {
    if (k >= refused_until && !kvbm_mreq_must_compute(r, k)) continue;
    uint64_t h;
    kvbm_mreq_block_hash(r, k, &h);
    block_pattern(c->m, ids[k], h, false);
  }
}

static int run_request(run_ctx *c, const kvsim_trace_request *q, size_t idx, kvbm_error *err) {
  kvsim_w2_result *res = c->res;
  uint32_t *tok = c->prompt;
  size_t n = q->input_length, out_from = 0;
  if (n) {
    kvsim_trace_prompt_tokens(q, tok);
  } else if (q->output_length) {
    /* No prompt: the first output token opens the sequence, as W1's append. */
    kvsim_trace_output_tokens(q, idx, c->output);
    tok = c->output;
    n = out_from = 1;
  } else {
    return KVBM_OK;
  }
  kvbm_mreq *r;
  uint64_t t0 = call_start(c);
  int rc = kvbm_manager_prefill(c->m, 0, 0, tok, n, &r, NULL, NULL);
  call_end(c, KVSIM_W2_CALL_PREFILL, t0);
  if (rc == KVBM_ENOSPC)
    return kvbm_error_set(err, rc, "replay: request %zu (%u prompt + %u output tokens) does not fit in the pool",
                          idx, q->input_length, q->output_length);
  if (rc) return kvbm_error_set(err, rc, "replay: request %zu: %s", idx, kvbm_strerror(rc));
  kvbm_mreq_info info;
  t0 = call_start(c);
  rc = kvbm_mreq_wait(r, -1, &info); /* no deadline: only an error can end it early */
  call_end(c, KVSIM_W2_CALL_WAIT, t0);
  if (rc) {
    kvbm_mreq_destroy(r);
    return kvbm_error_set(err, rc, "replay: request %zu: wait: %s", idx, kvbm_strerror(rc));
  }
  size_t settled = info.matched_tokens / c->B, matched = settled;
  const uint32_t *ids;
  size_t nb;
  kvbm_mreq_blocks(r, &ids, &nb);
  for (size_t k = 0; k < settled; k++) {
    int src = kvbm_mreq_block_source(r, k);
    if (src == KVBM_TIER_G1) continue;
    uint64_t h;
    kvbm_mreq_block_hash(r, k, &h);
    if (!block_pattern(c->m, ids[k], h, true)) {
      res->verify_failures++;
      matched = k;
      break;
    }
  }
  for (size_t k = 0; k < matched; k++)
    res->tiers[kvbm_mreq_block_source(r, k)].hit_tokens += c->B;
  compute(c, r, matched, settled);
  if (q->output_length > out_from) {
    if (tok != c->output) kvsim_trace_output_tokens(q, idx, c->output);
    size_t before = info.num_tokens / c->B;
    t0 = call_start(c);
    rc = kvbm_mreq_append(r, c->output + out_from, q->output_length - out_from);
    call_end(c, KVSIM_W2_CALL_APPEND, t0);
    if (!rc) compute(c, r, before, 0);
  }
  if (!rc) {
    t0 = call_start(c);
    rc = kvbm_mreq_commit(r);
    call_end(c, KVSIM_W2_CALL_COMMIT, t0);
  }
  t0 = call_start(c);
  kvbm_manager_flush(c->m);
  call_end(c, KVSIM_W2_CALL_FLUSH, t0);
  t0 = call_start(c);
  kvbm_mreq_destroy(r);
  call_end(c, KVSIM_W2_CALL_DESTROY, t0);
  if (rc == KVBM_ENOSPC)
    return kvbm_error_set(err, rc, "replay: request %zu (%u prompt + %u output tokens) does not fit in the pool",
                          idx, q->input_length, q->output_length);
  if (rc) return kvbm_error_set(err, rc, "replay: request %zu: %s", idx, kvbm_strerror(rc));
  res->w1.prompt_tokens += q->input_length;
  res->w1.hit_tokens += matched * c->B;
  return KVBM_OK;
}

/* ---- with groups: hybrid requests (w2.h) ---- */

/* The pattern key of group g's block with hash h: the hash for group 0
 * (so a run of one full group writes W2's bytes), mixed for the others. */
static uint64_t group_key(uint64_t h, uint32_t g) {
  return g ? kvbm__mix64(h ^ ((uint64_t)g << 56)) : h;
}

/* The sequence hashes of full blocks [from, to) of c->seq (salt 0, as
 * the prefill's). */
static void hash_blocks(run_ctx *c, size_t from, size_t to) {
  for (size_t k = from; k < to; k++)
    c->hashes[k] = kvbm_hash_next(c->scheme, 0, k ? c->hashes[k - 1] : 0, k > 0, c->seq + k * c->B, c->B);
}

/* The G1 blocks the request's tables hold now, per group: the peak. */
static void note_held(run_ctx *c, const kvbm_hreq *r) {
  for (uint32_t g = 0; g < c->ngroups; g++) {
    const uint32_t *ids;
    size_t nb, held = 0;
    if (kvbm_hreq_table(r, g, &ids, &nb)) continue; /* g < ngroups: never */
    for (size_t k = 0; k < nb; k++) held += ids[k] != KVBM_HREQ_NULL;
    if (held > c->res->groups[g].peak_held) c->res->groups[g].peak_held = held;
  }
}

/* Writes the full blocks [from, to) each group must compute. */
static void hcompute(run_ctx *c, kvbm_hreq *r, size_t from, size_t to) {
  for (uint32_t g = 0; g < c->ngroups; g++) {
    const uint32_t *ids;
    size_t nb;
    if (kvbm_hreq_table(r, g, &ids, &nb)) continue; /* g < ngroups: never */
    for (size_t k = from; k < to && k < nb; k++)
      if (ids[k] != KVBM_HREQ_NULL && kvbm_hreq_must_compute(r, g, k))
        block_pattern(c->m, ids[k], group_key(c->hashes[k], g), false);
  }
}

/* Checks the bytes of every block of the hit each group holds (from G1
 * or onboarded); a wrong one is counted (the hybrid request has no way to
 * hand one back: its tables are the manager's). */
static void hverify(run_ctx *c, kvbm_hreq *r, size_t hit) {
  for (uint32_t g = 0; g < c->ngroups; g++) {
    const uint32_t *ids;
    size_t nb;
    if (kvbm_hreq_table(r, g, &ids, &nb)) continue; /* g < ngroups: never */
    for (size_t k = 0; k < hit && k < nb; k++)
      if (ids[k] != KVBM_HREQ_NULL && !kvbm_hreq_must_compute(r, g, k) &&
          !block_pattern(c->m, ids[k], group_key(c->hashes[k], g), true))
        c->res->verify_failures++;
  }
}

static int too_big(kvbm_error *err, int rc, size_t idx, const kvsim_trace_request *q) {
  return kvbm_error_set(err, rc, "replay: request %zu (%u prompt + %u output tokens) does not fit in the pool",
                        idx, q->input_length, q->output_length);
}

/* Appends the output tokens [from, total) of c->seq one block boundary at
 * a time: each step's filled block written, then committed. Groups of full
 * attention alone release nothing while the request runs: then the whole
 * output is one append, written and committed once with the prompt, W2's
 * calls exactly (a commit per step would start copies earlier, and a
 * request larger than G2 would then skip fewer: other counts than W2's). */
static int hdecode(run_ctx *c, kvbm_hreq *r, size_t pos, size_t total, kvbm_error *err) {
  int rc = KVBM_OK;
  while (!rc && pos < total) {
    size_t step = c->stepwise ? c->B - pos % c->B : total - pos;
    if (step > total - pos) step = total - pos;
    uint64_t t0 = call_start(c);
    rc = kvbm_hreq_append(r, c->seq + pos, step, err);
    call_end(c, KVSIM_W2_CALL_APPEND, t0);
    if (rc) break;
    size_t k = pos / c->B, end = (pos + step) / c->B; /* full blocks filled */
    pos += step;
    hash_blocks(c, k, end);
    note_held(c, r);
    hcompute(c, r, k, end);
    if (c->stepwise && pos % c->B) continue; /* the tail: committed at its step */
    t0 = call_start(c);
    rc = kvbm_hreq_commit(r);
    call_end(c, KVSIM_W2_CALL_COMMIT, t0);
  }
  return rc;
}

static int run_hrequest(run_ctx *c, const kvsim_trace_request *q, size_t idx, kvbm_error *err) {
  kvsim_w2_result *res = c->res;
  size_t n = q->input_length, total = (size_t)q->input_length + q->output_length;
  if (n) {
    kvsim_trace_prompt_tokens(q, c->seq);
  } else if (q->output_length) {
    n = 1; /* no prompt: the first output token opens the sequence, as W2's */
  } else {
    return KVBM_OK;
  }
  if (q->output_length) {
    kvsim_trace_output_tokens(q, idx, c->output);
    memcpy(c->seq + q->input_length, c->output, q->output_length * sizeof *c->output);
  }
  kvbm_hreq *r;
  kvbm_error e = {0};
  uint64_t t0 = call_start(c);
  int rc = kvbm_manager_hprefill(c->m, 0, 0, c->seq, n, &r, NULL, &e);
  call_end(c, KVSIM_W2_CALL_PREFILL, t0);
  if (rc == KVBM_ENOSPC) return too_big(err, rc, idx, q);
  if (rc) return kvbm_error_set(err, rc, "replay: request %zu: %s", idx, e.msg);
  kvbm_hreq_info info;
  t0 = call_start(c);
  rc = kvbm_hreq_wait(r, -1, &info);
  call_end(c, KVSIM_W2_CALL_WAIT, t0);
  if (rc) {
    kvbm_hreq_destroy(r);
    return kvbm_error_set(err, rc, "replay: request %zu: wait: %s", idx, kvbm_strerror(rc));
  }
  size_t hit = info.hit_tokens / c->B;
  hash_blocks(c, 0, n / c->B);
  note_held(c, r);
  hverify(c, r, hit);
  for (uint32_t g = 0; g < c->ngroups; g++) {
    res->groups[g].hit_blocks += info.hit_g1[g] + info.onboarded[g];
    res->groups[g].onboarded_blocks += info.onboarded[g];
    res->tiers[KVBM_TIER_G1].hit_tokens += (uint64_t)info.hit_g1[g] * c->B;
  }
  for (int t = KVBM_TIER_G2; t < KVBM_TIER_COUNT; t++)
    res->tiers[t].hit_tokens += (uint64_t)info.onboarded_from[t] * c->B;
  hcompute(c, r, 0, n / c->B);
  if (c->stepwise || total == n) { /* else committed with the output */
    t0 = call_start(c);
    rc = kvbm_hreq_commit(r);
    call_end(c, KVSIM_W2_CALL_COMMIT, t0);
  }
  if (!rc) rc = hdecode(c, r, n, total, &e);
  t0 = call_start(c);
  kvbm_manager_flush(c->m);
  call_end(c, KVSIM_W2_CALL_FLUSH, t0);
  t0 = call_start(c);
  kvbm_hreq_destroy(r);
  call_end(c, KVSIM_W2_CALL_DESTROY, t0);
  if (rc == KVBM_ENOSPC) return too_big(err, rc, idx, q);
  if (rc) return kvbm_error_set(err, rc, "replay: request %zu: %s", idx, e.msg[0] ? e.msg : kvbm_strerror(rc));
  res->w1.prompt_tokens += q->input_length;
  res->w1.hit_tokens += (uint64_t)hit * c->B;
  return KVBM_OK;
}

int kvsim_w2_run(const kvsim_trace *trace, const kvsim_w2_config *o,
                   kvsim_w2_result *out, kvbm_error *err) {
  if (!trace || !o || !out) return kvbm_error_set(err, KVBM_EINVAL, "replay: NULL argument");
  if (o->block_bytes < 16 || o->block_bytes % 16 || o->block_bytes > (1u << 30))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "replay: --block-bytes %llu is not a multiple of 16 in 16..2^30",
                          (unsigned long long)o->block_bytes);
  size_t n = kvsim_trace_count(trace);
  if (o->w1.limit && o->w1.limit < n) n = o->w1.limit;
  /* Refuse what cannot fit in G1 before sizing buffers and queues by it. */
  int rc = kvsim_trace_check_fit(trace, n, o->w1.block_size, o->w1.capacity, err);
  if (rc) return rc;
  size_t max_in, max_out;
  kvsim_trace_max_lengths(trace, n, &max_in, &max_out);
  kvbm_manager_config mc = o->base ? *o->base : kvbm_manager_config_default();
  mc.block_size = o->w1.block_size;
  mc.scheme = o->w1.scheme;
  mc.layout = (kvbm_layout_config){.num_blocks = 1, .num_layers = 2, .outer_dim = 1,
                                   .page_size = 1, .inner_dim = o->block_bytes / 2,
                                   .dtype_size = 1, .alignment = 16};
  mc.g1_blocks = o->w1.capacity;
  mc.g2_blocks = o->g2_blocks;
  mc.g3_blocks = o->g3_blocks;
  mc.g3_dir = o->g3_dir;
  mc.g3_direct = o->g3_direct;
  if (o->g1_memory) mc.g1_memory = o->g1_memory;
  /* Device G1 copies to pinned G2 (asynchronous on the CUDA stream). */
  if (mc.g1_memory == KVBM_MEMORY_DEVICE) mc.g2_memory = KVBM_MEMORY_PINNED;
  mc.g2_policy = o->g2_policy;
  mc.g3_policy = o->g3_policy;
  mc.g4_url = o->g4_url;
  if (o->g4_blocks) mc.g4_blocks = o->g4_blocks;
  mc.g4_policy = o->g4_policy;
  mc.g4_lookup_timeout_ms = o->g4_lookup_timeout_ms;
  mc.model_id = o->model_id;
  mc.g4_key_file = o->g4_key_file;
  mc.g4_key = o->g4_key;
  mc.g4_key_len = o->g4_key_len;
  if (o->metrics) mc.metrics = *o->metrics;
  mc.groups = o->groups;
  mc.num_groups = o->num_groups;
  /* Room for every copy of the largest request: nothing skipped for lack
   * of queue room, so the counts are those of the policy alone. */
  uint64_t qcap = 2 * ((max_in + max_out) / (o->w1.block_size ? o->w1.block_size : 1) + 2);
  mc.queue_capacity = qcap > (1u << 24) ? (1u << 24) : (uint32_t)qcap;
  kvbm_manager *m;
  rc = kvbm_manager_create(&mc, &m, err);
  if (rc) return rc;
  kvsim_w2_result res;
  memset(&res, 0, sizeof res);
  run_ctx c = {.m = m, .B = o->w1.block_size, .res = &res, .on_call = o->on_call,
               .user = o->observer_user, .ngroups = (uint32_t)o->num_groups, .scheme = o->w1.scheme};
  c.prompt = malloc((max_in ? max_in : 1) * sizeof *c.prompt);
  c.output = malloc((max_out ? max_out : 1) * sizeof *c.output);
  for (size_t g = 0; g < o->num_groups; g++) c.stepwise |= o->groups[g].kind != KVBM_GROUP_FULL;
  if (c.ngroups) {
    c.seq = malloc((max_in + max_out + 1) * sizeof *c.seq);
    c.hashes = malloc(((max_in + max_out) / c.B + 1) * sizeof *c.hashes);
  }
  if (!c.prompt || !c.output || (c.ngroups && (!c.seq || !c.hashes)))
    rc = kvbm_error_set(err, KVBM_ENOMEM, "replay: out of memory");
  bool observed = !rc && o->on_start;
  if (observed) o->on_start(o->observer_user, m);
  double t0 = kvbm_clock_seconds();
  for (size_t i = 0; i < n && !rc; i++) {
    rc = c.ngroups ? run_hrequest(&c, kvsim_trace_get(trace, i), i, err)
                   : run_request(&c, kvsim_trace_get(trace, i), i, err);
    res.w1.requests += !rc;
    if (!rc && o->on_request) o->on_request(o->observer_user, i + 1, n, &res, m);
    if (o->w1.progress && (i % 256 == 255)) o->w1.progress(o->w1.progress_user, i + 1, n);
  }
  res.w1.seconds = kvbm_clock_seconds() - t0;
  if (!rc) {
    if (o->w1.progress) o->w1.progress(o->w1.progress_user, n, n);
    for (int t = 0; t < KVBM_TIER_COUNT; t++) {
      kvbm_tier_stats s;
      kvbm_manager_stats_get(m, t, &s);
      kvsim_w2_tier *x = &res.tiers[t];
      x->offloaded_blocks = s.offloaded_blocks;
      x->offloaded_bytes = s.offloaded_bytes;
      x->onboarded_blocks = s.onboarded_blocks;
      x->onboarded_bytes = s.onboarded_bytes;
      x->skipped = s.skipped_queue + s.skipped_space + s.skipped_io + s.skipped_unavailable;
      x->onboard_failures = s.onboard_failures;
      x->missing = s.missing;
      x->foreign = s.foreign;
      x->lookups = s.lookups;
      x->lookup_found = s.lookup_found;
      x->lookup_timeouts = s.lookup_timeouts;
      x->lookup_errors = s.lookup_errors;
      x->checksum_failures = s.checksum_failures;
      x->auth_failures = s.auth_failures;
      x->evictions = s.evictions;
      x->busy_seconds = s.busy_seconds;
      if (t == KVBM_TIER_G1) res.w1.blocks_allocated = s.allocated;
    }
    strncpy(res.g3_mode, kvbm_manager_g3_mode(m), sizeof res.g3_mode - 1);
    strncpy(res.g3_error, kvbm_manager_g3_error(m), sizeof res.g3_error - 1);
    strncpy(res.g4_mode, kvbm_manager_tier_mode(m, KVBM_TIER_G4), sizeof res.g4_mode - 1);
    strncpy(res.g4_error, kvbm_manager_tier_error(m, KVBM_TIER_G4), sizeof res.g4_error - 1);
    *out = res;
  }
  if (observed && o->on_finish) o->on_finish(o->observer_user, m, rc ? NULL : &res);
  free(c.prompt);
  free(c.output);
  free(c.seq);
  free(c.hashes);
  kvbm_manager_destroy(m);
  return rc;
}
