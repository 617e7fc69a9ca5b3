/* SPDX-License-Identifier: Apache-2.0 */
/*
 * event_codec/fields.h: the event fields kvbm names, as the codec's two
 * halves share them (private to src/event_codec/): the encoder's check
 * (codec.c: extras must not name a field) and the decoder (decode.c: a
 * map key to the field it names). One table, so that a field added to the
 * wire is known to both at once.
 */
#ifndef KVBM_EVENT_CODEC_FIELDS_H
#define KVBM_EVENT_CODEC_FIELDS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Field ids shared by both forms and by kvbm_event_check. */
enum {
  F_HASHES, F_PARENT, F_TOKENS, F_BSIZE, F_LORA, F_MEDIUM, F_LNAME, F_EKEYS, F_GROUP,
  F_KIND, F_SWIN, F_LOCALITY, F_OWNERSHIP, F_SALT,
  F_NAMED,            /* fields above have a name in the map form */
  F_SLOT7 = F_NAMED,  /* positional index 7: lora_name or SGLang's metadata map */
  F_EXTRA,            /* a key kvbm does not name: kept as bytes */
  F_SKIP,             /* a positional field past the known ones */
};
/* The field a map key names (F_EXTRA for one kvbm does not name), by
 * length first: this runs for every key of every event. */
static inline int kvbm__event_key_field(const uint8_t *k, size_t n) {
#define K(str, f) \
  if (n == sizeof(str) - 1 && !memcmp(k, str, n)) return f
  switch (n) {
    case 6: K("medium", F_MEDIUM); break;
    case 7: K("lora_id", F_LORA); break;
    case 8: K("locality", F_LOCALITY); break;
    case 9:
      K("token_ids", F_TOKENS);
      K("lora_name", F_LNAME);
      K("group_idx", F_GROUP);
      K("ownership", F_OWNERSHIP);
      break;
    case 10:
      K("block_size", F_BSIZE);
      K("extra_keys", F_EKEYS);
      K("cache_salt", F_SALT);
      break;
    case 12: K("block_hashes", F_HASHES); break;
    case 17: K("parent_block_hash", F_PARENT); break;
    case 18: K("kv_cache_spec_kind", F_KIND); break;
    case 28: K("kv_cache_spec_sliding_window", F_SWIN); break;
  }
#undef K
  return F_EXTRA;
}

#endif
