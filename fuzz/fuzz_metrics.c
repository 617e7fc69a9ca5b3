/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_metrics.c: libFuzzer target for the metrics writer and renderer
 * (kvbm/metrics.h): collectors that write whatever the input says.
 * fuzz-modules: common service metrics
 *
 * The input is read as a program: each step takes an opcode byte and NUL-
 * separated strings (family names, help texts, label names and values of
 * any bytes) and numbers, and announces a family or writes a counter,
 * gauge or histogram sample. Beyond "no crash, no leak, no UB": the page
 * is well formed whatever was written: every line ends in a newline, is a
 * "# HELP"/"# TYPE" line or a sample whose name is a valid metric name,
 * each family is typed once, label values are quoted with only \\, \" and
 * \n escapes, everything is valid UTF-8, and a second render gives the
 * same page but for the registry's own error counter.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/metrics.h"
#include "metrics/internal.h"

typedef struct prog {
  const uint8_t *p;
  size_t n;
} prog;

static uint8_t byte(prog *g) {
  if (!g->n) return 0;
  g->n--;
  return *g->p++;
}

/* A string of the input up to a NUL (at most 64 bytes), copied to buf. */
static const char *str(prog *g, char *buf) {
  size_t k = 0;
  while (g->n && k < 64) {
    uint8_t c = byte(g);
    if (!c) break;
    buf[k++] = (char)c;
  }
  buf[k] = 0;
  return buf;
}

static void collect(void *user, kvbm_metrics_writer *w) {
  prog g = *(prog *)user;
  char a[65], b[65], ln[4][65], lv[4][65];
  while (g.n) {
    uint8_t op = byte(&g);
    kvbm_metric_label l[4];
    size_t nl = byte(&g) % 5;
    for (size_t i = 0; i < nl; i++) l[i] = (kvbm_metric_label){str(&g, ln[i]), str(&g, lv[i])};
    switch (op % 6) {
      case 0:
        kvbm_metrics_family(w, str(&g, a), (kvbm_metric_type)(byte(&g) % 4), str(&g, b));
        break;
      case 1:
        kvbm_metrics_value_u64(w, l, nl, (uint64_t)byte(&g) << (byte(&g) % 57));
        break;
      case 2: {
        double v;
        uint8_t raw[8] = {0};
        for (int i = 0; i < 8; i++) raw[i] = byte(&g);
        memcpy(&v, raw, 8);
        kvbm_metrics_value(w, l, nl, v);
        break;
      }
      case 3: {
        kvbm_histogram h;
        kvbm_histogram_init_exponential(&h, 1e-3 * (1 + byte(&g)), 1.5 + byte(&g) % 4,
                                        1 + byte(&g) % KVBM_HISTOGRAM_MAX_BOUNDS, NULL);
        for (int i = byte(&g) % 8; i > 0; i--) kvbm_histogram_observe(&h, byte(&g) * 0.01);
        if (byte(&g) == 0xff) h.count++; /* an inconsistent one: refused */
        kvbm_metrics_histogram_value(w, l, nl, &h);
        break;
      }
      case 4:
        kvbm_metrics_counter(w, str(&g, a), str(&g, b), l, nl, byte(&g));
        break;
      default:
        kvbm_metrics_gauge(w, str(&g, a), NULL, l, nl, byte(&g) - 128.0);
        break;
    }
  }
}

static bool name_char(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
         (!first && c >= '0' && c <= '9');
}

/* Well-formed UTF-8 (the renderer's promise): decodes every sequence. */
static void check_utf8(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    size_t k = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!k || i + k > n) abort();
    for (size_t j = 1; j < k; j++)
      if ((s[i + j] & 0xc0) != 0x80) abort();
    if (c == 0xe0 && s[i + 1] < 0xa0) abort();
    if (c == 0xed && s[i + 1] >= 0xa0) abort();
    if (c == 0xf0 && s[i + 1] < 0x90) abort();
    if (c == 0xf4 && s[i + 1] >= 0x90) abort();
    i += k;
  }
}

static void check_page(const char *t, size_t len) {
  if (strlen(t) != len || (len && t[len - 1] != '\n')) abort();
  check_utf8((const unsigned char *)t, len);
  for (const char *p = t; *p;) {
    const char *nl = strchr(p, '\n');
    if (!nl) abort();
    if (!strncmp(p, "# HELP ", 7) || !strncmp(p, "# TYPE ", 7)) {
      const char *q = p + 7;
      if (!name_char(*q, true)) abort();
      while (name_char(*q, false)) q++;
      if (*q != ' ') abort();
      if (p[2] == 'T' && strncmp(q + 1, "counter\n", 8) && strncmp(q + 1, "gauge\n", 6) &&
          strncmp(q + 1, "histogram\n", 10))
        abort();
      if (p[2] == 'H') {
        for (q++; q < nl; q++) {
          if (*q != '\\') continue;
          if (q[1] != '\\' && q[1] != 'n') abort();
          q++;
        }
      }
    } else {
      const char *q = p;
      if (!name_char(*q, true)) abort();
      while (name_char(*q, false)) q++;
      if (*q == '{') {
        for (q++; *q != '}';) {
          if (!name_char(*q, true) || *q == ':') abort();
          while (name_char(*q, false) && *q != ':') q++;
          if (q[0] != '=' || q[1] != '"') abort();
          for (q += 2; *q != '"'; q++) {
            if (*q == '\n' || !*q) abort();
            if (*q == '\\') {
              if (q[1] != '\\' && q[1] != '"' && q[1] != 'n') abort();
              q++;
            }
          }
          q++;
          if (*q == ',') q++;
          else if (*q != '}') abort();
        }
        q++;
      }
      if (*q != ' ' || q + 1 >= nl) abort();
    }
    p = nl + 1;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  prog g = {data, size};
  kvbm_metrics *r;
  if (kvbm_metrics_create(&r, NULL)) return 0;
  kvbm_metrics_register(r, collect, &g, NULL, 0, NULL, NULL);
  char *t1 = NULL, *t2 = NULL;
  size_t n1 = 0, n2 = 0;
  if (!kvbm_metrics_render(r, &t1, &n1, NULL)) {
    check_page(t1, n1);
    if (!kvbm_metrics_render(r, &t2, &n2, NULL)) {
      check_page(t2, n2);
      /* the same page, but for the cumulative error counter at the end */
      const char *e1 = strstr(t1, "# HELP kvbm_metrics_errors_total");
      const char *e2 = strstr(t2, "# HELP kvbm_metrics_errors_total");
      if (!e1 || !e2 || e1 - t1 != e2 - t2 || memcmp(t1, t2, (size_t)(e1 - t1))) abort();
    }
  }
  kvbm_metrics_text_free(t1);
  kvbm_metrics_text_free(t2);
  kvbm_metrics_destroy(r);
  return 0;
}
