/* SPDX-License-Identifier: Apache-2.0 */
/*
 * text.c: the lexical side of Prometheus' text exposition format 0.0.4,
 * and the buffer the page is assembled in.
 *
 * Everything the registry writes goes through here, so the rules live in
 * one place: which names are names, how a label value or a help text is
 * escaped, how a number is spelled.
 *
 * Numbers. Counters are integers and are written as such (a uint64 above
 * 2^53 would lose digits through a double). Other values are written with
 * the fewest significant digits that read back to the same double (15,
 * else 16, else 17: %.17g always round-trips), so 0.1 is "0.1" and not
 * "0.10000000000000001"; NaN and the infinities get the spellings
 * Prometheus' parser knows.
 *
 * Text. Label values and help texts come from anywhere (a volume's URL, a
 * worker's endpoint, an engine's model id), and one byte that is not UTF-8
 * makes Prometheus refuse the whole scrape. So escaping also decodes: a
 * well-formed sequence (no overlong form, no surrogate, nothing above
 * U+10FFFF) is copied, anything else becomes U+FFFD one byte at a time.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/vec.h"
#include "metrics/internal.h"

/* Room for `more` bytes after len; a page past SIZE_MAX / 2 bytes, or a
 * failed allocation, marks the buffer out of memory for good. */
static bool grow(kvbm__mbuf *b, size_t more) {
  if (b->oom) return false;
  if (more > SIZE_MAX / 2 - b->len ||
      kvbm__vec_reserve_of(&b->p, &b->cap, b->len + more, 256, KVBM__VEC_NO_LIMIT)) {
    b->oom = true;
    return false;
  }
  return true;
}

void kvbm__mbuf_put(kvbm__mbuf *b, const char *s, size_t n) {
  if (!grow(b, n + 1)) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

void kvbm__mbuf_puts(kvbm__mbuf *b, const char *s) { kvbm__mbuf_put(b, s, strlen(s)); }

void kvbm__mbuf_u64(kvbm__mbuf *b, uint64_t v) {
  char tmp[24];
  int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v);
  kvbm__mbuf_put(b, tmp, (size_t)n);
}

void kvbm__mbuf_double(kvbm__mbuf *b, double v) {
  if (isnan(v) || isinf(v)) {
    kvbm__mbuf_puts(b, isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf");
    return;
  }
  char tmp[40];
  int n = 0;
  for (int prec = 15; prec <= 17; prec++) {
    n = snprintf(tmp, sizeof tmp, "%.*g", prec, v);
    if (strtod(tmp, NULL) == v) break;
  }
  kvbm__mbuf_put(b, tmp, (size_t)n);
}

/* Length of the well-formed UTF-8 sequence at s (1..4), 0 if there is none. */
static size_t utf8_len(const unsigned char *s) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) return (s[1] & 0xc0) == 0x80 ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    if ((s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0;
    if (c == 0xe0 && s[1] < 0xa0) return 0; /* overlong */
    if (c == 0xed && s[1] >= 0xa0) return 0; /* surrogate */
    return 3;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    if ((s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80) return 0;
    if (c == 0xf0 && s[1] < 0x90) return 0;  /* overlong */
    if (c == 0xf4 && s[1] >= 0x90) return 0; /* above U+10FFFF */
    return 4;
  }
  return 0;
}

void kvbm__mbuf_escaped(kvbm__mbuf *b, const char *str, bool quoted) {
  const unsigned char *s = (const unsigned char *)str;
  while (*s) {
    /* the plain run first: one copy for the common case */
    size_t run = 0;
    while (s[run] && s[run] < 0x80 && s[run] != '\\' && s[run] != '\n' &&
           !(quoted && s[run] == '"'))
      run++;
    if (run) {
      kvbm__mbuf_put(b, (const char *)s, run);
      s += run;
      continue;
    }
    if (*s == '\\') kvbm__mbuf_put(b, "\\\\", 2);
    else if (*s == '\n') kvbm__mbuf_put(b, "\\n", 2);
    else if (*s == '"') kvbm__mbuf_put(b, "\\\"", 2);
    if (*s < 0x80) {
      s++;
      continue;
    }
    /* utf8_len reads at most up to the first byte that is not a
     * continuation byte, and the NUL ends every string before that */
    size_t n = utf8_len(s);
    if (n) {
      kvbm__mbuf_put(b, (const char *)s, n);
      s += n;
    } else {
      kvbm__mbuf_put(b, "\xef\xbf\xbd", 3);
      s++;
    }
  }
}

void kvbm__mbuf_free(kvbm__mbuf *b) {
  free(b->p);
  *b = (kvbm__mbuf){0};
}

static bool alpha_(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool digit(unsigned char c) { return c >= '0' && c <= '9'; }

bool kvbm__metric_name_ok(const char *s) {
  if (!s || !(alpha_((unsigned char)s[0]) || s[0] == ':')) return false;
  size_t i = 1;
  for (; s[i]; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!alpha_(c) && !digit(c) && c != ':') return false;
    if (i >= KVBM_METRICS_MAX_NAME) return false;
  }
  return true;
}

bool kvbm__label_name_ok(const char *s) {
  if (!s || !alpha_((unsigned char)s[0]) || (s[0] == '_' && s[1] == '_')) return false;
  for (size_t i = 1; s[i]; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!alpha_(c) && !digit(c)) return false;
    if (i >= KVBM_METRICS_MAX_NAME) return false;
  }
  return true;
}
