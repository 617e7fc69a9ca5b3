/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_metrics.c: the registry, the writer and the page (kvbm/metrics.h).
 *
 * The page is checked by a strict reader of the text format written here
 * (every line a comment of the known kinds or a sample of the family whose
 * TYPE came last; each family once; no series twice; histograms cumulative
 * with +Inf equal to _count), by exact expected text where the spelling
 * matters, and by Prometheus' own parser (promtool check metrics) on a page
 * full of hostile labels.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvbm/metrics.h"

/* ------------------------------------------------------ a strict reader */

/* Checks the whole page; returns the number of sample lines, or fails the
 * test naming the line. */
static size_t check_page(const char *page) {
  char fam[64][256];
  size_t nfam = 0;
  char series[512][512];
  size_t nser = 0, samples = 0;
  char cur[256] = "", curtype[16] = "";
  const char *p = page;
  int lineno = 0;
  while (*p) {
    const char *nl = strchr(p, '\n');
    assert_non_null(nl); /* every line ends with a newline */
    char line[2048];
    size_t n = (size_t)(nl - p);
    assert_true(n < sizeof line);
    memcpy(line, p, n);
    line[n] = 0;
    p = nl + 1;
    lineno++;
    if (!strncmp(line, "# HELP ", 7)) {
      char name[256];
      assert_int_equal(sscanf(line + 7, "%255s", name), 1);
      for (size_t i = 0; i < nfam; i++) assert_string_not_equal(fam[i], name);
      continue;
    }
    if (!strncmp(line, "# TYPE ", 7)) {
      assert_int_equal(sscanf(line + 7, "%255s %15s", cur, curtype), 2);
      for (size_t i = 0; i < nfam; i++) assert_string_not_equal(fam[i], cur);
      assert_true(nfam < 64);
      strcpy(fam[nfam++], cur);
      assert_true(!strcmp(curtype, "counter") || !strcmp(curtype, "gauge") ||
                  !strcmp(curtype, "histogram"));
      continue;
    }
    assert_true(line[0] != '#');
    /* name{labels} value */
    size_t i = 0;
    while (line[i] && line[i] != '{' && line[i] != ' ') i++;
    char name[256];
    memcpy(name, line, i);
    name[i] = 0;
    assert_true(cur[0]);
    if (!strcmp(curtype, "histogram")) {
      size_t cl = strlen(cur);
      assert_true(!strncmp(name, cur, cl));
      assert_true(!strcmp(name + cl, "_bucket") || !strcmp(name + cl, "_sum") ||
                  !strcmp(name + cl, "_count"));
    } else {
      assert_string_equal(name, cur);
    }
    size_t j = i;
    if (line[j] == '{') {
      bool inq = false;
      for (j++; line[j] && (inq || line[j] != '}'); j++) {
        if (inq && line[j] == '\\') {
          j++;
          assert_true(line[j] == '\\' || line[j] == '"' || line[j] == 'n');
        } else if (line[j] == '"') {
          inq = !inq;
        }
      }
      assert_int_equal(line[j], '}');
      j++;
    }
    assert_int_equal(line[j], ' ');
    char *end;
    const char *v = line + j + 1;
    if (strcmp(v, "NaN") && strcmp(v, "+Inf") && strcmp(v, "-Inf")) {
      strtod(v, &end);
      assert_true(end != v && *end == 0);
    }
    /* series (name + labels) once */
    char key[512];
    snprintf(key, sizeof key, "%.*s", (int)j, line);
    for (size_t k = 0; k < nser; k++) assert_string_not_equal(series[k], key);
    assert_true(nser < 512);
    strcpy(series[nser++], key);
    samples++;
  }
  (void)lineno;
  return samples;
}

static char *render(kvbm_metrics *r) {
  char *t = NULL;
  size_t len = 0;
  kvbm_error err = {0};
  assert_int_equal(kvbm_metrics_render(r, &t, &len, &err), KVBM_OK);
  assert_int_equal(strlen(t), len);
  check_page(t);
  return t;
}

/* The value of a series ("name{labels}" as written), or NAN. */
static double value_of(const char *page, const char *series) {
  size_t n = strlen(series);
  for (const char *p = page; (p = strstr(p, series)); p++) {
    if ((p == page || p[-1] == '\n') && p[n] == ' ') return strtod(p + n + 1, NULL);
  }
  return NAN;
}

/* --------------------------------------------------------- collectors */

typedef struct demo {
  uint64_t hits;
  double temp;
  kvbm_histogram h;
} demo;

static void demo_collect(void *user, kvbm_metrics_writer *w) {
  demo *d = user;
  kvbm_metrics_family(w, "demo_hits_total", KVBM_METRIC_COUNTER, "Hits, by tier");
  kvbm_metrics_value_u64(w, (kvbm_metric_label[]){{"tier", "G1"}}, 1, d->hits);
  kvbm_metrics_value_u64(w, (kvbm_metric_label[]){{"tier", "G2"}}, 1, d->hits * 2);
  kvbm_metrics_gauge(w, "demo_temp", "A gauge", NULL, 0, d->temp);
  kvbm_metrics_family(w, "demo_seconds", KVBM_METRIC_HISTOGRAM, "Latency");
  kvbm_metrics_histogram_value(w, NULL, 0, &d->h);
}

static void test_page_basic(void **state) {
  (void)state;
  kvbm_metrics *r;
  assert_int_equal(kvbm_metrics_create(&r, NULL), KVBM_OK);
  demo d = {.hits = 5, .temp = 0.1};
  assert_int_equal(kvbm_histogram_init(&d.h, (double[]){0.001, 0.01, 0.1}, 3, NULL), KVBM_OK);
  kvbm_histogram_observe(&d.h, 0.0005);
  kvbm_histogram_observe(&d.h, 0.01); /* on a bound: counts in that bucket */
  kvbm_histogram_observe(&d.h, 5);
  kvbm_histogram_observe(&d.h, NAN); /* ignored */
  assert_int_equal(kvbm_metrics_register(r, demo_collect, &d, NULL, 0, NULL, NULL), KVBM_OK);
  char *t = render(r);
  const char *want =
      "# HELP demo_hits_total Hits, by tier\n"
      "# TYPE demo_hits_total counter\n"
      "demo_hits_total{tier=\"G1\"} 5\n"
      "demo_hits_total{tier=\"G2\"} 10\n"
      "# HELP demo_temp A gauge\n"
      "# TYPE demo_temp gauge\n"
      "demo_temp 0.1\n"
      "# HELP demo_seconds Latency\n"
      "# TYPE demo_seconds histogram\n"
      "demo_seconds_bucket{le=\"0.001\"} 1\n"
      "demo_seconds_bucket{le=\"0.01\"} 2\n"
      "demo_seconds_bucket{le=\"0.1\"} 2\n"
      "demo_seconds_bucket{le=\"+Inf\"} 3\n"
      "demo_seconds_sum 5.0105\n"
      "demo_seconds_count 3\n";
  assert_true(!strncmp(t, want, strlen(want)));
  /* the registry's own counter follows, at 0 */
  assert_true(value_of(t, "kvbm_metrics_errors_total") == 0);
  kvbm_metrics_text_free(t);
  kvbm_metrics_destroy(r);
}

/* Two collectors writing one family (two managers in one process, told
 * apart by constant labels): one HELP/TYPE, the samples together, labels
 * sorted by name. */
static void test_merge_and_constant_labels(void **state) {
  (void)state;
  kvbm_metrics *r;
  assert_int_equal(kvbm_metrics_create(&r, NULL), KVBM_OK);
  demo a = {.hits = 1}, b = {.hits = 7};
  kvbm_histogram_init_exponential(&a.h, 1, 2, 4, NULL);
  kvbm_histogram_init_exponential(&b.h, 1, 2, 4, NULL);
  uint64_t ida, idb;
  assert_int_equal(kvbm_metrics_register(r, demo_collect, &a, (kvbm_metric_label[]){{"worker", "a"}},
                                         1, &ida, NULL), KVBM_OK);
  assert_int_equal(kvbm_metrics_register(r, demo_collect, &b, (kvbm_metric_label[]){{"worker", "b"}},
                                         1, &idb, NULL), KVBM_OK);
  char *t = render(r);
  const char *first = strstr(t, "# TYPE demo_hits_total counter\n");
  assert_non_null(first);
  assert_null(strstr(first + 1, "# TYPE demo_hits_total"));
  assert_true(value_of(t, "demo_hits_total{tier=\"G2\",worker=\"b\"}") == 14);
  assert_true(value_of(t, "demo_hits_total{tier=\"G1\",worker=\"a\"}") == 1);
  /* a's and b's hits are adjacent: the family's samples are together */
  const char *s1 = strstr(t, "demo_hits_total{tier=\"G1\",worker=\"a\"}");
  const char *s4 = strstr(t, "demo_hits_total{tier=\"G2\",worker=\"b\"}");
  assert_true(s1 && s4 && s1 < s4 && !memchr(s1, '#', (size_t)(s4 - s1)));
  assert_true(value_of(t, "demo_seconds_count{worker=\"b\"}") == 0);
  kvbm_metrics_text_free(t);
  /* unregistered: gone */
  assert_int_equal(kvbm_metrics_unregister(r, ida), KVBM_OK);
  assert_int_equal(kvbm_metrics_unregister(r, ida), KVBM_ENOTFOUND);
  t = render(r);
  assert_null(strstr(t, "worker=\"a\""));
  assert_non_null(strstr(t, "worker=\"b\""));
  kvbm_metrics_text_free(t);
  kvbm_metrics_destroy(r);
}

/* ------------------------------------------------------------ hostile */

static void hostile_collect(void *user, kvbm_metrics_writer *w) {
  (void)user;
  /* escaping: backslash, quote, newline, bytes that are not UTF-8, and
   * good UTF-8 kept */
  kvbm_metrics_family(w, "x_total", KVBM_METRIC_COUNTER, "help with \\ and\nnewline");
  kvbm_metrics_value_u64(w, (kvbm_metric_label[]){{"v", "a\\b\"c\nd"}}, 1, 1);
  kvbm_metrics_value_u64(w, (kvbm_metric_label[]){{"v", "bad\xff\xc0\x80utf\xe2\x82"}}, 1, 2);
  kvbm_metrics_value_u64(w, (kvbm_metric_label[]){{"v", "caf\xc3\xa9 \xf0\x9f\x98\x80"}}, 1, 3);
  kvbm_metrics_value_u64(w, (kvbm_metric_label[]){{"v", ""}}, 1, 4);
  /* refused, each counted: */
  kvbm_metrics_value_u64(w, (kvbm_metric_label[]){{"v", ""}}, 1, 5);           /* duplicate */
  kvbm_metrics_value_u64(w, (kvbm_metric_label[]){{"9v", "x"}}, 1, 6);         /* label name */
  kvbm_metrics_value_u64(w, (kvbm_metric_label[]){{"__v", "x"}}, 1, 7);        /* reserved */
  kvbm_metrics_value_u64(w, (kvbm_metric_label[]){{"v", "x"}, {"v", "y"}}, 2, 8); /* twice */
  kvbm_metrics_value(w, (kvbm_metric_label[]){{"v", "neg"}}, 1, -1);          /* negative */
  kvbm_metrics_value(w, (kvbm_metric_label[]){{"v", "nan"}}, 1, NAN);         /* NaN counter */
  kvbm_metrics_family(w, "1bad", KVBM_METRIC_GAUGE, NULL);                    /* name */
  kvbm_metrics_value(w, NULL, 0, 1);                                          /* no family */
  kvbm_metrics_family(w, "x_total", KVBM_METRIC_GAUGE, NULL);                 /* type conflict */
  kvbm_metrics_value(w, NULL, 0, 1);
  kvbm_metrics_family(w, "h_seconds", KVBM_METRIC_HISTOGRAM, "h");
  kvbm_histogram h;
  kvbm_histogram_init(&h, (double[]){1}, 1, NULL);
  kvbm_histogram_observe(&h, 0.5);
  kvbm_metrics_histogram_value(w, (kvbm_metric_label[]){{"le", "1"}}, 1, &h); /* le */
  h.count++;                                                                  /* inconsistent */
  kvbm_metrics_histogram_value(w, NULL, 0, &h);
  h.count--;
  kvbm_metrics_value(w, NULL, 0, 1); /* a plain value of a histogram */
  kvbm_metrics_histogram_value(w, NULL, 0, &h); /* the good one */
  /* gauges take anything */
  kvbm_metrics_gauge(w, "g", NULL, (kvbm_metric_label[]){{"k", "nan"}}, 1, NAN);
  kvbm_metrics_gauge(w, "g", NULL, (kvbm_metric_label[]){{"k", "inf"}}, 1, -INFINITY);
  kvbm_metrics_gauge(w, "g", NULL, (kvbm_metric_label[]){{"k", "big"}}, 1, 1e300);
  kvbm_metrics_gauge(w, "g", NULL, (kvbm_metric_label[]){{"k", "tiny"}}, 1, 1e-7);
  kvbm_metrics_counter(w, "u_total", NULL, NULL, 0, UINT64_MAX);
}

#define HOSTILE_REFUSED 13

static void test_hostile(void **state) {
  (void)state;
  kvbm_metrics *r;
  assert_int_equal(kvbm_metrics_create(&r, NULL), KVBM_OK);
  assert_int_equal(kvbm_metrics_register(r, hostile_collect, NULL, NULL, 0, NULL, NULL), KVBM_OK);
  char *t = render(r);
  assert_non_null(strstr(t, "# HELP x_total help with \\\\ and\\nnewline\n"));
  assert_non_null(strstr(t, "x_total{v=\"a\\\\b\\\"c\\nd\"} 1\n"));
  assert_non_null(strstr(t, "x_total{v=\"bad\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdutf\xef\xbf\xbd\xef\xbf\xbd\"} 2\n"));
  assert_non_null(strstr(t, "x_total{v=\"caf\xc3\xa9 \xf0\x9f\x98\x80\"} 3\n"));
  assert_non_null(strstr(t, "x_total{v=\"\"} 4\n"));
  assert_null(strstr(t, "} 5\n"));
  assert_null(strstr(t, "1bad"));
  assert_non_null(strstr(t, "h_seconds_bucket{le=\"1\"} 1\nh_seconds_bucket{le=\"+Inf\"} 1\n"
                            "h_seconds_sum 0.5\nh_seconds_count 1\n"));
  assert_non_null(strstr(t, "g{k=\"nan\"} NaN\n"));
  assert_non_null(strstr(t, "g{k=\"inf\"} -Inf\n"));
  assert_non_null(strstr(t, "g{k=\"big\"} 1e+300\n"));
  assert_non_null(strstr(t, "g{k=\"tiny\"} 1e-07\n"));
  assert_non_null(strstr(t, "u_total 18446744073709551615\n"));
  assert_true(value_of(t, "kvbm_metrics_errors_total") == HOSTILE_REFUSED);
  char why[256];
  kvbm_metrics_last_error(r, why, sizeof why);
  assert_non_null(strstr(why, "x_total"));
  assert_non_null(strstr(why, "written twice"));
  /* the count is cumulative */
  kvbm_metrics_text_free(t);
  t = render(r);
  assert_true(value_of(t, "kvbm_metrics_errors_total") == 2 * HOSTILE_REFUSED);

  /* Prometheus' own parser takes the page (lint remarks are not errors:
   * exit status 3; a parse error is 1) */
  char path[] = "/tmp/kvbm_metrics_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, t, strlen(t)), (ssize_t)strlen(t));
  close(fd);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "promtool check metrics < %s > %s.out 2>&1", path, path);
  int st = system(cmd);
  char out[300];
  snprintf(out, sizeof out, "%s.out", path);
  FILE *f = fopen(out, "r");
  char msg[4096] = "";
  if (f) {
    size_t n = fread(msg, 1, sizeof msg - 1, f);
    msg[n] = 0;
    fclose(f);
  }
  unlink(out);
  unlink(path);
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 3) fprintf(stderr, "promtool: %s\n", msg);
  assert_true(WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 3);
  assert_null(strstr(msg, "error"));
  kvbm_metrics_text_free(t);
  kvbm_metrics_destroy(r);
}

/* Found by fuzz_metrics: a collector writing the registry's own family
 * took its place on the page (its HELP, its value). It is refused. */
static void reserved_collect(void *user, kvbm_metrics_writer *w) {
  (void)user;
  kvbm_metrics_counter(w, "kvbm_metrics_errors_total", "mine", NULL, 0, 777);
}

static void test_reserved_family(void **state) {
  (void)state;
  kvbm_metrics *r;
  assert_int_equal(kvbm_metrics_create(&r, NULL), KVBM_OK);
  assert_int_equal(kvbm_metrics_register(r, reserved_collect, NULL, NULL, 0, NULL, NULL), KVBM_OK);
  char *t = render(r);
  assert_null(strstr(t, "777"));
  assert_null(strstr(t, "mine"));
  assert_true(value_of(t, "kvbm_metrics_errors_total") == 1);
  char why[256];
  kvbm_metrics_last_error(r, why, sizeof why);
  assert_non_null(strstr(why, "registry's own"));
  kvbm_metrics_text_free(t);
  kvbm_metrics_destroy(r);
}

static void test_register_refusals(void **state) {
  (void)state;
  kvbm_metrics *r;
  kvbm_error err = {0};
  assert_int_equal(kvbm_metrics_create(&r, NULL), KVBM_OK);
  assert_int_equal(kvbm_metrics_register(r, NULL, NULL, NULL, 0, NULL, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_metrics_register(r, demo_collect, NULL,
                                         (kvbm_metric_label[]){{"bad-name", "x"}}, 1, NULL, &err),
                   KVBM_EINVAL);
  assert_non_null(strstr(err.msg, "bad-name"));
  assert_int_equal(kvbm_metrics_register(r, demo_collect, NULL, (kvbm_metric_label[]){{"le", "x"}},
                                         1, NULL, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_metrics_register(r, demo_collect, NULL,
                                         (kvbm_metric_label[]){{"a", "x"}, {"a", "y"}}, 2, NULL, &err),
                   KVBM_EINVAL);
  assert_int_equal(kvbm_metrics_register(r, demo_collect, NULL, (kvbm_metric_label[]){{"a", NULL}},
                                         1, NULL, &err), KVBM_EINVAL);
  /* constant labels and sample labels together over the limit: refused */
  kvbm_metric_label many[KVBM_METRICS_MAX_LABELS];
  char names[KVBM_METRICS_MAX_LABELS][8];
  for (int i = 0; i < KVBM_METRICS_MAX_LABELS; i++) {
    snprintf(names[i], sizeof names[i], "l%d", i);
    many[i] = (kvbm_metric_label){names[i], "v"};
  }
  demo d = {0};
  kvbm_histogram_init_exponential(&d.h, 1, 2, 3, NULL);
  assert_int_equal(kvbm_metrics_register(r, demo_collect, &d, many, KVBM_METRICS_MAX_LABELS, NULL,
                                         &err), KVBM_OK);
  char *t = render(r);
  /* demo_hits' samples (one label each) refused; the gauge and the
   * histogram, with the 16 constant labels alone, fit */
  assert_true(value_of(t, "kvbm_metrics_errors_total") == 2);
  assert_null(strstr(t, "demo_hits_total"));
  assert_non_null(strstr(t, "demo_temp{l0=\"v\""));
  kvbm_metrics_text_free(t);
  kvbm_metrics_destroy(r);
}

static void test_histogram_init(void **state) {
  (void)state;
  kvbm_histogram h;
  kvbm_error err = {0};
  assert_int_equal(kvbm_histogram_init(&h, (double[]){1, 1}, 2, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_histogram_init(&h, (double[]){2, 1}, 2, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_histogram_init(&h, (double[]){NAN}, 1, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_histogram_init(&h, (double[]){1}, 0, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_histogram_init_exponential(&h, 0, 2, 3, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_histogram_init_exponential(&h, 1, 1, 3, &err), KVBM_EINVAL);
  assert_int_equal(kvbm_histogram_init_exponential(&h, 1, 2, KVBM_HISTOGRAM_MAX_BOUNDS + 1, &err),
                   KVBM_EINVAL);
  assert_int_equal(kvbm_histogram_init_exponential(&h, 1e-4, 2, KVBM_HISTOGRAM_MAX_BOUNDS, &err),
                   KVBM_OK);
  assert_int_equal(h.num_bounds, KVBM_HISTOGRAM_MAX_BOUNDS);
  /* every value lands in the bucket whose bound is the first >= it */
  for (uint32_t i = 0; i < h.num_bounds; i++) {
    kvbm_histogram_observe(&h, h.bounds[i]);
    assert_int_equal(h.buckets[i], 1);
  }
  kvbm_histogram_observe(&h, INFINITY);
  kvbm_histogram_observe(&h, -INFINITY);
  assert_int_equal(h.buckets[h.num_bounds], 1);
  assert_int_equal(h.buckets[0], 2);
  assert_int_equal(h.count, KVBM_HISTOGRAM_MAX_BOUNDS + 2);
}

/* ------------------------------------------------- unregister vs render */

typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int in_collector, release, unregistered;
} gate;

static void slow_collect(void *user, kvbm_metrics_writer *w) {
  gate *g = user;
  pthread_mutex_lock(&g->mu);
  g->in_collector = 1;
  pthread_cond_broadcast(&g->cv);
  while (!g->release) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  kvbm_metrics_counter(w, "slow_total", NULL, NULL, 0, 1);
}

typedef struct unreg_arg {
  kvbm_metrics *r;
  uint64_t id;
  gate *g;
} unreg_arg;

static void *unreg_thread(void *p) {
  unreg_arg *a = p;
  kvbm_metrics_unregister(a->r, a->id);
  pthread_mutex_lock(&a->g->mu);
  a->g->unregistered = 1;
  pthread_mutex_unlock(&a->g->mu);
  return NULL;
}

static void *render_thread(void *p) {
  char *t = NULL;
  kvbm_metrics_render(p, &t, NULL, NULL);
  kvbm_metrics_text_free(t);
  return NULL;
}

static void test_unregister_waits_for_render(void **state) {
  (void)state;
  kvbm_metrics *r;
  assert_int_equal(kvbm_metrics_create(&r, NULL), KVBM_OK);
  gate g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  uint64_t id;
  assert_int_equal(kvbm_metrics_register(r, slow_collect, &g, NULL, 0, &id, NULL), KVBM_OK);
  pthread_t rt, ut;
  pthread_create(&rt, NULL, render_thread, r);
  pthread_mutex_lock(&g.mu);
  while (!g.in_collector) pthread_cond_wait(&g.cv, &g.mu);
  pthread_mutex_unlock(&g.mu);
  unreg_arg a = {r, id, &g};
  pthread_create(&ut, NULL, unreg_thread, &a);
  usleep(50000); /* the unregister, if it did not wait, would be done by now */
  pthread_mutex_lock(&g.mu);
  assert_int_equal(g.unregistered, 0); /* still inside the render */
  g.release = 1;
  pthread_cond_broadcast(&g.cv);
  pthread_mutex_unlock(&g.mu);
  pthread_join(rt, NULL);
  pthread_join(ut, NULL);
  assert_int_equal(g.unregistered, 1);
  char *t = render(r);
  assert_null(strstr(t, "slow_total"));
  kvbm_metrics_text_free(t);
  kvbm_metrics_destroy(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_page_basic),
      cmocka_unit_test(test_merge_and_constant_labels),
      cmocka_unit_test(test_hostile),
      cmocka_unit_test(test_reserved_family),
      cmocka_unit_test(test_register_refusals),
      cmocka_unit_test(test_histogram_init),
      cmocka_unit_test(test_unregister_waits_for_render),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
