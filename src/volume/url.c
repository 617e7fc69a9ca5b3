/* SPDX-License-Identifier: Apache-2.0 */
/*
 * url.c: the volume descriptor (a URL) and the key rules.
 *
 * Design. A descriptor comes from a flag or an environment variable, so it
 * is treated as hostile: the parser reads it once, left to right, within a
 * hard length bound, into fixed-size fields, and every refusal names the
 * part that is wrong ("volume: redis:// port '99999' is not in 1..65535").
 * No allocation, no recursion, no locale: the fuzz target
 * (fuzz/fuzz_volume_url.c) runs it on arbitrary bytes.
 *
 * Grammar (a strict subset of RFC 3986, enough for the four schemes):
 *
 *   scheme "://" [userinfo "@"] hosts [path]
 *   scheme   = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )      (<= 32)
 *   userinfo = [user] ":" password | password                   (%XX ok)
 *   hosts    = host [":" port] *( "," host [":" port] )
 *   host     = name | "[" IPv6 "]"
 *   path     = "/" ...                                          (%XX ok)
 *
 * No fragment, no spaces or control bytes anywhere, and a query only where
 * its every key is known (disk://): a '?' or '#' is refused rather than
 * silently dropped, because it would mean an option the user believes is
 * applied. disk:// takes ?direct=0|1, ?uring=0|1, ?depth=1..256 (requests
 * in flight) and, for tests, ?test_refuse=direct,uring (the kernel's
 * refusals, simulated), joined with '&'. A userinfo without ':' is a password (the
 * common Redis habit, "redis://secret@host"). The display form, used for
 * the volume's name and in every message, is the URL without its userinfo,
 * so a password never reaches a log or an event.
 *
 * Per scheme: file:// and disk:// take no host and an absolute path (a
 * bare "disk://" is the slot file's private default directory);
 * redis:// one host, an optional "/DB" (decimal); redis+cluster:// one to
 * 16 seeds and no database but 0 (Redis Cluster has only database 0). Any
 * other scheme is checked for syntax only and left to the caller's backend.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "volume/internal.h"

static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static int hexval(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Decodes [s, s + n) (%XX escapes) into out (cap bytes with the NUL). */
static int decode(const char *what, const char *s, size_t n, char *out, size_t cap,
                  kvbm_error *err) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '%') {
      int hi = i + 2 < n ? hexval(s[i + 1]) : -1;
      int lo = i + 2 < n ? hexval(s[i + 2]) : -1;
      if (hi < 0 || lo < 0)
        return kvbm_error_set(err, KVBM_EINVAL, "volume: %s has a bad %%-escape at byte %zu",
                              what, i);
      c = (char)(hi << 4 | lo);
      if (c == 0)
        return kvbm_error_set(err, KVBM_EINVAL, "volume: %s decodes to a NUL byte (%%00)", what);
      i += 2;
    }
    if (o + 1 >= cap)
      return kvbm_error_set(err, KVBM_EINVAL, "volume: %s is longer than %zu bytes", what,
                            cap - 1);
    out[o++] = c;
  }
  out[o] = 0;
  return KVBM_OK;
}

/* A port: 1..65535, decimal digits only. */
static int parse_port(const char *scheme, const char *s, size_t n, uint16_t *out,
                      kvbm_error *err) {
  unsigned v = 0;
  bool ok = n >= 1 && n <= 5;
  for (size_t i = 0; ok && i < n; i++) {
    ok = is_digit(s[i]);
    v = v * 10 + (unsigned)(s[i] - '0');
  }
  if (!ok || v < 1 || v > 65535)
    return kvbm_error_set(err, KVBM_EINVAL, "volume: %s:// port '%.*s' is not in 1..65535",
                          scheme, (int)(n > 16 ? 16 : n), s);
  *out = (uint16_t)v;
  return KVBM_OK;
}

/* One "host[:port]" or "[v6][:port]" of [s, s + n). */
static int parse_host(const char *scheme, const char *s, size_t n, kvbm__volume_host *h,
                      kvbm_error *err) {
  const char *name = s, *rest;
  size_t nlen;
  if (n && s[0] == '[') {
    const char *close = memchr(s, ']', n);
    if (!close)
      return kvbm_error_set(err, KVBM_EINVAL, "volume: %s:// host '%.*s' has no closing ']'",
                            scheme, (int)(n > 64 ? 64 : n), s);
    name = s + 1;
    nlen = (size_t)(close - name);
    for (size_t i = 0; i < nlen; i++)
      if (hexval(name[i]) < 0 && name[i] != ':' && name[i] != '.')
        return kvbm_error_set(err, KVBM_EINVAL,
                              "volume: %s:// IPv6 address '%.*s' has a bad character '%c'",
                              scheme, (int)(nlen > 64 ? 64 : nlen), name, name[i]);
    rest = close + 1;
  } else {
    const char *colon = memchr(s, ':', n);
    nlen = colon ? (size_t)(colon - s) : n;
    for (size_t i = 0; i < nlen; i++)
      if (!is_alpha(s[i]) && !is_digit(s[i]) && s[i] != '.' && s[i] != '-' && s[i] != '_')
        return kvbm_error_set(err, KVBM_EINVAL,
                              "volume: %s:// host '%.*s' has a bad character '%c' (a name, an "
                              "IPv4 address or [IPv6])",
                              scheme, (int)(nlen > 64 ? 64 : nlen), s, s[i]);
    rest = s + nlen;
  }
  if (nlen == 0) return kvbm_error_set(err, KVBM_EINVAL, "volume: %s:// URL has an empty host", scheme);
  if (nlen > KVBM__VOLUME_HOST_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "volume: %s:// host is longer than %d bytes", scheme,
                          KVBM__VOLUME_HOST_MAX);
  memcpy(h->host, name, nlen);
  h->host[nlen] = 0;
  size_t left = n - (size_t)(rest - s);
  h->port = 6379;
  if (left == 0) return KVBM_OK;
  if (rest[0] != ':')
    return kvbm_error_set(err, KVBM_EINVAL, "volume: %s:// host '%.*s' is followed by '%c'",
                          scheme, (int)(nlen > 64 ? 64 : nlen), name, rest[0]);
  return parse_port(scheme, rest + 1, left - 1, &h->port, err);
}

/* userinfo: "[user]:password" or "password". */
static int parse_userinfo(const char *s, size_t n, kvbm__volume_url *u, kvbm_error *err) {
  const char *colon = memchr(s, ':', n);
  int rc;
  if (colon) {
    rc = decode("user name", s, (size_t)(colon - s), u->user, sizeof u->user, err);
    if (!rc)
      rc = decode("password", colon + 1, n - (size_t)(colon + 1 - s), u->password,
                  sizeof u->password, err);
  } else {
    rc = decode("password", s, n, u->password, sizeof u->password, err);
  }
  u->has_password = !rc && u->password[0];
  return rc;
}

static int parse_redis_path(const char *p, size_t n, kvbm__volume_url *u, kvbm_error *err) {
  if (n <= 1) return KVBM_OK; /* "" or "/" */
  uint32_t db = 0;
  bool ok = n - 1 <= 9;
  for (size_t i = 1; ok && i < n; i++) {
    ok = is_digit(p[i]);
    db = db * 10 + (uint32_t)(p[i] - '0');
  }
  if (!ok)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "volume: %s:// path '%.*s' is not a database number (/0 .. /999999999)",
                          u->scheme, (int)(n > 32 ? 32 : n), p);
  if (u->kind == KVBM__VOLUME_CLUSTER && db != 0)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "volume: redis+cluster:// has only database 0, not %u", db);
  u->db = db;
  return KVBM_OK;
}

static kvbm__volume_kind kind_of(const char *scheme) {
  if (!strcmp(scheme, "file")) return KVBM__VOLUME_FILE;
  if (!strcmp(scheme, "disk")) return KVBM__VOLUME_DISK;
  if (!strcmp(scheme, "redis")) return KVBM__VOLUME_REDIS;
  if (!strcmp(scheme, "redis+cluster")) return KVBM__VOLUME_CLUSTER;
  return KVBM__VOLUME_OTHER;
}

/* One "0" or "1". */
static int flag(const char *v, size_t n) {
  return n == 1 && (v[0] == '0' || v[0] == '1') ? v[0] - '0' : -1;
}

/* disk://'s query: "k=v&k=v". */
static int parse_disk_query(const char *q, size_t n, kvbm__volume_url *u, kvbm_error *err) {
  const char *s = q, *end = q + n;
  while (s < end) {
    const char *amp = memchr(s, '&', (size_t)(end - s));
    const char *e = amp ? amp : end;
    const char *eq = memchr(s, '=', (size_t)(e - s));
    size_t kl = eq ? (size_t)(eq - s) : (size_t)(e - s);
    const char *v = eq ? eq + 1 : e;
    size_t vl = (size_t)(e - v);
    int bad = !eq;
    if (!bad && kl == 6 && !memcmp(s, "direct", 6)) {
      bad = (u->disk_direct = flag(v, vl)) < 0;
    } else if (!bad && kl == 5 && !memcmp(s, "uring", 5)) {
      bad = (u->disk_uring = flag(v, vl)) < 0;
    } else if (!bad && kl == 5 && !memcmp(s, "depth", 5)) {
      int d = 0;
      bad = vl < 1 || vl > 3;
      for (size_t i = 0; !bad && i < vl; i++) {
        bad = !is_digit(v[i]);
        d = d * 10 + v[i] - '0';
      }
      bad = bad || d < 1 || d > 256;
      u->disk_depth = d;
    } else if (!bad && kl == 11 && !memcmp(s, "test_refuse", 11)) {
      for (const char *t = v; !bad && t < e;) {
        const char *c = memchr(t, ',', (size_t)(e - t));
        size_t tl = c ? (size_t)(c - t) : (size_t)(e - t);
        if (tl == 6 && !memcmp(t, "direct", 6)) u->disk_test_refuse |= 1u;
        else if (tl == 5 && !memcmp(t, "uring", 5)) u->disk_test_refuse |= 2u;
        else bad = 1;
        t += tl + (c ? 1 : 0);
      }
    } else {
      return kvbm_error_set(err, KVBM_EINVAL,
                            "volume: disk:// has no option '%.*s' (direct, uring, depth, "
                            "test_refuse)",
                            (int)(kl > 32 ? 32 : kl), s);
    }
    if (bad)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "volume: disk:// option '%.*s' has a bad value (direct=0|1, "
                            "uring=0|1, depth=1..256, test_refuse=direct,uring)",
                            (int)(e - s > 48 ? 48 : e - s), s);
    s = e + (amp ? 1 : 0);
  }
  return KVBM_OK;
}

/* Everything after "://" for the built-in schemes. */
static int parse_rest(const char *auth, size_t alen, const char *path,
                      size_t plen, kvbm__volume_url *u, kvbm_error *err) {
  const char *at = NULL;
  for (size_t i = 0; i < alen; i++)
    if (auth[i] == '@') at = auth + i; /* the last '@': passwords may hold one %-escaped */
  const char *hosts = at ? at + 1 : auth;
  size_t hlen = alen - (size_t)(hosts - auth);
  if (u->kind == KVBM__VOLUME_FILE || u->kind == KVBM__VOLUME_DISK) {
    if (alen)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "volume: %s:// takes no host ('%.*s'): write %s:///DIR", u->scheme,
                            (int)(alen > 64 ? 64 : alen), auth, u->scheme);
    if (plen == 0 && u->kind == KVBM__VOLUME_DISK) return KVBM_OK; /* the private default */
    if (plen == 0)
      return kvbm_error_set(err, KVBM_EINVAL, "volume: %s:// needs a directory: %s:///DIR",
                            u->scheme, u->scheme);
    const char *q = memchr(path, '?', plen);
    if (q && memchr(q + 1, '?', plen - (size_t)(q + 1 - path)))
      return kvbm_error_set(err, KVBM_EINVAL, "volume: %s:// URL has two '?'", u->scheme);
    int rc = decode("directory", path, q ? (size_t)(q - path) : plen, u->path, sizeof u->path,
                    err);
    if (!rc && !u->path[0])
      return kvbm_error_set(err, KVBM_EINVAL, "volume: %s:// needs a directory: %s:///DIR",
                            u->scheme, u->scheme);
    if (!rc && q) rc = parse_disk_query(q + 1, plen - (size_t)(q + 1 - path), u, err);
    return rc;
  }
  int rc = at ? parse_userinfo(auth, (size_t)(at - auth), u, err) : KVBM_OK;
  if (rc) return rc;
  if (hlen == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "volume: %s:// URL has no host", u->scheme);
  const char *s = hosts, *end = hosts + hlen;
  while (s <= end) {
    const char *comma = memchr(s, ',', (size_t)(end - s));
    const char *e = comma ? comma : end;
    if (u->nhosts == (u->kind == KVBM__VOLUME_CLUSTER ? KVBM__VOLUME_HOSTS_MAX : 1))
      return kvbm_error_set(err, KVBM_EINVAL,
                            u->kind == KVBM__VOLUME_CLUSTER
                                ? "volume: redis+cluster:// takes at most %d seeds"
                                : "volume: redis:// takes one host (%d), not a list: use "
                                  "redis+cluster:// for a cluster",
                            u->kind == KVBM__VOLUME_CLUSTER ? KVBM__VOLUME_HOSTS_MAX : 1);
    rc = parse_host(u->scheme, s, (size_t)(e - s), &u->hosts[u->nhosts], err);
    if (rc) return rc;
    u->nhosts++;
    if (!comma) break;
    s = comma + 1;
  }
  return parse_redis_path(path, plen, u, err);
}

int kvbm__volume_url_parse(const char *url, kvbm__volume_url *u, kvbm_error *err) {
  if (!url || !u) return kvbm_error_set(err, KVBM_EINVAL, "volume: NULL URL");
  memset(u, 0, sizeof *u);
  u->disk_direct = u->disk_uring = u->disk_depth = -1;
  size_t n = strnlen(url, KVBM__VOLUME_URL_MAX + 1);
  if (n == 0) return kvbm_error_set(err, KVBM_EINVAL, "volume: empty URL");
  if (n > KVBM__VOLUME_URL_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "volume: URL longer than %d bytes",
                          KVBM__VOLUME_URL_MAX);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)url[i];
    if (c <= 0x20 || c >= 0x7f)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "volume: URL has a space, control or non-ASCII byte 0x%02x at "
                            "byte %zu",
                            c, i);
    if (c == '#' || (c == '?' && strncasecmp(url, "disk://", 7) != 0))
      return kvbm_error_set(err, KVBM_EINVAL,
                            "volume: URL has a '%c' at byte %zu: queries and fragments are "
                            "not supported",
                            c, i);
  }
  size_t sl = 0;
  while (sl < n && (is_alpha(url[sl]) || (sl && (is_digit(url[sl]) || url[sl] == '+' ||
                                                 url[sl] == '-' || url[sl] == '.'))))
    sl++;
  if (sl == 0 || n - sl < 3 || memcmp(url + sl, "://", 3) != 0)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "volume: URL '%.*s' does not start with a scheme and '://' (e.g. "
                          "file:///DIR, redis://HOST:PORT)",
                          (int)(n > 64 ? 64 : n), url);
  if (sl > KVBM__VOLUME_SCHEME_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "volume: URL scheme longer than %d bytes",
                          KVBM__VOLUME_SCHEME_MAX);
  for (size_t i = 0; i < sl; i++)
    u->scheme[i] = (char)(url[i] >= 'A' && url[i] <= 'Z' ? url[i] - 'A' + 'a' : url[i]);
  u->kind = kind_of(u->scheme);
  const char *auth = url + sl + 3;
  const char *slash = memchr(auth, '/', n - sl - 3);
  size_t alen = slash ? (size_t)(slash - auth) : n - sl - 3;
  const char *path = auth + alen;
  size_t plen = n - (size_t)(path - url);
  /* The display form: everything but the userinfo. */
  const char *at = NULL;
  for (size_t i = 0; i < alen; i++)
    if (auth[i] == '@') at = auth + i;
  snprintf(u->display, sizeof u->display, "%s://%s", u->scheme, at ? at + 1 : auth);
  if (u->kind == KVBM__VOLUME_OTHER) return KVBM_OK;
  return parse_rest(auth, alen, path, plen, u, err);
}

int kvbm__volume_ns_check(const char *ns, kvbm_error *err) {
  if (!ns) return KVBM_OK;
  size_t n = strnlen(ns, KVBM__VOLUME_NS_MAX + 1);
  if (n > KVBM__VOLUME_NS_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "volume: key_namespace longer than %d bytes",
                          KVBM__VOLUME_NS_MAX);
  for (size_t i = 0; i < n; i++) {
    char c = ns[i];
    if (!is_alpha(c) && !is_digit(c) && c != '.' && c != '_' && c != ':' && c != '-') {
      unsigned char b = (unsigned char)c;
      if (b > 0x20 && b < 0x7f)
        return kvbm_error_set(err, KVBM_EINVAL,
                              "volume: key_namespace has '%c' at byte %zu (allowed: A-Z a-z "
                              "0-9 . _ : -)",
                              c, i);
      return kvbm_error_set(err, KVBM_EINVAL,
                            "volume: key_namespace has byte 0x%02x at byte %zu (allowed: A-Z "
                            "a-z 0-9 . _ : -)",
                            b, i);
    }
  }
  if (!strcmp(ns, ".") || !strcmp(ns, ".."))
    return kvbm_error_set(err, KVBM_EINVAL, "volume: key_namespace '%s' names a directory", ns);
  return KVBM_OK;
}

void kvbm__volume_hex(uint64_t key, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 15; i >= 0; i--) {
    out[i] = digits[key & 15];
    key >>= 4;
  }
  out[16] = 0;
}

size_t kvbm__volume_key(const char *ns, uint64_t key, char *out) {
  size_t n = ns ? strlen(ns) : 0;
  if (n) {
    memcpy(out, ns, n);
    out[n++] = '/';
  }
  kvbm__volume_hex(key, out + n);
  return n + 16;
}
