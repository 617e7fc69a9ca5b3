/* SPDX-License-Identifier: Apache-2.0 */
/*
 * histogram.c: Prometheus-style histograms as plain values (see
 * kvbm/metrics.h).
 *
 * A histogram lives inside its owner's counters and is guarded the same
 * way they are (the manager's lock, the router's one HTTP thread), so it
 * needs no atomics of its own: a collector copies it with the rest of the
 * owner's counters in one snapshot, and the copy is consistent (the count
 * equals the sum of the buckets) by construction. Buckets are stored per
 * interval, not cumulatively, so an observation touches one bucket; the
 * writer accumulates them when it writes the page.
 */
#include <math.h>
#include <string.h>

#include "metrics/internal.h"

int kvbm_histogram_init(kvbm_histogram *h, const double *bounds, size_t n, kvbm_error *err) {
  if (!h) return kvbm_error_set(err, KVBM_EINVAL, "histogram: NULL histogram");
  memset(h, 0, sizeof *h);
  if (!bounds || n == 0 || n > KVBM_HISTOGRAM_MAX_BOUNDS)
    return kvbm_error_set(err, KVBM_EINVAL, "histogram: %zu bounds (1..%d allowed)", n,
                          KVBM_HISTOGRAM_MAX_BOUNDS);
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(bounds[i]))
      return kvbm_error_set(err, KVBM_EINVAL, "histogram: bound %zu is not finite", i);
    if (i && !(bounds[i] > bounds[i - 1]))
      return kvbm_error_set(err, KVBM_EINVAL, "histogram: bound %zu (%g) is not above bound %zu (%g)",
                            i, bounds[i], i - 1, bounds[i - 1]);
  }
  memcpy(h->bounds, bounds, n * sizeof *bounds);
  h->num_bounds = (uint32_t)n;
  return KVBM_OK;
}

int kvbm_histogram_init_exponential(kvbm_histogram *h, double first, double factor, size_t n,
                                    kvbm_error *err) {
  if (!(first > 0) || !isfinite(first) || !(factor > 1) || !isfinite(factor)) {
    if (h) memset(h, 0, sizeof *h);
    return kvbm_error_set(err, KVBM_EINVAL,
                          "histogram: exponential bounds need first > 0 and factor > 1");
  }
  double b[KVBM_HISTOGRAM_MAX_BOUNDS];
  size_t m = n < KVBM_HISTOGRAM_MAX_BOUNDS ? n : KVBM_HISTOGRAM_MAX_BOUNDS;
  double v = first;
  for (size_t i = 0; i < m; i++, v *= factor) b[i] = v;
  if (n > KVBM_HISTOGRAM_MAX_BOUNDS) m = n; /* let init say it */
  return kvbm_histogram_init(h, b, m, err);
}

void kvbm_histogram_observe(kvbm_histogram *h, double v) {
  if (!h || isnan(v)) return;
  /* the first bound >= v (binary search; the "+Inf" bucket past them) */
  uint32_t lo = 0, hi = h->num_bounds;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (v <= h->bounds[mid]) hi = mid;
    else lo = mid + 1;
  }
  h->buckets[lo]++;
  h->count++;
  h->sum += v;
}
