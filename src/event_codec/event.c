/* SPDX-License-Identifier: Apache-2.0 */
/*
 * event.c: names of event types and media, and events as JSON.
 *
 * Media. Each engine spells its tiers its own way: vLLM "GPU", "CPU" and,
 * for its secondary tiers, "FS" and "OBJ" (v0.26) then "STORAGE"; SGLang
 * "GPU", "CPU_PINNED", "DISK", "EXTERNAL" (and "CPU_TIER1"/"CPU_TIER2"
 * before); Dynamo also "DEVICE", "NVME", "NETWORK", "SHARED". One table
 * maps them all onto kvbm's four tiers (kvbm/event_codec.h); the event
 * keeps the wire text so that a relay writes back what the engine sent.
 * Where kvbm and Dynamo differ: Dynamo counts CPU_TIER2 as disk; SGLang
 * introduced it as its second host tier (L2 host, L3 storage were
 * CPU_TIER1 and CPU_TIER2's neighbours), and kvbm keeps it on the host.
 *
 * JSON is for people (`kvbm events tail`) and for tests that compare with
 * Python: hashes are printed as unsigned decimal integers, which Python
 * reads exactly (JavaScript would not: a consumer there should treat them
 * as strings). The fields kvbm carries as msgpack bytes (extra_keys, the
 * extras) are printed as JSON with a bounded depth. The writer works like
 * snprintf so that callers can size their buffer with one failed call.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/msgpack.h"
#include "kvbm/event_codec.h"

const char *kvbm_event_type_name(kvbm_event_type t) {
  switch (t) {
    case KVBM_EVENT_STORED: return "BlockStored";
    case KVBM_EVENT_REMOVED: return "BlockRemoved";
    case KVBM_EVENT_CLEARED: return "AllBlocksCleared";
  }
  return "?";
}

static const char *const kMedium[] = {NULL, "GPU", "CPU", "DISK", "REMOTE"};

const char *kvbm_medium_name(kvbm_medium m) {
  if ((unsigned)m >= sizeof kMedium / sizeof kMedium[0]) return NULL;
  return kMedium[m];
}

static const struct {
  const char *name;
  kvbm_medium medium;
} kMediumNames[] = {
    {"GPU", KVBM_MEDIUM_GPU},         {"DEVICE", KVBM_MEDIUM_GPU},
    {"CPU", KVBM_MEDIUM_CPU},         {"CPU_PINNED", KVBM_MEDIUM_CPU},
    {"CPU_TIER1", KVBM_MEDIUM_CPU},   {"CPU_TIER2", KVBM_MEDIUM_CPU},
    {"DISK", KVBM_MEDIUM_DISK},       {"STORAGE", KVBM_MEDIUM_DISK},
    {"FS", KVBM_MEDIUM_DISK},         {"NVME", KVBM_MEDIUM_DISK},
    {"REMOTE", KVBM_MEDIUM_REMOTE},   {"OBJ", KVBM_MEDIUM_REMOTE},
    {"EXTERNAL", KVBM_MEDIUM_REMOTE}, {"NETWORK", KVBM_MEDIUM_REMOTE},
    {"SHARED", KVBM_MEDIUM_REMOTE},
};

kvbm_medium kvbm_medium_from_name(const char *name, size_t len) {
  if (!name) return KVBM_MEDIUM_OTHER;
  if (len == 0) return KVBM_MEDIUM_NONE;
  if (len == 3 && name[1] == 'P' && name[2] == 'U') { /* the usual: exact GPU / CPU */
    if (name[0] == 'G') return KVBM_MEDIUM_GPU;
    if (name[0] == 'C') return KVBM_MEDIUM_CPU;
  }
  for (size_t i = 0; i < sizeof kMediumNames / sizeof kMediumNames[0]; i++)
    if (strlen(kMediumNames[i].name) == len && !strncasecmp(name, kMediumNames[i].name, len))
      return kMediumNames[i].medium;
  return KVBM_MEDIUM_OTHER;
}

kvbm_tier kvbm_medium_tier(kvbm_medium m) {
  switch (m) {
    case KVBM_MEDIUM_NONE:
    case KVBM_MEDIUM_GPU:
      return KVBM_TIER_G1;
    case KVBM_MEDIUM_CPU:
      return KVBM_TIER_G2;
    case KVBM_MEDIUM_REMOTE:
      return KVBM_TIER_G4;
    default:
      return KVBM_TIER_G3;
  }
}

/* ----------------------------------------------------------------- JSON */

/* An snprintf that appends and keeps counting past the end. */
typedef struct jbuf {
  char *buf;
  size_t cap, len;
} jbuf;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void jprintf(jbuf *j, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = j->len < j->cap ? j->cap - j->len : 0;
  int n = vsnprintf(room ? j->buf + j->len : NULL, room, fmt, ap);
  va_end(ap);
  if (n > 0) j->len += (size_t)n;
}

static void jstrn(jbuf *j, const char *s, size_t n) {
  jprintf(j, "\"");
  for (const unsigned char *p = (const unsigned char *)s, *e = p + n; p < e; p++) {
    if (*p == '"' || *p == '\\') jprintf(j, "\\%c", *p);
    else if (*p < 0x20 || *p == 0x7f) jprintf(j, "\\u%04x", *p);
    else jprintf(j, "%c", *p);
  }
  jprintf(j, "\"");
}

static void jstr(jbuf *j, const char *s) {
  if (!s) jprintf(j, "null");
  else jstrn(j, s, strlen(s));
}

static void jhashes(jbuf *j, const uint64_t *h, size_t n) {
  jprintf(j, "[");
  for (size_t i = 0; i < n; i++) jprintf(j, "%s%" PRIu64, i ? "," : "", h[i]);
  jprintf(j, "]");
}

#define JSON_DEPTH 64

/* One msgpack value as JSON: bytes as a hex string, an ext as null, map
 * keys that are not strings as their JSON text in a string; past
 * JSON_DEPTH levels a value is skipped and printed as null. Returns false
 * on malformed input (null printed). */
static bool jmsgpack(jbuf *j, kvbm__mpr *r, int depth) {
  kvbm__mpr_kind k = kvbm__mpr_peek(r);
  if (depth >= JSON_DEPTH) {
    jprintf(j, "null");
    return kvbm__mpr_skip(r) == 0;
  }
  switch (k) {
    case KVBM__MPR_NIL: r->p++; jprintf(j, "null"); return true;
    case KVBM__MPR_BOOL: jprintf(j, *r->p == 0xc3 ? "true" : "false"); r->p++; return true;
    case KVBM__MPR_INT: {
      uint64_t u;
      bool neg;
      if (kvbm__mpr_int(r, &u, &neg)) break;
      if (neg) jprintf(j, "%" PRId64, (int64_t)u);
      else jprintf(j, "%" PRIu64, u);
      return true;
    }
    case KVBM__MPR_FLOAT: {
      double d;
      if (kvbm__mpr_double(r, &d)) break;
      if (isfinite(d)) jprintf(j, "%.17g", d);
      else jprintf(j, "null");
      return true;
    }
    case KVBM__MPR_STR:
    case KVBM__MPR_BIN: {
      const uint8_t *b;
      size_t n;
      if (kvbm__mpr_bytes(r, k == KVBM__MPR_BIN, &b, &n)) break;
      if (k == KVBM__MPR_STR) {
        jstrn(j, (const char *)b, n);
      } else {
        jprintf(j, "\"");
        for (size_t i = 0; i < n; i++) jprintf(j, "%02x", b[i]);
        jprintf(j, "\"");
      }
      return true;
    }
    case KVBM__MPR_ARRAY:
    case KVBM__MPR_MAP: {
      uint32_t n;
      if (kvbm__mpr_container(r, k == KVBM__MPR_MAP, &n)) break;
      jprintf(j, k == KVBM__MPR_MAP ? "{" : "[");
      for (uint32_t i = 0; i < n; i++) {
        if (i) jprintf(j, ",");
        if (k == KVBM__MPR_MAP) {
          if (kvbm__mpr_peek(r) == KVBM__MPR_STR) {
            if (!jmsgpack(j, r, depth + 1)) return false;
          } else { /* JSON keys are strings: the key's JSON, quoted */
            char tmp[128];
            jbuf t = {tmp, sizeof tmp, 0};
            if (!jmsgpack(&t, r, depth + 1)) return false;
            jstrn(j, tmp, t.len < sizeof tmp ? t.len : sizeof tmp - 1);
          }
          jprintf(j, ":");
        }
        if (!jmsgpack(j, r, depth + 1)) return false;
      }
      jprintf(j, k == KVBM__MPR_MAP ? "}" : "]");
      return true;
    }
    case KVBM__MPR_EXT:
      jprintf(j, "null");
      return kvbm__mpr_skip(r) == 0;
    default:
      break;
  }
  jprintf(j, "null");
  return false;
}

static void jraw(jbuf *j, const uint8_t *p, size_t n) {
  kvbm__mpr r = {p, p + n};
  jmsgpack(j, &r, 0);
}

/* The extras as one object {key: value, ...}. */
static void jextras(jbuf *j, const kvbm_event *ev) {
  kvbm__mpr r = {ev->extras, ev->extras + ev->extras_len};
  jprintf(j, ",\"extras\":{");
  for (uint32_t i = 0; i < ev->num_extras; i++) {
    if (i) jprintf(j, ",");
    if (kvbm__mpr_peek(&r) != KVBM__MPR_STR || !jmsgpack(j, &r, 1)) break;
    jprintf(j, ":");
    if (!jmsgpack(j, &r, 1)) break;
  }
  jprintf(j, "}");
}

size_t kvbm_event_to_json(const kvbm_event *ev, char *buf, size_t cap) {
  jbuf j = {buf, cap, 0};
  if (cap) buf[0] = '\0';
  jprintf(&j, "{\"type\":\"%s\"", kvbm_event_type_name(ev->type));
  if (ev->event_id) jprintf(&j, ",\"event_id\":%" PRIu64, ev->event_id);
  bool st = ev->type == KVBM_EVENT_STORED, rm = ev->type == KVBM_EVENT_REMOVED;
  if (st || rm) {
    jprintf(&j, ",\"block_hashes\":");
    jhashes(&j, ev->block_hashes, ev->num_block_hashes);
  }
  if (st) {
    if (ev->has_parent) jprintf(&j, ",\"parent_block_hash\":%" PRIu64, ev->parent_hash);
    else jprintf(&j, ",\"parent_block_hash\":null");
    jprintf(&j, ",\"token_ids\":[");
    for (size_t i = 0; i < ev->num_tokens; i++)
      jprintf(&j, "%s%" PRIu32, i ? "," : "", ev->token_ids[i]);
    jprintf(&j, "],\"block_size\":%" PRIu32, ev->block_size);
    if (ev->has_lora_id) jprintf(&j, ",\"lora_id\":%" PRId64, ev->lora_id);
    else jprintf(&j, ",\"lora_id\":null");
  }
  if (st || rm) {
    jprintf(&j, ",\"medium\":");
    jstr(&j, ev->medium_name ? ev->medium_name : kvbm_medium_name(ev->medium));
  }
  if (st) {
    jprintf(&j, ",\"lora_name\":");
    jstr(&j, ev->lora_name);
  }
  if (ev->has_group_idx) jprintf(&j, ",\"group_idx\":%" PRId64, ev->group_idx);
  if (st) {
    if (ev->token_pairs) jprintf(&j, ",\"token_pairs\":true");
    if (ev->cache_salt) {
      jprintf(&j, ",\"cache_salt\":");
      jstr(&j, ev->cache_salt);
    }
    if (ev->extra_keys) {
      jprintf(&j, ",\"extra_keys\":");
      jraw(&j, ev->extra_keys, ev->extra_keys_len);
    }
    if (ev->kv_cache_spec_kind) {
      jprintf(&j, ",\"kv_cache_spec_kind\":");
      jstr(&j, ev->kv_cache_spec_kind);
    }
    if (ev->has_sliding_window)
      jprintf(&j, ",\"kv_cache_spec_sliding_window\":%" PRId64, ev->sliding_window);
  }
  if (st || rm) {
    if (ev->locality) {
      jprintf(&j, ",\"locality\":");
      jstr(&j, ev->locality);
    }
    if (ev->ownership) {
      jprintf(&j, ",\"ownership\":");
      jstr(&j, ev->ownership);
    }
    if (ev->num_extras && ev->extras) jextras(&j, ev);
  }
  jprintf(&j, "}");
  return j.len;
}
