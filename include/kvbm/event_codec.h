/*
 * kvbm/event_codec.h: KV events (BlockStored / BlockRemoved /
 * AllBlocksCleared) and their wire codec: bytes in, events out, and back.
 * No sockets, no threads, no pool: publishing and subscribing over ZMQ and
 * NATS live in kvbm/events.h, which includes this header.
 *
 * The wire is vLLM's (vllm/distributed/kv_events.py), so routers built for
 * vLLM, SGLang or Dynamo can read what kvbm publishes and kvbm can read
 * what those engines publish:
 *
 *   payload = [ts, [event, ...], dp_rank]        (dp_rank may be absent)
 *   event, positional form ("array_like" in msgspec terms):
 *     ["BlockStored", block_hashes, parent_block_hash, token_ids,
 *      block_size, lora_id, medium, lora_name, extra_keys, group_idx, ...]
 *     ["BlockRemoved", block_hashes, medium, group_idx, ...]
 *     ["AllBlocksCleared", ...]
 *   event, map form (newer vLLM): {"type": "BlockStored", "block_hashes":
 *     ..., "parent_block_hash": ..., ...}; same field names.
 *
 * Decoding accepts both forms, a batch given as a map ({"ts", "events",
 * "data_parallel_rank"}), hashes as msgpack integers (negative ones are
 * read as their 64-bit two's complement) or as bytes (vLLM's bytes hashes:
 * the low 64 bits of the big-endian number, i.e. the last 8 bytes), and
 * skips fields it does not know. kvbm encodes hashes as unsigned msgpack
 * integers.
 *
 * Media (which tier holds the block): "GPU" (G1), "CPU" (G2), "DISK" (G3)
 * and "REMOTE" (G4). Any other name read from the wire is kept as
 * KVBM_MEDIUM_OTHER with its text.
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
  KVBM_MEDIUM_NONE = 0,   /* not given (nil on the wire) */
  KVBM_MEDIUM_GPU = 1,    /* "GPU": device memory, tier G1 */
  KVBM_MEDIUM_CPU = 2,    /* "CPU": host memory, tier G2 */
  KVBM_MEDIUM_DISK = 3,   /* "DISK": local disk, tier G3 */
  KVBM_MEDIUM_REMOTE = 4, /* "REMOTE": another node or a remote store, G4 */
  KVBM_MEDIUM_OTHER = 5,  /* a name kvbm does not know: see medium_name */
} kvbm_medium;

/* "GPU", "CPU", "DISK", "REMOTE"; NULL for NONE and OTHER. */
KVBM_EXTERN const char *kvbm_medium_name(kvbm_medium m);

/* Maps a name (case-insensitive) to a medium: GPU, CPU, DISK, REMOTE;
 * anything else is KVBM_MEDIUM_OTHER. */
KVBM_EXTERN kvbm_medium kvbm_medium_from_name(const char *name, size_t len);

/* The tier a medium stands for: GPU and a missing medium (Dynamo's reading)
 * G1, CPU G2, DISK G3, REMOTE G4; a name kvbm does not know counts as G3. */
KVBM_EXTERN kvbm_tier kvbm_medium_tier(kvbm_medium m);

/* One event. Arrays and strings are borrowed: in a decoded batch they stay
 * valid until the decoder (or subscriber) that produced them is used again
 * or freed; given to the publisher they are copied before it returns. */
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
  const char *medium_name;     /* the wire text; NULL when medium is NONE.
                                * Publishing: only read for OTHER. */
  const char *lora_name;       /* STORED: NULL when absent */
  int64_t group_idx;           /* STORED, REMOVED (vLLM kv-cache group):
                                * valid when has_group_idx */
  bool has_group_idx;
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
} kvbm_event_batch;

/* Writes `ev` as one JSON object (no newline) into buf, NUL-terminated;
 * hashes are unsigned decimal integers. Returns the length it needs (like
 * snprintf): the output is complete when that is < cap. */
KVBM_EXTERN size_t kvbm_event_to_json(const kvbm_event *ev, char *buf, size_t cap);

/* ----------------------------------------------------------------- codec */

typedef enum kvbm_event_form {
  KVBM_FORM_POSITIONAL = 0,  /* ["BlockStored", hashes, ...] (vLLM classic) */
  KVBM_FORM_MAP = 1,         /* {"type": "BlockStored", ...} (newer vLLM) */
} kvbm_event_form;

/* Encoder: reusable output buffer. */
typedef struct kvbm_event_encoder kvbm_event_encoder;

/* Creates an encoder (free with kvbm_event_encoder_destroy). */
KVBM_EXTERN int kvbm_event_encoder_create(kvbm_event_encoder **out, kvbm_error *err);
KVBM_EXTERN void kvbm_event_encoder_destroy(kvbm_event_encoder *enc); /* NULL is a no-op */

/* Encodes the payload [ts, [events], dp_rank] (dp_rank omitted when
 * !has_dp_rank) in `form`. *data and *len point into the encoder and stay valid
 * until its next use. KVBM_EINVAL for an event of unknown type, a medium of
 * OTHER without a name, or too many elements for msgpack (2^32). */
KVBM_EXTERN int kvbm_event_encode(kvbm_event_encoder *enc, const kvbm_event_batch *batch,
                      kvbm_event_form form, const uint8_t **data, size_t *len,
                      kvbm_error *err);

/* Decoder: owns the memory of the batches it returns. */
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
 * decode or free. On bad input returns KVBM_EFORMAT (bad msgpack, a wrong
 * type, an unknown event tag, a token id beyond 32 bits, a missing field,
 * a name containing a NUL byte), KVBM_ETRUNCATED
 * (input ends early, or declares more elements than it has bytes for) or
 * KVBM_ETOOLONG (bytes after the payload), with err naming the place; it
 * never reads outside [data, data+len) and allocates at most a small
 * multiple of len. */
KVBM_EXTERN int kvbm_event_decode(kvbm_event_decoder *dec, const void *data, size_t len,
                      uint64_t seq, kvbm_event_batch *out, kvbm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_EVENT_CODEC_H */
