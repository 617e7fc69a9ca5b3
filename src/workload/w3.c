/* SPDX-License-Identifier: Apache-2.0 */
/*
 * w3.c: workload W3 (../shared/WORKLOADS.md) in one process.
 *
 * Every worker is a W1 cache: a kvbm pool driven through the sequence API
 * exactly as src/workload/w1.c does (prefill, append the outputs,
 * destroy). For the kv-aware run each pool's listener records its events;
 * after each request the worker's events become one batch (consecutive
 * BlockStored of a chain merged into one multi-block event, as vLLM sends
 * them), which is encoded in vLLM's msgpack form, decoded again and applied
 * to the router's index with the batch sequence number as its id: the
 * router sees the workers only through the wire format. Token ids travel
 * only when the index needs them (recompute); it ignores them otherwise.
 * Before each request the router looks the prompt up in the index; the
 * same lookup is also made against the pools themselves and every worker
 * whose prefix differs counts as an index mismatch.
 *
 * Warm restart (restart_at): the kv-aware run also feeds every batch to a
 * second index that never stops. Before request N the router's index is
 * saved (kvbm_index_save/_snapshot), destroyed, and a new one is loaded
 * from the snapshot; each worker's last batch is then delivered again, as
 * a redelivering transport would, and must be skipped by its id. The run
 * goes on with the loaded index (every lookup still checked against the
 * caches), and at the end both indexes' snapshots must be byte-equal.
 *
 * The four policies run one after the other on fresh caches. The kv-aware
 * and ideal runs use the same cost function, load model and generator
 * seed, so an exact index makes them choose identically.
 *
 * Load model: a request counts as active on its worker from its arrival
 * (trace timestamp) for `active_ms` of trace time, with its blocks (prompt
 * plus output); 0 turns load off. The caches themselves still run the
 * requests one at a time in file order, as W1 does.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "workload/w3.h"
#include "kvbm/sequence.h"
#include "common/clock.h"
#include "common/vec.h"

kvsim_w3_config kvsim_w3_config_default(void) {
  kvsim_w3_config o = {0};
  o.workers = 8;
  o.block_size = 16;
  o.capacity = 16384;
  o.scheme = KVBM_HASH_NATIVE;
  o.index_scheme = KVBM_HASH_DYNAMO;
  o.choice = kvbm_choice_config_default();
  o.active_ms = 10000;
  o.seed = 1;
  return o;
}

/* ---------------------------------------------------------- event capture */

typedef struct rec {
  kvbm_event_type type;
  size_t h0, nh;      /* hashes[h0 .. h0 + nh) */
  size_t t0;          /* tokens[t0 ..) for STORED */
  uint64_t parent;
  bool has_parent;
} rec;

typedef struct capture {
  rec *r;
  size_t nr, cr;
  uint64_t *h;
  size_t nh, ch;
  uint32_t *t;
  size_t nt, ct;
  uint32_t block_size;
  bool oom;
  bool with_tokens; /* send token ids (the index needs them to recompute) */
  uint64_t seq; /* next batch sequence number */
} capture;

/* Room for `need` elements in the array at pp (a T **): from 64, doubling;
 * false when memory runs out, the old array kept. */
#define RESERVE(pp, cap, need) \
  (kvbm__vec_reserve_of((pp), (cap), (need), 64, KVBM__VEC_NO_LIMIT) == KVBM_OK)

static void on_pool_event(void *user, const kvbm_pool_event *ev) {
  capture *c = user;
  if (c->oom) return;
  if (!RESERVE(&c->h, &c->ch, c->nh + 1) ||
      !RESERVE(&c->r, &c->cr, c->nr + 1) ||
      !RESERVE(&c->t, &c->ct, c->nt + c->block_size)) {
    c->oom = true;
    return;
  }
  rec *last = c->nr ? &c->r[c->nr - 1] : NULL;
  if (ev->kind == KVBM_POOL_STORED) {
    /* the next block of the chain the last BlockStored ended: extend it */
    if (last && last->type == KVBM_EVENT_STORED && ev->has_parent &&
        c->h[last->h0 + last->nh - 1] == ev->parent_hash) {
      last->nh++;
    } else {
      c->r[c->nr++] = (rec){.type = KVBM_EVENT_STORED, .h0 = c->nh, .nh = 1, .t0 = c->nt,
                            .parent = ev->parent_hash, .has_parent = ev->has_parent};
    }
    c->h[c->nh++] = ev->seq_hash;
    if (c->with_tokens) {
      if (ev->tokens) memcpy(c->t + c->nt, ev->tokens, c->block_size * sizeof *c->t);
      else memset(c->t + c->nt, 0, c->block_size * sizeof *c->t);
      c->nt += c->block_size;
    }
  } else if (ev->kind == KVBM_POOL_REMOVED) {
    if (last && last->type == KVBM_EVENT_REMOVED) {
      last->nh++;
    } else {
      c->r[c->nr++] = (rec){.type = KVBM_EVENT_REMOVED, .h0 = c->nh, .nh = 1};
    }
    c->h[c->nh++] = ev->seq_hash;
  } else {
    c->r[c->nr++] = (rec){.type = KVBM_EVENT_CLEARED};
  }
}

typedef struct wire {
  kvbm_event_encoder *enc;
  kvbm_event_decoder *dec;
  kvbm_event *ev;
  size_t cev;
  uint64_t events, bytes;
  /* warm restart: the index that never stops, each worker's last payload */
  kvbm_index *twin;
  uint8_t **last;
  size_t *last_len, *last_cap;
  uint64_t *last_seq;
} wire;

/* Sends worker w's captured events to the index through the codec. */
static int flush(wire *wr, capture *c, uint32_t w, kvbm_index *idx, double *index_s,
                 const kvsim_w3_config *tap, kvbm_error *err) {
  if (c->oom) return kvbm_error_set(err, KVBM_ENOMEM, "w3: out of memory");
  if (!c->nr) return KVBM_OK;
  if (!RESERVE(&wr->ev, &wr->cev, c->nr))
    return kvbm_error_set(err, KVBM_ENOMEM, "w3: out of memory");
  for (size_t i = 0; i < c->nr; i++) {
    const rec *r = &c->r[i];
    kvbm_event *e = &wr->ev[i];
    memset(e, 0, sizeof *e);
    e->type = r->type;
    e->block_hashes = c->h + r->h0;
    e->num_block_hashes = r->nh;
    e->medium = KVBM_MEDIUM_GPU;
    if (r->type == KVBM_EVENT_STORED) {
      e->parent_hash = r->parent;
      e->has_parent = r->has_parent;
      if (c->with_tokens) {
        e->token_ids = c->t + r->t0;
        e->num_tokens = r->nh * c->block_size;
      }
      e->block_size = c->block_size;
    }
  }
  kvbm_event_batch b = {.seq = c->seq++, .ts = 0, .dp_rank = 0, .has_dp_rank = true,
                        .events = wr->ev, .num_events = c->nr};
  const uint8_t *data;
  size_t len;
  int rc = kvbm_event_encode(wr->enc, &b, &data, &len, err);
  kvbm_event_batch d;
  if (!rc) rc = kvbm_event_decode(wr->dec, data, len, b.seq, &d, err);
  if (!rc && tap->tap_batch) tap->tap_batch(tap->tap_user, w, &d);
  double t0 = kvbm_clock_seconds();
  if (!rc) rc = kvbm_index_apply_batch(idx, w, &d, err);
  *index_s += kvbm_clock_seconds() - t0;
  if (!rc && wr->twin) {
    rc = kvbm_index_apply_batch(wr->twin, w, &d, err);
    if (!rc && !RESERVE(&wr->last[w], &wr->last_cap[w], len))
      rc = kvbm_error_set(err, KVBM_ENOMEM, "w3: out of memory");
    if (!rc) {
      memcpy(wr->last[w], data, len);
      wr->last_len[w] = len;
      wr->last_seq[w] = b.seq;
    }
  }
  wr->events += c->nr;
  wr->bytes += len;
  c->nr = c->nh = c->nt = 0;
  return rc;
}

/* ---------------------------------------------------------- one policy */

enum policy { P_KV, P_RANDOM, P_RR, P_IDEAL };

typedef struct active {
  double end_ms;
  uint32_t w;
  double blocks;
} active;

typedef struct sim {
  const kvsim_trace *trace;
  const kvsim_w3_config *o;
  size_t n;
  kvbm_pool **pool;
  capture *cap;
  kvbm_index *idx;
  wire wr;
  uint32_t *prompt, *output;
  uint64_t *wh, *ih; /* workers' and index's hashes of the prompt */
  size_t max_blocks;
  active *act;
  size_t nact, cact;
  double load[KVBM_ROUTER_MAX_WORKERS];
  uint64_t rng;
  kvsim_w3_result *res;
} sim;

/* Longest prefix of h[0..n) registered in a pool. */
static uint32_t pool_prefix(const kvbm_pool *p, const uint64_t *h, size_t n) {
  uint32_t k = 0;
  while (k < n && kvbm_pool_contains(p, h[k])) k++;
  return k;
}

static void expire_load(sim *s, double t_ms) {
  size_t j = 0;
  for (size_t i = 0; i < s->nact; i++) {
    if (s->act[i].end_ms <= t_ms) s->load[s->act[i].w] -= s->act[i].blocks;
    else s->act[j++] = s->act[i];
  }
  s->nact = j;
}

static int add_load(sim *s, uint32_t w, double t_ms, double blocks) {
  if (!RESERVE(&s->act, &s->cact, s->nact + 1)) return KVBM_ENOMEM;
  s->act[s->nact++] = (active){.end_ms = t_ms + s->o->active_ms, .w = w, .blocks = blocks};
  s->load[w] += blocks;
  return KVBM_OK;
}

static int run_on(sim *s, uint32_t w, const kvsim_trace_request *r, size_t i,
                  kvsim_w3_policy *pol, kvbm_error *err) {
  kvbm_seq *seq;
  int rc = kvbm_seq_create(s->pool[w], 0, 0, &seq);
  if (rc) return kvbm_error_set(err, rc, "w3: request %zu: %s", i, kvbm_strerror(rc));
  size_t matched = 0;
  if (r->input_length) rc = kvbm_seq_prefill(seq, s->prompt, r->input_length, &matched);
  if (!rc) {
    kvsim_trace_output_tokens(r, i, s->output);
    rc = kvbm_seq_append(seq, s->output, r->output_length);
  }
  kvbm_seq_destroy(seq);
  if (rc == KVBM_ENOSPC)
    return kvbm_error_set(err, rc,
                          "w3: request %zu (%u prompt + %u output tokens) does not fit in a "
                          "worker of %u blocks",
                          i, r->input_length, r->output_length, s->o->capacity);
  if (rc) return kvbm_error_set(err, rc, "w3: request %zu: %s", i, kvbm_strerror(rc));
  pol->hit_tokens += matched;
  pol->prompt_tokens += r->input_length;
  pol->requests++;
  return KVBM_OK;
}

static int choose(sim *s, enum policy p, size_t i, const kvsim_trace_request *r, uint32_t *w,
                  kvbm_error *err) {
  const kvsim_w3_config *o = s->o;
  uint32_t W = o->workers;
  if (p == P_RR) {
    *w = (uint32_t)(i % W);
    return KVBM_OK;
  }
  if (p == P_RANDOM) {
    *w = (uint32_t)(kvbm_router_rand(&s->rng) % W);
    return KVBM_OK;
  }
  size_t nb = kvbm_hash_chain(o->scheme, 0, s->prompt, r->input_length, o->block_size, s->wh,
                              s->max_blocks);
  kvbm_overlap ov[KVBM_ROUTER_MAX_WORKERS];
  memset(ov, 0, sizeof ov);
  if (p == P_KV) {
    const uint64_t *keys = s->wh;
    if (o->recompute) {
      kvbm_index_hash_tokens(s->idx, s->prompt, r->input_length, s->ih, s->max_blocks);
      keys = s->ih;
    }
    if (o->tap_lookup) o->tap_lookup(o->tap_user, keys, nb);
    double t0 = kvbm_clock_seconds();
    kvbm_index_lookup(s->idx, keys, nb, ov, NULL);
    s->res->index_seconds += kvbm_clock_seconds() - t0;
    s->res->lookups++;
    for (uint32_t x = 0; x < W; x++) {
      uint32_t truth = pool_prefix(s->pool[x], s->wh, nb);
      for (int t = 0; t < KVBM_TIER_COUNT; t++)
        if (ov[x].prefix[t] != truth) {
          s->res->index_mismatches++;
          break;
        }
    }
  } else {
    for (uint32_t x = 0; x < W; x++) {
      uint32_t k = pool_prefix(s->pool[x], s->wh, nb);
      ov[x] = (kvbm_overlap){.prefix = {k, k, k}};
    }
  }
  uint64_t cand = W == 64 ? ~0ull : (1ull << W) - 1;
  double load[KVBM_ROUTER_MAX_WORKERS] = {0};
  if (o->active_ms > 0) {
    expire_load(s, r->timestamp_ms);
    for (uint32_t x = 0; x < W; x++) load[x] = s->load[x];
  }
  kvbm_choice ch;
  int rc = kvbm_choose(&o->choice, nb, ov, o->active_ms > 0 ? load : NULL, cand, &s->rng, &ch);
  if (rc) return kvbm_error_set(err, rc, "w3: choose: %s", kvbm_strerror(rc));
  *w = ch.slot;
  if (o->active_ms > 0) {
    double units = o->choice.load_kind == KVBM_LOAD_REQUESTS
                       ? 1.0
                       : ceil((double)(r->input_length + r->output_length) / o->block_size);
    if (add_load(s, *w, r->timestamp_ms, units))
      return kvbm_error_set(err, KVBM_ENOMEM, "w3: out of memory");
  }
  return KVBM_OK;
}

static void sim_free(sim *s) {
  for (uint32_t w = 0; s->pool && w < s->o->workers; w++) kvbm_pool_destroy(s->pool[w]);
  for (uint32_t w = 0; s->cap && w < s->o->workers; w++) {
    free(s->cap[w].r);
    free(s->cap[w].h);
    free(s->cap[w].t);
  }
  free(s->pool);
  free(s->cap);
  kvbm_index_destroy(s->idx);
  kvbm_index_destroy(s->wr.twin);
  for (uint32_t w = 0; s->wr.last && w < s->o->workers; w++) free(s->wr.last[w]);
  free(s->wr.last);
  free(s->wr.last_len);
  free(s->wr.last_cap);
  free(s->wr.last_seq);
  kvbm_event_encoder_destroy(s->wr.enc);
  kvbm_event_decoder_destroy(s->wr.dec);
  free(s->wr.ev);
  free(s->act);
  s->pool = NULL;
  s->cap = NULL;
  s->idx = NULL;
  s->wr = (wire){0};
  s->act = NULL;
  s->nact = s->cact = 0;
}

static int sim_setup(sim *s, enum policy p, kvbm_error *err) {
  const kvsim_w3_config *o = s->o;
  s->pool = calloc(o->workers, sizeof *s->pool);
  s->cap = calloc(o->workers, sizeof *s->cap);
  if (!s->pool || !s->cap) return kvbm_error_set(err, KVBM_ENOMEM, "w3: out of memory");
  memset(s->load, 0, sizeof s->load);
  s->rng = o->seed ? o->seed : 1;
  int rc;
  if (p == P_KV) {
    kvbm_index_config ic = kvbm_index_config_default();
    ic.block_size = o->block_size;
    ic.recompute = o->recompute;
    ic.scheme = o->recompute ? o->index_scheme : o->scheme;
    ic.expected_blocks = o->capacity;
    if ((rc = kvbm_index_create(&ic, &s->idx, err))) return rc;
    if (o->restart_at) {
      s->wr.last = calloc(o->workers, sizeof *s->wr.last);
      s->wr.last_len = calloc(o->workers, sizeof *s->wr.last_len);
      s->wr.last_cap = calloc(o->workers, sizeof *s->wr.last_cap);
      s->wr.last_seq = calloc(o->workers, sizeof *s->wr.last_seq);
      if (!s->wr.last || !s->wr.last_len || !s->wr.last_cap || !s->wr.last_seq)
        return kvbm_error_set(err, KVBM_ENOMEM, "w3: out of memory");
      if ((rc = kvbm_index_create(&ic, &s->wr.twin, err))) return rc;
    }
    /* vLLM's positional form, as the figures in docs/areas/router.md were
     * taken with */
    kvbm_event_encoder_config ec = {.form = KVBM_FORM_POSITIONAL};
    if ((rc = kvbm_event_encoder_create(&ec, &s->wr.enc, err))) return rc;
    if ((rc = kvbm_event_decoder_create(&s->wr.dec, err))) return rc;
  }
  for (uint32_t w = 0; w < o->workers; w++) {
    kvbm_pool_config pc = kvbm_pool_config_default(o->capacity, o->block_size);
    pc.scheme = o->scheme;
    pc.keep_tokens = false;
    if (p == P_KV) {
      s->cap[w].block_size = o->block_size;
      s->cap[w].with_tokens = o->recompute;
      pc.listener = on_pool_event;
      pc.listener_user = &s->cap[w];
      kvbm_worker_key key = {w, 0};
      if ((rc = kvbm_index_add_worker(s->idx, key, NULL, err))) return rc;
      if (s->wr.twin && (rc = kvbm_index_add_worker(s->wr.twin, key, NULL, err))) return rc;
    }
    if ((rc = kvbm_pool_create(&pc, &s->pool[w], err))) return rc;
  }
  return KVBM_OK;
}

/* The router restarts warm (see the top): save, drop, load, redeliver. */
static int restart(sim *s, kvbm_error *err) {
  const kvsim_w3_config *o = s->o;
  kvbm_index_config ic = *kvbm_index_config_get(s->idx);
  uint8_t *snap = NULL;
  size_t len = 0;
  int rc = o->snapshot_path ? kvbm_index_save(s->idx, o->snapshot_path, err)
                            : kvbm_index_snapshot(s->idx, &snap, &len, err);
  kvbm_index_destroy(s->idx);
  s->idx = NULL;
  if (!rc) rc = kvbm_index_create(&ic, &s->idx, err);
  if (!rc) rc = o->snapshot_path ? kvbm_index_load(s->idx, o->snapshot_path, err)
                                 : kvbm_index_restore(s->idx, snap, len, err);
  free(snap);
  s->res->restarted = true;
  for (uint32_t w = 0; w < o->workers && !rc; w++) {
    if (!s->wr.last_len[w]) continue;
    kvbm_event_batch d;
    rc = kvbm_event_decode(s->wr.dec, s->wr.last[w], s->wr.last_len[w], s->wr.last_seq[w], &d, err);
    if (!rc) rc = kvbm_index_apply_batch(s->idx, w, &d, err);
    s->res->redelivered++;
  }
  kvbm_index_stats st;
  kvbm_index_stats_get(s->idx, &st);
  s->res->redelivered_skipped = st.duplicates;
  return rc;
}

/* The restarted index against the one that never stopped. */
static int compare_twin(sim *s, kvbm_error *err) {
  uint8_t *a = NULL, *b = NULL;
  size_t la = 0, lb = 0;
  int rc = kvbm_index_snapshot(s->idx, &a, &la, err);
  if (!rc) rc = kvbm_index_snapshot(s->wr.twin, &b, &lb, err);
  if (!rc) {
    s->res->restart_equal = la == lb && !memcmp(a, b, la);
    s->res->snapshot_bytes = lb;
  }
  free(a);
  free(b);
  return rc;
}

static int run_policy(sim *s, enum policy p, kvsim_w3_policy *pol, kvbm_error *err) {
  int rc = sim_setup(s, p, err);
  double t0 = kvbm_clock_seconds();
  for (size_t i = 0; i < s->n && !rc; i++) {
    if (p == P_KV && s->o->restart_at && i == s->o->restart_at && (rc = restart(s, err))) break;
    const kvsim_trace_request *r = kvsim_trace_get(s->trace, i);
    kvsim_trace_prompt_tokens(r, s->prompt);
    uint32_t w;
    if ((rc = choose(s, p, i, r, &w, err))) break;
    if ((rc = run_on(s, w, r, i, pol, err))) break;
    if (p == P_KV) {
      double t1 = kvbm_clock_seconds();
      rc = flush(&s->wr, &s->cap[w], w, s->idx, &s->res->index_seconds, s->o, err);
      s->res->wire_seconds += kvbm_clock_seconds() - t1;
    }
    if (s->o->progress && i % 256 == 255)
      s->o->progress(s->o->progress_user, (size_t)p * s->n + i + 1, 4 * s->n);
  }
  pol->seconds = kvbm_clock_seconds() - t0;
  if (!rc && p == P_KV && s->res->restarted) rc = compare_twin(s, err);
  if (p == P_KV) {
    s->res->events = s->wr.events;
    s->res->event_bytes = s->wr.bytes;
  }
  sim_free(s);
  return rc;
}

int kvsim_w3_run(const kvsim_trace *trace, const kvsim_w3_config *o, kvsim_w3_result *out,
                kvbm_error *err) {
  if (!trace || !o || !out) return kvbm_error_set(err, KVBM_EINVAL, "w3: NULL argument");
  if (o->workers < 1 || o->workers > KVBM_ROUTER_MAX_WORKERS)
    return kvbm_error_set(err, KVBM_EINVAL, "w3: %u workers is not in 1..%d", o->workers,
                          KVBM_ROUTER_MAX_WORKERS);
  if (!isfinite(o->active_ms) || o->active_ms < 0)
    return kvbm_error_set(err, KVBM_EINVAL, "w3: active_ms %g is not a finite number >= 0",
                          o->active_ms);
  int rc = kvbm_choice_config_check(&o->choice, err);
  if (rc) return rc;
  sim s = {.trace = trace, .o = o};
  s.n = kvsim_trace_count(trace);
  if (o->limit && o->limit < s.n) s.n = o->limit;
  /* A request no worker can hold is refused before buffers are sized by it. */
  rc = kvsim_trace_check_fit(trace, s.n, o->block_size, o->capacity, err);
  if (rc) return rc;
  size_t max_in, max_out;
  kvsim_trace_max_lengths(trace, s.n, &max_in, &max_out);
  s.max_blocks = max_in / (o->block_size ? o->block_size : 1) + 1;
  s.prompt = malloc(max_in * sizeof *s.prompt);
  s.output = malloc(max_out * sizeof *s.output);
  s.wh = malloc(s.max_blocks * sizeof *s.wh);
  s.ih = malloc(s.max_blocks * sizeof *s.ih);
  kvsim_w3_result res = {0};
  s.res = &res;
  if (!s.prompt || !s.output || !s.wh || !s.ih)
    rc = kvbm_error_set(err, KVBM_ENOMEM, "w3: out of memory");
  if (!rc) rc = run_policy(&s, P_KV, &res.kv_aware, err);
  if (!rc) rc = run_policy(&s, P_RANDOM, &res.random, err);
  if (!rc) rc = run_policy(&s, P_RR, &res.round_robin, err);
  if (!rc) rc = run_policy(&s, P_IDEAL, &res.ideal, err);
  free(s.prompt);
  free(s.output);
  free(s.wh);
  free(s.ih);
  if (!rc) *out = res;
  return rc;
}
