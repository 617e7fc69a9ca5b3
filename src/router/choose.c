/* SPDX-License-Identifier: Apache-2.0 */
/*
 * choose.c: from overlaps and load to one worker (see kvbm/router.h).
 *
 * The cost is Dynamo's shape: blocks the worker would have to prefill
 * (what its cached prefix does not cover, with host and disk blocks only
 * partly covering, by their weights) plus its load. It is a pure function
 * of its inputs and of the caller's generator state, so a simulation that
 * feeds it the same overlaps makes the same choices: that is what lets W3
 * compare the event-fed router with the ideal one decision by decision.
 *
 * Temperature: costs are first scaled to [0, 1] (the cheapest 0, the
 * dearest 1), so one temperature means the same across request sizes;
 * then p(s) ~ exp(-x(s) / temperature).
 */
#include <math.h>

#include "kvbm/router.h"

kvbm_choice_config kvbm_choice_config_default(void) {
  return (kvbm_choice_config){.tier_weight = {1.0, 0.75, 0.25, 0.1},
                              .prefill_weight = 1.0,
                              .load_weight = 1.0,
                              .load_kind = KVBM_LOAD_BLOCKS,
                              .temperature = 0.0};
}

static bool bad(double x) { return !isfinite(x) || x < 0; }

int kvbm_choice_config_check(const kvbm_choice_config *c, kvbm_error *err) {
  if (!c) return kvbm_error_set(err, KVBM_EINVAL, "router: NULL choice config");
  static const char *tn[] = {"G1 (device)", "G2 (host)", "G3 (disk)", "G4 (remote)"};
  for (int t = 0; t < KVBM_TIER_COUNT; t++)
    if (bad(c->tier_weight[t]))
      return kvbm_error_set(err, KVBM_EINVAL, "router: %s tier weight %g is not a finite number >= 0",
                            tn[t], c->tier_weight[t]);
  if (bad(c->prefill_weight))
    return kvbm_error_set(err, KVBM_EINVAL, "router: prefill weight %g is not a finite number >= 0",
                          c->prefill_weight);
  if (bad(c->load_weight))
    return kvbm_error_set(err, KVBM_EINVAL, "router: load weight %g is not a finite number >= 0",
                          c->load_weight);
  if (bad(c->temperature))
    return kvbm_error_set(err, KVBM_EINVAL, "router: temperature %g is not a finite number >= 0",
                          c->temperature);
  if (c->load_kind != KVBM_LOAD_BLOCKS && c->load_kind != KVBM_LOAD_REQUESTS)
    return kvbm_error_set(err, KVBM_EINVAL, "router: unknown load kind %d", (int)c->load_kind);
  return KVBM_OK;
}

double kvbm_overlap_score(const kvbm_choice_config *c, const kvbm_overlap *ov) {
  double d = ov->prefix[0], h = ov->prefix[1], k = ov->prefix[2], r = ov->prefix[3];
  return c->tier_weight[0] * d + c->tier_weight[1] * (h - d) + c->tier_weight[2] * (k - h) +
         c->tier_weight[3] * (r - k);
}

uint64_t kvbm_router_rand(uint64_t *s) {
  uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

static double unit(uint64_t *rng) { return (double)(kvbm_router_rand(rng) >> 11) * 0x1.0p-53; }

int kvbm_choose(const kvbm_choice_config *c, size_t n_blocks, const kvbm_overlap *ov,
                const double *load, uint64_t cand, uint64_t *rng, kvbm_choice *out) {
  if (!c || !ov || !rng || !out) return KVBM_EINVAL;
  if (!cand) return KVBM_ENOTFOUND;
  double cost[KVBM_ROUTER_MAX_WORKERS], lo = INFINITY, hi = -INFINITY;
  for (uint64_t m = cand; m; m &= m - 1) {
    int s = __builtin_ctzll(m);
    double x = c->prefill_weight * ((double)n_blocks - kvbm_overlap_score(c, &ov[s]));
    if (load) x += c->load_weight * load[s];
    cost[s] = x;
    if (x < lo) lo = x;
    if (x > hi) hi = x;
  }
  uint32_t ties = 0;
  int pick = -1;
  double eps = 1e-9 * (fabs(lo) > 1 ? fabs(lo) : 1);
  for (uint64_t m = cand; m; m &= m - 1) {
    int s = __builtin_ctzll(m);
    /* reservoir sampling: each tied slot wins with probability 1/ties */
    if (cost[s] - lo <= eps && kvbm_router_rand(rng) % ++ties == 0) pick = s;
  }
  if (c->temperature > 0 && hi - lo > eps) {
    double w[KVBM_ROUTER_MAX_WORKERS], sum = 0;
    for (uint64_t m = cand; m; m &= m - 1) {
      int s = __builtin_ctzll(m);
      w[s] = exp(-((cost[s] - lo) / (hi - lo)) / c->temperature);
      sum += w[s];
    }
    double r = unit(rng) * sum;
    for (uint64_t m = cand; m; m &= m - 1) {
      int s = __builtin_ctzll(m);
      pick = s;
      if ((r -= w[s]) < 0) break;
    }
  }
  out->slot = (uint32_t)pick;
  out->cost = cost[pick];
  out->ties = ties;
  return KVBM_OK;
}
