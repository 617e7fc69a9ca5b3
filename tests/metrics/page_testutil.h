/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers for tests that read a rendered metrics page: a series' value,
 * and the check that every family on it is in the table of
 * docs/areas/observability.md. */
#ifndef KVBM_PAGE_TESTUTIL_H
#define KVBM_PAGE_TESTUTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/metrics.h"

/* The value of one series ("name{labels}" as written), or NAN. */
static inline double page_value(const char *page, const char *series) {
  size_t n = strlen(series);
  for (const char *p = page; (p = strstr(p, series)); p++)
    if ((p == page || p[-1] == '\n') && p[n] == ' ') return strtod(p + n + 1, NULL);
  return NAN;
}

/* Renders reg; the caller frees with kvbm_metrics_text_free. */
static inline char *page_render(kvbm_metrics *reg) {
  char *t = NULL;
  if (kvbm_metrics_render(reg, &t, NULL, NULL)) return NULL;
  return t;
}

/* The first family on the page that docs/areas/observability.md does not
 * list (in *missing, up to cap bytes); false when every one is listed. */
static inline bool page_undocumented(const char *page, char *missing, size_t cap) {
  FILE *f = fopen(KVBM_SOURCE_DIR "/docs/areas/observability.md", "r");
  if (!f) {
    snprintf(missing, cap, "(cannot read docs/areas/observability.md)");
    return true;
  }
  static char doc[1 << 18];
  size_t n = fread(doc, 1, sizeof doc - 1, f);
  doc[n] = 0;
  fclose(f);
  for (const char *p = page; (p = strstr(p, "# TYPE ")); p++) {
    if (p != page && p[-1] != '\n') continue;
    char name[256], row[300];
    if (sscanf(p + 7, "%255s", name) != 1) continue;
    snprintf(row, sizeof row, "| `%s` |", name);
    if (!strstr(doc, row)) {
      snprintf(missing, cap, "%s", name);
      return true;
    }
  }
  return false;
}

#endif
