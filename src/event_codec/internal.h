/* SPDX-License-Identifier: Apache-2.0 */
/*
 * event_codec/internal.h: what the events module uses of the codec beyond
 * its public header (private to the library).
 */
#ifndef KVBM_EVENT_CODEC_INTERNAL_H
#define KVBM_EVENT_CODEC_INTERNAL_H

#include "kvbm/event_codec.h"

/* kvbm_event_encode without kvbm_event_check on each event: for callers
 * that checked every event already in the encoder's form (the publisher
 * checks at publish time, so that its thread never fails a batch, and need
 * not pay the check twice). Unchecked events give unspecified bytes. */
int kvbm__event_encode_checked(kvbm_event_encoder *enc, const kvbm_event_batch *batch,
                               const uint8_t **data, size_t *len, kvbm_error *err);

/* One event's wire bytes, for a publisher that encodes each event when it
 * is published (once) and frames batches of them later: at most
 * kvbm__event_wire_bound(ev) bytes written at p, in cfg's form, without
 * checking (the caller has run kvbm_event_check in that form); returns
 * the byte after them. */
size_t kvbm__event_wire_bound(const kvbm_event *ev);
uint8_t *kvbm__event_put(uint8_t *p, const kvbm_event *ev, const kvbm_event_encoder_config *cfg);

/* kvbm__event_put for a plain event (the publisher's plain_ok: a store or
 * remove with no names, salt, extras, pairs or kind, a medium of its own):
 * the same bytes, written from pre-encoded templates; any other event
 * (group index, sliding window) goes to kvbm__event_put. Its bound: */
uint8_t *kvbm__event_put_plain(uint8_t *p, const kvbm_event *ev,
                               const kvbm_event_encoder_config *cfg);
static inline size_t kvbm__event_plain_bound(size_t num_hashes, size_t num_tokens) {
  return 400 + 9 * num_hashes + 5 * num_tokens + 6;
}

/* A payload of n events already encoded by kvbm__event_put (their bytes
 * back to back in `events`): [ts, [events...], dp_rank] (no rank without
 * has_rank), the same bytes kvbm_event_encode writes for those events.
 * *data points into the encoder until its next use. KVBM_ENOMEM. */
int kvbm__event_frame(kvbm_event_encoder *enc, double ts, bool has_rank, int32_t dp_rank,
                      size_t n, const uint8_t *events, size_t events_len, const uint8_t **data,
                      size_t *len);

/* The same framing in place, for a publisher that encodes a batch's
 * events into one buffer with KVBM__EVENT_HEAD_MAX bytes free before
 * them: writes the head [ts, [n (1 + 9 + at most 5 bytes) so that it ends
 * at `end` (the first event's byte) and returns where it starts; the
 * caller appends the dp_rank (kvbm__mp_put_int, at most 9 bytes) after
 * the last event. The bytes from the returned pointer on are then what
 * kvbm__event_frame writes. */
#define KVBM__EVENT_HEAD_MAX (1 + 9 + 5)
uint8_t *kvbm__event_head_before(uint8_t *end, double ts, bool has_rank, size_t n);

/* Tests: with `on`, the decoder reads every event with its general reader
 * only (no quick path for the usual layouts; decode.c), so that the two
 * can be compared. Off by default. */
void kvbm__event_decoder_general(kvbm_event_decoder *dec, bool on);
/* Whether event i of the last decode was read whole by the quick path. */
bool kvbm__event_decoder_plain(const kvbm_event_decoder *dec, size_t i);

#endif
