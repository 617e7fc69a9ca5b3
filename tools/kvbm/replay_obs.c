/* SPDX-License-Identifier: Apache-2.0 */
/*
 * replay_obs.c: the metrics endpoint and the picture of `kvbm replay` (see
 * replay_obs.h).
 *
 * Threads. The replay runs on the main thread; the endpoint's thread (W1:
 * ours; W2: the manager's) renders on its own. The replay's counters the
 * page shows are copied after every request under the observer's mutex,
 * and the replay collector reads the copy under the same mutex: a scrape
 * never sees a request half counted. --hold blocks SIGINT and SIGTERM
 * before any thread starts (threads inherit the mask) and waits for one
 * with sigwait after the summary, so a test can read the summary, let
 * Prometheus scrape the final numbers, and stop the process cleanly.
 *
 * The picture. At most PLOT_POINTS samples, one every total / PLOT_POINTS
 * requests: the hit rate so far (hit tokens over prompt tokens), the hit
 * rate of the requests since the previous sample, and each tier's
 * occupancy ((cached + active) / capacity). An SVG of two panels sharing
 * the request axis, written by hand: no library, viewable in a browser.
 */
#include "replay_obs.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvbm/manager.h"

#define PLOT_POINTS 1000

typedef struct sample {
  size_t done;
  double cum_rate, step_rate;
  double occ[KVBM_TIER_COUNT];
} sample;

struct replay_obs {
  replay_obs_opts o;
  bool w2, ok;
  kvbm_metrics *reg;            /* W1: ours; W2: the manager's */
  kvbm_metrics_server *srv;     /* W1 */
  uint64_t collector;
  bool registered;
  pthread_mutex_t mu;           /* guards what the collector reads */
  bool finished;
  size_t done, total;
  kvsim_w1_result w1;            /* W1: counts so far */
  kvbm_pool_stats pool;         /* W1: the pool after the last request */
  kvsim_w2_result w2r;           /* W2: counts so far */
  /* the picture (the replay's thread only) */
  sample *s;
  size_t ns, every;
  uint64_t last_prompt, last_hit;
  unsigned present;             /* tiers with blocks (bit per tier) */
  void (*print)(void *ctx, const kvsim_w2_result *res);
  void *print_ctx;
};

/* --------------------------------------------------------------- options */

bool replay_obs_opts_init(replay_obs_opts *o) {
  memset(o, 0, sizeof *o);
  return metrics_cli_init(&o->m, "replay");
}

int replay_obs_take(int argc, char **argv, int *i, replay_obs_opts *o) {
  const char *v;
  int r;
  if (!strcmp(argv[*i], "--hold")) {
    o->hold = true;
  } else if ((r = metrics_cli_take("replay", argc, argv, i, &o->m))) {
    return r;
  } else if ((r = cli_opt_value("replay", argc, argv, i, "--plot", &v))) {
    if (r < 0) return -1;
    o->plot = v;
  } else {
    return 0;
  }
  return 1;
}

/* --------------------------------------------------------- the collector */

static void collect(void *user, kvbm_metrics_writer *w) {
  replay_obs *obs = user;
  pthread_mutex_lock(&obs->mu);
  size_t done = obs->done, total = obs->total;
  bool finished = obs->finished;
  kvsim_w1_result w1 = obs->w2 ? obs->w2r.w1 : obs->w1;
  kvbm_pool_stats pool = obs->pool;
  uint64_t hit[KVBM_TIER_COUNT], verify = obs->w2r.verify_failures;
  for (int t = 0; t < KVBM_TIER_COUNT; t++) hit[t] = obs->w2r.tiers[t].hit_tokens;
  pthread_mutex_unlock(&obs->mu);
  kvbm_metrics_gauge(w, "kvbm_replay_requests", "Requests of the trace the replay runs", NULL, 0,
                     (double)total);
  kvbm_metrics_counter(w, "kvbm_replay_requests_done_total", "Requests the replay has run",
                       NULL, 0, done);
  kvbm_metrics_gauge(w, "kvbm_replay_finished", "1 once the replay has run every request", NULL,
                     0, finished ? 1 : 0);
  kvbm_metrics_counter(w, "kvbm_replay_prompt_tokens_total",
                       "Prompt tokens of the requests run (the replay's count)", NULL, 0,
                       w1.prompt_tokens);
  kvbm_metrics_counter(w, "kvbm_replay_hit_tokens_total",
                       "Prompt tokens the replay was handed from the cache and verified", NULL, 0,
                       w1.hit_tokens);
  if (obs->w2) {
    kvbm_metrics_family(w, "kvbm_replay_tier_hit_tokens_total", KVBM_METRIC_COUNTER,
                        "Verified hit tokens by the tier that held them (the replay's count)");
    for (int t = 0; t < KVBM_TIER_COUNT; t++)
      if (obs->present >> t & 1)
        kvbm_metrics_value_u64(w, &(kvbm_metric_label){"tier", kvbm_tier_name(t)}, 1, hit[t]);
    kvbm_metrics_counter(w, "kvbm_replay_verify_failures_total",
                         "Onboarded blocks whose bytes the replay found wrong", NULL, 0, verify);
  } else if (done) {
    kvbm_pool_metrics_write(w, &pool, &(kvbm_metric_label){"tier", "G1"}, 1);
  }
}

/* ----------------------------------------------------------------- setup */

static bool write_port(replay_obs *obs, uint16_t port) {
  return metrics_cli_announce(&obs->o.m, "replay", port);
}

bool replay_obs_create(const replay_obs_opts *o, bool w2, replay_obs **out) {
  *out = NULL;
  if (!o->m.cfg.enabled && !o->plot) {
    if (o->hold) fprintf(stderr, "kvbm replay: --hold without a metrics endpoint does nothing\n");
    return true;
  }
  replay_obs *obs = calloc(1, sizeof *obs);
  if (!obs) return false;
  obs->o = *o;
  obs->w2 = w2;
  obs->ok = true;
  pthread_mutex_init(&obs->mu, NULL);
  if (o->hold && o->m.cfg.enabled) {
    /* before any thread starts: they all inherit the mask */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
  }
  *out = obs;
  if (w2 || !o->m.cfg.enabled) return true;
  kvbm_error err = {0};
  if (kvbm_metrics_create(&obs->reg, &err) ||
      kvbm_metrics_register(obs->reg, collect, obs, NULL, 0, &obs->collector, &err) ||
      kvbm_metrics_server_start(obs->reg, &o->m.cfg, &obs->srv, &err)) {
    fprintf(stderr, "kvbm replay: %s\n", err.msg);
    return false;
  }
  obs->registered = true;
  return write_port(obs, kvbm_metrics_server_port(obs->srv));
}

void replay_obs_destroy(replay_obs *obs) {
  if (!obs) return;
  if (obs->srv) kvbm_metrics_server_stop(obs->srv);
  if (!obs->w2) kvbm_metrics_destroy(obs->reg);
  pthread_mutex_destroy(&obs->mu);
  free(obs->s);
  free(obs);
}

bool replay_obs_ok(const replay_obs *obs) { return !obs || obs->ok; }

/* ----------------------------------------------------------- the picture */

static void take_sample(replay_obs *obs, size_t done, size_t total, uint64_t prompt, uint64_t hit,
                        const double occ[KVBM_TIER_COUNT]) {
  if (!obs->o.plot) return;
  if (!obs->s) {
    obs->every = total / PLOT_POINTS + 1;
    obs->s = calloc(PLOT_POINTS + 2, sizeof *obs->s);
    if (!obs->s) return;
  }
  if (done % obs->every && done != total) return;
  if (obs->ns >= PLOT_POINTS + 2) return;
  sample *p = &obs->s[obs->ns++];
  p->done = done;
  p->cum_rate = prompt ? (double)hit / (double)prompt : 0;
  uint64_t dp = prompt - obs->last_prompt, dh = hit - obs->last_hit;
  p->step_rate = dp ? (double)dh / (double)dp : 0;
  obs->last_prompt = prompt;
  obs->last_hit = hit;
  memcpy(p->occ, occ, sizeof p->occ);
}

static const char *const colour[KVBM_TIER_COUNT] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"};

static void xml_text(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '<') fputs("&lt;", f);
    else if (*s == '>') fputs("&gt;", f);
    else if (*s == '&') fputs("&amp;", f);
    else if (*s == '"') fputs("&quot;", f);
    else fputc(*s, f);
  }
}

/* One panel: the frame, the y grid in percent, the x ticks. */
static void panel(FILE *f, double x0, double y0, double w, double h, size_t total,
                  const char *title) {
  fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
             "stroke=\"#444\"/>\n", x0, y0, w, h);
  for (int k = 0; k <= 4; k++) {
    double y = y0 + h - h * k / 4.0;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x0, y,
            x0 + w, y);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%d%%</text>\n",
            x0 - 6, y + 4, k * 25);
  }
  for (int k = 0; k <= 5; k++) {
    double x = x0 + w * k / 5.0;
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\">%zu</text>\n",
            x, y0 + h + 15, (size_t)((double)total * k / 5.0 + 0.5));
  }
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" font-weight=\"bold\">", x0, y0 - 8);
  xml_text(f, title);
  fputs("</text>\n", f);
}

static void line(FILE *f, const replay_obs *obs, double x0, double y0, double w, double h,
                 size_t total, int what, const char *col, double width, const char *dash) {
  fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\"%s%s%s points=\"", col,
          width, dash ? " stroke-dasharray=\"" : "", dash ? dash : "", dash ? "\"" : "");
  for (size_t i = 0; i < obs->ns; i++) {
    const sample *p = &obs->s[i];
    double v = what == -1 ? p->cum_rate : what == -2 ? p->step_rate : p->occ[what];
    if (!isfinite(v)) v = 0;
    double x = x0 + w * (double)p->done / (double)(total ? total : 1);
    double y = y0 + h - h * (v < 0 ? 0 : v > 1 ? 1 : v);
    fprintf(f, "%s%.1f,%.1f", i ? " " : "", x, y);
  }
  fputs("\"/>\n", f);
}

static void legend(FILE *f, double x, double y, const char *col, const char *dash,
                   const char *label) {
  fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
             "stroke-width=\"2\"%s%s%s/>\n", x, y, x + 24, y, col,
          dash ? " stroke-dasharray=\"" : "", dash ? dash : "", dash ? "\"" : "");
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">", x + 30, y + 4);
  xml_text(f, label);
  fputs("</text>\n", f);
}

static bool write_plot(replay_obs *obs, size_t total, const char *what) {
  if (!obs->o.plot || !obs->ns) return true;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", obs->o.plot);
  FILE *f = fopen(tmp, "w");
  if (!f) {
    fprintf(stderr, "kvbm replay: --plot %s: %s\n", obs->o.plot, strerror(errno));
    return false;
  }
  const double W = 960, H = 640, x0 = 70, w = 760, h1 = 220, y1 = 60, y2 = 360, h2 = 220;
  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
             "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
             "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
             "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H, W, H);
  fputs("<text x=\"70\" y=\"28\" font-size=\"16\" font-weight=\"bold\">kvbm replay (", f);
  xml_text(f, what);
  fputs("): ", f);
  const char *tr = obs->o.trace ? obs->o.trace : "";
  const char *slash = strrchr(tr, '/');
  xml_text(f, slash ? slash + 1 : tr);
  fputs("</text>\n", f);
  panel(f, x0, y1, w, h1, total, "Hit rate (prompt tokens found in the cache)");
  line(f, obs, x0, y1, w, h1, total, -2, "#9ecae1", 1, NULL);
  line(f, obs, x0, y1, w, h1, total, -1, "#08519c", 2.5, NULL);
  legend(f, x0 + w + 12, y1 + 10, "#08519c", NULL, "so far");
  legend(f, x0 + w + 12, y1 + 30, "#9ecae1", NULL, "per interval");
  panel(f, x0, y2, w, h2, total, "Tier occupancy ((cached + active) / capacity)");
  int row = 0;
  for (int t = 0; t < KVBM_TIER_COUNT; t++) {
    if (!(obs->present >> t & 1)) continue;
    line(f, obs, x0, y2, w, h2, total, t, colour[t], 2, t == 3 ? "6,3" : NULL);
    legend(f, x0 + w + 12, y2 + 10 + 20 * row++, colour[t], t == 3 ? "6,3" : NULL, kvbm_tier_name(t));
  }
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\">requests "
             "replayed</text>\n</svg>\n", x0 + w / 2, y2 + h2 + 36);
  bool ok = !ferror(f);
  if (fclose(f) || !ok || rename(tmp, obs->o.plot)) {
    fprintf(stderr, "kvbm replay: --plot %s: cannot write\n", obs->o.plot);
    return false;
  }
  return true;
}

/* ------------------------------------------------------------------ hold */

static void hold(replay_obs *obs) {
  if (!obs->o.hold || !obs->o.m.cfg.enabled) return;
  fflush(stdout);
  fprintf(stderr, "kvbm replay: holding the metrics endpoint until SIGINT or SIGTERM\n");
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig;
  sigwait(&set, &sig);
}

/* -------------------------------------------------------------------- W1 */

static void w1_request(void *user, size_t done, size_t total, const kvsim_w1_result *so_far,
                       const kvbm_pool *pool) {
  replay_obs *obs = user;
  kvbm_pool_stats ps;
  kvbm_pool_stats_get(pool, &ps);
  pthread_mutex_lock(&obs->mu);
  obs->done = done;
  obs->total = total;
  obs->w1 = *so_far;
  obs->pool = ps;
  pthread_mutex_unlock(&obs->mu);
  double occ[KVBM_TIER_COUNT] = {0};
  occ[0] = ps.num_blocks ? (double)(ps.cached + ps.active) / ps.num_blocks : 0;
  obs->present = 1;
  take_sample(obs, done, total, so_far->prompt_tokens, so_far->hit_tokens, occ);
}

void replay_obs_w1(replay_obs *obs, kvsim_w1_config *cfg) {
  if (!obs) return;
  cfg->on_request = w1_request;
  cfg->request_user = obs;
}

void replay_obs_w1_done(replay_obs *obs, const kvsim_w1_result *res) {
  if (!obs) return;
  pthread_mutex_lock(&obs->mu);
  obs->finished = true;
  obs->w1 = *res;
  pthread_mutex_unlock(&obs->mu);
  if (!write_plot(obs, obs->total, "W1")) obs->ok = false;
  hold(obs);
}

/* -------------------------------------------------------------------- W2 */

static void w2_start(void *user, kvbm_manager *m) {
  replay_obs *obs = user;
  for (int t = 0; t < KVBM_TIER_COUNT; t++) {
    kvbm_tier_stats s;
    if (!kvbm_manager_stats_get(m, t, &s) && s.num_blocks) obs->present |= 1u << t;
  }
  obs->reg = kvbm_manager_metrics(m);
  if (!obs->reg) return;
  kvbm_error err = {0};
  if (kvbm_metrics_register(obs->reg, collect, obs, NULL, 0, &obs->collector, &err)) {
    fprintf(stderr, "kvbm replay: %s\n", err.msg);
    obs->ok = false;
    return;
  }
  obs->registered = true;
  if (!write_port(obs, kvbm_manager_metrics_port(m))) obs->ok = false;
}

static void w2_request(void *user, size_t done, size_t total, const kvsim_w2_result *so_far,
                       kvbm_manager *m) {
  replay_obs *obs = user;
  pthread_mutex_lock(&obs->mu);
  obs->done = done;
  obs->total = total;
  obs->w2r = *so_far;
  pthread_mutex_unlock(&obs->mu);
  if (!obs->o.plot) return;
  double occ[KVBM_TIER_COUNT] = {0};
  if (done % (total / PLOT_POINTS + 1) == 0 || done == total)
    for (int t = 0; t < KVBM_TIER_COUNT; t++) {
      kvbm_tier_stats s;
      if (!kvbm_manager_stats_get(m, t, &s) && s.num_blocks)
        occ[t] = (double)(s.cached + s.active) / s.num_blocks;
    }
  take_sample(obs, done, total, so_far->w1.prompt_tokens, so_far->w1.hit_tokens, occ);
}

static void w2_finish(void *user, kvbm_manager *m, const kvsim_w2_result *res) {
  (void)m;
  replay_obs *obs = user;
  if (res) {
    pthread_mutex_lock(&obs->mu);
    obs->finished = true;
    obs->w2r = *res;
    pthread_mutex_unlock(&obs->mu);
    if (obs->print) obs->print(obs->print_ctx, res);
    if (!write_plot(obs, obs->total, "W2")) obs->ok = false;
    hold(obs);
  }
  /* the manager goes next: its registry with it */
  if (obs->registered) kvbm_metrics_unregister(obs->reg, obs->collector);
  obs->registered = false;
  obs->reg = NULL;
}

void replay_obs_w2(replay_obs *obs, kvsim_w2_config *cfg,
                   void (*print)(void *ctx, const kvsim_w2_result *res), void *ctx) {
  if (!obs) return;
  cfg->on_start = w2_start;
  cfg->on_request = w2_request;
  cfg->on_finish = w2_finish;
  cfg->observer_user = obs;
  if (obs->o.m.cfg.enabled) cfg->metrics = &obs->o.m.cfg;
  obs->print = print;
  obs->print_ctx = ctx;
}
