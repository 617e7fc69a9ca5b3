/* SPDX-License-Identifier: Apache-2.0 */
/*
 * seq.c: the sequence rules of an event stream (see kvbm/events.h,
 * "sequence rules"). Pure bookkeeping: no sockets, no allocation, so the
 * subscriber (ZMQ and NATS), the router's JetStream source and the
 * router's index all judge numbers the same way.
 *
 * Why these rules. vLLM numbers batches 0, 1, 2, ... per process and starts
 * again at 0 when it restarts; nothing on the wire says "new stream". A
 * consumer that only keeps a high-water mark ignores a restarted engine
 * until its numbers pass the old mark, and one message with a number near
 * 2^64 (a bug, a bit flip, a hostile peer) raises the mark so high that
 * the real stream is never heard again. So:
 *
 *   - A live stream never goes back by itself (one PUB socket, one NATS
 *     publisher): a live number below the last live one is a restart. The
 *     only legitimate repeats are live batches that a replay already
 *     delivered; those lie between where the stream began for us (`floor`)
 *     and the batch due, and after the last live number.
 *   - A live number equal to the last live one is a restart when that
 *     batch is all the stream has given us (the stream began there and
 *     nothing after it was taken), a repeat otherwise. This is the engine
 *     whose previous stream ended at batch 0 and which restarts at 0: the
 *     number alone cannot tell that from batch 0 sent twice, and there is
 *     no stream id on vLLM's wire. Calling it a restart is right either
 *     way: if it was a repeat, the consumer forgets a stream of that one
 *     batch and takes the same batch again (the same state); calling a
 *     restart a repeat dropped the new stream's first batch and left the
 *     consumer believing the dead engine's blocks. Further into a stream
 *     the two readings differ: a restarted engine comes back below the
 *     last number (0, 1, ...), so a repeat there is a redelivery (NATS,
 *     JetStream), and a restart would make the consumer forget the whole
 *     stream. Not used to decide: the ZMQ connection (a reconnect is as
 *     often a network blip, with the numbers going on), the payload's
 *     timestamp (the tracker sees numbers only, and a duplicate is skipped
 *     before it is decoded), or seq 0 always starting a stream (a late
 *     joiner that replayed from 0 sees the live 0 again as a repeat).
 *   - A step forward of at most max_gap is a gap: the batches between are
 *     missing, to be replayed or counted lost.
 *   - A bigger step forward is not believed at once. It may be a stray
 *     number; it may be the stream after a long outage. The tracker holds
 *     it aside: if `confirm` batches in a row continue it, the stream did
 *     move (RESYNC: a new stream starting at the first held batch, since
 *     what happened in between cannot be recovered); anything else makes
 *     the held batches void and the stream goes on where it was. Holding
 *     costs at most confirm - 1 batches of delay, and a stray number costs
 *     nothing.
 *
 * For consumers fed by a mix of live and replayed input (the index, which
 * sees whatever its caller applies), a step back is a duplicate unless it
 * reaches further back than max_gap; such consumers learn of a restart
 * nearer than that from the batch's `reset` flag, which the subscriber
 * sets from the live order.
 */
#include "kvbm/events.h"

#define DEFAULT_MAX_GAP 100000u
#define DEFAULT_CONFIRM 3u

kvbm_seqno_rules kvbm_seqno_rules_default(void) {
  return (kvbm_seqno_rules){.max_gap = DEFAULT_MAX_GAP, .confirm = DEFAULT_CONFIRM};
}

void kvbm_seqno_init(kvbm_seqno_tracker *t, const kvbm_seqno_rules *rules) {
  *t = (kvbm_seqno_tracker){.rules = rules ? *rules : kvbm_seqno_rules_default()};
  if (!t->rules.max_gap) t->rules.max_gap = DEFAULT_MAX_GAP;
  if (!t->rules.confirm) t->rules.confirm = DEFAULT_CONFIRM;
}

/* A new stream whose first batch is `first` (not yet taken). */
static void begin(kvbm_seqno_tracker *t, uint64_t first) {
  t->started = true;
  t->next = t->floor = first;
  t->have_live = false;
  t->held = 0;
}

void kvbm_seqno_start(kvbm_seqno_tracker *t, uint64_t first) { begin(t, first); }

uint64_t kvbm_seqno_next(const kvbm_seqno_tracker *t) { return t->next; }

static void saw_live(kvbm_seqno_tracker *t, uint64_t seq, bool live) {
  if (!live) return;
  t->have_live = true;
  t->live_last = seq;
}

/* A held batch is continued by seq: HOLD again, or RESYNC once enough
 * came in a row. */
static kvbm_seqno_verdict continue_held(kvbm_seqno_tracker *t, uint64_t seq, bool live) {
  t->held++;
  t->held_next = seq + 1;
  if (t->held < t->rules.confirm) return KVBM_SEQNO_HOLD;
  begin(t, t->held_first);
  saw_live(t, seq, live);
  return KVBM_SEQNO_RESYNC;
}

/* seq is too far ahead to believe: the first of a new held run. 2^64 - 1
 * is vLLM's replay end marker (-1), never a batch: it is held and can be
 * continued by nothing, so it never becomes a stream position. */
static kvbm_seqno_verdict hold_new(kvbm_seqno_tracker *t, uint64_t seq, bool live) {
  t->held = 0;
  t->held_first = seq;
  if (seq == UINT64_MAX) {
    t->held = 1;
    t->held_next = UINT64_MAX;
    return KVBM_SEQNO_HOLD;
  }
  return continue_held(t, seq, live);
}

/* seq is behind the batch due (or repeats the last live one). */
static kvbm_seqno_verdict behind(kvbm_seqno_tracker *t, uint64_t seq, bool live) {
  bool restart;
  if (live)
    restart = (t->have_live && seq < t->live_last) || seq < t->floor ||
              (t->have_live && seq == t->live_last && seq == t->floor && t->next == seq + 1);
  else
    restart = t->next - seq > t->rules.max_gap;
  if (!restart) {
    saw_live(t, seq, live);
    return KVBM_SEQNO_DUPLICATE;
  }
  begin(t, seq);
  saw_live(t, seq, live);
  return KVBM_SEQNO_RESTART;
}

kvbm_seqno_verdict kvbm_seqno_check(kvbm_seqno_tracker *t, uint64_t seq, bool live,
                                uint32_t *discard) {
  if (discard) *discard = 0;
  if (t->held) {
    if (seq == t->held_next && seq != UINT64_MAX) return continue_held(t, seq, live);
    if (discard) *discard = t->held;
    t->held = 0;
  }
  if (seq == UINT64_MAX) return hold_new(t, seq, live);
  if (!t->started) {
    begin(t, seq);
    saw_live(t, seq, live);
    return KVBM_SEQNO_NEXT;
  }
  if (seq < t->next || (live && t->have_live && seq <= t->live_last))
    return behind(t, seq, live);
  if (seq == t->next) {
    saw_live(t, seq, live);
    return KVBM_SEQNO_NEXT;
  }
  if (seq - t->next <= t->rules.max_gap) {
    saw_live(t, seq, live);
    return KVBM_SEQNO_GAP;
  }
  return hold_new(t, seq, live); /* too far ahead: not believed yet */
}

uint64_t kvbm_seqno_take(kvbm_seqno_tracker *t, uint64_t seq) {
  if (!t->started) begin(t, seq);
  uint64_t lost = seq > t->next ? seq - t->next : 0;
  if (seq >= t->next && seq != UINT64_MAX) t->next = seq + 1;
  return lost;
}

const char *kvbm_seqno_verdict_name(kvbm_seqno_verdict v) {
  switch (v) {
    case KVBM_SEQNO_NEXT: return "next";
    case KVBM_SEQNO_GAP: return "gap";
    case KVBM_SEQNO_DUPLICATE: return "duplicate";
    case KVBM_SEQNO_RESTART: return "restart";
    case KVBM_SEQNO_HOLD: return "hold";
    case KVBM_SEQNO_RESYNC: return "resync";
  }
  return "?";
}
