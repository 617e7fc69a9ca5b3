/* SPDX-License-Identifier: Apache-2.0 */
/*
 * _kvbm_tierindex.c: kvbm.TierIndex, a lower tier's slot index (G2 host,
 * G3 disk) as kvbm keeps it: a fill_only kvbm pool whose block ids are the
 * tier's slots and whose sequence hashes are the blocks' 64-bit keys.
 *
 * Why a pool and not a dict: the tier then evicts by kvbm's own rule
 * (lowest priority, then least recently released) and a referenced block
 * is never evicted, the same code the C tiers run, instead of Python that
 * imitates it. The mapping:
 *   take(key)   kvbm_pool_alloc of one block (evicting the pool's choice,
 *               seen through the listener's REMOVED) + kvbm_block_fill of
 *               the key: the block is registered but held by the store, so
 *               it is pending (has() is False) and cannot be evicted.
 *   commit(key) the store's reference is released: the block is cached, the
 *               most recently released.
 *   pin/unpin   kvbm_block_retain / kvbm_block_release (a load in flight).
 *   touch(key)  kvbm_pool_match + release: the block becomes the most
 *               recently released (a lookup hit).
 *   drop(key)   the block goes back to the free list (a failed store).
 * Per slot the object keeps the key, the pin count and the pending flag
 * (13 bytes a slot) so that unpin/pins() never ask the pool for what it
 * does not promise. Every call keeps the GIL; the listener only records
 * the evicted key (it must not call the pool, and does not).
 */
#include "_kvbm.h"

#include <string.h>

#include "kvbm/pool.h"

typedef struct TierIndexObject {
  PyObject_HEAD
  kvbm_pool *pool;
  uint32_t capacity;
  uint64_t *keys;    /* per slot, valid while the slot is registered */
  uint32_t *pins;    /* per slot */
  uint8_t *pending;  /* per slot: taken, not committed */
  uint64_t evicted;  /* set by the listener during take */
  bool has_evicted;
  bool in_take;
} TierIndexObject;

static PyTypeObject TierIndexType;

static void ti_listener(void *user, const kvbm_pool_event *ev) {
  TierIndexObject *self = user;
  if (self->in_take && ev->kind == KVBM_POOL_REMOVED) {
    self->evicted = ev->seq_hash;
    self->has_evicted = true;
  }
}

static PyObject *ti_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"capacity", NULL};
  PyObject *co;
  uint64_t cap;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O:TierIndex", kwlist, &co)) return NULL;
  if (kvbmpy_uint(co, "TierIndex: capacity", KVBM_POOL_MAX_BLOCKS, &cap)) return NULL;
  if (cap == 0) return kvbmpy_raise(KVBM_EINVAL, "TierIndex: capacity must be at least 1 slot");
  TierIndexObject *self = (TierIndexObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  self->capacity = (uint32_t)cap;
  self->keys = PyMem_Calloc(cap, sizeof *self->keys);
  self->pins = PyMem_Calloc(cap, sizeof *self->pins);
  self->pending = PyMem_Calloc(cap, 1);
  if (!self->keys || !self->pins || !self->pending) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  kvbm_pool_config cfg = kvbm_pool_config_default((uint32_t)cap, 1);
  cfg.keep_tokens = false;
  cfg.fill_only = true;
  cfg.listener = ti_listener;
  cfg.listener_user = self;
  kvbm_error err = {0};
  int rc = kvbm_pool_create(&cfg, &self->pool, &err);
  if (rc) {
    Py_DECREF(self);
    return kvbmpy_raise_kvbm(rc, &err, "TierIndex");
  }
  return (PyObject *)self;
}

static void ti_dealloc(TierIndexObject *self) {
  kvbm_pool_destroy(self->pool);
  PyMem_Free(self->keys);
  PyMem_Free(self->pins);
  PyMem_Free(self->pending);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The slot of a registered key (pending or not); -1 with KeyError-like
 * kvbm.NotFoundError when `must` and absent, -1 without error otherwise. */
static int64_t ti_find(TierIndexObject *self, uint64_t key, const char *what, bool must) {
  uint32_t id;
  bool cached;
  if (kvbm_pool_peek(self->pool, key, &id, &cached) == KVBM_OK) return id;
  if (must) kvbmpy_raise(KVBM_ENOTFOUND, "TierIndex.%s: key %#018llx is not in the index", what,
                         (unsigned long long)key);
  return -1;
}

/* A committed key's slot (not pending); -1 with NotFoundError otherwise. */
static int64_t ti_committed(TierIndexObject *self, uint64_t key, const char *what) {
  int64_t s = ti_find(self, key, what, true);
  if (s >= 0 && self->pending[s]) {
    kvbmpy_raise(KVBM_ESTATE, "TierIndex.%s: key %#018llx is taken but not committed", what,
                 (unsigned long long)key);
    return -1;
  }
  return s;
}

static int ti_key(PyObject *o, const char *what, uint64_t *key) {
  return kvbmpy_uint(o, what, UINT64_MAX, key);
}

static PyObject *ti_take(TierIndexObject *self, PyObject *ko) {
  uint64_t key;
  if (ti_key(ko, "TierIndex.take: key", &key)) return NULL;
  if (ti_find(self, key, "take", false) >= 0)
    return kvbmpy_raise(KVBM_EEXIST, "TierIndex.take: key %#018llx is in the index already",
                        (unsigned long long)key);
  uint32_t id, out;
  self->has_evicted = false;
  self->in_take = true;
  int rc = kvbm_pool_alloc(self->pool, 1, &id);
  self->in_take = false;
  if (rc == KVBM_ENOSPC)
    return kvbmpy_raise(rc, "TierIndex.take: no free or evictable slot (all %u pinned or pending)",
                        self->capacity);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "TierIndex.take");
  const uint32_t tok = 0;
  rc = kvbm_block_fill(self->pool, id, 0, 0, false, &tok, key, &out);
  if (rc) {
    kvbm_block_release(self->pool, id, 0);
    return kvbmpy_raise_kvbm(rc, NULL, "TierIndex.take");
  }
  self->keys[id] = key;
  self->pins[id] = 0;
  self->pending[id] = 1;
  if (self->has_evicted) {
    PyObject *ev = PyLong_FromUnsignedLongLong(self->evicted);
    return ev ? Py_BuildValue("(IN)", id, ev) : NULL;
  }
  return Py_BuildValue("(IO)", id, Py_None);
}

static PyObject *ti_commit(TierIndexObject *self, PyObject *ko) {
  uint64_t key;
  if (ti_key(ko, "TierIndex.commit: key", &key)) return NULL;
  int64_t s = ti_find(self, key, "commit", true);
  if (s < 0) return NULL;
  if (!self->pending[s])
    return kvbmpy_raise(KVBM_ESTATE, "TierIndex.commit: key %#018llx is committed already",
                        (unsigned long long)key);
  int rc = kvbm_block_release(self->pool, (uint32_t)s, 0);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "TierIndex.commit");
  self->pending[s] = 0;
  Py_RETURN_NONE;
}

static PyObject *ti_has(TierIndexObject *self, PyObject *ko) {
  uint64_t key;
  if (ti_key(ko, "TierIndex.has: key", &key)) return NULL;
  int64_t s = ti_find(self, key, "has", false);
  return PyBool_FromLong(s >= 0 && !self->pending[s]);
}

static PyObject *ti_is_pending(TierIndexObject *self, PyObject *ko) {
  uint64_t key;
  if (ti_key(ko, "TierIndex.is_pending: key", &key)) return NULL;
  int64_t s = ti_find(self, key, "is_pending", false);
  return PyBool_FromLong(s >= 0 && self->pending[s]);
}

static PyObject *ti_slot(TierIndexObject *self, PyObject *ko) {
  uint64_t key;
  if (ti_key(ko, "TierIndex.slot: key", &key)) return NULL;
  int64_t s = ti_find(self, key, "slot", true);
  return s < 0 ? NULL : PyLong_FromLongLong(s);
}

static PyObject *ti_pin(TierIndexObject *self, PyObject *ko) {
  uint64_t key;
  if (ti_key(ko, "TierIndex.pin: key", &key)) return NULL;
  int64_t s = ti_committed(self, key, "pin");
  if (s < 0) return NULL;
  if (self->pins[s] == UINT32_MAX)
    return kvbmpy_raise(KVBM_EOVERFLOW, "TierIndex.pin: key %#018llx is pinned 2**32-1 times",
                        (unsigned long long)key);
  int rc = kvbm_block_retain(self->pool, (uint32_t)s);
  if (rc == KVBM_ESTATE) { /* a cached block: reactivate it through match */
    uint32_t id;
    rc = kvbm_pool_match(self->pool, key, &id);
  }
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "TierIndex.pin");
  self->pins[s]++;
  Py_RETURN_NONE;
}

static PyObject *ti_unpin(TierIndexObject *self, PyObject *ko) {
  uint64_t key;
  if (ti_key(ko, "TierIndex.unpin: key", &key)) return NULL;
  int64_t s = ti_committed(self, key, "unpin");
  if (s < 0) return NULL;
  if (!self->pins[s])
    return kvbmpy_raise(KVBM_ESTATE, "TierIndex.unpin: key %#018llx is not pinned",
                        (unsigned long long)key);
  int rc = kvbm_block_release(self->pool, (uint32_t)s, 0);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "TierIndex.unpin");
  self->pins[s]--;
  Py_RETURN_NONE;
}

static PyObject *ti_touch(TierIndexObject *self, PyObject *ko) {
  uint64_t key;
  if (ti_key(ko, "TierIndex.touch: key", &key)) return NULL;
  int64_t s = ti_committed(self, key, "touch");
  if (s < 0) return NULL;
  uint32_t id;
  int rc = kvbm_pool_match(self->pool, key, &id);
  if (!rc) rc = kvbm_block_release(self->pool, id, 0);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "TierIndex.touch");
  Py_RETURN_NONE;
}

static PyObject *ti_drop(TierIndexObject *self, PyObject *ko) {
  uint64_t key;
  if (ti_key(ko, "TierIndex.drop: key", &key)) return NULL;
  int64_t s = ti_find(self, key, "drop", true);
  if (s < 0) return NULL;
  if (self->pins[s])
    return kvbmpy_raise(KVBM_ESTATE, "TierIndex.drop: key %#018llx is pinned %u times",
                        (unsigned long long)key, self->pins[s]);
  int rc = KVBM_OK;
  if (self->pending[s]) rc = kvbm_block_release(self->pool, (uint32_t)s, 0);
  if (!rc) rc = kvbm_pool_evict(self->pool, key);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "TierIndex.drop");
  self->pending[s] = 0;
  Py_RETURN_NONE;
}

/* Slots a take could get now without touching `protect` (committed,
 * unpinned keys the caller wants kept): free + cached, less those. */
static PyObject *ti_room(TierIndexObject *self, PyObject *protect) {
  uint64_t *keys = NULL;
  size_t n = 0;
  if (kvbmpy_hashes(protect, "TierIndex.room: protect", &keys, &n)) return NULL;
  long long room = kvbm_pool_available(self->pool);
  for (size_t i = 0; i < n; i++) {
    bool dup = false;
    for (size_t j = 0; j < i && !dup; j++) dup = keys[j] == keys[i];
    int64_t s = dup ? -1 : ti_find(self, keys[i], "room", false);
    if (s >= 0 && !self->pending[s] && !self->pins[s]) room--;
  }
  PyMem_Free(keys);
  return PyLong_FromLongLong(room);
}

static PyObject *ti_pin_count(TierIndexObject *self, PyObject *ko) {
  uint64_t key;
  if (ti_key(ko, "TierIndex.pin_count: key", &key)) return NULL;
  int64_t s = ti_find(self, key, "pin_count", false);
  return PyLong_FromUnsignedLong(s >= 0 ? self->pins[s] : 0);
}

static PyObject *ti_pinned(TierIndexObject *self, PyObject *unused) {
  (void)unused;
  PyObject *d = PyDict_New();
  for (uint32_t s = 0; d && s < self->capacity; s++) {
    if (!self->pins[s]) continue;
    uint64_t key = self->keys[s];
    uint32_t n = self->pins[s];
    PyObject *k = PyLong_FromUnsignedLongLong(key), *v = PyLong_FromUnsignedLong(n);
    if (!k || !v || PyDict_SetItem(d, k, v) < 0) Py_CLEAR(d);
    Py_XDECREF(k);
    Py_XDECREF(v);
  }
  return d;
}

static Py_ssize_t ti_len(TierIndexObject *self) {
  kvbm_pool_stats st;
  kvbm_pool_stats_get(self->pool, &st);
  Py_ssize_t pend = 0;
  for (uint32_t s = 0; s < self->capacity; s++) pend += self->pending[s];
  return (Py_ssize_t)st.registered - pend;
}

static PyObject *ti_get_capacity(TierIndexObject *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLong(self->capacity);
}

static PyObject *ti_get_evictable(TierIndexObject *self, void *c) {
  (void)c;
  kvbm_pool_stats st;
  kvbm_pool_stats_get(self->pool, &st);
  return PyLong_FromUnsignedLong(st.cached);
}

static PyObject *ti_get_available(TierIndexObject *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLong(kvbm_pool_available(self->pool));
}

static PyMethodDef ti_methods[] = {
  {"take", (PyCFunction)ti_take, METH_O,
   "take(key) -> (slot, evicted_key or None)\n\nA slot for a block being stored: a free one, or the\n"
   "one kvbm evicts (lowest priority, then least recently released; never a pinned or\n"
   "pending one). The key is pending (has() False) until commit. EEXIST if present."},
  {"commit", (PyCFunction)ti_commit, METH_O,
   "commit(key)\n\nThe store finished: the block is visible and the most recently released."},
  {"has", (PyCFunction)ti_has, METH_O, "has(key) -> bool\n\nWhether a committed block has the key."},
  {"is_pending", (PyCFunction)ti_is_pending, METH_O,
   "is_pending(key) -> bool\n\nWhether the key was taken and not committed yet."},
  {"slot", (PyCFunction)ti_slot, METH_O, "slot(key) -> int\n\nThe key's slot (pending or committed)."},
  {"pin", (PyCFunction)ti_pin, METH_O,
   "pin(key)\n\nOne more reference on a committed block: it is not evicted while pinned."},
  {"unpin", (PyCFunction)ti_unpin, METH_O,
   "unpin(key)\n\nDrops a pin; the last one makes the block the most recently released."},
  {"touch", (PyCFunction)ti_touch, METH_O,
   "touch(key)\n\nA use of a committed block: it becomes the most recently released."},
  {"drop", (PyCFunction)ti_drop, METH_O,
   "drop(key)\n\nFrees the key's slot (a failed store, or a drop). StateError if pinned."},
  {"room", (PyCFunction)ti_room, METH_O,
   "room(protect) -> int\n\nSlots take() could hand out without evicting a key of protect."},
  {"pin_count", (PyCFunction)ti_pin_count, METH_O,
   "pin_count(key) -> int\n\nThe key's pins (0 when absent or unpinned)."},
  {"pinned", (PyCFunction)ti_pinned, METH_NOARGS, "pinned() -> dict[key, count]"},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef ti_getset[] = {
  {"capacity", (getter)ti_get_capacity, NULL, "Slots in the index.", NULL},
  {"evictable", (getter)ti_get_evictable, NULL, "Committed, unpinned blocks (kvbm's cache).", NULL},
  {"available", (getter)ti_get_available, NULL, "Free + evictable slots.", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods ti_as_seq = {.sq_length = (lenfunc)ti_len};

static PyTypeObject TierIndexType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "kvbm.TierIndex",
  .tp_basicsize = sizeof(TierIndexObject),
  .tp_dealloc = (destructor)ti_dealloc,
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "TierIndex(capacity)\n\n"
            "A lower tier's slot index (G2, G3) on kvbm's own fill-only pool: 64-bit keys\n"
            "to slots 0..capacity-1, evicting by kvbm's rule (lowest priority, then least\n"
            "recently released); pinned and pending blocks are never evicted. len() counts\n"
            "committed keys.",
  .tp_methods = ti_methods,
  .tp_getset = ti_getset,
  .tp_as_sequence = &ti_as_seq,
  .tp_new = ti_new,
};

int kvbmpy_tierindex_init(PyObject *m) {
  if (PyType_Ready(&TierIndexType) < 0) return -1;
  return PyModule_AddObjectRef(m, "TierIndex", (PyObject *)&TierIndexType);
}
