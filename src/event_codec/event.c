/*
 * event.c: names of event types and media, and events as JSON.
 *
 * JSON is for people (`kvbm events tail`) and for tests that compare with
 * Python: hashes are printed as unsigned decimal integers, which Python
 * reads exactly (JavaScript would not: a consumer there should treat them
 * as strings). The writer works like snprintf so that callers can size
 * their buffer with one failed call.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

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

kvbm_medium kvbm_medium_from_name(const char *name, size_t len) {
  if (name && len == 3 && name[1] == 'P' && name[2] == 'U') { /* exact GPU / CPU */
    if (name[0] == 'G') return KVBM_MEDIUM_GPU;
    if (name[0] == 'C') return KVBM_MEDIUM_CPU;
  }
  for (unsigned m = KVBM_MEDIUM_GPU; m <= KVBM_MEDIUM_REMOTE; m++)
    if (name && strlen(kMedium[m]) == len && !strncasecmp(name, kMedium[m], len))
      return (kvbm_medium)m;
  return KVBM_MEDIUM_OTHER;
}

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

static void jstr(jbuf *j, const char *s) {
  if (!s) {
    jprintf(j, "null");
    return;
  }
  jprintf(j, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') jprintf(j, "\\%c", *p);
    else if (*p < 0x20) jprintf(j, "\\u%04x", *p);
    else jprintf(j, "%c", *p);
  }
  jprintf(j, "\"");
}

static void jhashes(jbuf *j, const uint64_t *h, size_t n) {
  jprintf(j, "[");
  for (size_t i = 0; i < n; i++) jprintf(j, "%s%" PRIu64, i ? "," : "", h[i]);
  jprintf(j, "]");
}

size_t kvbm_event_to_json(const kvbm_event *ev, char *buf, size_t cap) {
  jbuf j = {buf, cap, 0};
  if (cap) buf[0] = '\0';
  jprintf(&j, "{\"type\":\"%s\"", kvbm_event_type_name(ev->type));
  if (ev->event_id) jprintf(&j, ",\"event_id\":%" PRIu64, ev->event_id);
  if (ev->type == KVBM_EVENT_STORED || ev->type == KVBM_EVENT_REMOVED) {
    jprintf(&j, ",\"block_hashes\":");
    jhashes(&j, ev->block_hashes, ev->num_block_hashes);
  }
  if (ev->type == KVBM_EVENT_STORED) {
    if (ev->has_parent) jprintf(&j, ",\"parent_block_hash\":%" PRIu64, ev->parent_hash);
    else jprintf(&j, ",\"parent_block_hash\":null");
    jprintf(&j, ",\"token_ids\":[");
    for (size_t i = 0; i < ev->num_tokens; i++)
      jprintf(&j, "%s%" PRIu32, i ? "," : "", ev->token_ids[i]);
    jprintf(&j, "],\"block_size\":%" PRIu32, ev->block_size);
    if (ev->has_lora_id) jprintf(&j, ",\"lora_id\":%" PRId64, ev->lora_id);
    else jprintf(&j, ",\"lora_id\":null");
  }
  if (ev->type == KVBM_EVENT_STORED || ev->type == KVBM_EVENT_REMOVED) {
    jprintf(&j, ",\"medium\":");
    jstr(&j, ev->medium == KVBM_MEDIUM_NONE ? NULL
             : ev->medium_name                ? ev->medium_name
                                              : kvbm_medium_name(ev->medium));
  }
  if (ev->type == KVBM_EVENT_STORED) {
    jprintf(&j, ",\"lora_name\":");
    jstr(&j, ev->lora_name);
  }
  if (ev->has_group_idx) jprintf(&j, ",\"group_idx\":%" PRId64, ev->group_idx);
  jprintf(&j, "}");
  return j.len;
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
