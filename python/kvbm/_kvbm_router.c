/* SPDX-License-Identifier: Apache-2.0 */
/*
 * _kvbm_router.c: kvbm.Index, the router's index of which worker holds
 * which blocks (kvbm/router.h), fed by KV events as Subscriber.recv gives
 * them, answering overlap scores for a prompt.
 *
 * Threads. The C index takes one writer at a time and lock-free readers.
 * Every Index call keeps the GIL, which serializes the writers (apply,
 * remove_worker) for Python threads; lookups are short (one probe per
 * block per worker).
 *
 * Applying. An EventBatch (from Subscriber.recv) goes in as a batch, so
 * its sequence number drives the index's duplicate and gap detection; a
 * plain list of event dicts is applied event by event without ids. Events
 * are converted first, all of them, and only then applied: a conversion
 * error changes nothing, while an event the index refuses stops the
 * application there (the earlier ones stay applied, as in C).
 */
#include "_kvbm.h"

#include <string.h>

#include "kvbm/router.h"

typedef struct IndexObject {
  PyObject_HEAD
  kvbm_index *idx;  /* NULL once closed */
  kvbm_index_stats final_st; /* as close() left it: what stats() answers then */
  bool final_ok;
} IndexObject;

static PyTypeObject IndexType;

static int idx_open(IndexObject *self) {
  if (!self->idx) {
    kvbmpy_closed("Index");
    return -1;
  }
  return 0;
}

static PyObject *idx_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"block_size", "scheme", "recompute", "salt_hash", "expected_blocks", NULL};
  PyObject *bso = NULL, *so = NULL, *salto = NULL, *ebo = NULL;
  int recompute = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO$pOO:Index", kwlist, &bso, &so, &recompute, &salto, &ebo))
    return NULL;
  kvbm_index_config cfg = kvbm_index_config_default();
  uint64_t v;
  if (bso) {
    if (kvbmpy_uint(bso, "block_size", UINT32_MAX, &v)) return NULL;
    cfg.block_size = (uint32_t)v;
  }
  if ((so && kvbmpy_scheme(so, &cfg.scheme)) || (salto && kvbmpy_hash(salto, "salt_hash", &cfg.salt_hash)))
    return NULL;
  if (ebo) {
    if (kvbmpy_uint(ebo, "expected_blocks", 1u << 30, &v)) return NULL;
    cfg.expected_blocks = (size_t)v;
  }
  cfg.recompute = recompute;
  IndexObject *self = (IndexObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  kvbm_error err = {0};
  int rc = kvbm_index_create(&cfg, &self->idx, &err);
  if (rc) {
    Py_DECREF(self);
    return kvbmpy_raise_kvbm(rc, &err, NULL);
  }
  return (PyObject *)self;
}

static void idx_dealloc(IndexObject *self) {
  kvbm_index_destroy(self->idx);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *idx_close(IndexObject *self, PyObject *unused) {
  (void)unused;
  if (self->idx) {
    kvbm_index_stats_get(self->idx, &self->final_st);
    self->final_ok = true;
  }
  kvbm_index_destroy(self->idx);
  self->idx = NULL;
  Py_RETURN_NONE;
}

/* Converts a sequence of event dicts into evs[0..*n) (PyMem; release each). */
static int convert_events(PyObject *list, kvbmpy_event **out, size_t *n) {
  *out = NULL;
  *n = 0;
  PyObject *tup = PySequence_Tuple(list);
  if (!tup) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "events: expected an EventBatch or a list of event dicts, got %.100s",
                   Py_TYPE(list)->tp_name);
    }
    return -1;
  }
  Py_ssize_t len = PyTuple_GET_SIZE(tup);
  kvbmpy_event *evs = PyMem_Calloc((size_t)(len ? len : 1), sizeof *evs);
  if (!evs) {
    Py_DECREF(tup);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < len; i++) {
    if (kvbmpy_event_from_dict(PyTuple_GET_ITEM(tup, i), &evs[i])) {
      for (Py_ssize_t j = 0; j <= i; j++) kvbmpy_event_release(&evs[j]);
      PyMem_Free(evs);
      Py_DECREF(tup);
      return -1;
    }
  }
  Py_DECREF(tup);
  *out = evs;
  *n = (size_t)len;
  return 0;
}

static PyObject *idx_apply(IndexObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"worker_id", "events", "dp_rank", NULL};
  PyObject *wo, *evo, *dpo = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$O:apply", kwlist, &wo, &evo, &dpo)) return NULL;
  uint64_t worker, dp = 0;
  if (kvbmpy_uint(wo, "worker_id", UINT64_MAX, &worker) ||
      (dpo != Py_None && kvbmpy_uint(dpo, "dp_rank", UINT32_MAX, &dp)))
    return NULL;
  bool is_batch = Py_IS_TYPE(evo, kvbmpy_EventBatchType);
  kvbm_event_batch batch = {0};
  if (is_batch) {
    PyObject *seq = PyStructSequence_GetItem(evo, 2), *rank = PyStructSequence_GetItem(evo, 1);
    if (kvbmpy_uint(seq, "batch seq", UINT64_MAX, &batch.seq)) return NULL;
    if (dpo != Py_None) {
      batch.dp_rank = (int32_t)dp;
      batch.has_dp_rank = true;
    } else if (rank != Py_None) {
      uint64_t r;
      if (kvbmpy_uint(rank, "batch dp_rank", INT32_MAX, &r)) return NULL;
      batch.dp_rank = (int32_t)r;
      batch.has_dp_rank = true;
    }
    batch.reset = PyStructSequence_GetItem(evo, 6) == Py_True; /* a new stream */
    evo = PyStructSequence_GetItem(evo, 3);
  } else if (PyDict_Check(evo)) {
    return PyErr_Format(PyExc_TypeError, "events: a single dict; pass a list of event dicts");
  }
  kvbmpy_event *evs;
  size_t n;
  if (convert_events(evo, &evs, &n)) return NULL;
  PyObject *res = NULL;
  kvbm_event *flat = PyMem_Calloc(n ? n : 1, sizeof *flat);
  if (!flat) {
    PyErr_NoMemory();
    goto out;
  }
  for (size_t i = 0; i < n; i++) flat[i] = evs[i].ev;
  if (idx_open(self)) goto out;
  kvbm_error err = {0};
  int rc = KVBM_OK;
  if (is_batch) {
    batch.events = flat;
    batch.num_events = n;
    rc = kvbm_index_apply_batch(self->idx, worker, &batch, &err);
  } else {
    kvbm_worker_key key = {worker, (uint32_t)dp};
    for (size_t i = 0; i < n && !rc; i++) rc = kvbm_index_apply(self->idx, key, KVBM_INDEX_NO_ID, &flat[i], &err);
  }
  if (rc) kvbmpy_raise_kvbm(rc, &err, "Index.apply");
  else res = Py_NewRef(Py_None);
out:
  PyMem_Free(flat);
  for (size_t i = 0; i < n; i++) kvbmpy_event_release(&evs[i]);
  PyMem_Free(evs);
  return res;
}

/* {(worker_id, dp_rank): (G1, G2, G3, G4) prefixes} for the live workers. */
static PyObject *overlap_dict(IndexObject *self, const uint64_t *h, size_t n) {
  kvbm_overlap ov[KVBM_ROUTER_MAX_WORKERS];
  kvbm_worker_key keys[KVBM_ROUTER_MAX_WORKERS];
  uint64_t live;
  kvbm_index_lookup(self->idx, h, n, ov, &live);
  for (uint32_t s = 0; s < KVBM_ROUTER_MAX_WORKERS; s++)
    if ((live >> s & 1) && !kvbm_index_slot_worker(self->idx, s, &keys[s])) live &= ~(1ull << s);
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  for (uint32_t s = 0; s < KVBM_ROUTER_MAX_WORKERS; s++) {
    if (!(live >> s & 1)) continue;
    PyObject *k = Py_BuildValue("(KI)", (unsigned long long)keys[s].worker_id, keys[s].dp_rank);
    PyObject *v = PyTuple_New(KVBM_TIER_COUNT);
    for (int t = 0; v && t < KVBM_TIER_COUNT; t++) {
      PyObject *x = PyLong_FromUnsignedLong(ov[s].prefix[t]);
      if (!x) Py_CLEAR(v);
      else PyTuple_SET_ITEM(v, t, x);
    }
    int rc = k && v ? PyDict_SetItem(d, k, v) : -1;
    Py_XDECREF(k);
    Py_XDECREF(v);
    if (rc) {
      Py_DECREF(d);
      return NULL;
    }
  }
  return d;
}

static PyObject *idx_overlap(IndexObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"tokens", "salt_hash", NULL};
  PyObject *tok, *salto = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:overlap", kwlist, &tok, &salto)) return NULL;
  uint64_t salt = 0;
  if (salto != Py_None && kvbmpy_hash(salto, "salt_hash", &salt)) return NULL;
  kvbmpy_tokens t;
  if (kvbmpy_tokens_get(tok, "tokens", &t) || idx_open(self)) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  const kvbm_index_config *cfg = kvbm_index_config_get(self->idx);
  size_t n = t.n / cfg->block_size;
  uint64_t *h = PyMem_Malloc((n ? n : 1) * sizeof *h);
  if (!h) {
    kvbmpy_tokens_release(&t);
    return PyErr_NoMemory();
  }
  if (salto == Py_None) n = kvbm_index_hash_tokens(self->idx, t.data, t.n, h, n);
  else n = kvbm_hash_chain(cfg->scheme, salt, t.data, t.n, cfg->block_size, h, n);
  kvbmpy_tokens_release(&t);
  PyObject *d = overlap_dict(self, h, n);
  PyMem_Free(h);
  return d;
}

static PyObject *idx_overlap_hashes(IndexObject *self, PyObject *arg) {
  uint64_t *h;
  size_t n;
  if (kvbmpy_hashes(arg, "block_hashes", &h, &n)) return NULL;
  PyObject *d = idx_open(self) ? NULL : overlap_dict(self, h, n);
  PyMem_Free(h);
  return d;
}

static PyObject *idx_workers(IndexObject *self, PyObject *unused) {
  (void)unused;
  if (idx_open(self)) return NULL;
  kvbm_worker_key keys[KVBM_ROUTER_MAX_WORKERS];
  size_t n = 0;
  uint64_t live = kvbm_index_workers(self->idx);
  for (uint32_t s = 0; s < KVBM_ROUTER_MAX_WORKERS; s++)
    if ((live >> s & 1) && kvbm_index_slot_worker(self->idx, s, &keys[n])) n++;
  PyObject *list = PyList_New((Py_ssize_t)n);
  if (!list) return NULL;
  for (size_t i = 0; i < n; i++) {
    PyObject *k = Py_BuildValue("(KI)", (unsigned long long)keys[i].worker_id, keys[i].dp_rank);
    if (!k) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SET_ITEM(list, (Py_ssize_t)i, k);
  }
  return list;
}

static PyObject *idx_remove_worker(IndexObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"worker_id", "dp_rank", NULL};
  PyObject *wo, *dpo = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:remove_worker", kwlist, &wo, &dpo)) return NULL;
  uint64_t worker, dp = 0;
  if (kvbmpy_uint(wo, "worker_id", UINT64_MAX, &worker) ||
      (dpo && kvbmpy_uint(dpo, "dp_rank", UINT32_MAX, &dp)) || idx_open(self))
    return NULL;
  int rc = kvbm_index_remove_worker(self->idx, (kvbm_worker_key){worker, (uint32_t)dp});
  if (rc) return kvbmpy_raise(rc, "Index.remove_worker: worker (%llu, %llu) is not known",
                              (unsigned long long)worker, (unsigned long long)dp);
  Py_RETURN_NONE;
}

static PyObject *idx_stats(IndexObject *self, PyObject *unused) {
  (void)unused;
  kvbm_index_stats s;
  if (!self->idx && self->final_ok) { /* closed: the final counts */
    s = self->final_st;
  } else {
    if (idx_open(self)) return NULL;
    kvbm_index_stats_get(self->idx, &s);
  }
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  if (kvbmpy_dict_u64(d, "events", s.events) || kvbmpy_dict_u64(d, "stored", s.stored) ||
      kvbmpy_dict_u64(d, "removed", s.removed) || kvbmpy_dict_u64(d, "cleared", s.cleared) ||
      kvbmpy_dict_u64(d, "duplicates", s.duplicates) || kvbmpy_dict_u64(d, "gaps", s.gaps) ||
      kvbmpy_dict_u64(d, "unknown_removed", s.unknown_removed) ||
      kvbmpy_dict_u64(d, "orphans", s.orphans) || kvbmpy_dict_u64(d, "entries", s.entries) ||
      kvbmpy_dict_u64(d, "workers", s.workers)) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

static PyObject *idx_enter(PyObject *self, PyObject *unused) {
  (void)unused;
  return Py_NewRef(self);
}

static PyObject *idx_exit(IndexObject *self, PyObject *args) {
  (void)args;
  return idx_close(self, NULL);
}

static PyMethodDef idx_methods[] = {
  {"apply", (PyCFunction)(void (*)(void))idx_apply, METH_VARARGS | METH_KEYWORDS,
   "apply(worker_id, events, *, dp_rank=None)\n\n"
   "Applies a worker's events: an EventBatch from Subscriber.recv (its seq checks\n"
   "for duplicates and gaps; its dp_rank names the worker unless dp_rank is given;\n"
   "reset, a restarted engine, first forgets every rank of the worker)\n"
   "or a list of event dicts ({'type': 'BlockStored', 'block_hashes': [...],\n"
   "'parent_block_hash', 'token_ids', 'block_size', 'medium', ...}). The medium\n"
   "picks the tier: GPU (or none) G1, CPU G2, DISK G3, REMOTE G4, others G3."},
  {"overlap", (PyCFunction)(void (*)(void))idx_overlap, METH_VARARGS | METH_KEYWORDS,
   "overlap(tokens, salt_hash=None) -> dict[(worker_id, dp_rank), (g1, g2, g3, g4)]\n\n"
   "For every known worker, the length in blocks of its longest cached prefix of\n"
   "the prompt per tier, each counting the tiers above it: on device (G1), on\n"
   "device or host (G2), also on disk (G3), on any tier (G4). The prompt is hashed\n"
   "with the index's block size and scheme (and salt, unless salt_hash is given)."},
  {"overlap_hashes", (PyCFunction)idx_overlap_hashes, METH_O,
   "overlap_hashes(block_hashes) -> dict\n\noverlap() for hashes already computed."},
  {"workers", (PyCFunction)idx_workers, METH_NOARGS,
   "workers() -> list[(worker_id, dp_rank)]\n\nThe workers the index knows."},
  {"remove_worker", (PyCFunction)(void (*)(void))idx_remove_worker, METH_VARARGS | METH_KEYWORDS,
   "remove_worker(worker_id, dp_rank=0)\n\nForgets a worker and its blocks (NotFoundError if unknown)."},
  {"stats", (PyCFunction)idx_stats, METH_NOARGS,
   "stats() -> dict\n\nevents, stored, removed, cleared, duplicates, gaps, unknown_removed,\n"
   "orphans, entries, workers."},
  {"close", (PyCFunction)idx_close, METH_NOARGS, "close()\n\nFrees the index. Idempotent."},
  {"__enter__", idx_enter, METH_NOARGS, NULL},
  {"__exit__", (PyCFunction)idx_exit, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL},
};

static PyTypeObject IndexType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "kvbm.Index",
  .tp_basicsize = sizeof(IndexObject),
  .tp_dealloc = (destructor)idx_dealloc,
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "Index(block_size=16, scheme='native', *, recompute=False, salt_hash=0,\n"
            "      expected_blocks=16384)\n\n"
            "The KV-aware router's index: which worker holds which blocks, per tier, fed\n"
            "by KV events. Keys are the engines' block hashes, or with recompute=True\n"
            "hashes the index computes from the events' token ids (for engines whose\n"
            "hashes a router cannot reproduce). Up to 64 workers.",
  .tp_methods = idx_methods,
  .tp_new = idx_new,
};

int kvbmpy_router_init(PyObject *m) {
  if (PyType_Ready(&IndexType) < 0) return -1;
  return PyModule_AddObjectRef(m, "Index", (PyObject *)&IndexType);
}
