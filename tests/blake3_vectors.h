/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blake3_vectors.h: the official BLAKE3 test vectors
 * (KVBM_SHARED_DIR/data/blake3_test_vectors.json), read for the tests that
 * check a BLAKE3 against them (tests/blake3/, tests/cuda/). The reader
 * knows the file's fixed shape only: a key, a context string, and cases of
 * an input length with hash, keyed_hash and derive_key in hex (131 bytes
 * of extended output each). Each case's input is fill_input(): byte i is
 * i % 251, the vectors' own rule.
 */
#ifndef KVBM_TESTS_BLAKE3_VECTORS_H
#define KVBM_TESTS_BLAKE3_VECTORS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CASES 64
#define VEC_OUT 131

typedef struct vcase {
  size_t input_len;
  uint8_t hash[VEC_OUT], keyed[VEC_OUT], derive[VEC_OUT];
} vcase;

typedef struct vectors {
  char key[64];
  char context[128];
  vcase cases[MAX_CASES];
  size_t ncases;
} vectors;

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  if (buf) buf[n] = '\0';
  fclose(f);
  return buf;
}

/* Copies the string value of "name" found after `from` into out. */
static const char *json_string(const char *from, const char *name, char *out,
                               size_t cap) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\"", name);
  const char *p = strstr(from, pat);
  if (!p) return NULL;
  p = strchr(p + strlen(pat), '"');
  if (!p) return NULL;
  p++;
  const char *e = strchr(p, '"');
  if (!e || (size_t)(e - p) >= cap) return NULL;
  memcpy(out, p, (size_t)(e - p));
  out[e - p] = '\0';
  return e + 1;
}

static int unhex(const char *hex, uint8_t *out, size_t n) {
  if (strlen(hex) != 2 * n) return -1;
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
    out[i] = (uint8_t)v;
  }
  return 0;
}

static int load_vectors(vectors *v) {
  char *text = slurp(KVBM_SHARED_DIR "/data/blake3_test_vectors.json");
  if (!text) return -1;
  memset(v, 0, sizeof *v);
  const char *p = strstr(text, "\"cases\"");
  if (!json_string(text, "key", v->key, sizeof v->key) ||
      !json_string(text, "context_string", v->context, sizeof v->context) ||
      !p) {
    free(text);
    return -1;
  }
  char hex[2 * VEC_OUT + 1];
  while ((p = strstr(p, "\"input_len\"")) != NULL && v->ncases < MAX_CASES) {
    vcase *c = &v->cases[v->ncases];
    p = strchr(p, ':') + 1;
    c->input_len = strtoul(p, NULL, 10);
    if (!(p = json_string(p, "hash", hex, sizeof hex)) ||
        unhex(hex, c->hash, VEC_OUT) ||
        !(p = json_string(p, "keyed_hash", hex, sizeof hex)) ||
        unhex(hex, c->keyed, VEC_OUT) ||
        !(p = json_string(p, "derive_key", hex, sizeof hex)) ||
        unhex(hex, c->derive, VEC_OUT)) {
      free(text);
      return -1;
    }
    v->ncases++;
  }
  free(text);
  return 0;
}

static void fill_input(uint8_t *buf, size_t n) {
  for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(i % 251);
}

#endif
