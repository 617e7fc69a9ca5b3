/* SPDX-License-Identifier: Apache-2.0 */
/*
 * svg.c: the SVG line-chart writer (see workload/svg.h).
 *
 * Layout: a plot box with margins for the tick labels (left, bottom), the
 * title (top) and the legend (right). Ticks: y at a "nice" step (1, 2 or 5
 * times a power of ten) giving about five intervals from zero; x in log
 * mode at every power of ten in range plus the 2x and 5x marks when the
 * range is narrow, else at a nice linear step. Points are drawn as a
 * polyline plus a small circle each, in a fixed palette that stays
 * distinguishable in print. Numbers are written with %g, so the file is
 * short and diffs well when committed.
 */
#include "workload/svg.h"

#include <math.h>
#include <string.h>

static const char *const kPalette[KVSIM_SVG_MAX_SERIES] = {
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#7f7f7f", "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#000000"};

void kvsim_svg_chart_init(kvsim_svg_chart *c) {
  memset(c, 0, sizeof *c);
  c->width = 720;
  c->height = 460;
}

bool kvsim_svg_chart_add(kvsim_svg_chart *c, const char *name, const double *x, const double *y,
                        size_t n) {
  if (c->nseries == KVSIM_SVG_MAX_SERIES) return false;
  c->series[c->nseries++] = (kvsim_svg_series){name ? name : "", x, y, n};
  return true;
}

static void escaped(FILE *f, const char *s) {
  for (; s && *s; s++) switch (*s) {
      case '<': fputs("&lt;", f); break;
      case '>': fputs("&gt;", f); break;
      case '&': fputs("&amp;", f); break;
      case '"': fputs("&quot;", f); break;
      default:
        if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
}

static double nice_step(double range, int intervals) {
  double raw = range / intervals, p = pow(10, floor(log10(raw))), m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

typedef struct frame {
  double x0, x1, y0, y1;       /* data range (x in log10 when x_log) */
  double left, top, w, h;      /* plot box in pixels */
  bool xlog;
} frame;

static double px(const frame *fr, double x) {
  double v = fr->xlog ? log10(x) : x;
  return fr->left + (fr->x1 > fr->x0 ? (v - fr->x0) / (fr->x1 - fr->x0) : 0.5) * fr->w;
}

static double py(const frame *fr, double y) {
  return fr->top + fr->h - (fr->y1 > fr->y0 ? (y - fr->y0) / (fr->y1 - fr->y0) : 0.5) * fr->h;
}

static int data_range(const kvsim_svg_chart *c, frame *fr, kvbm_error *err) {
  bool any = false;
  fr->x0 = fr->y0 = INFINITY;
  fr->x1 = fr->y1 = -INFINITY;
  for (size_t s = 0; s < c->nseries; s++)
    for (size_t i = 0; i < c->series[s].n; i++) {
      double x = c->series[s].x[i], y = c->series[s].y[i];
      if (!isfinite(x) || !isfinite(y) || (c->x_log && x <= 0))
        return kvbm_error_set(err, KVBM_EINVAL, "svg: series '%s' point %zu is not drawable",
                              c->series[s].name, i);
      double v = c->x_log ? log10(x) : x;
      fr->x0 = fmin(fr->x0, v);
      fr->x1 = fmax(fr->x1, v);
      fr->y0 = fmin(fr->y0, y);
      fr->y1 = fmax(fr->y1, y);
      any = true;
    }
  if (!any) return kvbm_error_set(err, KVBM_EINVAL, "svg: nothing to draw");
  if (fr->y0 > 0) fr->y0 = 0; /* rates read best from zero */
  double step = nice_step(fr->y1 - fr->y0 > 0 ? fr->y1 - fr->y0 : 1, 5);
  fr->y1 = ceil(fr->y1 / step) * step;
  if (fr->y1 <= fr->y0) fr->y1 = fr->y0 + step;
  if (fr->x1 <= fr->x0) fr->x0 -= 0.5, fr->x1 += 0.5;
  return KVBM_OK;
}

static void axes(FILE *f, const kvsim_svg_chart *c, const frame *fr) {
  fprintf(f, "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"#444\"/>\n",
          fr->left, fr->top, fr->w, fr->h);
  double ystep = nice_step(fr->y1 - fr->y0, 5);
  for (double y = fr->y0; y <= fr->y1 + ystep * 1e-6; y += ystep) {
    double yy = py(fr, y);
    fprintf(f, "<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", fr->left,
            yy, fr->left + fr->w, yy);
    fprintf(f, "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\" font-size=\"12\">%g</text>\n",
            fr->left - 6, yy + 4, y);
  }
  if (fr->xlog) {
    double span = fr->x1 - fr->x0;
    for (double e = floor(fr->x0); e <= ceil(fr->x1); e++)
      for (int m = 1; m <= 5; m++) {
        if (m != 1 && (m != 2 && m != 5)) continue;
        if (m != 1 && span > 2.5) continue;
        double v = e + log10(m);
        if (v < fr->x0 - 1e-9 || v > fr->x1 + 1e-9) continue;
        double x = fr->left + (v - fr->x0) / (fr->x1 - fr->x0) * fr->w;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#ddd\"/>\n", x,
                fr->top, x, fr->top + fr->h);
        fprintf(f, "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\" font-size=\"12\">%g</text>\n",
                x, fr->top + fr->h + 16, pow(10, v));
      }
  } else {
    double xstep = nice_step(fr->x1 - fr->x0, 6);
    for (double x = ceil(fr->x0 / xstep) * xstep; x <= fr->x1 + xstep * 1e-6; x += xstep) {
      double xx = px(fr, x);
      fprintf(f, "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#ddd\"/>\n", xx,
              fr->top, xx, fr->top + fr->h);
      fprintf(f, "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\" font-size=\"12\">%g</text>\n",
              xx, fr->top + fr->h + 16, x);
    }
  }
  fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\" font-size=\"13\">", fr->left + fr->w / 2,
          fr->top + fr->h + 36);
  escaped(f, c->x_label);
  fprintf(f, "</text>\n<text transform=\"translate(16,%g) rotate(-90)\" text-anchor=\"middle\" "
             "font-size=\"13\">", fr->top + fr->h / 2);
  escaped(f, c->y_label);
  fputs("</text>\n", f);
}

static void series(FILE *f, const kvsim_svg_chart *c, const frame *fr) {
  for (size_t s = 0; s < c->nseries; s++) {
    const kvsim_svg_series *se = &c->series[s];
    fprintf(f, "<g stroke=\"%s\" fill=\"%s\">\n<polyline fill=\"none\" stroke-width=\"2\" points=\"",
            kPalette[s], kPalette[s]);
    for (size_t i = 0; i < se->n; i++)
      fprintf(f, "%s%.1f,%.1f", i ? " " : "", px(fr, se->x[i]), py(fr, se->y[i]));
    fputs("\"/>\n", f);
    for (size_t i = 0; i < se->n; i++)
      fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>\n", px(fr, se->x[i]), py(fr, se->y[i]));
    fputs("</g>\n", f);
    double ly = fr->top + 14 + 20.0 * (double)s, lx = fr->left + fr->w + 14;
    fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-width=\"3\"/>\n",
            lx, ly - 4, lx + 22, ly - 4, kPalette[s]);
    fprintf(f, "<text x=\"%g\" y=\"%g\" font-size=\"12\">", lx + 28, ly);
    escaped(f, se->name);
    fputs("</text>\n", f);
  }
}

int kvsim_svg_chart_print(const kvsim_svg_chart *c, FILE *f, kvbm_error *err) {
  if (!c || !f) return kvbm_error_set(err, KVBM_EINVAL, "svg: NULL argument");
  frame fr = {.left = 70, .top = 40, .xlog = c->x_log};
  fr.w = c->width - fr.left - 150;
  fr.h = c->height - fr.top - 56;
  int rc = data_range(c, &fr, err);
  if (rc) return rc;
  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
             "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
             "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
             "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
          c->width, c->height, c->width, c->height);
  fprintf(f, "<text x=\"%g\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">", fr.left + fr.w / 2);
  escaped(f, c->title);
  fputs("</text>\n", f);
  axes(f, c, &fr);
  series(f, c, &fr);
  fputs("</svg>\n", f);
  return ferror(f) ? kvbm_error_set(err, KVBM_EIO, "svg: write failed") : KVBM_OK;
}

int kvsim_svg_chart_write(const kvsim_svg_chart *c, const char *path, kvbm_error *err) {
  if (!path) return kvbm_error_set(err, KVBM_EINVAL, "svg: NULL path");
  FILE *f = fopen(path, "w");
  if (!f) return kvbm_error_set(err, KVBM_EIO, "svg: cannot create %s", path);
  int rc = kvsim_svg_chart_print(c, f, err);
  if (fclose(f) && !rc) rc = kvbm_error_set(err, KVBM_EIO, "svg: cannot write %s", path);
  return rc;
}
