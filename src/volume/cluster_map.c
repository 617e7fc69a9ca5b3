/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cluster_map.c: key slots, slot-map replies and redirections of the Redis
 * Cluster protocol (see volume/cluster.h).
 *
 * Design. Everything here is a pure function of bytes or of a parsed reply
 * tree, so it is tested against a real cluster (the slot of every key we
 * store must match CLUSTER KEYSLOT) and fuzzed on its own. Replies come
 * from the network: every element's type and count is checked before it
 * is read, numbers are range-checked, strings are copied only into fixed
 * fields with their length bounded. The CRC is bitwise rather than table
 * driven: a key is ~80 bytes and one CRC per operation costs nothing next
 * to the round trip, and there is no table to get wrong.
 *
 * A slot map is refused whole (KVBM_EPROTO, naming the entry) when an
 * entry is malformed, when two entries claim one slot, or when it has
 * more entries than there are slots: a node that sends such a map is
 * broken or hostile, and half of its map is no better than none. The
 * overlap check is one bit per slot, so a 16384-entry map costs one pass.
 */
#include "volume/cluster.h"

#include <stdio.h>
#include <string.h>

uint16_t kvbm__cluster_crc16(const char *buf, size_t len) {
  uint16_t crc = 0;
  for (size_t i = 0; i < len; i++) {
    crc ^= (uint16_t)((uint8_t)buf[i] << 8);
    for (int b = 0; b < 8; b++) crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
  }
  return crc;
}

uint16_t kvbm__cluster_keyslot(const char *key, size_t len) {
  const char *open = memchr(key, '{', len);
  if (open) {
    size_t from = (size_t)(open - key) + 1;
    const char *close = memchr(key + from, '}', len - from);
    if (close && close > key + from) key += from, len = (size_t)(close - key);
  }
  return kvbm__cluster_crc16(key, len) & (KVBM__CLUSTER_SLOTS - 1);
}

static bool is_int(const redisReply *r, long long lo, long long hi) {
  return r && r->type == REDIS_REPLY_INTEGER && r->integer >= lo && r->integer <= hi;
}

int kvbm__cluster_parse_slots(const redisReply *r, const char *asked_host, kvbm__slot_range *out,
                              size_t cap, size_t *n, kvbm_error *err) {
  *n = 0;
  if (!r || r->type != REDIS_REPLY_ARRAY)
    return kvbm_error_set(err, KVBM_EPROTO, "volume: CLUSTER SLOTS did not answer an array");
  if (r->elements > KVBM__CLUSTER_SLOTS)
    return kvbm_error_set(err, KVBM_EPROTO,
                          "volume: CLUSTER SLOTS has %zu entries, more than the %u slots",
                          r->elements, KVBM__CLUSTER_SLOTS);
  uint64_t seen[KVBM__CLUSTER_SLOTS / 64] = {0}; /* slots some entry claimed */
  for (size_t i = 0; i < r->elements; i++) {
    const redisReply *e = r->element[i];
    if (!e || e->type != REDIS_REPLY_ARRAY || e->elements < 3)
      return kvbm_error_set(err, KVBM_EPROTO,
                            "volume: CLUSTER SLOTS entry %zu is not [start, end, master...]", i);
    if (!is_int(e->element[0], 0, KVBM__CLUSTER_SLOTS - 1) ||
        !is_int(e->element[1], e->element[0]->integer, KVBM__CLUSTER_SLOTS - 1))
      return kvbm_error_set(err, KVBM_EPROTO, "volume: CLUSTER SLOTS entry %zu has a bad range",
                            i);
    /* Each slot once: ranges never overlap in a sound map, and accepting
     * one that does would let its order pick the owner. Entries claim
     * disjoint slots, so this loop runs at most 16384 times a reply. */
    for (long long slot = e->element[0]->integer; slot <= e->element[1]->integer; slot++) {
      uint64_t bit = UINT64_C(1) << (slot & 63);
      if (seen[slot >> 6] & bit)
        return kvbm_error_set(err, KVBM_EPROTO,
                              "volume: CLUSTER SLOTS entry %zu (slots %lld..%lld) overlaps an "
                              "earlier entry at slot %lld",
                              i, e->element[0]->integer, e->element[1]->integer, slot);
      seen[slot >> 6] |= bit;
    }
    const redisReply *m = e->element[2];
    if (!m || m->type != REDIS_REPLY_ARRAY || m->elements < 2)
      return kvbm_error_set(err, KVBM_EPROTO,
                            "volume: CLUSTER SLOTS entry %zu has no [host, port] master", i);
    const redisReply *h = m->element[0], *p = m->element[1];
    if (!is_int(p, 0, 65535))
      return kvbm_error_set(err, KVBM_EPROTO, "volume: CLUSTER SLOTS entry %zu has a bad port", i);
    if (!h || (h->type != REDIS_REPLY_STRING && h->type != REDIS_REPLY_NIL))
      return kvbm_error_set(err, KVBM_EPROTO, "volume: CLUSTER SLOTS entry %zu has a bad host", i);
    /* No usable endpoint: those slots stay unknown (their ops miss). */
    if (h->type == REDIS_REPLY_NIL || p->integer == 0 || (h->len == 1 && h->str[0] == '?'))
      continue;
    const char *host = h->len ? h->str : asked_host;
    size_t hl = h->len ? h->len : strlen(asked_host);
    if (hl == 0 || hl > 255 || memchr(host, 0, hl))
      return kvbm_error_set(err, KVBM_EPROTO, "volume: CLUSTER SLOTS entry %zu has a bad host", i);
    if (*n == cap)
      return kvbm_error_set(err, KVBM_EPROTO, "volume: CLUSTER SLOTS has more than %zu ranges",
                            cap);
    kvbm__slot_range *s = &out[(*n)++];
    s->start = (uint16_t)e->element[0]->integer;
    s->end = (uint16_t)e->element[1]->integer;
    memcpy(s->host, host, hl);
    s->host[hl] = 0;
    s->port = (uint16_t)p->integer;
  }
  return KVBM_OK;
}

bool kvbm__cluster_parse_redirect(const char *msg, size_t len, const char *current_host,
                                  kvbm__redirect *out) {
  size_t i;
  if (len > 6 && !memcmp(msg, "MOVED ", 6)) {
    out->ask = false;
    i = 6;
  } else if (len > 4 && !memcmp(msg, "ASK ", 4)) {
    out->ask = true;
    i = 4;
  } else {
    return false;
  }
  unsigned slot = 0;
  size_t d = 0;
  for (; i < len && msg[i] >= '0' && msg[i] <= '9' && d < 5; i++, d++)
    slot = slot * 10 + (unsigned)(msg[i] - '0');
  if (!d || slot >= KVBM__CLUSTER_SLOTS || i >= len || msg[i] != ' ') return false;
  i++;
  /* host:port, split at the last ':' (an IPv6 host has colons) */
  const char *ep = msg + i;
  size_t el = len - i;
  const char *colon = NULL;
  for (size_t k = 0; k < el; k++)
    if (ep[k] == ':') colon = ep + k;
  if (!colon) return false;
  size_t hl = (size_t)(colon - ep);
  const char *pp = colon + 1;
  size_t pl = el - hl - 1;
  unsigned port = 0;
  if (pl == 0 || pl > 5) return false;
  for (size_t k = 0; k < pl; k++) {
    if (pp[k] < '0' || pp[k] > '9') return false;
    port = port * 10 + (unsigned)(pp[k] - '0');
  }
  if (port == 0 || port > 65535) return false;
  const char *host = hl ? ep : current_host;
  if (!hl) hl = strlen(current_host);
  if (hl == 0 || hl > 255 || memchr(host, 0, hl) || memchr(host, ' ', hl)) return false;
  memcpy(out->host, host, hl);
  out->host[hl] = 0;
  out->slot = (uint16_t)slot;
  out->port = (uint16_t)port;
  return true;
}
