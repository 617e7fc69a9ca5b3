/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_volume_url.c: libFuzzer target for the volume descriptor parser and
 * the key-namespace rules (src/volume/url.c).
 * fuzz-modules: common volume/url.c
 *
 * Beyond "no crash, no leak, no UB": an accepted URL has the shape its
 * scheme promises (hosts and ports in range, an absolute directory for
 * file:// and disk://, no userinfo in the display form), and a namespace
 * that passes the check can only name one folder and makes a key that fits.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "volume/internal.h"

static void check_url(const char *s) {
  kvbm__volume_url u;
  kvbm_error err = {0};
  if (kvbm__volume_url_parse(s, &u, &err) != KVBM_OK) {
    if (err.code != KVBM_EINVAL || strncmp(err.msg, "volume: ", 8) != 0) abort();
    return;
  }
  if (strlen(u.display) > KVBM__VOLUME_URL_MAX ||
      (strchr(u.display, '@') != NULL &&
       (u.kind == KVBM__VOLUME_REDIS || u.kind == KVBM__VOLUME_CLUSTER)))
    abort(); /* hosts have no '@': the display form has no userinfo */
  switch (u.kind) {
  case KVBM__VOLUME_FILE:
  case KVBM__VOLUME_DISK:
    if (u.nhosts != 0 || (u.path[0] == 0 && u.kind == KVBM__VOLUME_FILE) ||
        (u.path[0] != 0 && u.path[0] != '/'))
      abort();
    break;
  case KVBM__VOLUME_REDIS:
  case KVBM__VOLUME_CLUSTER:
    if (u.nhosts < 1 || u.nhosts > (u.kind == KVBM__VOLUME_REDIS ? 1u : KVBM__VOLUME_HOSTS_MAX))
      abort();
    for (uint32_t i = 0; i < u.nhosts; i++)
      if (u.hosts[i].port == 0 || u.hosts[i].host[0] == 0 ||
          strlen(u.hosts[i].host) > KVBM__VOLUME_HOST_MAX)
        abort();
    if (u.kind == KVBM__VOLUME_CLUSTER && u.db != 0) abort();
    break;
  default:
    break;
  }
}

static void check_ns(const char *s) {
  if (kvbm__volume_ns_check(s, NULL) != KVBM_OK) return;
  if (strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, "..") || strlen(s) > KVBM__VOLUME_NS_MAX)
    abort();
  char key[KVBM__VOLUME_KEY_MAX];
  size_t n = kvbm__volume_key(s, 0x0123456789abcdefull, key);
  if (n >= sizeof key || strlen(key) != n) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 2 * KVBM__VOLUME_URL_MAX) return 0;
  char *s = malloc(size + 1);
  memcpy(s, data, size);
  s[size] = 0;
  check_url(s);
  check_ns(s);
  /* the same bytes without a terminator the parser could rely on: an
   * exact-size copy (ASan catches a read past it) */
  size_t n = strnlen(s, size);
  char *exact = malloc(n + 1);
  memcpy(exact, s, n + 1);
  check_url(exact);
  free(exact);
  free(s);
  return 0;
}
