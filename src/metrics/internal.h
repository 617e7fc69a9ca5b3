/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics/internal.h: what the metrics module's files share (private to
 * src/metrics/): a growable text buffer and the exposition format's
 * lexical rules.
 */
#ifndef KVBM_METRICS_INTERNAL_H
#define KVBM_METRICS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/metrics.h"

/* A growable byte buffer. An allocation failure sets oom and makes every
 * later append a no-op, so a writer checks once at the end. */
typedef struct kvbm__mbuf {
  char *p;
  size_t len, cap;
  bool oom;
} kvbm__mbuf;

void kvbm__mbuf_put(kvbm__mbuf *b, const char *s, size_t n);
void kvbm__mbuf_puts(kvbm__mbuf *b, const char *s);
void kvbm__mbuf_u64(kvbm__mbuf *b, uint64_t v);
/* A float as Prometheus reads it: the shortest text that reads back to the
 * same double, "NaN", "+Inf", "-Inf". */
void kvbm__mbuf_double(kvbm__mbuf *b, double v);
/* Text with \ and newline escaped, and " too when `quoted` (a label
 * value); bytes that are not UTF-8 become U+FFFD. */
void kvbm__mbuf_escaped(kvbm__mbuf *b, const char *s, bool quoted);
void kvbm__mbuf_free(kvbm__mbuf *b);

/* [a-zA-Z_:][a-zA-Z0-9_:]*, at most KVBM_METRICS_MAX_NAME bytes. */
bool kvbm__metric_name_ok(const char *s);
/* [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__", at most
 * KVBM_METRICS_MAX_NAME bytes. */
bool kvbm__label_name_ok(const char *s);

#endif
