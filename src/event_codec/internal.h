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

#endif
