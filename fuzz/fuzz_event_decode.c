/*
 * fuzz_event_decode.c: libFuzzer target for the KV event payload decoder
 * (kvbm/event_codec.h), run by scripts/ci.d/fuzz.sh with ASan+UBSan.
 * fuzz-modules: common event_codec
 * fuzz-libs: msgpackc
 *
 * Properties: decoding any bytes returns a status and never reads outside
 * the input; a payload that decodes re-encodes in both forms, and those
 * decode to the same events (types, hashes, parents, tokens, block size,
 * LoRA id and name, medium, group); every decoded event prints as JSON.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/event_codec.h"

static void check_same(const kvbm_event_batch *a, const kvbm_event_batch *b) {
  if (a->num_events != b->num_events || a->has_dp_rank != b->has_dp_rank ||
      (a->has_dp_rank && a->dp_rank != b->dp_rank) || memcmp(&a->ts, &b->ts, sizeof a->ts))
    abort();
  for (size_t i = 0; i < a->num_events; i++) {
    const kvbm_event *x = &a->events[i], *y = &b->events[i];
    if (x->type != y->type || x->num_block_hashes != y->num_block_hashes ||
        x->num_tokens != y->num_tokens || x->has_parent != y->has_parent ||
        (x->has_parent && x->parent_hash != y->parent_hash) || x->block_size != y->block_size ||
        x->has_lora_id != y->has_lora_id || (x->has_lora_id && x->lora_id != y->lora_id) ||
        x->medium != y->medium || x->has_group_idx != y->has_group_idx ||
        (x->has_group_idx && x->group_idx != y->group_idx) || !x->lora_name != !y->lora_name)
      abort();
    if (x->num_block_hashes &&
        memcmp(x->block_hashes, y->block_hashes, 8 * x->num_block_hashes))
      abort();
    if (x->num_tokens && memcmp(x->token_ids, y->token_ids, 4 * x->num_tokens)) abort();
    if (x->lora_name && strcmp(x->lora_name, y->lora_name)) abort();
    if (x->medium == KVBM_MEDIUM_OTHER && strcmp(x->medium_name, y->medium_name)) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kvbm_event_decoder *d1, *d2;
  kvbm_event_encoder *enc;
  if (kvbm_event_decoder_create(&d1, NULL) || kvbm_event_decoder_create(&d2, NULL) ||
      kvbm_event_encoder_create(&enc, NULL))
    abort();
  kvbm_event_batch b;
  kvbm_error err;
  int rc = kvbm_event_decode(d1, data, size, 1, &b, &err);
  if (rc == KVBM_OK) {
    char json[256];
    for (size_t i = 0; i < b.num_events; i++) kvbm_event_to_json(&b.events[i], json, sizeof json);
    for (int form = 0; form < 2; form++) {
      const uint8_t *p;
      size_t n;
      if (kvbm_event_encode(enc, &b, (kvbm_event_form)form, &p, &n, &err)) abort();
      kvbm_event_batch b2;
      if (kvbm_event_decode(d2, p, n, 1, &b2, &err)) abort();
      check_same(&b, &b2);
    }
  } else if (rc != KVBM_EFORMAT && rc != KVBM_ETRUNCATED && rc != KVBM_ETOOLONG &&
             rc != KVBM_ENOMEM) {
    abort();
  } else if (err.code != rc || !err.msg[0]) {
    abort();
  }
  kvbm_event_encoder_destroy(enc);
  kvbm_event_decoder_destroy(d1);
  kvbm_event_decoder_destroy(d2);
  return 0;
}
