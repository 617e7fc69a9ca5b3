/* SPDX-License-Identifier: Apache-2.0 */
/*
 * registry.c: collectors, the writer they write through, and the page.
 *
 * A render calls the collectors in registration order with one writer.
 * The writer renders every sample to text at once, into its family's own
 * buffer: families are found by name in a small open-addressing table, so
 * samples of one family from several collectors (two managers in one
 * process) land together, and the page is the families' buffers
 * concatenated in the order they were first announced, each after its
 * HELP and TYPE lines. Nothing of a sample outlives the call that wrote
 * it, so collectors may pass labels built on their stack.
 *
 * Strictness is the writer's job, not the collectors': a name that is not
 * a name, a label given twice, a counter that went negative, a histogram
 * whose buckets do not add up, a type that contradicts an earlier
 * announcement, or a series written twice (same family, same labels, in
 * any order: labels are sorted by name before anything else) is refused,
 * counted and remembered. One bad sample would otherwise make Prometheus
 * reject the whole scrape.
 *
 * Series are deduplicated by a second table keyed by (family, label text):
 * a hash finds the candidates, the text itself (kept in one arena per
 * render) decides, so two different series never collide.
 *
 * The registry's lock is held for the whole render. That serializes
 * renders (two scrapers at once take turns) and makes unregister wait for
 * a render in progress, which is what lets a component unregister and
 * then free what its collector reads.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"
#include "metrics/internal.h"

#define KVBM__METRICS_ERRORS "kvbm_metrics_errors_total"

typedef struct collector {
  uint64_t id;
  kvbm_metrics_collect_fn fn;
  void *user;
  size_t nl;
  char *ln[KVBM_METRICS_MAX_LABELS], *lv[KVBM_METRICS_MAX_LABELS];
} collector;

struct kvbm_metrics {
  pthread_mutex_t mu;
  collector *c;
  size_t n, cap;
  uint64_t next_id;
  uint64_t errors; /* samples refused, every render */
  char last_error[KVBM_ERROR_MSG_MAX];
};

typedef struct family {
  char *name;
  char *help; /* escaped; NULL: no HELP line */
  kvbm_metric_type type;
  kvbm__mbuf lines;
} family;

/* A series seen in this render: its label text is keys.p[off, off+len). */
typedef struct series {
  uint64_t hash; /* 0: empty slot */
  uint32_t fam;
  size_t off, len;
} series;

struct kvbm_metrics_writer {
  kvbm_metrics *reg;
  const collector *col;  /* the collector being called (constant labels) */
  family *fam;
  size_t nfam, capfam;
  uint32_t *ftab;        /* family index + 1 by name hash; 0: empty */
  size_t ftab_cap;       /* a power of two */
  series *stab;
  size_t nser, stab_cap;
  kvbm__mbuf keys;       /* label texts of the series seen */
  kvbm__mbuf scratch;
  long cur;              /* the current family, -1: none (refused) */
  uint64_t errors;
  char first_error[KVBM_ERROR_MSG_MAX];
  bool oom;
};

/* ------------------------------------------------------------- helpers */

static uint64_t hash_bytes(const void *p, size_t n, uint64_t seed) {
  /* FNV-1a, then a finalizer: table keys are short and few */
  const unsigned char *s = p;
  uint64_t h = 1469598103934665603ull ^ seed;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h ? h : 1;
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int refuse(kvbm_metrics_writer *w, const char *fmt, ...) {
  w->errors++;
  if (!w->first_error[0]) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->first_error, sizeof w->first_error, fmt, ap);
    va_end(ap);
  }
  return KVBM_EINVAL;
}

static const char *cur_name(const kvbm_metrics_writer *w) {
  return w->cur >= 0 ? w->fam[w->cur].name : "?";
}

const char *kvbm_metric_type_name(kvbm_metric_type t) {
  switch (t) {
    case KVBM_METRIC_COUNTER: return "counter";
    case KVBM_METRIC_GAUGE: return "gauge";
    case KVBM_METRIC_HISTOGRAM: return "histogram";
    default: return "?";
  }
}

/* ------------------------------------------------------------- families */

static bool ftab_grow(kvbm_metrics_writer *w) {
  size_t cap = w->ftab_cap ? w->ftab_cap * 2 : 64;
  uint32_t *t = calloc(cap, sizeof *t);
  if (!t) return false;
  for (size_t i = 0; i < w->nfam; i++) {
    size_t k = hash_bytes(w->fam[i].name, strlen(w->fam[i].name), 0) & (cap - 1);
    while (t[k]) k = (k + 1) & (cap - 1);
    t[k] = (uint32_t)i + 1;
  }
  free(w->ftab);
  w->ftab = t;
  w->ftab_cap = cap;
  return true;
}

/* The family named `name`: its index, or -1 (and *slot: where it goes). */
static long family_find(const kvbm_metrics_writer *w, const char *name, size_t *slot) {
  size_t k = hash_bytes(name, strlen(name), 0) & (w->ftab_cap - 1);
  while (w->ftab[k]) {
    if (!strcmp(w->fam[w->ftab[k] - 1].name, name)) return (long)w->ftab[k] - 1;
    k = (k + 1) & (w->ftab_cap - 1);
  }
  *slot = k;
  return -1;
}

int kvbm_metrics_family(kvbm_metrics_writer *w, const char *name, kvbm_metric_type type,
                        const char *help) {
  if (!w) return KVBM_EINVAL;
  w->cur = -1;
  if (!kvbm__metric_name_ok(name))
    return refuse(w, "metrics: '%.64s' is not a metric name", name ? name : "(null)");
  if (type != KVBM_METRIC_COUNTER && type != KVBM_METRIC_GAUGE && type != KVBM_METRIC_HISTOGRAM)
    return refuse(w, "metrics: %s: unknown type %d", name, (int)type);
  /* The registry writes its own error counter after every collector; a
   * collector's family of that name would take its place on the page. */
  if (w->col && !strcmp(name, KVBM__METRICS_ERRORS))
    return refuse(w, "metrics: %s is the registry's own family", name);
  if ((w->nfam + 1) * 2 > w->ftab_cap && !ftab_grow(w)) {
    w->oom = true;
    return KVBM_ENOMEM;
  }
  size_t slot = 0;
  long i = family_find(w, name, &slot);
  if (i >= 0) {
    if (w->fam[i].type != type)
      return refuse(w, "metrics: %s announced as a %s, earlier as a %s", name,
                    kvbm_metric_type_name(type), kvbm_metric_type_name(w->fam[i].type));
    w->cur = i;
    return KVBM_OK;
  }
  if (kvbm__vec_reserve_of(&w->fam, &w->capfam, w->nfam + 1, 32, KVBM__VEC_NO_LIMIT)) {
    w->oom = true;
    return KVBM_ENOMEM;
  }
  family *f = &w->fam[w->nfam];
  *f = (family){.type = type, .name = strdup(name)};
  if (help && *help) {
    kvbm__mbuf h = {0};
    kvbm__mbuf_escaped(&h, help, false);
    f->help = h.oom ? NULL : h.p;
    if (h.oom) {
      kvbm__mbuf_free(&h);
      w->oom = true;
    }
  }
  if (!f->name) {
    free(f->help);
    w->oom = true;
    return KVBM_ENOMEM;
  }
  w->ftab[slot] = (uint32_t)w->nfam + 1;
  w->cur = (long)w->nfam++;
  return KVBM_OK;
}

/* -------------------------------------------------------------- samples */

typedef struct lab {
  const char *name, *value;
} lab;

/* Sorts (insertion: at most KVBM_METRICS_MAX_LABELS) and checks the
 * collector's constant labels and the sample's, then renders them as
 * `a="x",b="y"` into w->scratch. */
static int labels_text(kvbm_metrics_writer *w, const kvbm_metric_label *labels, size_t n) {
  const collector *c = w->col;
  size_t nc = c ? c->nl : 0;
  if (n && !labels) return refuse(w, "metrics: %s: labels missing", cur_name(w));
  if (n > KVBM_METRICS_MAX_LABELS - nc)
    return refuse(w, "metrics: %s: more than %d labels", cur_name(w), KVBM_METRICS_MAX_LABELS);
  lab all[KVBM_METRICS_MAX_LABELS];
  size_t k = 0;
  for (size_t i = 0; i < nc; i++) all[k++] = (lab){c->ln[i], c->lv[i]};
  for (size_t i = 0; i < n; i++) {
    if (!kvbm__label_name_ok(labels[i].name))
      return refuse(w, "metrics: %s: '%.64s' is not a label name", cur_name(w),
                    labels[i].name ? labels[i].name : "(null)");
    if (!labels[i].value) return refuse(w, "metrics: %s: label %s has no value", cur_name(w),
                                        labels[i].name);
    if (strlen(labels[i].value) > KVBM_METRICS_MAX_VALUE)
      return refuse(w, "metrics: %s: label %s is longer than %d bytes", cur_name(w),
                    labels[i].name, KVBM_METRICS_MAX_VALUE);
    all[k++] = (lab){labels[i].name, labels[i].value};
  }
  for (size_t i = 1; i < k; i++) {
    lab x = all[i];
    size_t j = i;
    for (; j > 0 && strcmp(all[j - 1].name, x.name) > 0; j--) all[j] = all[j - 1];
    all[j] = x;
  }
  const family *f = &w->fam[w->cur];
  for (size_t i = 0; i < k; i++) {
    if (i && !strcmp(all[i].name, all[i - 1].name))
      return refuse(w, "metrics: %s: label %s given twice", f->name, all[i].name);
    if (f->type == KVBM_METRIC_HISTOGRAM && !strcmp(all[i].name, "le"))
      return refuse(w, "metrics: %s: a histogram's samples may not have a label 'le'", f->name);
  }
  w->scratch.len = 0;
  w->scratch.oom = false;
  for (size_t i = 0; i < k; i++) {
    if (i) kvbm__mbuf_put(&w->scratch, ",", 1);
    kvbm__mbuf_puts(&w->scratch, all[i].name);
    kvbm__mbuf_put(&w->scratch, "=\"", 2);
    kvbm__mbuf_escaped(&w->scratch, all[i].value, true);
    kvbm__mbuf_put(&w->scratch, "\"", 1);
  }
  kvbm__mbuf_put(&w->scratch, "", 0); /* a NUL even when empty */
  if (w->scratch.oom) {
    w->oom = true;
    return KVBM_ENOMEM;
  }
  return KVBM_OK;
}

static bool stab_grow(kvbm_metrics_writer *w) {
  size_t cap = w->stab_cap ? w->stab_cap * 2 : 256;
  series *t = calloc(cap, sizeof *t);
  if (!t) return false;
  for (size_t i = 0; i < w->stab_cap; i++) {
    if (!w->stab[i].hash) continue;
    size_t k = w->stab[i].hash & (cap - 1);
    while (t[k].hash) k = (k + 1) & (cap - 1);
    t[k] = w->stab[i];
  }
  free(w->stab);
  w->stab = t;
  w->stab_cap = cap;
  return true;
}

/* Records the series (current family, w->scratch); KVBM_EINVAL when this
 * render has it already. */
static int series_add(kvbm_metrics_writer *w) {
  if ((w->nser + 1) * 2 > w->stab_cap && !stab_grow(w)) {
    w->oom = true;
    return KVBM_ENOMEM;
  }
  uint32_t fam = (uint32_t)w->cur;
  const char *txt = w->scratch.p;
  size_t len = w->scratch.len;
  uint64_t h = hash_bytes(txt, len, fam + 1);
  size_t k = h & (w->stab_cap - 1);
  for (; w->stab[k].hash; k = (k + 1) & (w->stab_cap - 1)) {
    const series *s = &w->stab[k];
    if (s->hash == h && s->fam == fam && s->len == len && !memcmp(w->keys.p + s->off, txt, len))
      return refuse(w, "metrics: %s{%.100s} written twice", w->fam[fam].name, txt);
  }
  size_t off = w->keys.len;
  kvbm__mbuf_put(&w->keys, txt, len);
  if (w->keys.oom) {
    w->oom = true;
    return KVBM_ENOMEM;
  }
  w->stab[k] = (series){.hash = h, .fam = fam, .off = off, .len = len};
  w->nser++;
  return KVBM_OK;
}

/* name[suffix]{labels[,extra]} */
static void series_name(kvbm__mbuf *b, const char *name, const char *suffix, const char *labels,
                        const char *extra) {
  kvbm__mbuf_puts(b, name);
  if (suffix) kvbm__mbuf_puts(b, suffix);
  if (!*labels && !extra) return;
  kvbm__mbuf_put(b, "{", 1);
  kvbm__mbuf_puts(b, labels);
  if (extra) {
    if (*labels) kvbm__mbuf_put(b, ",", 1);
    kvbm__mbuf_puts(b, extra);
  }
  kvbm__mbuf_put(b, "}", 1);
}

/* Checks the current family's type and the labels; renders them. */
static int sample_begin(kvbm_metrics_writer *w, const kvbm_metric_label *labels, size_t n,
                        bool histogram) {
  if (w->cur < 0) return refuse(w, "metrics: a sample without a family (or of a refused one)");
  const family *f = &w->fam[w->cur];
  if ((f->type == KVBM_METRIC_HISTOGRAM) != histogram)
    return refuse(w, "metrics: %s is a %s: %s sample refused", f->name,
                  kvbm_metric_type_name(f->type), histogram ? "a histogram" : "a plain");
  int rc = labels_text(w, labels, n);
  return rc ? rc : series_add(w);
}

static int plain_value(kvbm_metrics_writer *w, const kvbm_metric_label *labels, size_t n,
                       bool is_u64, uint64_t u, double d) {
  if (!w) return KVBM_EINVAL;
  int rc = sample_begin(w, labels, n, false);
  if (rc) return rc;
  family *f = &w->fam[w->cur];
  if (!is_u64 && f->type == KVBM_METRIC_COUNTER && !(isfinite(d) && d >= 0))
    return refuse(w, "metrics: counter %s{%.100s} is %g (must be finite and >= 0)", f->name,
                  w->scratch.p, d);
  series_name(&f->lines, f->name, NULL, w->scratch.p, NULL);
  kvbm__mbuf_put(&f->lines, " ", 1);
  if (is_u64) kvbm__mbuf_u64(&f->lines, u);
  else kvbm__mbuf_double(&f->lines, d);
  kvbm__mbuf_put(&f->lines, "\n", 1);
  if (f->lines.oom) w->oom = true;
  return w->oom ? KVBM_ENOMEM : KVBM_OK;
}

int kvbm_metrics_value(kvbm_metrics_writer *w, const kvbm_metric_label *labels, size_t n,
                       double value) {
  return plain_value(w, labels, n, false, 0, value);
}

int kvbm_metrics_value_u64(kvbm_metrics_writer *w, const kvbm_metric_label *labels, size_t n,
                           uint64_t value) {
  return plain_value(w, labels, n, true, value, 0);
}

int kvbm_metrics_histogram_value(kvbm_metrics_writer *w, const kvbm_metric_label *labels,
                                 size_t n, const kvbm_histogram *h) {
  if (!w) return KVBM_EINVAL;
  if (!h) return refuse(w, "metrics: %s: NULL histogram", cur_name(w));
  /* checked before the series is recorded: a refused sample leaves nothing */
  if (h->num_bounds < 1 || h->num_bounds > KVBM_HISTOGRAM_MAX_BOUNDS)
    return refuse(w, "metrics: %s: histogram with %u bounds", cur_name(w), h->num_bounds);
  uint64_t total = 0;
  for (uint32_t i = 0; i <= h->num_bounds; i++) {
    if (i < h->num_bounds &&
        (!isfinite(h->bounds[i]) || (i && !(h->bounds[i] > h->bounds[i - 1]))))
      return refuse(w, "metrics: %s: histogram bounds not finite and increasing", cur_name(w));
    if (h->buckets[i] > UINT64_MAX - total)
      return refuse(w, "metrics: %s: histogram buckets overflow", cur_name(w));
    total += h->buckets[i];
  }
  if (total != h->count)
    return refuse(w, "metrics: %s: histogram buckets add up to %llu, count is %llu", cur_name(w),
                  (unsigned long long)total, (unsigned long long)h->count);
  int rc = sample_begin(w, labels, n, true);
  if (rc) return rc;
  family *f = &w->fam[w->cur];
  kvbm__mbuf *b = &f->lines;
  char le[64];
  uint64_t cum = 0;
  for (uint32_t i = 0; i <= h->num_bounds; i++) {
    cum += h->buckets[i];
    if (i < h->num_bounds) {
      /* the bound's text, through a buffer of our own */
      kvbm__mbuf t = {0};
      kvbm__mbuf_put(&t, "le=\"", 4);
      kvbm__mbuf_double(&t, h->bounds[i]);
      kvbm__mbuf_put(&t, "\"", 1);
      if (t.oom || t.len >= sizeof le) {
        kvbm__mbuf_free(&t);
        w->oom = true;
        return KVBM_ENOMEM;
      }
      memcpy(le, t.p, t.len + 1);
      kvbm__mbuf_free(&t);
    } else {
      memcpy(le, "le=\"+Inf\"", 10);
    }
    series_name(b, f->name, "_bucket", w->scratch.p, le);
    kvbm__mbuf_put(b, " ", 1);
    kvbm__mbuf_u64(b, cum);
    kvbm__mbuf_put(b, "\n", 1);
  }
  series_name(b, f->name, "_sum", w->scratch.p, NULL);
  kvbm__mbuf_put(b, " ", 1);
  kvbm__mbuf_double(b, h->sum);
  kvbm__mbuf_put(b, "\n", 1);
  series_name(b, f->name, "_count", w->scratch.p, NULL);
  kvbm__mbuf_put(b, " ", 1);
  kvbm__mbuf_u64(b, h->count);
  kvbm__mbuf_put(b, "\n", 1);
  if (b->oom) w->oom = true;
  return w->oom ? KVBM_ENOMEM : KVBM_OK;
}

int kvbm_metrics_counter(kvbm_metrics_writer *w, const char *name, const char *help,
                         const kvbm_metric_label *labels, size_t n, uint64_t value) {
  int rc = kvbm_metrics_family(w, name, KVBM_METRIC_COUNTER, help);
  return rc ? rc : kvbm_metrics_value_u64(w, labels, n, value);
}

int kvbm_metrics_gauge(kvbm_metrics_writer *w, const char *name, const char *help,
                       const kvbm_metric_label *labels, size_t n, double value) {
  int rc = kvbm_metrics_family(w, name, KVBM_METRIC_GAUGE, help);
  return rc ? rc : kvbm_metrics_value(w, labels, n, value);
}

/* ------------------------------------------------------------- registry */

int kvbm_metrics_create(kvbm_metrics **out, kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "metrics: NULL argument");
  kvbm_metrics *r = calloc(1, sizeof *r);
  if (!r) return kvbm_error_set(err, KVBM_ENOMEM, "metrics: out of memory");
  pthread_mutex_init(&r->mu, NULL);
  r->next_id = 1;
  *out = r;
  return KVBM_OK;
}

static void collector_free(collector *c) {
  for (size_t i = 0; i < c->nl; i++) {
    free(c->ln[i]);
    free(c->lv[i]);
  }
}

void kvbm_metrics_destroy(kvbm_metrics *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n; i++) collector_free(&r->c[i]);
  free(r->c);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

int kvbm_metrics_register(kvbm_metrics *r, kvbm_metrics_collect_fn fn, void *user,
                          const kvbm_metric_label *labels, size_t nl, uint64_t *id,
                          kvbm_error *err) {
  if (!r || !fn) return kvbm_error_set(err, KVBM_EINVAL, "metrics: register needs a registry and a function");
  if (nl && !labels) return kvbm_error_set(err, KVBM_EINVAL, "metrics: labels missing");
  if (nl > KVBM_METRICS_MAX_LABELS)
    return kvbm_error_set(err, KVBM_EINVAL, "metrics: more than %d constant labels",
                          KVBM_METRICS_MAX_LABELS);
  collector c = {.fn = fn, .user = user};
  for (size_t i = 0; i < nl; i++) {
    if (!kvbm__label_name_ok(labels[i].name))
      return kvbm_error_set(err, KVBM_EINVAL, "metrics: '%.64s' is not a label name",
                            labels[i].name ? labels[i].name : "(null)");
    if (!strcmp(labels[i].name, "le"))
      return kvbm_error_set(err, KVBM_EINVAL, "metrics: 'le' is a histogram's own label");
    if (!labels[i].value || strlen(labels[i].value) > KVBM_METRICS_MAX_VALUE)
      return kvbm_error_set(err, KVBM_EINVAL, "metrics: label %s: no value or longer than %d bytes",
                            labels[i].name, KVBM_METRICS_MAX_VALUE);
    for (size_t j = 0; j < i; j++)
      if (!strcmp(labels[i].name, labels[j].name))
        return kvbm_error_set(err, KVBM_EINVAL, "metrics: label %s given twice", labels[i].name);
  }
  for (size_t i = 0; i < nl; i++) {
    c.ln[i] = strdup(labels[i].name);
    c.lv[i] = strdup(labels[i].value);
    c.nl = i + 1;
    if (!c.ln[i] || !c.lv[i]) {
      collector_free(&c);
      return kvbm_error_set(err, KVBM_ENOMEM, "metrics: out of memory");
    }
  }
  pthread_mutex_lock(&r->mu);
  if (kvbm__vec_reserve_of(&r->c, &r->cap, r->n + 1, 8, KVBM__VEC_NO_LIMIT)) {
    pthread_mutex_unlock(&r->mu);
    collector_free(&c);
    return kvbm_error_set(err, KVBM_ENOMEM, "metrics: out of memory");
  }
  c.id = r->next_id++;
  r->c[r->n++] = c;
  pthread_mutex_unlock(&r->mu);
  if (id) *id = c.id;
  return KVBM_OK;
}

int kvbm_metrics_unregister(kvbm_metrics *r, uint64_t id) {
  if (!r) return KVBM_EINVAL;
  pthread_mutex_lock(&r->mu);
  for (size_t i = 0; i < r->n; i++) {
    if (r->c[i].id != id) continue;
    collector_free(&r->c[i]);
    memmove(&r->c[i], &r->c[i + 1], (r->n - i - 1) * sizeof *r->c);
    r->n--;
    pthread_mutex_unlock(&r->mu);
    return KVBM_OK;
  }
  pthread_mutex_unlock(&r->mu);
  return KVBM_ENOTFOUND;
}

static void writer_free(kvbm_metrics_writer *w) {
  for (size_t i = 0; i < w->nfam; i++) {
    free(w->fam[i].name);
    free(w->fam[i].help);
    kvbm__mbuf_free(&w->fam[i].lines);
  }
  free(w->fam);
  free(w->ftab);
  free(w->stab);
  kvbm__mbuf_free(&w->keys);
  kvbm__mbuf_free(&w->scratch);
}

/* The page: every family with samples, in order of first announcement. */
static void assemble(kvbm_metrics_writer *w, kvbm__mbuf *out) {
  for (size_t i = 0; i < w->nfam; i++) {
    const family *f = &w->fam[i];
    if (!f->lines.len) continue;
    if (f->help) {
      kvbm__mbuf_put(out, "# HELP ", 7);
      kvbm__mbuf_puts(out, f->name);
      kvbm__mbuf_put(out, " ", 1);
      kvbm__mbuf_puts(out, f->help);
      kvbm__mbuf_put(out, "\n", 1);
    }
    kvbm__mbuf_put(out, "# TYPE ", 7);
    kvbm__mbuf_puts(out, f->name);
    kvbm__mbuf_put(out, " ", 1);
    kvbm__mbuf_puts(out, kvbm_metric_type_name(f->type));
    kvbm__mbuf_put(out, "\n", 1);
    kvbm__mbuf_put(out, f->lines.p, f->lines.len);
  }
}

int kvbm_metrics_render(kvbm_metrics *r, char **text, size_t *len, kvbm_error *err) {
  if (!r || !text) return kvbm_error_set(err, KVBM_EINVAL, "metrics: NULL argument");
  kvbm_metrics_writer w = {.reg = r, .cur = -1};
  pthread_mutex_lock(&r->mu);
  for (size_t i = 0; i < r->n && !w.oom; i++) {
    w.col = &r->c[i];
    w.cur = -1;
    r->c[i].fn(r->c[i].user, &w);
  }
  w.col = NULL;
  r->errors += w.errors;
  memcpy(r->last_error, w.first_error, sizeof r->last_error);
  kvbm_metrics_counter(&w, KVBM__METRICS_ERRORS,
                       "Samples the metrics renderer refused (bad names or labels, type "
                       "conflicts, duplicate series), since the registry was created",
                       NULL, 0, r->errors);
  pthread_mutex_unlock(&r->mu);
  kvbm__mbuf out = {0};
  if (!w.oom) assemble(&w, &out);
  writer_free(&w);
  if (w.oom || out.oom) {
    kvbm__mbuf_free(&out);
    return kvbm_error_set(err, KVBM_ENOMEM, "metrics: out of memory rendering the page");
  }
  if (!out.p) kvbm__mbuf_put(&out, "", 0);
  if (out.oom) return kvbm_error_set(err, KVBM_ENOMEM, "metrics: out of memory");
  *text = out.p;
  if (len) *len = out.len;
  return KVBM_OK;
}

void kvbm_metrics_text_free(char *text) { free(text); }

void kvbm_metrics_last_error(kvbm_metrics *r, char *buf, size_t cap) {
  if (!buf || !cap) return;
  buf[0] = 0;
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  snprintf(buf, cap, "%s", r->last_error);
  pthread_mutex_unlock(&r->mu);
}
