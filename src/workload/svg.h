/* SPDX-License-Identifier: Apache-2.0 */
/*
 * workload/svg.h: a small SVG line-chart writer (the policy simulator's
 * capacity curves), with no dependency beyond stdio.
 *
 * A chart has up to KVSIM_SVG_MAX_SERIES named series of (x, y) points on
 * shared axes: x linear or log10, y linear; ticks at round values, a
 * legend, a title. Every text is XML-escaped. The chart keeps pointers to
 * the caller's names and arrays until it is written.
 */
#ifndef KVSIM_WORKLOAD_SVG_H
#define KVSIM_WORKLOAD_SVG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "kvbm/status.h"

#define KVSIM_SVG_MAX_SERIES 16

typedef struct kvsim_svg_series {
  const char *name;
  const double *x, *y;
  size_t n;
} kvsim_svg_series;

typedef struct kvsim_svg_chart {
  const char *title, *x_label, *y_label;
  bool x_log;
  int width, height; /* pixels (720 x 460) */
  kvsim_svg_series series[KVSIM_SVG_MAX_SERIES];
  size_t nseries;
} kvsim_svg_chart;

void kvsim_svg_chart_init(kvsim_svg_chart *c);

/* Adds a series; false when the chart is full. */
bool kvsim_svg_chart_add(kvsim_svg_chart *c, const char *name, const double *x, const double *y,
                        size_t n);

/* Writes the chart to a stream or to a file (created or truncated).
 * KVBM_EINVAL when there is nothing to draw or a log axis has x <= 0 or a
 * value is not finite; KVBM_EIO when the file cannot be written. */
int kvsim_svg_chart_print(const kvsim_svg_chart *c, FILE *f, kvbm_error *err);
int kvsim_svg_chart_write(const kvsim_svg_chart *c, const char *path, kvbm_error *err);

#endif
