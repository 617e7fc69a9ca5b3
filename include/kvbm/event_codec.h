/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/event_codec.h: KV events (BlockStored / BlockRemoved /
 * AllBlocksCleared) and their wire codec: bytes in, events out, and back.
 * No sockets, no threads, no pool: publishing and subscribing over ZMQ and
 * NATS live in kvbm/events.h, which includes this header. The codec is
 * libkvbm's kvbm_event_codec module; everything here is pure computation
 * on caller-owned memory, safe from any thread on distinct objects.
 *
 * The wire is the engines' own (vLLM's vllm/distributed/kv_events.py,
 * SGLang's srt/disaggregation/kv_events.py), so routers built for vLLM,
 * SGLang or Dynamo read what kvbm publishes and kvbm reads what they send.
 * A payload (one ZMQ message, one NATS message) is a batch:
 *
 *   [ts, [event, ...], dp_rank]      (vLLM, SGLang; dp_rank may be absent
 *                                     or nil; old vLLM: [ts, events])
 *   {"ts", "events", "data_parallel_rank"}   (a map: read, never written)
 *
 * An event has one of two forms:
 *
 *   map (vLLM since PR #42892, SGLang since its tagged-map switch; kvbm's
 *   default):
 *     {"type": "BlockStored", "block_hashes", "parent_block_hash",
 *      "token_ids", "block_size", "lora_id", "medium", "lora_name",
 *      optional "extra_keys", "group_idx", "kv_cache_spec_kind",
 *      "kv_cache_spec_sliding_window", "locality", "ownership",
 *      "cache_salt", and any other key}
 *     {"type": "BlockRemoved", "block_hashes", "medium", optional
 *      "group_idx", "locality", "ownership", ...}
 *     {"type": "AllBlocksCleared"}
 *   positional (msgspec array_like: vLLM before #42892, SGLang before its
 *   switch):
 *     ["BlockStored", block_hashes, parent_block_hash, token_ids,
 *      block_size, lora_id, medium, X, extra_keys, group_idx,
 *      kv_cache_spec_kind, kv_cache_spec_sliding_window]
 *       X is vLLM's lora_name (a string or nil) or SGLang's metadata map
 *       {"cache_salt": ..., "session_id": ...}; trailing fields may be
 *       absent (old vLLM has 5, SGLang 6 or 7 after the tag)
 *     ["BlockRemoved", block_hashes, medium, group_idx]
 *     ["AllBlocksCleared"]
 *
 * Hashes are msgpack integers, unsigned or signed (Dynamo's Python API
 * sends int64: a negative one is read as its 64-bit two's complement), or
 * bytes (vLLM's bytes hashes: the low 64 bits of the big-endian number).
 * Token ids are integers, or pairs [t_i, t_i+1] (SGLang with EAGLE
 * speculative decoding: its radix keys are bigrams).
 *
 * Media: the engines' names map onto kvbm's tiers (kvbm/tier.h):
 *   "GPU", "DEVICE", "" or none                      G1 device
 *   "CPU", "CPU_PINNED", "CPU_TIER1", "CPU_TIER2"    G2 host
 *   "DISK", "STORAGE", "FS", "NVME"                  G3 disk
 *   "REMOTE", "OBJ", "EXTERNAL", "NETWORK", "SHARED" G4 remote
 * The wire text is kept (medium_name) and written back as it came.
 */
#ifndef KVBM_EVENT_CODEC_H
#define KVBM_EVENT_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"
#include "kvbm/tier.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- events */

typedef enum kvbm_event_type {
  KVBM_EVENT_STORED = 1,   /* BlockStored */
  KVBM_EVENT_REMOVED = 2,  /* BlockRemoved */
  KVBM_EVENT_CLEARED = 3,  /* AllBlocksCleared */
} kvbm_event_type;

/* The wire tag ("BlockStored", ...); "?" for an unknown value. */
KVBM_EXTERN const char *kvbm_event_type_name(kvbm_event_type t);

typedef enum kvbm_medium {
  KVBM_MEDIUM_NONE = 0,   /* not given (nil or "" on the wire): device */
  KVBM_MEDIUM_GPU = 1,    /* device memory, tier G1 */
  KVBM_MEDIUM_CPU = 2,    /* host memory, tier G2 */
  KVBM_MEDIUM_DISK = 3,   /* local disk or a node's file system, G3 */
  KVBM_MEDIUM_REMOTE = 4, /* another node, an object or shared store, G4 */
  KVBM_MEDIUM_OTHER = 5,  /* a name kvbm does not know: see medium_name */
} kvbm_medium;

/* kvbm's own spelling: "GPU", "CPU", "DISK", "REMOTE"; NULL for NONE and
 * OTHER. Static strings. */
KVBM_EXTERN const char *kvbm_medium_name(kvbm_medium m);

/* Maps a wire name (case-insensitive; see the table at the top) to a
 * medium: "" is NONE, an unknown name (NULL included) OTHER. */
KVBM_EXTERN kvbm_medium kvbm_medium_from_name(const char *name, size_t len);

/* The tier a medium stands for: NONE and GPU G1 (a missing medium is the
 * device, as Dynamo reads it), CPU G2, DISK G3, REMOTE G4; a name kvbm
 * does not know counts as G3 (somewhere slower than memory). */
KVBM_EXTERN kvbm_tier kvbm_medium_tier(kvbm_medium m);

/* One event. Arrays and strings are borrowed: in a decoded batch they stay
 * valid until the decoder (or subscriber) that produced them is used again
 * or freed; given to the publisher they are copied before it returns.
 * Zero-initialize and set what you have: every field past `type` has a
 * zero meaning "absent". */
typedef struct kvbm_event {
  kvbm_event_type type;
  uint64_t event_id;           /* per publisher, +1 per event; 0 when the
                                * event came from the wire (not carried) */
  const uint64_t *block_hashes;/* STORED, REMOVED: sequence hashes */
  size_t num_block_hashes;
  uint64_t parent_hash;        /* STORED: valid when has_parent */
  bool has_parent;
  const uint32_t *token_ids;   /* STORED: the blocks' tokens, in order */
  size_t num_tokens;
  uint32_t block_size;         /* STORED: tokens per block */
  int64_t lora_id;             /* STORED: valid when has_lora_id */
  bool has_lora_id;
  kvbm_medium medium;          /* STORED, REMOVED */
  const char *medium_name;     /* the wire text, written back as is; NULL:
                                * kvbm_medium_name(medium) (nil for NONE).
                                * When set it must map to `medium`
                                * (kvbm_medium_from_name). Required for OTHER. */
  const char *lora_name;       /* STORED: the LoRA adapter; NULL when absent */
  int64_t group_idx;           /* STORED, REMOVED (vLLM kv-cache group):
                                * valid when has_group_idx */
  bool has_group_idx;
  /* --- carried for the engines' consumers: kvbm reads the salt (the
   * router's namespaces) and passes the rest through unchanged --- */
  const char *cache_salt;      /* STORED: the tenant's salt (SGLang); NULL */
  bool token_pairs;            /* STORED: the tokens came, and go, as pairs
                                * [t_i, t_i+1] (SGLang EAGLE bigrams):
                                * token_ids holds t_0..t_n, one more than
                                * the pairs, the sequence they chain */
  const char *kv_cache_spec_kind;  /* STORED: vLLM's group kind
                                    * ("full_attention", ...); NULL */
  int64_t sliding_window;      /* STORED: kv_cache_spec_sliding_window,
                                * valid when has_sliding_window */
  bool has_sliding_window;
  const char *locality;        /* STORED, REMOVED: vLLM's "LOCAL" /
                                * "REMOTE" (to the publisher); NULL */
  const char *ownership;       /* STORED, REMOVED: vLLM's owning tier
                                * (e.g. "kvcr"); NULL */
  const uint8_t *extra_keys;   /* STORED: vLLM's extra_keys (one msgpack
                                * value: per block, nil or a tuple of
                                * multimodal hashes, LoRA name, salt, ...)
                                * as its bytes; NULL when absent or nil */
  size_t extra_keys_len;
  const uint8_t *extras;       /* STORED, REMOVED: the fields kvbm does not
                                * name (e.g. SGLang's "session_id", vLLM's
                                * future ones) as msgpack bytes: num_extras
                                * pairs of a string key and any value */
  size_t extras_len;
  uint32_t num_extras;
} kvbm_event;

/* A batch: one ZMQ message. */
typedef struct kvbm_event_batch {
  uint64_t seq;                /* the sequence frame (0, 1, 2, ...) */
  double ts;                   /* wall clock, seconds since the epoch */
  int32_t dp_rank;             /* valid when has_dp_rank */
  bool has_dp_rank;
  const kvbm_event *events;
  size_t num_events;
  uint64_t lost_before;        /* subscriber: batches missing just before
                                * this one that replay could not recover */
  bool replayed;               /* subscriber: came through the replay socket */
  bool reset;                  /* subscriber: this batch starts a new stream
                                * (the engine restarted, or the stream was
                                * re-synced after a jump; see kvbm_seqno_check):
                                * forget what this source sent before it.
                                * kvbm_index_apply_batch honours it. */
  size_t skipped;              /* decode: events of the payload left out
                                * (an unknown tag such as Dynamo's
                                * "Ignored", a field of the wrong type, a
                                * required field missing); the rest is in
                                * events. See kvbm_event_decoder_skip_reason. */
} kvbm_event_batch;

/* Writes `ev` as one JSON object (no newline) into buf, NUL-terminated;
 * hashes are unsigned decimal integers, extra_keys and extras as JSON
 * (bytes as lowercase hex strings, nesting past 64 levels as null).
 * Returns the length it needs (like snprintf): the output is complete when
 * that is < cap. */
KVBM_EXTERN size_t kvbm_event_to_json(const kvbm_event *ev, char *buf, size_t cap);

/* ----------------------------------------------------------------- codec */

typedef enum kvbm_event_form {
  KVBM_FORM_POSITIONAL = 0,  /* ["BlockStored", hashes, ...] (array_like) */
  KVBM_FORM_MAP = 1,         /* {"type": "BlockStored", ...} (today's vLLM
                              * and SGLang; the default) */
} kvbm_event_form;

typedef struct kvbm_event_encoder_config {
  kvbm_event_form form;     /* KVBM_FORM_MAP */
  bool signed_hashes;       /* write hashes as signed 64-bit integers (a
                             * hash >= 2^63 as a negative int64), as
                             * Dynamo's Python API and older Dynamo
                             * decoders expect; false: unsigned */
} kvbm_event_encoder_config;

KVBM_EXTERN kvbm_event_encoder_config kvbm_event_encoder_config_default(void);

/* Checks that `ev` can be written in cfg's form (NULL: the defaults):
 * KVBM_EINVAL, with a message naming the field, for an unknown type or
 * medium, a medium_name that names another medium (or OTHER without one),
 * NULL arrays with counts, more than 2^32 elements, token pairs with a
 * single token, extra_keys that are not one msgpack value or extras not
 * num_extras string-keyed pairs, or, in the positional form, both a
 * lora_name and a cache_salt (index 7 holds one of them). Names must not
 * contain NUL bytes (they are C strings). The encoder and the publisher
 * call this; cost O(1) but for extras and extra_keys (one scan). */
KVBM_EXTERN int kvbm_event_check(const kvbm_event *ev, const kvbm_event_encoder_config *cfg,
                                 kvbm_error *err);

/* Encoder: a reusable output buffer. Not thread-safe; one per thread. */
typedef struct kvbm_event_encoder kvbm_event_encoder;

/* Creates an encoder writing cfg's form (NULL: the defaults); free with
 * kvbm_event_encoder_destroy. KVBM_EINVAL for an unknown form. */
KVBM_EXTERN int kvbm_event_encoder_create(const kvbm_event_encoder_config *cfg,
                                          kvbm_event_encoder **out, kvbm_error *err);
KVBM_EXTERN void kvbm_event_encoder_destroy(kvbm_event_encoder *enc); /* NULL is a no-op */

/* Encodes the payload [ts, [events], dp_rank] (dp_rank omitted when
 * !has_dp_rank). The map form writes what vLLM writes (msgspec with
 * omit_defaults): the required keys always, nil when absent, the optional
 * ones only when present. *data and *len point into the encoder and stay
 * valid until its next use. Errors: kvbm_event_check's, and KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_event_encode(kvbm_event_encoder *enc, const kvbm_event_batch *batch,
                                  const uint8_t **data, size_t *len, kvbm_error *err);

/* Decoder: owns the memory of the batches it returns. Not thread-safe. */
typedef struct kvbm_event_decoder kvbm_event_decoder;

KVBM_EXTERN int kvbm_event_decoder_create(kvbm_event_decoder **out, kvbm_error *err);
KVBM_EXTERN void kvbm_event_decoder_destroy(kvbm_event_decoder *dec); /* NULL is a no-op */

/* Bytes the decoder keeps between calls (its arenas). A decode whose
 * payload needs far less than an arena holds gives the arena back first,
 * so one oversized message does not pin its memory: arenas above 256 KiB
 * shrink to what the next payload can need. */
KVBM_EXTERN size_t kvbm_event_decoder_footprint(const kvbm_event_decoder *dec);

/* Decodes one payload. On success fills *out (its seq set to `seq`); the
 * arrays it points to belong to the decoder and stay valid until its next
 * decode or free.
 *
 * One bad event never costs the batch: an event with an unknown tag, a
 * field of the wrong type or out of range (a token id beyond 32 bits, a
 * name with a NUL byte, token pairs that do not chain), or a required
 * field missing is left out and counted in out->skipped; the others are
 * returned. The whole payload is refused only when it is not well-formed
 * msgpack or not a batch: KVBM_EFORMAT (bad msgpack, a batch of the wrong
 * shape or type), KVBM_ETRUNCATED (input ends early, or declares more
 * elements than it has bytes for) or KVBM_ETOOLONG (bytes after the
 * payload), with err naming the place. It never reads outside
 * [data, data+len) and allocates at most a small multiple of len. */
KVBM_EXTERN int kvbm_event_decode(kvbm_event_decoder *dec, const void *data, size_t len,
                                  uint64_t seq, kvbm_event_batch *out, kvbm_error *err);

/* Why the first event the last decode skipped was skipped ("event 3:
 * token_ids: ..."); "" when none was. Valid until the next decode. */
KVBM_EXTERN const char *kvbm_event_decoder_skip_reason(const kvbm_event_decoder *dec);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_EVENT_CODEC_H */
