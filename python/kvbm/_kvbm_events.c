/* SPDX-License-Identifier: Apache-2.0 */
/*
 * _kvbm_events.c: kvbm.KvEventPublisher and kvbm.Subscriber over the event
 * plane of kvbm/events.h (vLLM's ZMQ wire, kvbm's NATS sink), and the event
 * dicts both they and the router's Index speak.
 *
 * The publisher has the shape of Dynamo's Python KvEventPublisher:
 * publish_stored(token_ids, num_block_tokens, block_hashes, lora_id,
 * parent_hash=None), publish_removed(block_hashes), shutdown(), and a relay
 * mode (zmq_endpoint=...) that subscribes to an engine's ZMQ PUB and
 * republishes what it reads. Where Dynamo sends to its own event plane,
 * this one sends to kvbm's sinks: a ZMQ PUB (endpoint=, with an optional
 * replay ROUTER) and/or a NATS subject. Block hashes are accepted signed or
 * unsigned (Dynamo's Python API passes signed 64-bit ints) and always come
 * back unsigned. A hybrid model's events name their KV cache group as
 * vLLM's do (group_idx=, kv_cache_spec_kind=, sliding_window= keywords;
 * the decoded dicts carry group_idx always and kv_cache_spec_kind /
 * kv_cache_spec_sliding_window when sent).
 *
 * Threads. The C publisher is thread-safe and has its own sender thread;
 * publish may wait for room in its queue, so it runs with the GIL released
 * and counts itself in `calls`. shutdown() first refuses new publishes
 * (ClosedError), waits for those in flight to return, stops the relay
 * thread (a plain pthread that only calls kvbm_relay_poll, never Python),
 * then destroys the publisher, which sends everything accepted.
 *
 * Final counts. What a user reads after shutdown() (or a Subscriber's
 * close()) is the final count: how many events went out, how many were
 * dropped. So the counters are copied as the object closes (the
 * publisher's after a flush, so that they include the last batches; the
 * relay's subscriber's once its thread is joined) and stats() returns
 * that copy from then on instead of raising ClosedError.
 *
 * A Subscriber is one socket, used by one thread: recv() waits with the GIL
 * released and marks the object busy until the batch it got has been
 * turned into Python objects (the batch's memory is the subscriber's, valid
 * until its next recv), so another thread's call raises BusyError instead
 * of invalidating it.
 */
#include "_kvbm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "kvbm/events.h"

PyTypeObject *kvbmpy_EventBatchType;

/* -------------------------------------------------------- event dicts */

static PyObject *opt_u64(bool has, uint64_t v) {
  return has ? PyLong_FromUnsignedLongLong(v) : Py_NewRef(Py_None);
}

static PyObject *opt_i64(bool has, int64_t v) {
  return has ? PyLong_FromLongLong(v) : Py_NewRef(Py_None);
}

static PyObject *opt_str(const char *s) {
  return s ? PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace") : Py_NewRef(Py_None);
}

static const char *medium_text(const kvbm_event *ev) {
  if (ev->medium == KVBM_MEDIUM_NONE) return NULL;
  if (ev->medium == KVBM_MEDIUM_OTHER) return ev->medium_name;
  return kvbm_medium_name(ev->medium);
}

PyObject *kvbmpy_event_to_dict(const kvbm_event *ev) {
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  int bad = kvbmpy_dict_obj(d, "type", PyUnicode_FromString(kvbm_event_type_name(ev->type)));
  if (!bad && ev->type != KVBM_EVENT_CLEARED) {
    bad = kvbmpy_dict_obj(d, "block_hashes", kvbmpy_list_u64(ev->block_hashes, ev->num_block_hashes)) ||
          kvbmpy_dict_obj(d, "medium", opt_str(medium_text(ev))) ||
          kvbmpy_dict_obj(d, "group_idx", opt_i64(ev->has_group_idx, ev->group_idx));
  }
  if (!bad && ev->type == KVBM_EVENT_STORED) {
    bad = kvbmpy_dict_obj(d, "parent_block_hash", opt_u64(ev->has_parent, ev->parent_hash)) ||
          kvbmpy_dict_obj(d, "token_ids", kvbmpy_list_u32(ev->token_ids, ev->num_tokens)) ||
          kvbmpy_dict_u64(d, "block_size", ev->block_size) ||
          kvbmpy_dict_obj(d, "lora_id", opt_i64(ev->has_lora_id, ev->lora_id)) ||
          kvbmpy_dict_obj(d, "lora_name", opt_str(ev->lora_name));
    /* the group's spec only when sent (vLLM omits it for one group) */
    if (!bad && ev->kv_cache_spec_kind)
      bad = kvbmpy_dict_obj(d, "kv_cache_spec_kind", PyUnicode_FromString(ev->kv_cache_spec_kind));
    if (!bad && ev->has_sliding_window)
      bad = kvbmpy_dict_obj(d, "kv_cache_spec_sliding_window", PyLong_FromLongLong(ev->sliding_window));
  }
  if (!bad && ev->event_id) bad = kvbmpy_dict_u64(d, "event_id", ev->event_id);
  if (bad) Py_CLEAR(d);
  return d;
}

/* A str kept alive by e->keep; *out borrows its UTF-8. */
static int keep_str(kvbmpy_event *e, PyObject *o, const char *what, const char **out) {
  if (kvbmpy_str(o, what, out)) return -1;
  return PyList_Append(e->keep, o);
}

static int medium_arg(kvbmpy_event *e, PyObject *o, kvbm_medium *m, const char **name) {
  *m = KVBM_MEDIUM_NONE;
  *name = NULL;
  if (!o || o == Py_None) return 0;
  const char *s;
  if (keep_str(e, o, "medium", &s)) return -1;
  *m = kvbm_medium_from_name(s, strlen(s));
  *name = s;
  return 0;
}

/* d[key], or NULL when absent or None. The value is kept alive in e->keep:
 * converting one field may run Python code that mutates the dict. */
static PyObject *dict_get(kvbmpy_event *e, PyObject *d, const char *key) {
  PyObject *v = PyDict_GetItemString(d, key);
  if (!v || v == Py_None || PyList_Append(e->keep, v) < 0) {
    PyErr_Clear();
    return NULL;
  }
  return v;
}

int kvbmpy_event_from_dict(PyObject *d, kvbmpy_event *e) {
  memset(e, 0, sizeof *e);
  e->tokens.has_view = false;
  e->tokens.owned = NULL;
  if (!(e->keep = PyList_New(0))) return -1;
  if (!PyDict_Check(d)) {
    PyErr_Format(PyExc_TypeError, "event: expected a dict, got %.100s", Py_TYPE(d)->tp_name);
    return -1;
  }
  PyObject *type = dict_get(e, d, "type");
  const char *ts;
  if (!type) {
    kvbmpy_raise(KVBM_EINVAL, "event: no 'type'");
    return -1;
  }
  if (keep_str(e, type, "event type", &ts)) return -1;
  kvbm_event *ev = &e->ev;
  if (!strcmp(ts, "BlockStored")) ev->type = KVBM_EVENT_STORED;
  else if (!strcmp(ts, "BlockRemoved")) ev->type = KVBM_EVENT_REMOVED;
  else if (!strcmp(ts, "AllBlocksCleared")) ev->type = KVBM_EVENT_CLEARED;
  else {
    kvbmpy_raise(KVBM_EINVAL, "event: type '%.40s' is not BlockStored, BlockRemoved or AllBlocksCleared", ts);
    return -1;
  }
  if (ev->type == KVBM_EVENT_CLEARED) return 0;
  PyObject *hashes = dict_get(e, d, "block_hashes"), *o;
  if (!hashes) {
    kvbmpy_raise(KVBM_EINVAL, "event: %s without 'block_hashes'", ts);
    return -1;
  }
  if (kvbmpy_hashes(hashes, "block_hashes", &e->hashes, &ev->num_block_hashes)) return -1;
  ev->block_hashes = e->hashes;
  if (medium_arg(e, dict_get(e, d, "medium"), &ev->medium, &ev->medium_name)) return -1;
  if ((o = dict_get(e, d, "group_idx"))) {
    uint64_t g;
    if (kvbmpy_hash(o, "group_idx", &g)) return -1;
    ev->group_idx = (int64_t)g;
    ev->has_group_idx = true;
  }
  if (ev->type != KVBM_EVENT_STORED) return 0;
  if ((o = dict_get(e, d, "parent_block_hash")) || (o = dict_get(e, d, "parent_hash"))) {
    if (kvbmpy_hash(o, "parent_block_hash", &ev->parent_hash)) return -1;
    ev->has_parent = true;
  }
  if ((o = dict_get(e, d, "token_ids"))) {
    if (kvbmpy_tokens_get(o, "token_ids", &e->tokens)) return -1;
    ev->token_ids = e->tokens.data;
    ev->num_tokens = e->tokens.n;
  }
  uint64_t v;
  if ((o = dict_get(e, d, "block_size"))) {
    if (kvbmpy_uint(o, "block_size", UINT32_MAX, &v)) return -1;
    ev->block_size = (uint32_t)v;
  }
  if ((o = dict_get(e, d, "lora_id"))) {
    if (kvbmpy_hash(o, "lora_id", &v)) return -1;
    ev->lora_id = (int64_t)v;
    ev->has_lora_id = true;
  }
  if ((o = dict_get(e, d, "lora_name")) && keep_str(e, o, "lora_name", &ev->lora_name)) return -1;
  if ((o = dict_get(e, d, "kv_cache_spec_kind")) &&
      keep_str(e, o, "kv_cache_spec_kind", &ev->kv_cache_spec_kind))
    return -1;
  if ((o = dict_get(e, d, "kv_cache_spec_sliding_window"))) {
    if (kvbmpy_uint(o, "kv_cache_spec_sliding_window", INT64_MAX, &v)) return -1;
    ev->sliding_window = (int64_t)v;
    ev->has_sliding_window = true;
  }
  return 0;
}

void kvbmpy_event_release(kvbmpy_event *e) {
  PyMem_Free(e->hashes);
  e->hashes = NULL;
  kvbmpy_tokens_release(&e->tokens);
  Py_CLEAR(e->keep);
}

static PyObject *batch_to_py(const kvbm_event_batch *b) {
  PyObject *o = PyStructSequence_New(kvbmpy_EventBatchType);
  PyObject *events = PyList_New((Py_ssize_t)b->num_events);
  if (!o || !events) goto fail;
  for (size_t i = 0; i < b->num_events; i++) {
    PyObject *e = kvbmpy_event_to_dict(&b->events[i]);
    if (!e) goto fail;
    PyList_SET_ITEM(events, (Py_ssize_t)i, e);
  }
  PyStructSequence_SetItem(o, 0, PyFloat_FromDouble(b->ts));
  PyStructSequence_SetItem(o, 1, b->has_dp_rank ? PyLong_FromLong(b->dp_rank) : Py_NewRef(Py_None));
  PyStructSequence_SetItem(o, 2, PyLong_FromUnsignedLongLong(b->seq));
  PyStructSequence_SetItem(o, 3, events);
  events = NULL;
  PyStructSequence_SetItem(o, 4, PyLong_FromUnsignedLongLong(b->lost_before));
  PyStructSequence_SetItem(o, 5, PyBool_FromLong(b->replayed));
  PyStructSequence_SetItem(o, 6, PyBool_FromLong(b->reset));
  for (int i = 0; i < 7; i++)
    if (!PyStructSequence_GetItem(o, i)) goto fail;
  return o;
fail:
  Py_XDECREF(events);
  Py_XDECREF(o);
  return NULL;
}

/* ---------------------------------------------------------- publisher */

typedef struct PublisherObject {
  PyObject_HEAD
  kvbm_publisher *pub;  /* NULL once shut down */
  kvbm_relay *relay;    /* relay mode: the source subscription */
  pthread_t relay_thread;
  bool relay_running;
  /* What the relay thread reads: set before it starts, left alone until
   * it has been joined (the fields above may be cleared meanwhile). */
  struct relay_arg {
    kvbm_relay *relay;
    atomic_bool stop;
    /* The relay's subscriber is the thread's: it publishes a copy of its
     * counters here after every poll, for stats(). */
    pthread_mutex_t mu;
    bool mu_ready;
    kvbm_subscriber_stats snap;
  } rt;
  bool closing;         /* shutdown began: publishes refused */
  bool final_ready;     /* shutdown ended: stats() returns the copies below */
  kvbm_publisher_stats final;
  kvbm_subscriber_stats final_relay; /* relay mode (had_relay) */
  bool had_relay;
  Py_ssize_t calls;     /* publishes/flushes running without the GIL */
  uint32_t block_size;
  kvbm_medium medium;
  PyObject *medium_name;  /* the medium's text (for OTHER), kept */
  size_t zmq_sink;        /* index of the ZMQ sink, or SIZE_MAX */
} PublisherObject;

static PyTypeObject PublisherType, SubscriberType;

static void *relay_main(void *arg) {
  struct relay_arg *rt = arg;
  while (!atomic_load(&rt->stop)) {
    kvbm_relay_poll(rt->relay, 100, NULL, NULL);
    kvbm_subscriber_stats st;
    kvbm_subscriber_stats_get(kvbm_relay_subscriber(rt->relay), &st);
    pthread_mutex_lock(&rt->mu);
    rt->snap = st;
    pthread_mutex_unlock(&rt->mu);
  }
  return NULL;
}

static int form_arg(PyObject *o, kvbm_event_form *out) {
  const char *s;
  if (kvbmpy_str(o, "form", &s)) return -1;
  if (!strcmp(s, "positional")) *out = KVBM_FORM_POSITIONAL;
  else if (!strcmp(s, "map")) *out = KVBM_FORM_MAP;
  else {
    kvbmpy_raise(KVBM_EINVAL, "form: '%.40s' is not 'positional' or 'map'", s);
    return -1;
  }
  return 0;
}

static int opt_str_arg(PyObject *o, const char *what, const char **out) {
  *out = NULL;
  if (!o || o == Py_None) return 0;
  return kvbmpy_str(o, what, out);
}

/* coalesce=: a bool and nothing else. Truthiness (what "p" would accept)
 * would turn coalescing on for coalesce="no" or coalesce=1.5, and the option
 * changes what every consumer sees, so anything but True/False is refused. */
static int coalesce_arg(PyObject *o, bool *out) {
  if (!PyBool_Check(o)) {
    PyErr_Format(PyExc_TypeError, "coalesce: expected a bool (True or False), got %.100s",
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  *out = o == Py_True;
  return 0;
}

/* Stops the relay and destroys the publisher, GIL released, keeping the
 * final counts (see the top of the file): the relay's once its thread is
 * joined, the publisher's after a flush (what destroy would send is sent
 * first, so the copy counts it). */
static void pub_teardown(PublisherObject *self) {
  kvbm_publisher *pub = self->pub;
  kvbm_relay *relay = self->relay;
  bool joining = self->relay_running;
  kvbm_publisher_stats fin = {0};
  kvbm_subscriber_stats fin_relay = {0};
  self->pub = NULL;
  self->relay = NULL;
  self->relay_running = false;
  Py_BEGIN_ALLOW_THREADS
  if (joining) {
    atomic_store(&self->rt.stop, true);
    pthread_join(self->relay_thread, NULL);
  }
  if (relay) kvbm_subscriber_stats_get(kvbm_relay_subscriber(relay), &fin_relay);
  kvbm_relay_destroy(relay);
  if (pub) {
    kvbm_publisher_flush(pub, -1, NULL); /* no new events: the queue only drains */
    kvbm_publisher_stats_get(pub, &fin);
  }
  kvbm_publisher_destroy(pub);
  Py_END_ALLOW_THREADS
  self->final = fin;
  self->final_relay = fin_relay;
  self->final_ready = true;
}

static PyObject *pub_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"kv_block_size", "dp_rank", "endpoint", "replay_endpoint", "topic",
                           "nats_url", "nats_subject", "form", "medium", "zmq_endpoint",
                           "zmq_topic", "zmq_replay_endpoint", "max_batch_events",
                           "max_batch_delay_us", "drop_when_full", "coalesce", NULL};
  PyObject *bso, *dpo = NULL, *epo = NULL, *repo = NULL, *topo = NULL, *nuo = NULL, *nso = NULL,
                 *formo = NULL, *medo = NULL, *zeo = NULL, *zto = NULL, *zro = NULL, *mbo = NULL,
                 *mdo = NULL, *coo = NULL;
  int drop = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OOOOOOOOOOOOOpO:KvEventPublisher", kwlist, &bso,
                                   &dpo, &epo, &repo, &topo, &nuo, &nso, &formo, &medo, &zeo, &zto,
                                   &zro, &mbo, &mdo, &drop, &coo))
    return NULL;
  uint64_t bs, dp = 0, mb, md;
  const char *ep, *rep, *topic, *nu, *ns, *ze, *zt, *zr, *medium = "GPU";
  kvbm_publisher_config po = kvbm_publisher_config_default();
  if (kvbmpy_uint(bso, "kv_block_size", UINT32_MAX, &bs) ||
      (dpo && kvbmpy_uint(dpo, "dp_rank", INT32_MAX, &dp)) || opt_str_arg(epo, "endpoint", &ep) ||
      opt_str_arg(repo, "replay_endpoint", &rep) || opt_str_arg(topo, "topic", &topic) ||
      opt_str_arg(nuo, "nats_url", &nu) || opt_str_arg(nso, "nats_subject", &ns) ||
      (formo && form_arg(formo, &po.form)) || (medo && opt_str_arg(medo, "medium", &medium)) ||
      opt_str_arg(zeo, "zmq_endpoint", &ze) || opt_str_arg(zto, "zmq_topic", &zt) ||
      opt_str_arg(zro, "zmq_replay_endpoint", &zr))
    return NULL;
  if (mbo) {
    if (kvbmpy_uint(mbo, "max_batch_events", SIZE_MAX, &mb)) return NULL;
    po.max_batch_events = (size_t)mb;
  }
  if (mdo) {
    if (kvbmpy_uint(mdo, "max_batch_delay_us", UINT32_MAX, &md)) return NULL;
    po.max_batch_delay_us = (uint32_t)md;
  }
  if (coo && coalesce_arg(coo, &po.coalesce)) return NULL;
  if (bs == 0) return kvbmpy_raise(KVBM_EINVAL, "kv_block_size: must be at least 1");
  if (!ep && !nu)
    return kvbmpy_raise(KVBM_EINVAL, "KvEventPublisher: no sink: give endpoint= (ZMQ PUB) and/or nats_url=");
  if ((nu == NULL) != (ns == NULL))
    return kvbmpy_raise(KVBM_EINVAL, "KvEventPublisher: nats_url and nats_subject go together");
  if (rep && !ep) return kvbmpy_raise(KVBM_EINVAL, "KvEventPublisher: replay_endpoint needs endpoint");
  po.dp_rank = (int32_t)dp;
  po.overflow = drop ? KVBM_OVERFLOW_DROP : KVBM_OVERFLOW_BLOCK;

  PublisherObject *self = (PublisherObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  atomic_init(&self->rt.stop, false);
  self->block_size = (uint32_t)bs;
  self->zmq_sink = SIZE_MAX;
  self->medium = medium ? kvbm_medium_from_name(medium, strlen(medium)) : KVBM_MEDIUM_NONE;
  self->medium_name = medium ? PyUnicode_FromString(medium) : NULL;
  if (medium && !self->medium_name) {
    Py_DECREF(self);
    return NULL;
  }
  kvbm_error err = {0};
  int rc;
  kvbm_publisher *pub = NULL;
  kvbm_relay *relay = NULL;
  size_t nsinks = 0, zsink = SIZE_MAX;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_publisher_create(&po, &pub, &err);
  if (!rc && ep) {
    kvbm_zmq_sink_config zo = kvbm_zmq_sink_config_default(ep);
    zo.topic = topic;
    zo.replay_endpoint = rep;
    rc = kvbm_publisher_add_zmq(pub, &zo, &err);
    zsink = nsinks++;
  }
  if (!rc && nu) rc = kvbm_publisher_add_nats(pub, nu, ns, &err), nsinks++;
  if (!rc) rc = kvbm_publisher_start(pub, &err);
  if (!rc && ze) {
    kvbm_subscriber_config so = kvbm_subscriber_config_default(ze);
    so.topic = zt;
    so.replay_endpoint = zr;
    rc = kvbm_relay_create(&so, pub, &relay, &err);
  }
  if (rc) {
    kvbm_relay_destroy(relay);
    kvbm_publisher_destroy(pub);
  }
  Py_END_ALLOW_THREADS
  if (rc) {
    Py_DECREF(self);
    return kvbmpy_raise_kvbm(rc, &err, NULL);
  }
  self->pub = pub;
  self->relay = relay;
  self->zmq_sink = zsink;
  if (relay) {
    self->rt.relay = relay;
    pthread_mutex_init(&self->rt.mu, NULL);
    self->rt.mu_ready = true;
    if (pthread_create(&self->relay_thread, NULL, relay_main, &self->rt)) {
      Py_DECREF(self);
      return kvbmpy_raise(KVBM_ENOMEM, "KvEventPublisher: cannot start the relay thread");
    }
    self->relay_running = true;
    self->had_relay = true;
  }
  return (PyObject *)self;
}

static int pub_open(PublisherObject *self) {
  if (!self->pub || self->closing) {
    kvbmpy_raise(KVBM_ECLOSED, "KvEventPublisher is shut down");
    return -1;
  }
  return 0;
}

/* Publishes `ev` with the GIL released; returns the event id or NULL. */
static PyObject *pub_send(PublisherObject *self, const kvbm_event *ev, const char *what) {
  if (pub_open(self)) return NULL;
  uint64_t id = 0;
  kvbm_error err = {0};
  int rc;
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_publisher_publish(self->pub, ev, &id, &err);
  Py_END_ALLOW_THREADS
  self->calls--;
  if (rc) return kvbmpy_raise_kvbm(rc, &err, what);
  return PyLong_FromUnsignedLongLong(id);
}

/* A medium whose text is kvbm's own name for it ("GPU", "CPU") is sent
 * without medium_name: the encoder writes that same text, and an event
 * without names is the publisher's plain one, which its fast path and
 * coalescing (coalesce=True) take. Another text ("CPU_PINNED", a name kvbm
 * does not know) is kept and written as given. */
static void plain_medium(kvbm_medium m, const char **name) {
  const char *c = m == KVBM_MEDIUM_OTHER ? NULL : kvbm_medium_name(m);
  if (*name && c && !strcmp(*name, c)) *name = NULL;
}

static int pub_medium(PublisherObject *self, PyObject *o, kvbm_medium *m, const char **name,
                      PyObject **keep) {
  *m = self->medium;
  *name = self->medium_name ? PyUnicode_AsUTF8(self->medium_name) : NULL;
  plain_medium(*m, name);
  *keep = NULL;
  if (!o) return 0;
  if (o == Py_None) {
    *m = KVBM_MEDIUM_NONE;
    *name = NULL;
    return 0;
  }
  if (kvbmpy_str(o, "medium", name)) return -1;
  *keep = Py_NewRef(o);
  *m = kvbm_medium_from_name(*name, strlen(*name));
  plain_medium(*m, name);
  return 0;
}

/* The group keywords of publish_stored / publish_removed (None: absent):
 * group_idx and sliding_window 0..2^63-1, kv_cache_spec_kind a str (vLLM's
 * names: "full_attention", "sliding_window", ...; the str must outlive the
 * publish call, which copies it: the caller's argument does). */
static int group_args(PyObject *grpo, PyObject *kindo, PyObject *wino, kvbm_event *ev) {
  uint64_t v;
  if (grpo != Py_None) {
    if (kvbmpy_uint(grpo, "group_idx", INT64_MAX, &v)) return -1;
    ev->group_idx = (int64_t)v;
    ev->has_group_idx = true;
  }
  if (kindo && kindo != Py_None && kvbmpy_str(kindo, "kv_cache_spec_kind", &ev->kv_cache_spec_kind))
    return -1;
  if (wino && wino != Py_None) {
    if (kvbmpy_uint(wino, "sliding_window", INT64_MAX, &v)) return -1;
    ev->sliding_window = (int64_t)v;
    ev->has_sliding_window = true;
  }
  return 0;
}

static PyObject *pub_publish_stored(PublisherObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"token_ids", "num_block_tokens", "block_hashes", "lora_id",
                           "parent_hash", "medium", "group_idx", "kv_cache_spec_kind",
                           "sliding_window", NULL};
  PyObject *toko, *nbto, *bho, *lorao = Py_None, *parento = Py_None, *medo = NULL;
  PyObject *grpo = Py_None, *kindo = Py_None, *wino = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OO$OOOO:publish_stored", kwlist, &toko, &nbto,
                                   &bho, &lorao, &parento, &medo, &grpo, &kindo, &wino))
    return NULL;
  kvbm_event ev = {.type = KVBM_EVENT_STORED, .block_size = self->block_size};
  kvbmpy_tokens t;
  uint64_t *hashes = NULL, *nbt = NULL, v;
  size_t nh = 0, nn = 0;
  PyObject *res = NULL, *keep = NULL;
  t.has_view = false;
  t.owned = NULL;
  if (kvbmpy_hashes(bho, "block_hashes", &hashes, &nh) ||
      kvbmpy_hashes(nbto, "num_block_tokens", &nbt, &nn) ||
      kvbmpy_tokens_get(toko, "token_ids", &t) || pub_medium(self, medo, &ev.medium, &ev.medium_name, &keep) ||
      group_args(grpo, kindo, wino, &ev))
    goto out;
  if (lorao != Py_None) {
    if (kvbmpy_hash(lorao, "lora_id", &v)) goto out;
    ev.lora_id = (int64_t)v;
    ev.has_lora_id = true;
  }
  if (parento != Py_None) {
    if (kvbmpy_hash(parento, "parent_hash", &ev.parent_hash)) goto out;
    ev.has_parent = true;
  }
  if (nn != nh) {
    kvbmpy_raise(KVBM_EINVAL, "publish_stored: %zu block_hashes but %zu num_block_tokens", nh, nn);
    goto out;
  }
  for (size_t i = 0; i < nn; i++)
    if (nbt[i] != self->block_size) {
      kvbmpy_raise(KVBM_EINVAL,
                   "publish_stored: num_block_tokens[%zu] is %llu; every block holds kv_block_size = %u",
                   i, (unsigned long long)nbt[i], self->block_size);
      goto out;
    }
  if (t.n != nh * self->block_size) {
    kvbmpy_raise(KVBM_EINVAL, "publish_stored: %zu token_ids for %zu block(s) of %u", t.n, nh,
                 self->block_size);
    goto out;
  }
  ev.block_hashes = hashes;
  ev.num_block_hashes = nh;
  ev.token_ids = t.data;
  ev.num_tokens = t.n;
  res = pub_send(self, &ev, "publish_stored");
out:
  Py_XDECREF(keep);
  PyMem_Free(hashes);
  PyMem_Free(nbt);
  kvbmpy_tokens_release(&t);
  return res;
}

static PyObject *pub_publish_removed(PublisherObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"block_hashes", "medium", "group_idx", NULL};
  PyObject *bho, *medo = NULL, *grpo = Py_None, *keep = NULL, *res = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OO:publish_removed", kwlist, &bho, &medo, &grpo))
    return NULL;
  kvbm_event ev = {.type = KVBM_EVENT_REMOVED};
  uint64_t *hashes = NULL;
  size_t nh = 0;
  if (!group_args(grpo, NULL, NULL, &ev) && !kvbmpy_hashes(bho, "block_hashes", &hashes, &nh) &&
      !pub_medium(self, medo, &ev.medium, &ev.medium_name, &keep)) {
    ev.block_hashes = hashes;
    ev.num_block_hashes = nh;
    res = pub_send(self, &ev, "publish_removed");
  }
  Py_XDECREF(keep);
  PyMem_Free(hashes);
  return res;
}

static PyObject *pub_publish_cleared(PublisherObject *self, PyObject *unused) {
  (void)unused;
  kvbm_event ev = {.type = KVBM_EVENT_CLEARED};
  return pub_send(self, &ev, "publish_cleared");
}

static PyObject *pub_flush(PublisherObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"timeout", NULL};
  PyObject *to = NULL;
  double timeout;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:flush", kwlist, &to) || kvbmpy_timeout(to, &timeout) ||
      pub_open(self))
    return NULL;
  int ms = timeout < 0 ? -1 : timeout * 1000 > INT32_MAX ? INT32_MAX : (int)(timeout * 1000 + 0.999);
  kvbm_error err = {0};
  int rc;
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_publisher_flush(self->pub, ms, &err);
  Py_END_ALLOW_THREADS
  self->calls--;
  if (rc) return kvbmpy_raise_kvbm(rc, &err, "KvEventPublisher.flush");
  Py_RETURN_NONE;
}

static PyObject *pub_shutdown(PublisherObject *self, PyObject *unused) {
  (void)unused;
  if (!self->pub || self->closing) Py_RETURN_NONE;
  self->closing = true;
  /* Publishes in flight finish (the sender drains the queue they wait on). */
  while (self->calls) {
    Py_BEGIN_ALLOW_THREADS
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
    Py_END_ALLOW_THREADS
  }
  pub_teardown(self);
  Py_RETURN_NONE;
}

static void pub_dealloc(PublisherObject *self) {
  if (self->pub) pub_teardown(self);
  if (self->rt.mu_ready) pthread_mutex_destroy(&self->rt.mu);
  Py_XDECREF(self->medium_name);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *pub_stats(PublisherObject *self, PyObject *unused) {
  (void)unused;
  kvbm_publisher_stats s;
  kvbm_subscriber_stats rs = {0};
  bool relay = self->had_relay;
  if (self->final_ready) { /* shut down: the final counts */
    s = self->final;
    rs = self->final_relay;
  } else {
    if (!self->pub) /* a shutdown on another thread has not ended yet */
      return kvbmpy_raise(KVBM_ECLOSED, "KvEventPublisher is shutting down");
    kvbm_publisher_stats_get(self->pub, &s);
    if (relay) {
      pthread_mutex_lock(&self->rt.mu);
      rs = self->rt.snap;
      pthread_mutex_unlock(&self->rt.mu);
    }
  }
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  if (kvbmpy_dict_u64(d, "accepted", s.accepted) || kvbmpy_dict_u64(d, "dropped", s.dropped) ||
      kvbmpy_dict_u64(d, "sent_events", s.sent_events) || kvbmpy_dict_u64(d, "batches", s.batches) ||
      kvbmpy_dict_u64(d, "sink_errors", s.sink_errors) ||
      kvbmpy_dict_u64(d, "replay_requests", s.replay_requests) ||
      kvbmpy_dict_u64(d, "replay_bad", s.replay_bad) || kvbmpy_dict_u64(d, "blocked", s.blocked) ||
      (relay && (kvbmpy_dict_u64(d, "relay_messages", rs.messages) ||
                 kvbmpy_dict_u64(d, "relay_delivered", rs.delivered) ||
                 kvbmpy_dict_u64(d, "relay_malformed", rs.malformed) ||
                 kvbmpy_dict_u64(d, "relay_lost", rs.lost)))) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

static PyObject *pub_endpoint(PublisherObject *self, bool replay) {
  if (pub_open(self)) return NULL;
  char buf[512];
  if (self->zmq_sink == SIZE_MAX ||
      kvbm_publisher_zmq_endpoint(self->pub, self->zmq_sink, replay, buf, sizeof buf))
    Py_RETURN_NONE;
  return PyUnicode_FromString(buf);
}

static PyObject *pub_get_endpoint(PublisherObject *self, void *c) {
  (void)c;
  return pub_endpoint(self, false);
}

static PyObject *pub_get_replay_endpoint(PublisherObject *self, void *c) {
  (void)c;
  return pub_endpoint(self, true);
}

static PyObject *pub_get_block_size(PublisherObject *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLong(self->block_size);
}

static PyObject *pub_get_closed(PublisherObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(!self->pub || self->closing);
}

static PyObject *any_enter(PyObject *self, PyObject *unused) {
  (void)unused;
  return Py_NewRef(self);
}

static PyObject *pub_exit(PublisherObject *self, PyObject *args) {
  (void)args;
  return pub_shutdown(self, NULL);
}

static PyMethodDef pub_methods[] = {
  {"publish_stored", (PyCFunction)(void (*)(void))pub_publish_stored, METH_VARARGS | METH_KEYWORDS,
   "publish_stored(token_ids, num_block_tokens, block_hashes, lora_id=None, parent_hash=None,\n"
   "               *, medium=<the publisher's>, group_idx=None, kv_cache_spec_kind=None,\n"
   "               sliding_window=None) -> int\n\n"
   "Publishes a BlockStored of len(block_hashes) blocks (sequence hashes, signed or\n"
   "unsigned 64-bit), each of kv_block_size tokens (num_block_tokens lists them, as\n"
   "in Dynamo), whose token_ids are given in order. Returns the event id. A hybrid\n"
   "model's event names its KV cache group as vLLM's do: group_idx, the group's\n"
   "kv_cache_spec_kind (\"full_attention\", \"sliding_window\", ...) and its window\n"
   "(kv_cache_spec_sliding_window on the wire)."},
  {"publish_removed", (PyCFunction)(void (*)(void))pub_publish_removed, METH_VARARGS | METH_KEYWORDS,
   "publish_removed(block_hashes, *, medium=<the publisher's>, group_idx=None) -> int\n\n"
   "Publishes a BlockRemoved (of KV cache group group_idx when given)."},
  {"publish_cleared", (PyCFunction)pub_publish_cleared, METH_NOARGS,
   "publish_cleared() -> int\n\nPublishes an AllBlocksCleared."},
  {"flush", (PyCFunction)(void (*)(void))pub_flush, METH_VARARGS | METH_KEYWORDS,
   "flush(timeout=None)\n\nSends everything accepted so far and waits until the sinks have it."},
  {"stats", (PyCFunction)pub_stats, METH_NOARGS,
   "stats() -> dict\n\naccepted, dropped, sent_events, batches, sink_errors, replay_requests,\n"
   "replay_bad, blocked; in relay mode also relay_messages, relay_delivered,\n"
   "relay_malformed, relay_lost. After shutdown(): the final counts (every accepted\n"
   "event sent)."},
  {"shutdown", (PyCFunction)pub_shutdown, METH_NOARGS,
   "shutdown()\n\nStops the relay, sends every accepted event, closes the sinks. Idempotent;\n"
   "later publishes raise ClosedError; stats() keeps the final counts. Releases the GIL."},
  {"__enter__", any_enter, METH_NOARGS, NULL},
  {"__exit__", (PyCFunction)pub_exit, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef pub_getset[] = {
  {"endpoint", (getter)pub_get_endpoint, NULL,
   "The endpoint the ZMQ PUB sink bound (the port picked for 'tcp://127.0.0.1:*'), or None.", NULL},
  {"replay_endpoint", (getter)pub_get_replay_endpoint, NULL, "The replay ROUTER's endpoint, or None.", NULL},
  {"kv_block_size", (getter)pub_get_block_size, NULL, "Tokens per block.", NULL},
  {"closed", (getter)pub_get_closed, NULL, "Whether shutdown() ran.", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PublisherType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "kvbm.KvEventPublisher",
  .tp_basicsize = sizeof(PublisherObject),
  .tp_dealloc = (destructor)pub_dealloc,
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc =
      "KvEventPublisher(kv_block_size, *, dp_rank=0, endpoint=None, replay_endpoint=None,\n"
      "                 topic='', nats_url=None, nats_subject=None, form='map',\n"
      "                 medium='GPU', zmq_endpoint=None, zmq_topic=None,\n"
      "                 zmq_replay_endpoint=None, max_batch_events=256,\n"
      "                 max_batch_delay_us=1000, drop_when_full=False, coalesce=False)\n\n"
      "KV events (BlockStored, BlockRemoved, AllBlocksCleared) in the shape of\n"
      "Dynamo's KvEventPublisher, sent on vLLM's wire to a ZMQ PUB socket (endpoint;\n"
      "vLLM's rule: bind for '*' or ipc://, connect otherwise; replay_endpoint adds a\n"
      "ROUTER for gap recovery) and/or a NATS subject. form='map' (the default) is\n"
      "today's vLLM's tagged event maps, form='positional' older vLLM's and SGLang's\n"
      "arrays. zmq_endpoint turns on relay mode: the publisher also subscribes to\n"
      "an engine's ZMQ PUB there (vLLM, SGLang) and republishes every event it reads.\n"
      "coalesce=True sends chained one-block BlockStored events (and one-block\n"
      "BlockRemoved events) published within one batch as one multi-block event, as\n"
      "vLLM sends a step: the same blocks in the same order, fewer events (ids and\n"
      "stats()['sent_events'] still count publishes). Off by default: consumers that\n"
      "count events see the difference (docs/areas/events.md, Coalescing).\n"
      "Thread-safe; publishes release the GIL.",
  .tp_methods = pub_methods,
  .tp_getset = pub_getset,
  .tp_new = pub_new,
};

/* --------------------------------------------------------- subscriber */

typedef struct SubscriberObject {
  PyObject_HEAD
  kvbm_subscriber *sub;  /* NULL once closed */
  bool busy;
  kvbm_subscriber_stats final; /* the counts at close(), for stats() after it */
} SubscriberObject;

static PyObject *sub_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"endpoint", "replay_endpoint", "topic", "bind", "start_seq",
                           "max_payload", "max_queue_bytes", NULL};
  PyObject *epo, *repo = NULL, *topo = NULL, *seqo = NULL, *maxo = NULL, *qo = NULL;
  int bind = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OOpOOO:Subscriber", kwlist, &epo, &repo, &topo,
                                   &bind, &seqo, &maxo, &qo))
    return NULL;
  const char *ep, *rep, *topic;
  uint64_t start = 0, maxp = 0, qb = 0;
  if (kvbmpy_str(epo, "endpoint", &ep) || opt_str_arg(repo, "replay_endpoint", &rep) ||
      opt_str_arg(topo, "topic", &topic) ||
      (seqo && seqo != Py_None && kvbmpy_uint(seqo, "start_seq", INT64_MAX, &start)) ||
      (maxo && kvbmpy_uint(maxo, "max_payload", SIZE_MAX, &maxp)) ||
      (qo && kvbmpy_uint(qo, "max_queue_bytes", SIZE_MAX, &qb)))
    return NULL;
  kvbm_subscriber_config so = kvbm_subscriber_config_default(ep);
  so.replay_endpoint = rep;
  so.topic = topic;
  so.bind = bind;
  so.start_seq = seqo && seqo != Py_None ? (int64_t)start : -1;
  if (maxo) so.max_payload = (size_t)maxp;
  if (qo) so.max_queue_bytes = (size_t)qb;
  else if (maxo && so.max_queue_bytes / 2 < so.max_payload && so.max_payload <= SIZE_MAX / 2)
    so.max_queue_bytes = 2 * so.max_payload; /* room for what was asked */
  SubscriberObject *self = (SubscriberObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  kvbm_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_subscriber_create(&so, &self->sub, &err);
  Py_END_ALLOW_THREADS
  if (rc) {
    Py_DECREF(self);
    return kvbmpy_raise_kvbm(rc, &err, NULL);
  }
  return (PyObject *)self;
}

static int sub_ready(SubscriberObject *self) {
  if (self->busy) {
    kvbmpy_busy("Subscriber");
    return -1;
  }
  if (!self->sub) {
    kvbmpy_closed("Subscriber");
    return -1;
  }
  return 0;
}

typedef struct recv_arg {
  kvbm_subscriber *sub;
  kvbm_event_batch batch;
  kvbm_error err;
} recv_arg;

static int recv_step(void *user, int slice_ms) {
  recv_arg *a = user;
  return kvbm_subscriber_recv(a->sub, slice_ms, &a->batch, &a->err);
}

static PyObject *sub_recv(SubscriberObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"timeout", NULL};
  PyObject *to = NULL;
  double timeout;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:recv", kwlist, &to) || kvbmpy_timeout(to, &timeout) ||
      sub_ready(self))
    return NULL;
  recv_arg a = {.sub = self->sub};
  self->busy = true;
  int rc = kvbmpy_wait_sliced(timeout, recv_step, &a);
  PyObject *res = NULL;
  if (rc == KVBM_OK) res = batch_to_py(&a.batch); /* still busy: the batch is the subscriber's */
  else if (rc == KVBM_ETIMEDOUT) res = Py_NewRef(Py_None);
  else if (rc != KVBMPY_INTERRUPTED) kvbmpy_raise_kvbm(rc, &a.err, "Subscriber.recv");
  self->busy = false;
  return res;
}

static PyObject *sub_stats(SubscriberObject *self, PyObject *unused) {
  (void)unused;
  if (self->busy) return kvbmpy_busy("Subscriber");
  kvbm_subscriber_stats s = self->final; /* closed: the final counts */
  if (self->sub) kvbm_subscriber_stats_get(self->sub, &s);
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  if (kvbmpy_dict_u64(d, "messages", s.messages) || kvbmpy_dict_u64(d, "delivered", s.delivered) ||
      kvbmpy_dict_u64(d, "events", s.events) || kvbmpy_dict_u64(d, "duplicates", s.duplicates) ||
      kvbmpy_dict_u64(d, "gaps", s.gaps) || kvbmpy_dict_u64(d, "replay_requests", s.replay_requests) ||
      kvbmpy_dict_u64(d, "replayed", s.replayed) || kvbmpy_dict_u64(d, "lost", s.lost) ||
      kvbmpy_dict_u64(d, "replay_failures", s.replay_failures) ||
      kvbmpy_dict_u64(d, "malformed", s.malformed) || kvbmpy_dict_u64(d, "bad_frames", s.bad_frames) ||
      kvbmpy_dict_u64(d, "bad_seq", s.bad_seq) || kvbmpy_dict_u64(d, "bad_payload", s.bad_payload) ||
      kvbmpy_dict_u64(d, "too_large", s.too_large) || kvbmpy_dict_u64(d, "resets", s.resets) ||
      kvbmpy_dict_u64(d, "jumps", s.jumps) ||
      kvbmpy_dict_u64(d, "replay_refused", s.replay_refused) ||
      kvbmpy_dict_u64(d, "overflow", s.overflow) || kvbmpy_dict_u64(d, "reconnects", s.reconnects) ||
      kvbmpy_dict_u64(d, "queued_bytes", s.queued_bytes) ||
      kvbmpy_dict_u64(d, "peak_bytes", s.peak_bytes)) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

static PyObject *sub_close(SubscriberObject *self, PyObject *unused) {
  (void)unused;
  if (self->busy) return kvbmpy_busy("Subscriber");
  kvbm_subscriber *s = self->sub;
  self->sub = NULL;
  if (s) {
    kvbm_subscriber_stats_get(s, &self->final);
    Py_BEGIN_ALLOW_THREADS
    kvbm_subscriber_destroy(s);
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

static PyObject *sub_exit(SubscriberObject *self, PyObject *args) {
  (void)args;
  return sub_close(self, NULL);
}

static void sub_dealloc(SubscriberObject *self) {
  kvbm_subscriber_destroy(self->sub);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *sub_get_busy(SubscriberObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(self->busy);
}

static PyObject *sub_get_closed(SubscriberObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(self->sub == NULL);
}

static PyMethodDef sub_methods[] = {
  {"recv", (PyCFunction)(void (*)(void))sub_recv, METH_VARARGS | METH_KEYWORDS,
   "recv(timeout=None) -> EventBatch | None\n\n"
   "The next batch in sequence order (gaps recovered through the replay socket\n"
   "first), or None when nothing came within timeout seconds (None: wait as long\n"
   "as it takes; Ctrl-C interrupts). A malformed message raises its error\n"
   "(FormatError, TruncatedError, ...); it is counted and skipped, and the next\n"
   "call goes on. Releases the GIL."},
  {"stats", (PyCFunction)sub_stats, METH_NOARGS,
   "stats() -> dict\n\nmessages, delivered, events, duplicates, gaps, replay_requests, replayed,\n"
   "lost, replay_failures, malformed, bad_frames, bad_seq, bad_payload, too_large, ...\n"
   "After close(): the counts at close."},
  {"close", (PyCFunction)sub_close, METH_NOARGS, "close()\n\nCloses the sockets. Idempotent."},
  {"__enter__", any_enter, METH_NOARGS, NULL},
  {"__exit__", (PyCFunction)sub_exit, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef sub_getset[] = {
  {"busy", (getter)sub_get_busy, NULL, "Whether a recv() on another thread is running.", NULL},
  {"closed", (getter)sub_get_closed, NULL, "Whether close() ran.", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SubscriberType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "kvbm.Subscriber",
  .tp_basicsize = sizeof(SubscriberObject),
  .tp_dealloc = (destructor)sub_dealloc,
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "Subscriber(endpoint, *, replay_endpoint=None, topic='', bind=False,\n"
            "           start_seq=None, max_payload=2 MiB, max_queue_bytes=64 MiB)\n\n"
            "Reads KV events on vLLM's ZMQ wire (positional or map events, int or bytes\n"
            "hashes) from an engine's PUB socket, recovering gaps through its replay\n"
            "ROUTER. Batches are EventBatch(ts, dp_rank, seq, events), events dicts with\n"
            "vLLM's field names. One thread at a time (else BusyError).",
  .tp_methods = sub_methods,
  .tp_getset = sub_getset,
  .tp_new = sub_new,
};

/* --------------------------------------------------------------- init */

static PyStructSequence_Field batch_fields[] = {
  {"ts", "wall clock of the batch, seconds since the epoch"},
  {"dp_rank", "data-parallel rank, or None"},
  {"seq", "the batch's sequence number"},
  {"events", "list of event dicts"},
  {"lost_before", "batches missing just before this one that replay could not recover"},
  {"replayed", "whether it came through the replay socket"},
  {"reset", "a new stream begins here (the engine restarted): forget what it sent before"},
  {NULL, NULL},
};

static PyStructSequence_Desc batch_desc = {
  "kvbm.EventBatch", "One batch of KV events (one ZMQ message).", batch_fields, 4,
};

int kvbmpy_events_init(PyObject *m) {
  kvbmpy_EventBatchType = PyStructSequence_NewType(&batch_desc);
  if (!kvbmpy_EventBatchType ||
      PyModule_AddObjectRef(m, "EventBatch", (PyObject *)kvbmpy_EventBatchType) < 0)
    return -1;
  if (PyType_Ready(&PublisherType) < 0 || PyType_Ready(&SubscriberType) < 0) return -1;
  if (PyModule_AddObjectRef(m, "KvEventPublisher", (PyObject *)&PublisherType) < 0 ||
      PyModule_AddObjectRef(m, "Subscriber", (PyObject *)&SubscriberType) < 0)
    return -1;
  return 0;
}
