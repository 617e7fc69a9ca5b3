/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.c: the event plane's counters as metrics (kvbm/metrics.h).
 *
 * The publisher has a lock of its own, so its collector snapshots it
 * (kvbm_publisher_stats_get copies the counters under that lock) and
 * writes after. A subscriber is driven by one thread and has no lock:
 * whoever drives it takes the snapshot (the router's sources copy theirs
 * after every receive) and hands it to kvbm_subscriber_metrics_write.
 *
 * Names: kvbm_events_* for what a publisher does with events (accepted,
 * published, dropped), kvbm_subscriber_* for what a reader of a stream
 * sees (batches, gaps, replays, lost and malformed messages),
 * kvbm_relay_* for what a relay passed on, skipped and had refused, and
 * kvbm_js_consumer_* for a JetStream reader (like a subscriber's, with
 * redeliveries and acks instead of replays). A relay and a JetStream
 * consumer are driven by one thread, as a subscriber is: their writers
 * take a snapshot. Counters end in _total; the two byte gauges say bytes.
 */
#include "kvbm/events.h"
#include "kvbm/metrics.h"

typedef struct item {
  const char *name, *help;
  uint64_t v;
} item;

static void counters(kvbm_metrics_writer *w, const item *it, size_t n, const kvbm_metric_label *l,
                     size_t nl) {
  for (size_t i = 0; i < n; i++) kvbm_metrics_counter(w, it[i].name, it[i].help, l, nl, it[i].v);
}

void kvbm_publisher_metrics_collect(void *user, kvbm_metrics_writer *w) {
  kvbm_publisher_stats s;
  kvbm_publisher_stats_get(user, &s);
  const item it[] = {
      {"kvbm_events_accepted_total", "KV events the publisher accepted (queued)", s.accepted},
      {"kvbm_events_published_total", "KV events handed to the publisher's sinks", s.sent_events},
      {"kvbm_event_batches_published_total", "Batches (messages) the publisher sent", s.batches},
      {"kvbm_events_publisher_sink_errors_total", "Sends a sink failed (e.g. NATS down)",
       s.sink_errors},
      {"kvbm_events_replay_requests_total", "Replay requests the publisher answered",
       s.replay_requests},
      {"kvbm_events_replay_bad_requests_total", "Malformed replay requests ignored", s.replay_bad},
      {"kvbm_events_publish_blocked_total", "Publish calls that waited for room in the queue",
       s.blocked},
  };
  counters(w, it, sizeof it / sizeof *it, NULL, 0);
  kvbm_metrics_family(w, "kvbm_events_dropped_total", KVBM_METRIC_COUNTER,
                      "KV events dropped before publication, by reason");
  kvbm_metrics_value_u64(w, &(kvbm_metric_label){"reason", "queue_full"}, 1, s.dropped);
}

void kvbm_subscriber_metrics_write(kvbm_metrics_writer *w, const struct kvbm_subscriber_stats *s,
                                   const kvbm_metric_label *l, size_t nl) {
  if (!w || !s) return;
  const item it[] = {
      {"kvbm_subscriber_messages_total", "Live messages the subscriber received", s->messages},
      {"kvbm_subscriber_batches_total", "Batches delivered in sequence order", s->delivered},
      {"kvbm_subscriber_events_total", "KV events in the delivered batches", s->events},
      {"kvbm_subscriber_duplicate_batches_total", "Batches skipped as already seen", s->duplicates},
      {"kvbm_subscriber_gaps_total", "Jumps in the sequence numbers", s->gaps},
      {"kvbm_subscriber_replay_requests_total", "Requests sent to the replay socket",
       s->replay_requests},
      {"kvbm_subscriber_replayed_batches_total", "Batches recovered by replay", s->replayed},
      {"kvbm_subscriber_lost_batches_total", "Batches neither received nor replayed", s->lost},
      {"kvbm_subscriber_replay_failures_total", "Replays that timed out or answered garbage",
       s->replay_failures},
      {"kvbm_subscriber_resets_total", "New streams (engine restarts, re-syncs)", s->resets},
      {"kvbm_subscriber_jumps_total", "Batches held past a jump and dropped", s->jumps},
      {"kvbm_subscriber_replay_refused_total", "Replay replies outside the asked range, ignored",
       s->replay_refused},
      {"kvbm_subscriber_overflow_batches_total", "Batches dropped for the byte budget", s->overflow},
      {"kvbm_subscriber_reconnects_total", "Connections ended and dialled again", s->reconnects},
  };
  counters(w, it, sizeof it / sizeof *it, l, nl);
  /* malformed messages, by what was wrong */
  kvbm_metric_label ml[KVBM_METRICS_MAX_LABELS];
  size_t k = 0;
  for (; k < nl && k + 1 < KVBM_METRICS_MAX_LABELS; k++) ml[k] = l[k];
  kvbm_metrics_family(w, "kvbm_subscriber_malformed_total", KVBM_METRIC_COUNTER,
                      "Messages the subscriber skipped as malformed, by reason");
  const struct {
    const char *reason;
    uint64_t v;
  } why[] = {{"frames", s->bad_frames}, {"sequence", s->bad_seq}, {"payload", s->bad_payload},
             {"too_large", s->too_large}};
  for (size_t i = 0; i < sizeof why / sizeof *why; i++) {
    ml[k] = (kvbm_metric_label){"reason", why[i].reason};
    kvbm_metrics_value_u64(w, ml, k + 1, why[i].v);
  }
  kvbm_metrics_gauge(w, "kvbm_subscriber_queued_bytes", "Bytes of batches the subscriber holds now",
                     l, nl, (double)s->queued_bytes);
  kvbm_metrics_gauge(w, "kvbm_subscriber_peak_queued_bytes", "The most bytes it ever held", l, nl,
                     (double)s->peak_bytes);
}

void kvbm_relay_metrics_write(kvbm_metrics_writer *w, const struct kvbm_relay_stats *s,
                              const kvbm_metric_label *l, size_t nl) {
  if (!w || !s) return;
  const item it[] = {
      {"kvbm_relay_batches_total", "Engine batches the relay took and passed on", s->batches},
      {"kvbm_relay_events_total", "KV events the relay queued on its publisher", s->events},
      {"kvbm_relay_skipped_events_total", "KV events the relay's decoder left out of a batch "
       "(an unknown tag, a field of the wrong type or missing)", s->skipped},
      {"kvbm_relay_refused_events_total", "Decoded KV events the relay's publisher refused",
       s->refused},
  };
  counters(w, it, sizeof it / sizeof *it, l, nl);
}

void kvbm_js_consumer_metrics_write(kvbm_metrics_writer *w,
                                    const struct kvbm_js_consumer_stats *s,
                                    const kvbm_metric_label *l, size_t nl) {
  if (!w || !s) return;
  const item it[] = {
      {"kvbm_js_consumer_messages_total", "Messages taken from the JetStream stream",
       s->messages},
      {"kvbm_js_consumer_batches_total", "Batches returned", s->delivered},
      {"kvbm_js_consumer_events_total", "KV events in them", s->events},
      {"kvbm_js_consumer_redelivered_total", "Messages the server had delivered before "
       "(not acked)", s->redelivered},
      {"kvbm_js_consumer_malformed_total", "Messages refused (header, size, payload)",
       s->malformed},
      {"kvbm_js_consumer_acks_total", "Acks sent", s->acks},
      {"kvbm_js_consumer_rebinds_total", "Times the durable consumer was re-bound at open",
       s->rebinds},
  };
  counters(w, it, sizeof it / sizeof *it, l, nl);
}
