/* SPDX-License-Identifier: Apache-2.0 */
/* cli.c: argument helpers shared by the subcommands (see cli.h). */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

bool cli_parse_u64(const char *cmd, const char *opt, const char *text,
                   uint64_t min, uint64_t max, uint64_t *out) {
  char *end = NULL;
  unsigned long long v;
  if (!text || !*text || *text == '-' || *text == '+' || *text == ' ') goto bad;
  errno = 0;
  v = strtoull(text, &end, 10);
  if (errno || *end) goto bad;
  if (v < min || v > max) {
    fprintf(stderr, "kvbm %s: %s: %s is out of range [%llu, %llu]\n", cmd, opt,
            text, (unsigned long long)min, (unsigned long long)max);
    return false;
  }
  *out = v;
  return true;
bad:
  fprintf(stderr, "kvbm %s: %s: '%s' is not a non-negative integer\n", cmd, opt,
          text ? text : "");
  return false;
}

bool cli_parse_double(const char *cmd, const char *opt, const char *text,
                      double min, double max, double *out) {
  char *end = NULL;
  double v;
  if (!text || !*text) goto bad;
  errno = 0;
  v = strtod(text, &end);
  if (errno || *end || !isfinite(v)) goto bad;
  if (v < min || v > max) {
    fprintf(stderr, "kvbm %s: %s: %s is out of range [%g, %g]\n", cmd, opt, text,
            min, max);
    return false;
  }
  *out = v;
  return true;
bad:
  fprintf(stderr, "kvbm %s: %s: '%s' is not a number\n", cmd, opt,
          text ? text : "");
  return false;
}

int cli_opt_value(const char *cmd, int argc, char **argv, int *i,
                  const char *opt, const char **value) {
  const char *a = argv[*i];
  size_t n = strlen(opt);
  if (strncmp(a, opt, n) != 0) return 0;
  if (a[n] == '=') {
    *value = a + n + 1;
    return 1;
  }
  if (a[n] != '\0') return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "kvbm %s: %s needs a value\n", cmd, opt);
    return -1;
  }
  *value = argv[++*i];
  return 1;
}

double cli_now(void) { return kvbm_clock_seconds(); }
