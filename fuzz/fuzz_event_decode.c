/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_event_decode.c: libFuzzer target for the KV event payload decoder
 * (kvbm/event_codec.h), run by scripts/ci.d/fuzz.sh with ASan+UBSan.
 * fuzz-modules: common event_codec
 * fuzz-libs: msgpackc
 *
 * Properties: decoding any bytes returns a status and never reads outside
 * the input; a payload that decodes re-encodes in both forms (as signed
 * hashes too, when the events allow the positional form), and those decode
 * to the same events (every field kvbm reads, and in the map form every
 * field it carries: salt, token pairs, extra_keys, kind, window, locality,
 * ownership, extras, byte for byte) with nothing skipped; every decoded
 * event prints as JSON; a failed decode has a message. The quick path
 * (decode.c) decides as the general reader: a second decoder without it
 * (kvbm__event_decoder_general) gives the same status and message, or
 * the same batch and events, every field.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "event_codec/internal.h"
#include "kvbm/event_codec.h"

static bool same_str(const char *a, const char *b) {
  return (!a && !b) || (a && b && !strcmp(a, b));
}

static bool same_bytes(const uint8_t *a, size_t al, const uint8_t *b, size_t bl) {
  return al == bl && (!al || !memcmp(a, b, al));
}

static void check_same(const kvbm_event_batch *a, const kvbm_event_batch *b, bool all) {
  if (a->num_events != b->num_events || a->has_dp_rank != b->has_dp_rank || b->skipped ||
      (a->has_dp_rank && a->dp_rank != b->dp_rank) || memcmp(&a->ts, &b->ts, sizeof a->ts))
    abort();
  for (size_t i = 0; i < a->num_events; i++) {
    const kvbm_event *x = &a->events[i], *y = &b->events[i];
    if (x->type != y->type || x->num_block_hashes != y->num_block_hashes ||
        x->num_tokens != y->num_tokens || x->has_parent != y->has_parent ||
        (x->has_parent && x->parent_hash != y->parent_hash) || x->block_size != y->block_size ||
        x->has_lora_id != y->has_lora_id || (x->has_lora_id && x->lora_id != y->lora_id) ||
        x->medium != y->medium || x->has_group_idx != y->has_group_idx ||
        (x->has_group_idx && x->group_idx != y->group_idx) || !same_str(x->lora_name, y->lora_name) ||
        !same_str(x->medium_name, y->medium_name) || !same_str(x->cache_salt, y->cache_salt) ||
        x->token_pairs != y->token_pairs ||
        !same_str(x->kv_cache_spec_kind, y->kv_cache_spec_kind) ||
        x->has_sliding_window != y->has_sliding_window ||
        (x->has_sliding_window && x->sliding_window != y->sliding_window) ||
        !same_bytes(x->extra_keys, x->extra_keys_len, y->extra_keys, y->extra_keys_len))
      abort();
    if (x->num_block_hashes &&
        memcmp(x->block_hashes, y->block_hashes, 8 * x->num_block_hashes))
      abort();
    if (x->num_tokens && memcmp(x->token_ids, y->token_ids, 4 * x->num_tokens)) abort();
    if (all && (!same_str(x->locality, y->locality) || !same_str(x->ownership, y->ownership) ||
                x->num_extras != y->num_extras ||
                !same_bytes(x->extras, x->extras_len, y->extras, y->extras_len)))
      abort();
  }
}

/* The quick path against the general reader: the same result. */
static void check_general(kvbm_event_decoder *quick, int rc, const kvbm_event_batch *b,
                          const kvbm_error *err, const uint8_t *data, size_t size) {
  kvbm_event_decoder *g;
  if (kvbm_event_decoder_create(&g, NULL)) abort();
  kvbm__event_decoder_general(g, true);
  kvbm_event_batch gb;
  kvbm_error gerr;
  int grc = kvbm_event_decode(g, data, size, 1, &gb, &gerr);
  if (grc != rc) abort();
  if (rc) {
    if (strcmp(gerr.msg, err->msg)) abort();
  } else {
    kvbm_event_batch same = gb;
    same.skipped = 0; /* check_same wants none skipped (a re-encode); compared below */
    check_same(b, &same, true);
    if (gb.skipped != b->skipped ||
        strcmp(kvbm_event_decoder_skip_reason(g), kvbm_event_decoder_skip_reason(quick)))
      abort();
    for (size_t i = 0; i < b->num_events; i++) {
      const kvbm_event *x = &b->events[i], *y = &gb.events[i];
      if ((x->num_block_hashes && x->block_hashes == NULL) ||
          (x->num_tokens && x->token_ids == NULL) || !same_str(x->medium_name, y->medium_name))
        abort();
    }
  }
  kvbm_event_decoder_destroy(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kvbm_event_decoder *d1, *d2;
  if (kvbm_event_decoder_create(&d1, NULL) || kvbm_event_decoder_create(&d2, NULL)) abort();
  kvbm_event_batch b;
  kvbm_error err;
  int rc = kvbm_event_decode(d1, data, size, 1, &b, &err);
  check_general(d1, rc, &b, &err, data, size);
  if (rc == KVBM_OK) {
    char json[256];
    for (size_t i = 0; i < b.num_events; i++) kvbm_event_to_json(&b.events[i], json, sizeof json);
    if (b.skipped && !kvbm_event_decoder_skip_reason(d1)[0]) abort();
    for (int v = 0; v < 4; v++) {
      kvbm_event_encoder_config ec = {.form = (kvbm_event_form)(v & 1), .signed_hashes = v >> 1};
      bool fits = true; /* the positional form holds a LoRA name or a salt, not both */
      for (size_t i = 0; i < b.num_events; i++)
        if (kvbm_event_check(&b.events[i], &ec, NULL)) fits = false;
      if (!fits && ec.form == KVBM_FORM_MAP) abort(); /* the map form holds anything decoded */
      if (!fits) continue;
      kvbm_event_encoder *enc;
      if (kvbm_event_encoder_create(&ec, &enc, NULL)) abort();
      const uint8_t *p;
      size_t n;
      if (kvbm_event_encode(enc, &b, &p, &n, &err)) abort();
      kvbm_event_batch b2;
      if (kvbm_event_decode(d2, p, n, 1, &b2, &err)) abort();
      /* the positional form has no place for locality, ownership, and
       * extras but a salt's */
      check_same(&b, &b2, ec.form == KVBM_FORM_MAP);
      kvbm_event_encoder_destroy(enc);
    }
  } else if (rc != KVBM_EFORMAT && rc != KVBM_ETRUNCATED && rc != KVBM_ETOOLONG &&
             rc != KVBM_ENOMEM) {
    abort();
  } else if (err.code != rc || !err.msg[0]) {
    abort();
  }
  kvbm_event_decoder_destroy(d1);
  kvbm_event_decoder_destroy(d2);
  return 0;
}
