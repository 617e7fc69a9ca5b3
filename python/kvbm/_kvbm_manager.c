/* SPDX-License-Identifier: Apache-2.0 */
/*
 * _kvbm_manager.c: kvbm.Manager (the tiered block manager, kvbm/manager.h)
 * and kvbm.Request (one request's blocks, a kvbm_mreq).
 *
 * Threads and the GIL. The C manager may be called from any thread; a
 * kvbm_mreq by one thread at a time. Calls that can wait (prefill, which
 * may contend for the manager lock; wait; commit, which waits for
 * onboarding; append; destroy; flush; close) run with the GIL released.
 * While one runs, the object it works on is marked: a Request is `busy`
 * (any other call on it raises BusyError, so two threads can never drive
 * one kvbm_mreq at once), a Manager counts its `calls` (close() refuses
 * with BusyError while any run). Calls that only read under the manager
 * lock for a moment (poll, must_compute, stats) keep the GIL: no Python
 * thread can interleave with them.
 *
 * Lifetime. A Request holds a reference to its Manager, so a manager is
 * freed only after all its requests. Manager.close() is explicit: it
 * destroys the live requests first (their later use raises ClosedError),
 * then the manager; it refuses with BusyError while a request is busy, a
 * call runs without the GIL, or a buffer view of the manager's memory
 * exists (freeing memory under a numpy array would be a crash, not an
 * error).
 *
 * Memory views. block_layer() and region() return memoryviews over the
 * tier's own memory (no copy) whose exporter is a small _Memory object
 * holding the manager: numpy.frombuffer / torch.frombuffer of them keep the
 * chain, and so the manager, alive. Exports are counted in getbuffer /
 * releasebuffer, which is what close() checks. A tier in device memory has
 * no host address: views are refused (UnsupportedError) and
 * read_layer/write_layer copy instead.
 *
 * Engine-owned G1. Manager(g1_ptr=..., g1_memory=..., g1_device=...,
 * g1_owner=...) adopts memory the caller allocated (kvbm_storage_adopt: a
 * torch tensor's data_ptr(), on the device or the host) as G1, one address
 * per region of G1's layout. The manager holds a reference to g1_owner
 * (the tensor) until close(), so the memory cannot be freed under kvbm by
 * Python's refcounting; the adopted storage is released after the C manager
 * is destroyed, and never frees the memory.
 */
#include "_kvbm.h"

#include <string.h>

#include "kvbm/layout.h"
#include "kvbm/manager.h"
#include "kvbm/storage.h"

typedef struct RequestObject RequestObject;

typedef struct ManagerObject {
  PyObject_HEAD
  kvbm_manager *m;      /* NULL once closed */
  Py_ssize_t exports;   /* live buffer exports of its memory */
  Py_ssize_t calls;     /* calls running with the GIL released */
  RequestObject *reqs;  /* live requests (borrowed; each unlinks itself) */
  uint32_t block_size;
  /* The counters as close() left them (read after the last request and
   * the queues were done), what stats() answers once closed. */
  kvbm_tier_stats final_st[KVBM_TIER_COUNT];
  bool final_ok;
  kvbm_storage *g1_storage; /* adopted G1 (g1_ptr), released after the manager */
  PyObject *g1_owner;       /* what keeps its memory alive (strong), or NULL */
  Py_ssize_t hreqs;         /* live HybridRequests: close() waits for none */
  bool sparse;              /* prefix_cache_retention_interval=0 (fixed at create) */
} ManagerObject;

struct RequestObject {
  PyObject_HEAD
  ManagerObject *mgr;   /* strong */
  kvbm_mreq *r;         /* NULL once destroyed (or its manager closed) */
  size_t matched;       /* the optimistic match given by prefill */
  size_t ntok;
  bool busy;
  RequestObject *prev, *next;
};

typedef struct MemoryObject {
  PyObject_HEAD
  ManagerObject *mgr;   /* strong */
  void *ptr;
  Py_ssize_t len;
} MemoryObject;

static PyTypeObject ManagerType, RequestType, MemoryType, HRequestType;
static PyObject *mgr_hprefill(ManagerObject *self, PyObject *args, PyObject *kw);
static PyObject *mgr_get_groups(ManagerObject *self, void *c);
static PyObject *mgr_get_retention(ManagerObject *self, void *c);
static PyObject *mgr_group_bytes(ManagerObject *self, PyObject *arg);
static PyTypeObject *RequestInfoType;

/* ------------------------------------------------------------ helpers */

static int tier_arg(PyObject *o, int *out) {
  uint64_t t;
  if (kvbmpy_uint(o, "tier", UINT64_MAX, &t)) return -1;
  if (t >= KVBM_TIER_COUNT) {
    kvbmpy_raise(KVBM_ETIER, "tier %llu: tiers are G1..G4 (0..3)", (unsigned long long)t);
    return -1;
  }
  *out = (int)t;
  return 0;
}

static int mgr_open(ManagerObject *self) {
  if (!self->m) {
    kvbmpy_closed("Manager");
    return -1;
  }
  return 0;
}

static void req_unlink(RequestObject *r) {
  if (!r->mgr) return;
  if (r->prev) r->prev->next = r->next;
  else if (r->mgr->reqs == r) r->mgr->reqs = r->next;
  if (r->next) r->next->prev = r->prev;
  r->prev = r->next = NULL;
}

static PyObject *info_new(const kvbm_mreq_info *in) {
  PyObject *o = PyStructSequence_New(RequestInfoType);
  if (!o) return NULL;
  PyObject *hits = PyTuple_New(KVBM_TIER_COUNT);
  if (!hits) {
    Py_DECREF(o);
    return NULL;
  }
  for (int t = 0; t < KVBM_TIER_COUNT; t++) {
    PyObject *x = PyLong_FromSize_t(in->hit_blocks[t]);
    if (!x) {
      Py_DECREF(hits);
      Py_DECREF(o);
      return NULL;
    }
    PyTuple_SET_ITEM(hits, t, x);
  }
  PyStructSequence_SetItem(o, 0, Py_NewRef(in->ready ? Py_True : Py_False));
  PyStructSequence_SetItem(o, 1, PyLong_FromSize_t(in->matched_tokens));
  PyStructSequence_SetItem(o, 2, hits);
  PyStructSequence_SetItem(o, 3, PyLong_FromSize_t(in->num_tokens));
  for (int i = 0; i < 4; i++)
    if (!PyStructSequence_GetItem(o, i)) {
      Py_DECREF(o);
      return NULL;
    }
  return o;
}

/* ------------------------------------------------------------ Manager */

static int layout_kind_arg(PyObject *o, kvbm_layout_kind *out) {
  const char *s;
  if (kvbmpy_str(o, "layout", &s)) return -1;
  if (!strcmp(s, "fully_contiguous") || !strcmp(s, "fully-contiguous")) *out = KVBM_LAYOUT_FULLY_CONTIGUOUS;
  else if (!strcmp(s, "layer_separate") || !strcmp(s, "layer-separate")) *out = KVBM_LAYOUT_LAYER_SEPARATE;
  else {
    kvbmpy_raise(KVBM_EINVAL, "layout: '%.50s' is not 'fully_contiguous' or 'layer_separate'", s);
    return -1;
  }
  return 0;
}

static int policy_arg(PyObject *o, const char *what, kvbm_offload_policy *out) {
  const char *s;
  if (kvbmpy_str(o, what, &s)) return -1;
  if (!kvbm_offload_policy_parse(s, out)) {
    kvbmpy_raise(KVBM_EINVAL, "%s: '%.50s' is not 'never', 'all' or 'frequency'", what, s);
    return -1;
  }
  return 0;
}

static int memory_arg(PyObject *o, const char *what, kvbm_memory_type *out) {
  const char *s;
  if (!o) return 0;
  if (kvbmpy_str(o, what, &s)) return -1;
  if (!strcmp(s, "system")) *out = KVBM_MEMORY_SYSTEM;
  else if (!strcmp(s, "pinned")) *out = KVBM_MEMORY_PINNED;
  else if (!strcmp(s, "device")) *out = KVBM_MEMORY_DEVICE;
  else {
    kvbmpy_raise(KVBM_EINVAL, "%s: '%.40s' is not 'system', 'pinned' or 'device'", what, s);
    return -1;
  }
  return 0;
}

static int u32_kw(PyObject *o, const char *what, uint32_t max, uint32_t *out) {
  if (!o) return 0;
  uint64_t v;
  if (kvbmpy_uint(o, what, max, &v)) return -1;
  *out = (uint32_t)v;
  return 0;
}

static int u64_kw(PyObject *o, const char *what, uint64_t max, uint64_t *out) {
  if (!o) return 0;
  return kvbmpy_uint(o, what, max, out);
}

/* The regions of an engine-owned G1: g1_ptr is one int (a single region)
 * or a sequence of ints, each an address in [1, 2**64). */
typedef struct adopt_arg {
  void **ptrs; /* PyMem_Malloc'd; NULL: no adoption */
  size_t n;
  PyObject *owner; /* borrowed */
} adopt_arg;

static int adopt_parse(PyObject *o, PyObject *owner, adopt_arg *a) {
  memset(a, 0, sizeof *a);
  if (!o || o == Py_None) {
    if (owner && owner != Py_None) {
      PyErr_SetString(PyExc_TypeError, "g1_owner: given without g1_ptr");
      return -1;
    }
    return 0;
  }
  PyObject *seq = NULL;
  Py_ssize_t n = 1;
  if (!PyIndex_Check(o)) {
    if (PyUnicode_Check(o) || PyBytes_Check(o) || PyByteArray_Check(o) ||
        !(seq = PySequence_Fast(o, "g1_ptr: expected an int or a sequence of ints"))) {
      if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "g1_ptr: expected an int or a sequence of ints, got %.100s",
                     Py_TYPE(o)->tp_name);
      }
      Py_XDECREF(seq);
      return -1;
    }
    n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || (uint64_t)n > KVBM_LAYOUT_MAX_LAYERS) {
      Py_DECREF(seq);
      kvbmpy_raise(KVBM_EINVAL, "g1_ptr: %zd addresses; one per G1 region (1..%u) is needed", n,
                   KVBM_LAYOUT_MAX_LAYERS);
      return -1;
    }
  }
  if (!(a->ptrs = PyMem_Calloc((size_t)n, sizeof *a->ptrs))) {
    Py_XDECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    uint64_t v;
    char what[48];
    snprintf(what, sizeof what, seq ? "g1_ptr[%zd]" : "g1_ptr", i);
    if (kvbmpy_uint(seq ? PySequence_Fast_GET_ITEM(seq, i) : o, what, UINTPTR_MAX, &v)) {
      Py_XDECREF(seq);
      PyMem_Free(a->ptrs);
      a->ptrs = NULL;
      return -1;
    }
    a->ptrs[i] = (void *)(uintptr_t)v;
  }
  Py_XDECREF(seq);
  a->n = (size_t)n;
  a->owner = owner && owner != Py_None ? owner : NULL;
  return 0;
}

static PyObject *mgr_create(PyTypeObject *type, kvbm_manager_config *cfg, PyObject *env,
                            int metrics, int port, const char *host, adopt_arg *adopt);

/* Manager(group_layouts=[...]): one item per group, None (the whole
 * block), an int (the group's block bytes) or a (conv_bytes, ssm_bytes)
 * pair (a Mamba state: block bytes their sum). The C library checks them
 * against the block (kvbm_manager_create's messages). */
static int group_layouts_get(PyObject *o, size_t ngroups, kvbm_group_layout *out) {
  PyObject *seq = PySequence_Fast(o, "Manager: group_layouts is a list, one item per group");
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  int rc = 0;
  if ((size_t)n != ngroups) {
    kvbmpy_raise(KVBM_EINVAL, "Manager: group_layouts has %zd items for %zu groups", n, ngroups);
    rc = -1;
  }
  for (Py_ssize_t i = 0; !rc && i < n; i++) {
    PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
    uint64_t a = 0, b = 0;
    out[i] = (kvbm_group_layout){0, 0, 0};
    if (it == Py_None) continue;
    if (PyTuple_Check(it) && PyTuple_GET_SIZE(it) == 2) {
      if (kvbmpy_uint(PyTuple_GET_ITEM(it, 0), "group_layouts conv_bytes", UINT32_MAX, &a) ||
          kvbmpy_uint(PyTuple_GET_ITEM(it, 1), "group_layouts ssm_bytes", UINT32_MAX, &b)) {
        rc = -1;
        break;
      }
      out[i] = (kvbm_group_layout){a + b, a, b};
    } else if (kvbmpy_uint(it, "group_layouts item", UINT32_MAX, &a)) {
      rc = -1;
    } else {
      out[i].block_bytes = a;
    }
  }
  Py_DECREF(seq);
  return rc;
}

static PyObject *mgr_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"block_size", "num_layers", "outer_dim", "inner_dim", "dtype_bytes",
                           "alignment", "layout", "g1_blocks", "g2_blocks", "g3_blocks", "g3_dir",
                           "g3_persist", "g3_direct", "g2_policy", "g3_policy", "freq_threshold",
                           "scheme", "env", "g1_memory", "g2_memory", "g1_device", "g3_key",
                           "metrics", "metrics_port", "metrics_host", "g1_ptr", "g1_owner", "groups",
                           "group_layouts", "prefix_cache_retention_interval", NULL};
  PyObject *bs = NULL, *nl = NULL, *od = NULL, *id = NULL, *db = NULL, *al = NULL, *lay = NULL,
           *g1 = NULL, *g2 = NULL, *g3 = NULL, *g3dir = NULL, *g2p = NULL, *g3p = NULL,
           *freq = NULL, *scheme = NULL, *env = NULL, *g1m = NULL, *g2m = NULL, *g1d = NULL,
           *g3k = NULL, *mon = NULL, *mport = NULL, *mhost = NULL, *g1p = NULL, *g1o = NULL,
           *grp = NULL, *glay = NULL, *reto = NULL;
  int persist = 0, direct = 1, metrics = -1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOOOOOOOOOppOOOOOOOOOOOOOOOOO:Manager", kwlist, &bs,
                                   &nl, &od, &id, &db, &al, &lay, &g1, &g2, &g3, &g3dir, &persist,
                                   &direct, &g2p, &g3p, &freq, &scheme, &env, &g1m, &g2m, &g1d, &g3k,
                                   &mon, &mport, &mhost, &g1p, &g1o, &grp, &glay, &reto))
    return NULL;
  kvbm_hseq_retention retention;
  if (kvbmpy_retention(reto, "Manager", &retention)) return NULL;
  kvbm_group_spec groups[KVBM_GROUPS_MAX];
  kvbm_group_layout layouts[KVBM_GROUPS_MAX];
  size_t ngroups = 0;
  if (grp && grp != Py_None && kvbmpy_groups_get(grp, "Manager", groups, &ngroups)) return NULL;
  if (glay && glay != Py_None && group_layouts_get(glay, ngroups, layouts)) return NULL;
  if (mon && mon != Py_None && (metrics = PyObject_IsTrue(mon)) < 0) return NULL;
  uint64_t dev = 0;
  kvbm_manager_config cfg = kvbm_manager_config_default();
  kvbm_layout_kind kind = KVBM_LAYOUT_FULLY_CONTIGUOUS;
  const char *dir = NULL;
  if (u32_kw(bs, "block_size", UINT32_MAX, &cfg.block_size) ||
      u64_kw(nl, "num_layers", UINT64_MAX, &cfg.layout.num_layers) ||
      u64_kw(od, "outer_dim", UINT64_MAX, &cfg.layout.outer_dim) ||
      u64_kw(id, "inner_dim", UINT64_MAX, &cfg.layout.inner_dim) ||
      u64_kw(db, "dtype_bytes", UINT64_MAX, &cfg.layout.dtype_size) ||
      u64_kw(al, "alignment", UINT64_MAX, &cfg.layout.alignment) ||
      (lay && layout_kind_arg(lay, &kind)) || u32_kw(g1, "g1_blocks", UINT32_MAX, &cfg.g1_blocks) ||
      u32_kw(g2, "g2_blocks", UINT32_MAX, &cfg.g2_blocks) ||
      u64_kw(g3, "g3_blocks", UINT64_MAX, &cfg.g3_blocks) ||
      (g3dir && g3dir != Py_None && kvbmpy_str(g3dir, "g3_dir", &dir)) ||
      (g2p && policy_arg(g2p, "g2_policy", &cfg.g2_policy)) ||
      (g3p && policy_arg(g3p, "g3_policy", &cfg.g3_policy)) ||
      u32_kw(freq, "freq_threshold", UINT32_MAX, &cfg.freq_threshold) ||
      (scheme && kvbmpy_scheme(scheme, &cfg.scheme)) || memory_arg(g1m, "g1_memory", &cfg.g1_memory) ||
      memory_arg(g2m, "g2_memory", &cfg.g2_memory) || (g1d && kvbmpy_uint(g1d, "g1_device", INT32_MAX, &dev)))
    return NULL;
  cfg.g1_device = (int32_t)dev;
  /* the metrics endpoint: metrics=True/False (absent: the environment's
   * word when env is given, else off), its port and address */
  uint64_t port = 0;
  const char *host = NULL;
  if ((mport && mport != Py_None && kvbmpy_uint(mport, "metrics_port", 65535, &port)) ||
      (mhost && mhost != Py_None && kvbmpy_str(mhost, "metrics_host", &host)))
    return NULL;
  if (metrics >= 0) cfg.metrics.enabled = metrics;
  if (mport && mport != Py_None) cfg.metrics.port = (uint16_t)port;
  if (host) cfg.metrics.host = host;
  cfg.layout.page_size = cfg.block_size;
  cfg.g1_kind = cfg.g2_kind = kind;
  cfg.g3_dir = dir;
  cfg.g3_persist = persist;
  cfg.g3_direct = direct;
  cfg.groups = ngroups ? groups : NULL;
  cfg.num_groups = ngroups;
  cfg.group_layouts = glay && glay != Py_None ? layouts : NULL;
  cfg.hybrid_retention = retention;

  /* The G3 secret is used at create only (kvbm derives its key from it and
   * keeps nothing): the buffer is held until then. */
  Py_buffer key = {0};
  if (g3k && g3k != Py_None) {
    if (PyObject_GetBuffer(g3k, &key, PyBUF_SIMPLE) < 0) {
      PyErr_Clear();
      return PyErr_Format(PyExc_TypeError, "g3_key: expected bytes, got %.100s", Py_TYPE(g3k)->tp_name);
    }
    cfg.g3_key = key.buf;
    cfg.g3_key_len = (size_t)key.len;
  }
  adopt_arg adopt;
  PyObject *res = NULL;
  if (!adopt_parse(g1p, g1o, &adopt))
    res = mgr_create(type, &cfg, env, metrics, mport && mport != Py_None ? (int)port : -1, host,
                     &adopt);
  PyMem_Free(adopt.ptrs);
  if (key.obj) PyBuffer_Release(&key);
  return res;
}

/* Creates the manager from a filled config, env applied last; the metrics
 * keywords given explicitly (metrics >= 0, port >= 0, host) win over it. */
static PyObject *mgr_create(PyTypeObject *type, kvbm_manager_config *cfgp, PyObject *env,
                            int metrics, int port, const char *host, adopt_arg *adopt) {
  kvbm_manager_config cfg = *cfgp;
  ManagerObject *self = (ManagerObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  kvbm_error err = {0};
  int rc;
  /* env values are applied last: they are the deployment's word. Their
   * strings live in a list that outlives create (the manager copies the
   * G3 directory). */
  PyObject *keep = NULL;
  if (env && env != Py_None && env != Py_False && env != Py_True) {
    if (!PyDict_Check(env)) {
      Py_DECREF(self);
      PyErr_Format(PyExc_TypeError, "env: expected a bool or a dict of str to str, got %.100s",
                   Py_TYPE(env)->tp_name);
      return NULL;
    }
    keep = PyList_New(0);
    if (!keep) {
      Py_DECREF(self);
      return NULL;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(env, &pos, &k, &v)) {
      const char *ks, *vs;
      PyObject *s = NULL;
      if (kvbmpy_str(k, "env key", &ks) || kvbmpy_str(v, "env value", &vs) ||
          !(s = PyBytes_FromFormat("%s=%s", ks, vs)) || PyList_Append(keep, s) < 0) {
        Py_XDECREF(s);
        Py_DECREF(keep);
        Py_DECREF(self);
        return NULL;
      }
      Py_DECREF(s);
    }
    Py_ssize_t n = PyList_GET_SIZE(keep);
    const char **arr = PyMem_Calloc((size_t)n + 1, sizeof *arr);
    if (!arr) {
      Py_DECREF(keep);
      Py_DECREF(self);
      return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) arr[i] = PyBytes_AS_STRING(PyList_GET_ITEM(keep, i));
    rc = kvbm_manager_config_env(&cfg, arr, &err);
    PyMem_Free(arr); /* the config points into keep's bytes, not into arr */
  } else {
    rc = env == Py_True ? kvbm_manager_config_env(&cfg, NULL, &err) : KVBM_OK;
  }
  if (metrics >= 0) cfg.metrics.enabled = metrics;
  if (port >= 0) cfg.metrics.port = (uint16_t)port;
  if (host) cfg.metrics.host = host;
  /* Engine-owned G1: its storage over the caller's addresses, in G1's
   * layout as the manager will make it (the config is final here). */
  kvbm_storage *g1s = NULL;
  if (!rc && adopt->ptrs) {
    kvbm_layout l;
    kvbm_layout_config lc = cfg.layout;
    lc.num_blocks = cfg.g1_blocks;
    rc = kvbm_layout_init(&l, cfg.g1_kind, &lc, &err);
    if (!rc && adopt->owner && cfg.g1_memory != KVBM_MEMORY_DEVICE &&
        PyObject_CheckBuffer(adopt->owner)) {
      /* A host owner that exports its bytes (numpy, bytearray): every
       * region must lie inside them, or kvbm would write past its end. */
      Py_buffer v;
      if (PyObject_GetBuffer(adopt->owner, &v, PyBUF_SIMPLE) < 0) {
        Py_XDECREF(keep);
        Py_DECREF(self);
        return NULL;
      }
      uintptr_t lo = (uintptr_t)v.buf, hi = lo + (uintptr_t)v.len;
      for (size_t i = 0; !rc && i < adopt->n; i++) {
        uintptr_t p = (uintptr_t)adopt->ptrs[i];
        if (p < lo || p > hi || hi - p < l.region_size)
          rc = kvbm_error_set(&err, KVBM_EINVAL,
                              "g1_ptr: region %zu (%llu bytes at %#llx) is not inside g1_owner's "
                              "%zd bytes at %#llx",
                              i, (unsigned long long)l.region_size, (unsigned long long)p,
                              v.len, (unsigned long long)lo);
      }
      PyBuffer_Release(&v);
    }
    if (!rc) {
      rc = kvbm_storage_adopt(cfg.g1_memory, cfg.g1_device, &l, adopt->ptrs, adopt->n, &g1s, &err);
      if (rc) { /* say which argument the storage's message is about */
        char msg[sizeof err.msg];
        memcpy(msg, err.msg, sizeof msg);
        kvbm_error_set(&err, rc, "g1_ptr: %.200s", msg);
      }
    }
    cfg.g1_storage = g1s;
  }
  kvbm_manager *m = NULL;
  if (!rc) {
    Py_BEGIN_ALLOW_THREADS
    rc = kvbm_manager_create(&cfg, &m, &err);
    Py_END_ALLOW_THREADS
  }
  Py_XDECREF(keep);
  if (rc) {
    kvbm_storage_release(g1s); /* the wrapper only: the memory is the caller's */
    Py_DECREF(self);
    return kvbmpy_raise_kvbm(rc, &err, NULL);
  }
  self->m = m;
  self->g1_storage = g1s;
  self->g1_owner = adopt->owner ? Py_NewRef(adopt->owner) : NULL;
  self->block_size = cfg.block_size;
  self->sparse = cfg.hybrid_retention == KVBM_HSEQ_RETAIN_BOUNDARIES;
  return (PyObject *)self;
}

/* Destroys the live requests and the manager, with the GIL released. */
static void mgr_teardown(ManagerObject *self, kvbm_mreq **reqs, size_t n) {
  kvbm_manager *m = self->m;
  self->m = NULL;
  kvbm_tier_stats st[KVBM_TIER_COUNT];
  bool ok = true;
  Py_BEGIN_ALLOW_THREADS
  for (size_t i = 0; i < n; i++) kvbm_mreq_destroy(reqs[i]);
  kvbm_manager_flush(m); /* the copies still queued are counted */
  for (int t = 0; t < KVBM_TIER_COUNT; t++)
    if (kvbm_manager_stats_get(m, (kvbm_tier)t, &st[t])) ok = false;
  kvbm_manager_destroy(m);
  Py_END_ALLOW_THREADS
  memcpy(self->final_st, st, sizeof st); /* with the GIL: stats() reads them */
  self->final_ok = ok;
  /* The manager is gone: the adopted wrapper goes, then the owner may
   * free the memory. */
  kvbm_storage_release(self->g1_storage);
  self->g1_storage = NULL;
  Py_CLEAR(self->g1_owner);
}

static PyObject *mgr_close(ManagerObject *self, PyObject *unused) {
  (void)unused;
  if (!self->m) Py_RETURN_NONE;
  if (self->exports)
    return kvbmpy_raise(KVBMPY_BUSY,
                        "Manager.close: %zd buffer view(s) of its memory are alive; release them "
                        "(del the arrays, memoryview.release()) first",
                        self->exports);
  if (self->calls) return kvbmpy_busy("Manager");
  if (self->hreqs)
    return kvbmpy_raise(KVBMPY_BUSY, "Manager.close: %zd HybridRequest(s) alive; destroy() them first",
                        self->hreqs);
  size_t n = 0;
  for (RequestObject *r = self->reqs; r; r = r->next) {
    if (r->busy) return kvbmpy_busy("a Request of this Manager");
    n += r->r != NULL;
  }
  kvbm_mreq **reqs = PyMem_Malloc((n ? n : 1) * sizeof *reqs);
  if (!reqs) return PyErr_NoMemory();
  n = 0;
  for (RequestObject *r = self->reqs; r; r = r->next)
    if (r->r) {
      reqs[n++] = r->r;
      r->r = NULL;
    }
  mgr_teardown(self, reqs, n);
  PyMem_Free(reqs);
  Py_RETURN_NONE;
}

static void mgr_dealloc(ManagerObject *self) {
  /* No request and no view can be alive: each holds a reference. */
  if (self->m) mgr_teardown(self, NULL, 0);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *mgr_enter(PyObject *self, PyObject *unused) {
  (void)unused;
  return Py_NewRef(self);
}

static PyObject *mgr_exit(ManagerObject *self, PyObject *args) {
  (void)args;
  return mgr_close(self, NULL);
}

static PyObject *mgr_flush(ManagerObject *self, PyObject *unused) {
  (void)unused;
  if (mgr_open(self)) return NULL;
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  kvbm_manager_flush(self->m);
  Py_END_ALLOW_THREADS
  self->calls--;
  Py_RETURN_NONE;
}

static PyObject *mgr_stats(ManagerObject *self, PyObject *arg) {
  int tier;
  if (tier_arg(arg, &tier)) return NULL;
  kvbm_tier_stats s;
  if (!self->m && self->final_ok) { /* closed: the final counts */
    s = self->final_st[tier];
  } else {
    if (mgr_open(self)) return NULL;
    int rc = kvbm_manager_stats_get(self->m, (kvbm_tier)tier, &s);
    if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Manager.stats");
  }
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  if (kvbmpy_dict_obj(d, "present", PyBool_FromLong(s.present)) ||
      kvbmpy_dict_u64(d, "num_blocks", s.num_blocks) || kvbmpy_dict_u64(d, "free", s.free) ||
      kvbmpy_dict_u64(d, "cached", s.cached) || kvbmpy_dict_u64(d, "active", s.active) ||
      kvbmpy_dict_u64(d, "allocated", s.allocated) ||
      kvbmpy_dict_u64(d, "evictions", s.evictions) ||
      kvbmpy_dict_u64(d, "hit_blocks", s.hit_blocks) ||
      kvbmpy_dict_u64(d, "offloaded_blocks", s.offloaded_blocks) ||
      kvbmpy_dict_u64(d, "offloaded_bytes", s.offloaded_bytes) ||
      kvbmpy_dict_u64(d, "onboarded_blocks", s.onboarded_blocks) ||
      kvbmpy_dict_u64(d, "onboarded_bytes", s.onboarded_bytes) ||
      kvbmpy_dict_u64(d, "filtered", s.filtered) ||
      kvbmpy_dict_u64(d, "skipped_queue", s.skipped_queue) ||
      kvbmpy_dict_u64(d, "skipped_space", s.skipped_space) ||
      kvbmpy_dict_u64(d, "skipped_io", s.skipped_io) ||
      kvbmpy_dict_u64(d, "skipped_unavailable", s.skipped_unavailable) ||
      kvbmpy_dict_u64(d, "onboard_failures", s.onboard_failures) ||
      kvbmpy_dict_u64(d, "checksum_failures", s.checksum_failures) ||
      kvbmpy_dict_u64(d, "read_errors", s.read_errors) ||
      kvbmpy_dict_u64(d, "copy_errors", s.copy_errors) ||
      kvbmpy_dict_u64(d, "restored_blocks", s.restored_blocks) ||
      kvbmpy_dict_u64(d, "restore_skipped", s.restore_skipped) ||
      kvbmpy_dict_u64(d, "missing", s.missing) || kvbmpy_dict_u64(d, "foreign", s.foreign) ||
      kvbmpy_dict_u64(d, "lookups", s.lookups) ||
      kvbmpy_dict_u64(d, "lookup_blocks", s.lookup_blocks) ||
      kvbmpy_dict_u64(d, "lookup_found", s.lookup_found) ||
      kvbmpy_dict_u64(d, "lookup_timeouts", s.lookup_timeouts) ||
      kvbmpy_dict_u64(d, "lookup_errors", s.lookup_errors) ||
      kvbmpy_dict_u64(d, "abandoned", s.abandoned) ||
      kvbmpy_dict_u64(d, "backoffs", s.backoffs) ||
      kvbmpy_dict_u64(d, "backoff_skips", s.backoff_skips) ||
      kvbmpy_dict_obj(d, "busy_seconds", PyFloat_FromDouble(s.busy_seconds))) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

static const char *kind_name(kvbm_layout_kind k) {
  return k == KVBM_LAYOUT_LAYER_SEPARATE ? "layer_separate" : "fully_contiguous";
}

static PyObject *mgr_layout(ManagerObject *self, PyObject *arg) {
  int tier;
  if (tier_arg(arg, &tier) || mgr_open(self)) return NULL;
  const kvbm_layout *lp = kvbm_manager_layout(self->m, (kvbm_tier)tier);
  if (!lp) return kvbmpy_raise(KVBM_ETIER, "Manager.layout: tier G%d is absent", tier + 1);
  kvbm_layout l = *lp; /* snapshot */
  kvbm_memory_type mem = kvbm_manager_memory(self->m, (kvbm_tier)tier);
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  if (kvbmpy_dict_obj(d, "kind", PyUnicode_FromString(kind_name(l.kind))) ||
      kvbmpy_dict_obj(d, "memory", PyUnicode_FromString(kvbm_memory_type_name(mem))) ||
      kvbmpy_dict_u64(d, "num_blocks", l.config.num_blocks) ||
      kvbmpy_dict_u64(d, "num_layers", l.config.num_layers) ||
      kvbmpy_dict_u64(d, "outer_dim", l.config.outer_dim) ||
      kvbmpy_dict_u64(d, "page_size", l.config.page_size) ||
      kvbmpy_dict_u64(d, "inner_dim", l.config.inner_dim) ||
      kvbmpy_dict_u64(d, "dtype_size", l.config.dtype_size) ||
      kvbmpy_dict_u64(d, "alignment", l.config.alignment) ||
      kvbmpy_dict_u64(d, "outer_stride", l.outer_stride) ||
      kvbmpy_dict_u64(d, "layer_stride", l.layer_stride) ||
      kvbmpy_dict_u64(d, "block_stride", l.block_stride) ||
      kvbmpy_dict_u64(d, "region_size", l.region_size) ||
      kvbmpy_dict_u64(d, "num_regions", l.num_regions)) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

/* A writable memoryview of [ptr, ptr + len) owned by a _Memory. */
static PyObject *memory_view(ManagerObject *self, void *ptr, size_t len) {
  MemoryObject *mo = PyObject_New(MemoryObject, &MemoryType);
  if (!mo) return NULL;
  mo->mgr = (ManagerObject *)Py_NewRef(self);
  mo->ptr = ptr;
  mo->len = (Py_ssize_t)len;
  PyObject *mv = PyMemoryView_FromObject((PyObject *)mo);
  Py_DECREF(mo);
  return mv;
}

static int host_tier(ManagerObject *self, int tier, const char *what) {
  kvbm_memory_type mem = kvbm_manager_memory(self->m, (kvbm_tier)tier);
  if (tier == KVBM_TIER_G3 || mem == 0) {
    kvbmpy_raise(KVBM_ETIER, "%s: tier G%d has no memory to view (G3 is a file; absent tiers none)",
                 what, tier + 1);
    return -1;
  }
  if (mem != KVBM_MEMORY_SYSTEM && mem != KVBM_MEMORY_PINNED) {
    kvbmpy_raise(KVBM_EUNSUPPORTED,
                 "%s: tier G%d lives in %s memory, which the host cannot view; use "
                 "read_layer/write_layer",
                 what, tier + 1, kvbm_memory_type_name(mem));
    return -1;
  }
  return 0;
}

static PyObject *mgr_block_layer(ManagerObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"tier", "block", "layer", NULL};
  PyObject *to, *bo, *lo;
  int tier;
  uint64_t block, layer;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:block_layer", kwlist, &to, &bo, &lo)) return NULL;
  if (tier_arg(to, &tier) || kvbmpy_uint(bo, "block", UINT32_MAX, &block) ||
      kvbmpy_uint(lo, "layer", UINT32_MAX, &layer) || mgr_open(self) ||
      host_tier(self, tier, "Manager.block_layer"))
    return NULL;
  void *ptr;
  size_t size;
  int rc = kvbm_manager_block_layer(self->m, (kvbm_tier)tier, (uint32_t)block, (uint32_t)layer,
                                    &ptr, &size);
  if (rc == KVBM_ERANGE)
    return kvbmpy_raise(rc, "Manager.block_layer: block %llu layer %llu is outside tier G%d",
                        (unsigned long long)block, (unsigned long long)layer, tier + 1);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Manager.block_layer");
  return memory_view(self, ptr, size);
}

static PyObject *mgr_region(ManagerObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"tier", "index", NULL};
  PyObject *to, *io = NULL;
  int tier;
  uint64_t index = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:region", kwlist, &to, &io)) return NULL;
  if (tier_arg(to, &tier) || (io && kvbmpy_uint(io, "index", UINT32_MAX, &index)) ||
      mgr_open(self) || host_tier(self, tier, "Manager.region"))
    return NULL;
  const kvbm_layout *l = kvbm_manager_layout(self->m, (kvbm_tier)tier);
  if (index >= l->num_regions)
    return kvbmpy_raise(KVBM_ERANGE, "Manager.region: index %llu, but tier G%d has %llu region(s)",
                        (unsigned long long)index, tier + 1, (unsigned long long)l->num_regions);
  /* Block 0 starts its region in both kinds, and a LayerSeparate
   * layout's region r is layer r: that block's address is the base. */
  uint32_t layer = l->kind == KVBM_LAYOUT_LAYER_SEPARATE ? (uint32_t)index : 0;
  void *ptr;
  int rc = kvbm_manager_block_layer(self->m, (kvbm_tier)tier, 0, layer, &ptr, NULL);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Manager.region");
  return memory_view(self, ptr, l->region_size);
}

static PyObject *mgr_read_layer(ManagerObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"tier", "block", "layer", NULL};
  PyObject *to, *bo, *lo;
  int tier;
  uint64_t block, layer;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:read_layer", kwlist, &to, &bo, &lo)) return NULL;
  if (tier_arg(to, &tier) || kvbmpy_uint(bo, "block", UINT32_MAX, &block) ||
      kvbmpy_uint(lo, "layer", UINT32_MAX, &layer) || mgr_open(self))
    return NULL;
  const kvbm_layout *l = kvbm_manager_layout(self->m, (kvbm_tier)tier);
  if (!l || tier == KVBM_TIER_G3)
    return kvbmpy_raise(KVBM_ETIER, "Manager.read_layer: tier G%d has no block memory", tier + 1);
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)l->layer_stride);
  if (!out) return NULL;
  if (mgr_open(self)) { /* the allocation may have run a finalizer */
    Py_DECREF(out);
    return NULL;
  }
  kvbm_error err = {0};
  int rc;
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_manager_block_read(self->m, (kvbm_tier)tier, (uint32_t)block, (uint32_t)layer,
                               PyBytes_AS_STRING(out), (size_t)PyBytes_GET_SIZE(out), &err);
  Py_END_ALLOW_THREADS
  self->calls--;
  if (rc) {
    Py_DECREF(out);
    return kvbmpy_raise_kvbm(rc, &err, "Manager.read_layer");
  }
  return out;
}

static PyObject *mgr_write_layer(ManagerObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"tier", "block", "layer", "data", NULL};
  PyObject *to, *bo, *lo;
  Py_buffer data;
  int tier;
  uint64_t block, layer;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOy*:write_layer", kwlist, &to, &bo, &lo, &data))
    return NULL;
  PyObject *res = NULL;
  if (tier_arg(to, &tier) || kvbmpy_uint(bo, "block", UINT32_MAX, &block) ||
      kvbmpy_uint(lo, "layer", UINT32_MAX, &layer) || mgr_open(self))
    goto out;
  kvbm_error err = {0};
  int rc;
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_manager_block_write(self->m, (kvbm_tier)tier, (uint32_t)block, (uint32_t)layer,
                                data.buf, (size_t)data.len, &err);
  Py_END_ALLOW_THREADS
  self->calls--;
  if (rc) kvbmpy_raise_kvbm(rc, &err, "Manager.write_layer");
  else res = Py_NewRef(Py_None);
out:
  PyBuffer_Release(&data);
  return res;
}

static PyObject *mgr_prefill(ManagerObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"tokens", "salt_hash", "priority", NULL};
  PyObject *tok, *so = NULL, *po = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OO:prefill", kwlist, &tok, &so, &po)) return NULL;
  uint64_t salt = 0, prio = 0;
  if ((so && kvbmpy_hash(so, "salt_hash", &salt)) || (po && kvbmpy_uint(po, "priority", 255, &prio)))
    return NULL;
  kvbmpy_tokens t;
  if (kvbmpy_tokens_get(tok, "tokens", &t)) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  RequestObject *req = PyObject_New(RequestObject, &RequestType);
  if (!req) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  req->mgr = NULL;
  req->r = NULL;
  req->busy = false;
  req->prev = req->next = NULL;
  if (mgr_open(self)) {
    kvbmpy_tokens_release(&t);
    Py_DECREF(req);
    return NULL;
  }
  kvbm_error err = {0};
  kvbm_mreq *r = NULL;
  size_t matched = 0;
  int rc;
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_manager_prefill(self->m, salt, (uint8_t)prio, t.data, t.n, &r, &matched, &err);
  Py_END_ALLOW_THREADS
  self->calls--;
  size_t n = t.n;
  kvbmpy_tokens_release(&t);
  if (rc) {
    Py_DECREF(req);
    if (rc == KVBM_ENOSPC)
      return kvbmpy_raise(rc, "Manager.prefill: G1 cannot hold a prompt of %zu tokens (nothing changed)", n);
    return kvbmpy_raise_kvbm(rc, &err, NULL);
  }
  req->mgr = (ManagerObject *)Py_NewRef(self);
  req->r = r;
  req->matched = matched;
  req->ntok = n;
  req->next = self->reqs;
  if (self->reqs) self->reqs->prev = req;
  self->reqs = req;
  return (PyObject *)req;
}

static PyObject *mgr_get_block_bytes(ManagerObject *self, void *c) {
  (void)c;
  if (mgr_open(self)) return NULL;
  return PyLong_FromUnsignedLongLong(kvbm_manager_block_bytes(self->m));
}

static PyObject *mgr_get_layer_bytes(ManagerObject *self, void *c) {
  (void)c;
  if (mgr_open(self)) return NULL;
  return PyLong_FromUnsignedLongLong(kvbm_manager_layout(self->m, KVBM_TIER_G1)->layer_stride);
}

static PyObject *mgr_get_num_layers(ManagerObject *self, void *c) {
  (void)c;
  if (mgr_open(self)) return NULL;
  return PyLong_FromUnsignedLongLong(kvbm_manager_layout(self->m, KVBM_TIER_G1)->config.num_layers);
}

static PyObject *mgr_get_block_size(ManagerObject *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLong(self->block_size);
}

static PyObject *mgr_get_g3_mode(ManagerObject *self, void *c) {
  (void)c;
  if (mgr_open(self)) return NULL;
  return PyUnicode_FromString(kvbm_manager_g3_mode(self->m));
}

static PyObject *mgr_get_g3_error(ManagerObject *self, void *c) {
  (void)c;
  if (mgr_open(self)) return NULL;
  return PyUnicode_DecodeUTF8(kvbm_manager_g3_error(self->m),
                              (Py_ssize_t)strlen(kvbm_manager_g3_error(self->m)), "replace");
}

static PyObject *mgr_get_closed(ManagerObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(self->m == NULL);
}

static PyObject *mgr_memory(ManagerObject *self, PyObject *arg) {
  int tier;
  if (tier_arg(arg, &tier) || mgr_open(self)) return NULL;
  kvbm_memory_type mem = kvbm_manager_memory(self->m, (kvbm_tier)tier);
  if (!mem) Py_RETURN_NONE;
  return PyUnicode_FromString(kvbm_memory_type_name(mem));
}

static PyObject *mgr_get_metrics_port(ManagerObject *self, void *c) {
  (void)c;
  if (mgr_open(self)) return NULL;
  uint16_t port = kvbm_manager_metrics_port(self->m);
  if (!port) Py_RETURN_NONE;
  return PyLong_FromLong(port);
}

/* The page the endpoint serves (the manager's registry when it runs, else
 * a registry of this call's with the manager's collector alone). */
static PyObject *mgr_metrics_text(ManagerObject *self, PyObject *unused) {
  (void)unused;
  if (mgr_open(self)) return NULL;
  kvbm_error err = {0};
  kvbm_metrics *own = NULL, *reg = kvbm_manager_metrics(self->m);
  int rc = KVBM_OK;
  if (!reg) {
    rc = kvbm_metrics_create(&own, &err);
    if (!rc) rc = kvbm_metrics_register(own, kvbm_manager_metrics_collect, self->m, NULL, 0, NULL, &err);
    reg = own;
  }
  char *text = NULL;
  size_t len = 0;
  self->calls++;
  if (!rc) {
    Py_BEGIN_ALLOW_THREADS
    rc = kvbm_metrics_render(reg, &text, &len, &err);
    Py_END_ALLOW_THREADS
  }
  self->calls--;
  kvbm_metrics_destroy(own);
  if (rc) return kvbmpy_raise_kvbm(rc, &err, "Manager.metrics_text");
  PyObject *s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "replace");
  kvbm_metrics_text_free(text);
  return s;
}

static PyMethodDef mgr_methods[] = {
  {"metrics_text", (PyCFunction)mgr_metrics_text, METH_NOARGS,
   "metrics_text() -> str\n\nThe manager's metrics in Prometheus' text format (what GET\n"
   "/metrics serves when the endpoint runs). Releases the GIL."},
  {"hprefill", (PyCFunction)(void (*)(void))mgr_hprefill, METH_VARARGS | METH_KEYWORDS,
   "hprefill(tokens, *, salt_hash=0, priority=0) -> HybridRequest\n"
   "A request of a manager with groups (Manager(groups=...)): the prefix hit every\n"
   "group can serve over G1..G4, only each group's needed blocks onboarded (the\n"
   "window's, the Mamba state's, every block for full attention). NoSpaceError\n"
   "(nothing changed) when G1 cannot hold the prompt in every group."},
  {"group_bytes", (PyCFunction)mgr_group_bytes, METH_O,
   "group_bytes(g) -> int: bytes of one block of group g's KV (its layout)."},
  {"prefill", (PyCFunction)(void (*)(void))mgr_prefill, METH_VARARGS | METH_KEYWORDS,
   "prefill(tokens, *, salt_hash=0, priority=0) -> Request\n\n"
   "Hashes the prompt's full blocks, matches them across G1, G2, G3 (at most\n"
   "floor((len - 1) / block_size) blocks), allocates G1 blocks for the rest and\n"
   "queues onboarding copies for blocks found below G1. Raises NoSpaceError,\n"
   "with nothing changed, when G1 cannot hold the prompt. Releases the GIL."},
  {"stats", (PyCFunction)mgr_stats, METH_O,
   "stats(tier) -> dict\n\nThe tier's counters (kvbm_tier_stats): present, num_blocks, free,\n"
   "cached, active, allocated, evictions, hit_blocks, offloaded_blocks/bytes,\n"
   "onboarded_blocks/bytes, filtered, skipped_*, onboard_failures, checksum_failures,\n"
   "read_errors, copy_errors, restored_blocks, restore_skipped, missing, foreign,\n"
   "lookups, lookup_blocks, lookup_found, lookup_timeouts, lookup_errors, abandoned,\n"
   "backoffs, backoff_skips, busy_seconds. After close(), the final counts."},
  {"layout", (PyCFunction)mgr_layout, METH_O,
   "layout(tier) -> dict\n\nThe tier's layout: kind, memory, the layout config (num_blocks,\n"
   "num_layers, outer_dim, page_size, inner_dim, dtype_size, alignment) and the strides\n"
   "in bytes (outer_stride, layer_stride, block_stride, region_size, num_regions).\n"
   "Block b, layer l of a fully_contiguous tier starts at b * block_stride +\n"
   "l * layer_stride of region 0; of a layer_separate tier at b * block_stride of\n"
   "region l."},
  {"memory", (PyCFunction)mgr_memory, METH_O,
   "memory(tier) -> str | None\n\nWhere the tier's blocks live: 'system', 'pinned', 'device',\n"
   "'disk'; None for an absent tier."},
  {"block_layer", (PyCFunction)(void (*)(void))mgr_block_layer, METH_VARARGS | METH_KEYWORDS,
   "block_layer(tier, block, layer) -> memoryview\n\n"
   "A writable view (format 'B', no copy) of one layer of a G1 or G2 block. The\n"
   "view keeps the manager alive; close() raises BusyError while views exist.\n"
   "RangeError for a block or layer out of range, TierError for G3 or an absent\n"
   "tier, UnsupportedError for device memory."},
  {"region", (PyCFunction)(void (*)(void))mgr_region, METH_VARARGS | METH_KEYWORDS,
   "region(tier, index=0) -> memoryview\n\n"
   "A writable view of a whole region of a G1 or G2 tier (region_size bytes, no\n"
   "copy): for a fully_contiguous tier every block, for a layer_separate tier\n"
   "layer `index` of every block. numpy.frombuffer / torch.frombuffer of it view\n"
   "the paged cache in place; index it with layout(tier)."},
  {"read_layer", (PyCFunction)(void (*)(void))mgr_read_layer, METH_VARARGS | METH_KEYWORDS,
   "read_layer(tier, block, layer) -> bytes\n\nA copy of one layer of a G1 or G2 block (any memory, device included)."},
  {"write_layer", (PyCFunction)(void (*)(void))mgr_write_layer, METH_VARARGS | METH_KEYWORDS,
   "write_layer(tier, block, layer, data)\n\nCopies a bytes-like object (at most layer_bytes)\n"
   "to the start of one layer of a G1 or G2 block."},
  {"flush", (PyCFunction)mgr_flush, METH_NOARGS,
   "flush()\n\nWaits until every queued copy has finished. Releases the GIL."},
  {"close", (PyCFunction)mgr_close, METH_NOARGS,
   "close()\n\nDestroys the live requests, stops the workers and frees the tiers. Idempotent.\n"
   "BusyError while a buffer view exists or a call runs on another thread."},
  {"__enter__", mgr_enter, METH_NOARGS, NULL},
  {"__exit__", (PyCFunction)mgr_exit, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef mgr_getset[] = {
  {"block_size", (getter)mgr_get_block_size, NULL, "Tokens per block.", NULL},
  {"num_groups", (getter)mgr_get_groups, NULL, "KV cache groups (1 without groups=).", NULL},
  {"prefix_cache_retention_interval", (getter)mgr_get_retention, NULL,
   "The hybrid requests' retention given at create: None (every full block cached) or 0\n"
   "(vLLM's sparse retention).", NULL},
  {"block_bytes", (getter)mgr_get_block_bytes, NULL, "Bytes of one block's KV (all layers).", NULL},
  {"layer_bytes", (getter)mgr_get_layer_bytes, NULL, "Bytes of one layer of one block.", NULL},
  {"num_layers", (getter)mgr_get_num_layers, NULL, "Layers per block.", NULL},
  {"g3_mode", (getter)mgr_get_g3_mode, NULL,
   "The G3 I/O mode in use ('io_uring+O_DIRECT', ...); '' without G3.", NULL},
  {"g3_error", (getter)mgr_get_g3_error, NULL,
   "Why G3 is unavailable ('' when it is available or not configured).", NULL},
  {"closed", (getter)mgr_get_closed, NULL, "Whether close() ran.", NULL},
  {"metrics_port", (getter)mgr_get_metrics_port, NULL,
   "The port of the metrics endpoint (GET /metrics), None when it does not run.", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ManagerType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "kvbm.Manager",
  .tp_basicsize = sizeof(ManagerObject),
  .tp_dealloc = (destructor)mgr_dealloc,
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "Manager(*, block_size=16, num_layers=2, outer_dim=1, inner_dim=64, dtype_bytes=2,\n"
            "        alignment=4096, layout='fully_contiguous', g1_blocks=1024, g2_blocks=0,\n"
            "        g3_blocks=0, g3_dir=None, g3_persist=False, g3_direct=True,\n"
            "        g2_policy='all', g3_policy='frequency', freq_threshold=2,\n"
            "        scheme='native', env=False, g1_memory='system', g2_memory='system',\n"
            "        g1_device=0, g3_key=None, metrics=None, metrics_port=None,\n"
            "        metrics_host=None, g1_ptr=None, g1_owner=None, groups=None,\n"
            "        group_layouts=None, prefix_cache_retention_interval=None)\n\n"
            "The tiered KV block manager: G1 (the engine's blocks, host memory here), G2\n"
            "(host), G3 (a file of checksummed slots). A block's KV is num_layers x\n"
            "outer_dim x block_size x inner_dim elements of dtype_bytes. env=True applies\n"
            "Dynamo's DYN_KVBM_* variables from the environment, a dict applies those\n"
            "given. g3_key (16..4096 bytes of secret) makes G3 slots carry keyed BLAKE3\n"
            "sums, which also catch slots forged without the secret.\n"
            "metrics=True serves the manager's counters in Prometheus' format on\n"
            "metrics_host:metrics_port (0.0.0.0:6880 by default; port 0 picks one, see\n"
            "metrics_port); with env, DYN_KVBM_METRICS=true does the same.\n"
            "g1_memory 'pinned' or 'device' (G2: 'pinned') need a CUDA build\n"
            "(else UnsupportedError) and a GPU (else DeviceError); device memory has no\n"
            "host views (read_layer/write_layer copy).\n"
            "g1_ptr adopts memory the caller owns as G1 (an int, or one int per region of\n"
            "G1's layout: e.g. a torch tensor's data_ptr()), of type g1_memory on g1_device;\n"
            "kvbm never frees it; g1_owner (e.g. the tensor) is kept referenced until\n"
            "close(). Thread-safe; long calls release the\n"
            "GIL. Use as a context manager\n"
            "or call close().",
  .tp_methods = mgr_methods,
  .tp_getset = mgr_getset,
  .tp_new = mgr_new,
};

/* ------------------------------------------------------------ Request */

static int req_ready(RequestObject *self) {
  if (self->busy) {
    kvbmpy_busy("Request");
    return -1;
  }
  if (!self->r) {
    if (self->mgr && !self->mgr->m) kvbmpy_raise(KVBM_ECLOSED, "Request: its Manager is closed");
    else kvbmpy_raise(KVBM_ECLOSED, "Request is destroyed");
    return -1;
  }
  return 0;
}

static size_t req_num_blocks(RequestObject *self) {
  size_t B = self->mgr->block_size;
  return self->ntok / B + (self->ntok % B != 0);
}

static PyObject *req_poll(RequestObject *self, PyObject *unused) {
  (void)unused;
  if (req_ready(self)) return NULL;
  kvbm_mreq_info info;
  kvbm_mreq_poll(self->r, &info);
  return info_new(&info);
}

typedef struct wait_arg {
  kvbm_mreq *r;
  kvbm_mreq_info info;
} wait_arg;

static int wait_step(void *user, int slice_ms) {
  wait_arg *a = user;
  return kvbm_mreq_wait(a->r, slice_ms, &a->info);
}

static PyObject *req_wait(RequestObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"timeout", NULL};
  PyObject *to = NULL;
  double timeout;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:wait", kwlist, &to)) return NULL;
  if (kvbmpy_timeout(to, &timeout) || req_ready(self)) return NULL;
  wait_arg a = {.r = self->r};
  self->busy = true;
  int rc = kvbmpy_wait_sliced(timeout, wait_step, &a);
  self->busy = false;
  if (rc == KVBMPY_INTERRUPTED) return NULL;
  if (rc == KVBM_ETIMEDOUT)
    return kvbmpy_raise(rc, "Request.wait: onboarding not finished after %g s", timeout);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Request.wait");
  return info_new(&a.info);
}

static int k_arg(RequestObject *self, PyObject *o, size_t *k) {
  uint64_t v;
  if (kvbmpy_uint(o, "k", UINT64_MAX, &v) || req_ready(self)) return -1;
  size_t nb = req_num_blocks(self);
  if (v >= nb) {
    kvbmpy_raise(KVBM_ERANGE, "block %llu: the request has %zu block(s)", (unsigned long long)v, nb);
    return -1;
  }
  *k = (size_t)v;
  return 0;
}

static PyObject *req_must_compute(RequestObject *self, PyObject *arg) {
  size_t k;
  if (k_arg(self, arg, &k)) return NULL;
  return PyBool_FromLong(kvbm_mreq_must_compute(self->r, k));
}

static PyObject *req_block_source(RequestObject *self, PyObject *arg) {
  size_t k;
  if (k_arg(self, arg, &k)) return NULL;
  return PyLong_FromLong(kvbm_mreq_block_source(self->r, k));
}

static PyObject *req_block_hash(RequestObject *self, PyObject *arg) {
  uint64_t v;
  if (kvbmpy_uint(arg, "k", UINT64_MAX, &v) || req_ready(self)) return NULL;
  size_t full = self->ntok / self->mgr->block_size;
  if (v >= full)
    return kvbmpy_raise(KVBM_ERANGE, "block %llu: the request has %zu full block(s)",
                        (unsigned long long)v, full);
  uint64_t h;
  int rc = kvbm_mreq_block_hash(self->r, (size_t)v, &h);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Request.block_hash");
  return PyLong_FromUnsignedLongLong(h);
}

static PyObject *req_append(RequestObject *self, PyObject *arg) {
  kvbmpy_tokens t;
  if (kvbmpy_tokens_get(arg, "tokens", &t) || req_ready(self)) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  int rc;
  self->busy = true;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_mreq_append(self->r, t.data, t.n);
  Py_END_ALLOW_THREADS
  self->busy = false;
  size_t n = t.n;
  kvbmpy_tokens_release(&t);
  if (rc == KVBM_ENOSPC)
    return kvbmpy_raise(rc, "Request.append: G1 has no block for %zu more token(s) (nothing changed)", n);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Request.append");
  self->ntok += n;
  Py_RETURN_NONE;
}

static PyObject *req_commit(RequestObject *self, PyObject *unused) {
  (void)unused;
  if (req_ready(self)) return NULL;
  int rc;
  self->busy = true;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_mreq_commit(self->r);
  Py_END_ALLOW_THREADS
  self->busy = false;
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Request.commit");
  Py_RETURN_NONE;
}

static PyObject *req_destroy(RequestObject *self, PyObject *unused) {
  (void)unused;
  if (self->busy) return kvbmpy_busy("Request");
  if (!self->r) Py_RETURN_NONE;
  kvbm_mreq *r = self->r;
  self->busy = true;
  Py_BEGIN_ALLOW_THREADS
  kvbm_mreq_destroy(r);
  Py_END_ALLOW_THREADS
  self->busy = false;
  self->r = NULL;
  req_unlink(self);
  Py_RETURN_NONE;
}

static PyObject *req_get_block_table(RequestObject *self, void *c) {
  (void)c;
  if (req_ready(self)) return NULL;
  const uint32_t *ids;
  size_t n;
  kvbm_mreq_blocks(self->r, &ids, &n);
  uint32_t *copy = PyMem_Malloc((n ? n : 1) * sizeof *copy);
  if (!copy) return PyErr_NoMemory();
  memcpy(copy, ids, n * sizeof *copy);
  PyObject *list = kvbmpy_list_u32(copy, n);
  PyMem_Free(copy);
  return list;
}

static PyObject *req_get_matched(RequestObject *self, void *c) {
  (void)c;
  return PyLong_FromSize_t(self->matched);
}

static PyObject *req_get_num_tokens(RequestObject *self, void *c) {
  (void)c;
  return PyLong_FromSize_t(self->ntok);
}

static PyObject *req_get_closed(RequestObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(self->r == NULL);
}

static PyObject *req_get_busy(RequestObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(self->busy);
}

static PyObject *req_exit(RequestObject *self, PyObject *args) {
  (void)args;
  return req_destroy(self, NULL);
}

static void req_dealloc(RequestObject *self) {
  if (self->r) {
    /* Busy while it runs: a close() on another thread must not free the
     * manager under this destroy. */
    self->busy = true;
    Py_BEGIN_ALLOW_THREADS
    kvbm_mreq_destroy(self->r);
    Py_END_ALLOW_THREADS
    self->r = NULL;
    self->busy = false;
  }
  req_unlink(self);
  Py_XDECREF(self->mgr);
  PyObject_Free(self);
}

static PyMethodDef req_methods[] = {
  {"poll", (PyCFunction)req_poll, METH_NOARGS,
   "poll() -> RequestInfo\n\nNon-blocking: whether onboarding has finished (ready), the match now\n"
   "(matched_tokens, shortened by failed onboards), hit_blocks per tier G1..G4 and num_tokens."},
  {"wait", (PyCFunction)(void (*)(void))req_wait, METH_VARARGS | METH_KEYWORDS,
   "wait(timeout=None) -> RequestInfo\n\nBlocks until onboarding has finished (timeout in seconds;\n"
   "None: no limit), then returns poll()'s answer. TimedOutError when time runs out.\n"
   "Releases the GIL; Ctrl-C interrupts it."},
  {"must_compute", (PyCFunction)req_must_compute, METH_O,
   "must_compute(k) -> bool\n\nWhether the engine must write the KV of block k (after the settled\n"
   "match and registered by this request, the partial tail, or a failed onboard)."},
  {"block_source", (PyCFunction)req_block_source, METH_O,
   "block_source(k) -> int\n\nThe tier (0..2: G1..G3, see kvbm.Tier) the prefill walk found block k in, or -1."},
  {"block_hash", (PyCFunction)req_block_hash, METH_O,
   "block_hash(k) -> int\n\nThe sequence hash of full block k."},
  {"append", (PyCFunction)req_append, METH_O,
   "append(tokens)\n\nAppends decode tokens. NoSpaceError, with nothing changed, when G1 has no block."},
  {"commit", (PyCFunction)req_commit, METH_NOARGS,
   "commit()\n\nThe engine has written the KV of every full block it must compute: they become\n"
   "valid, and full blocks are offloaded per policy. Waits for onboarding first."},
  {"destroy", (PyCFunction)req_destroy, METH_NOARGS,
   "destroy()\n\nReleases the request's G1 blocks, tail first. Idempotent."},
  {"__enter__", mgr_enter, METH_NOARGS, NULL},
  {"__exit__", (PyCFunction)req_exit, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef req_getset[] = {
  {"block_table", (getter)req_get_block_table, NULL, "The G1 block ids, in token order.", NULL},
  {"matched_tokens", (getter)req_get_matched, NULL,
   "The optimistic match prefill found (before onboarding settles; see poll()).", NULL},
  {"num_tokens", (getter)req_get_num_tokens, NULL, "Tokens in the request.", NULL},
  {"closed", (getter)req_get_closed, NULL, "Whether destroy() ran (or the manager closed).", NULL},
  {"busy", (getter)req_get_busy, NULL, "Whether a call on another thread is running on it.", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RequestType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "kvbm.Request",
  .tp_basicsize = sizeof(RequestObject),
  .tp_dealloc = (destructor)req_dealloc,
  .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
  .tp_doc = "A request's blocks in a Manager (from Manager.prefill). Use it from one thread\n"
            "at a time (another thread's call raises BusyError); destroy() or `with`.",
  .tp_methods = req_methods,
  .tp_getset = req_getset,
};

/* ------------------------------------------------------------ _Memory */

static int mem_getbuffer(MemoryObject *self, Py_buffer *view, int flags) {
  if (!self->mgr->m) {
    PyErr_SetString(PyExc_BufferError, "kvbm: the Manager is closed");
    return -1;
  }
  if (PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->len, 0, flags) < 0) return -1;
  self->mgr->exports++;
  return 0;
}

static void mem_releasebuffer(MemoryObject *self, Py_buffer *view) {
  (void)view;
  self->mgr->exports--;
}

static void mem_dealloc(MemoryObject *self) {
  Py_DECREF(self->mgr);
  PyObject_Free(self);
}

static PyBufferProcs mem_as_buffer = {
  (getbufferproc)mem_getbuffer,
  (releasebufferproc)mem_releasebuffer,
};

static PyTypeObject MemoryType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "kvbm._Memory",
  .tp_basicsize = sizeof(MemoryObject),
  .tp_dealloc = (destructor)mem_dealloc,
  .tp_as_buffer = &mem_as_buffer,
  .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
  .tp_doc = "The exporter behind Manager memory views (keeps the Manager alive).",
};

/* --------------------------------------------------------------- init */

static PyStructSequence_Field info_fields[] = {
  {"ready", "every onboarding of the match has finished"},
  {"matched_tokens", "the match now (shortened by failed onboards)"},
  {"hit_blocks", "blocks of the match from each tier, (G1, G2, G3, G4)"},
  {"num_tokens", "tokens in the request"},
  {NULL, NULL},
};

static PyStructSequence_Desc info_desc = {
  "kvbm.RequestInfo", "What Request.poll() and wait() report.", info_fields, 4,
};

/* ------------------------------------------------------ HybridRequest */

typedef struct HRequestObject {
  PyObject_HEAD
  ManagerObject *mgr; /* strong; counts us in hreqs while r is alive */
  kvbm_hreq *r;       /* NULL once destroyed */
  size_t hit;         /* the hit found by hprefill, in tokens */
} HRequestObject;

/* What the manager was created with, in vLLM's words, so that a caller
 * holding vLLM's config (KvbmCacheManager) can check that both agree. */
static PyObject *mgr_get_retention(ManagerObject *self, void *c) {
  (void)c;
  if (self->sparse) return PyLong_FromLong(0);
  Py_RETURN_NONE;
}

static PyObject *mgr_get_groups(ManagerObject *self, void *c) {
  (void)c;
  return PyLong_FromSize_t(self->m ? kvbm_manager_num_groups(self->m) : 0);
}

static PyObject *mgr_group_bytes(ManagerObject *self, PyObject *arg) {
  uint64_t g;
  if (mgr_open(self) || kvbmpy_uint(arg, "group", UINT32_MAX, &g)) return NULL;
  if (g >= kvbm_manager_num_groups(self->m))
    return kvbmpy_raise(KVBM_EINVAL, "Manager.group_bytes: group %llu of %zu", (unsigned long long)g,
                        kvbm_manager_num_groups(self->m));
  return PyLong_FromUnsignedLongLong(kvbm_manager_group_bytes(self->m, (uint32_t)g));
}

static PyObject *mgr_hprefill(ManagerObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"tokens", "salt_hash", "priority", NULL};
  PyObject *tok, *so = NULL, *po = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OO:hprefill", kwlist, &tok, &so, &po)) return NULL;
  uint64_t salt = 0, prio = 0;
  if ((so && kvbmpy_hash(so, "salt_hash", &salt)) || (po && kvbmpy_uint(po, "priority", 255, &prio)) ||
      mgr_open(self))
    return NULL;
  kvbmpy_tokens t;
  if (kvbmpy_tokens_get(tok, "tokens", &t)) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  HRequestObject *req = PyObject_New(HRequestObject, &HRequestType);
  if (!req) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  req->mgr = NULL;
  req->r = NULL;
  kvbm_error err = {0};
  int rc;
  self->calls++;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_manager_hprefill(self->m, salt, (uint8_t)prio, t.data, t.n, &req->r, &req->hit, &err);
  Py_END_ALLOW_THREADS
  self->calls--;
  kvbmpy_tokens_release(&t);
  if (rc) {
    Py_DECREF(req);
    return kvbmpy_raise_kvbm(rc, &err, NULL);
  }
  req->mgr = (ManagerObject *)Py_NewRef(self);
  self->hreqs++;
  return (PyObject *)req;
}

static int hreq_alive(HRequestObject *self) {
  if (self->r) return 0;
  kvbmpy_raise(KVBM_ECLOSED, "HybridRequest is destroyed");
  return -1;
}

static void hreq_finish(HRequestObject *self) {
  if (!self->r) return;
  kvbm_hreq *r = self->r;
  self->r = NULL;
  Py_BEGIN_ALLOW_THREADS
  kvbm_hreq_destroy(r);
  Py_END_ALLOW_THREADS
  self->mgr->hreqs--;
}

static PyObject *hreq_wait(HRequestObject *self, PyObject *unused) {
  (void)unused;
  if (hreq_alive(self)) return NULL;
  kvbm_hreq_info in;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_hreq_wait(self->r, -1, &in);
  Py_END_ALLOW_THREADS
  if (rc == KVBM_ENOSPC) /* the hit settled short: G1 lacks room for the places to write (kvbm_hreq_wait) */
    return kvbmpy_raise(rc, "HybridRequest.wait: the hit settled at %zu tokens and G1 has no room yet for the "
                            "blocks each group needs from there (wait again later, or destroy)", in.hit_tokens);
  size_t ng = kvbm_manager_num_groups(self->mgr->m);
  PyObject *g1 = PyList_New((Py_ssize_t)ng), *onb = PyList_New((Py_ssize_t)ng);
  PyObject *from = PyDict_New();
  for (size_t g = 0; g1 && onb && g < ng; g++) {
    PyList_SET_ITEM(g1, (Py_ssize_t)g, PyLong_FromSize_t(in.hit_g1[g]));
    PyList_SET_ITEM(onb, (Py_ssize_t)g, PyLong_FromSize_t(in.onboarded[g]));
  }
  for (int ti = KVBM_TIER_G2; from && ti < KVBM_TIER_COUNT; ti++) {
    PyObject *v = PyLong_FromSize_t(in.onboarded_from[ti]);
    if (!v || PyDict_SetItemString(from, kvbm_tier_name(ti), v) < 0) Py_CLEAR(from);
    Py_XDECREF(v);
  }
  PyObject *res = g1 && onb && from
                      ? Py_BuildValue("{s:n,s:n,s:O,s:O,s:O}", "hit_tokens", (Py_ssize_t)in.hit_tokens,
                                      "num_tokens", (Py_ssize_t)in.num_tokens, "hit_g1", g1,
                                      "onboarded", onb, "onboarded_from", from)
                      : NULL;
  Py_XDECREF(g1);
  Py_XDECREF(onb);
  Py_XDECREF(from);
  return res;
}

static PyObject *hreq_get_tables(HRequestObject *self, void *c) {
  (void)c;
  if (hreq_alive(self)) return NULL;
  size_t ng = kvbm_manager_num_groups(self->mgr->m);
  PyObject *out = PyList_New((Py_ssize_t)ng);
  for (size_t g = 0; out && g < ng; g++) {
    const uint32_t *ids;
    size_t n;
    if (kvbm_hreq_table(self->r, (uint32_t)g, &ids, &n)) n = 0, ids = NULL;
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t k = 0; l && k < n; k++)
      PyList_SET_ITEM(l, (Py_ssize_t)k, ids[k] == KVBM_HREQ_NULL ? Py_NewRef(Py_None) : PyLong_FromUnsignedLong(ids[k]));
    if (!l) Py_CLEAR(out);
    else PyList_SET_ITEM(out, (Py_ssize_t)g, l);
  }
  return out;
}

static PyObject *hreq_must_compute(HRequestObject *self, PyObject *args) {
  unsigned long long g, k;
  if (!PyArg_ParseTuple(args, "KK:must_compute", &g, &k) || hreq_alive(self)) return NULL;
  if (g >= kvbm_manager_num_groups(self->mgr->m))
    return kvbmpy_raise(KVBM_EINVAL, "HybridRequest.must_compute: group %llu of %zu", g,
                        kvbm_manager_num_groups(self->mgr->m));
  bool must;
  Py_BEGIN_ALLOW_THREADS
  must = kvbm_hreq_must_compute(self->r, (uint32_t)g, (size_t)k);
  Py_END_ALLOW_THREADS
  return PyBool_FromLong(must);
}

static PyObject *hreq_commit(HRequestObject *self, PyObject *unused) {
  (void)unused;
  if (hreq_alive(self)) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_hreq_commit(self->r);
  Py_END_ALLOW_THREADS
  if (rc) return kvbmpy_raise(rc, "HybridRequest.commit: %s", kvbm_strerror(rc));
  Py_RETURN_NONE;
}

static PyObject *hreq_append(HRequestObject *self, PyObject *arg) {
  kvbmpy_tokens t;
  if (kvbmpy_tokens_get(arg, "tokens", &t) || hreq_alive(self)) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  kvbm_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_hreq_append(self->r, t.data, t.n, &err);
  Py_END_ALLOW_THREADS
  kvbmpy_tokens_release(&t);
  if (rc) return kvbmpy_raise_kvbm(rc, &err, NULL);
  Py_RETURN_NONE;
}

static PyObject *hreq_destroy(HRequestObject *self, PyObject *unused) {
  (void)unused;
  hreq_finish(self);
  Py_RETURN_NONE;
}

static PyObject *hreq_get_hit(HRequestObject *self, void *c) {
  (void)c;
  return PyLong_FromSize_t(self->hit);
}

static void hreq_dealloc(HRequestObject *self) {
  if (self->mgr) {
    hreq_finish(self);
    Py_DECREF(self->mgr);
  }
  PyObject_Free(self);
}

static PyMethodDef hreq_methods[] = {
  {"wait", (PyCFunction)hreq_wait, METH_NOARGS,
   "wait() -> dict: waits for the onboards; hit_tokens (the hit the blocks that\n"
   "arrived serve), num_tokens, hit_g1 and onboarded (blocks per group), onboarded_from\n"
   "(per tier). NoSpaceError: the hit settled short and G1 has no room yet for the\n"
   "blocks each group needs from the settled hit on (wait again, or destroy)."},
  {"must_compute", (PyCFunction)hreq_must_compute, METH_VARARGS,
   "must_compute(group, k) -> bool: whether the engine writes group's block k."},
  {"commit", (PyCFunction)hreq_commit, METH_NOARGS,
   "commit(): the computed blocks become valid and every group's full blocks not\n"
   "committed before are offloaded per policy; what each group no longer needs is\n"
   "released. After the prompt and after each decode step."},
  {"append", (PyCFunction)hreq_append, METH_O,
   "append(tokens): one decode step: every group's table grows (room for all groups\n"
   "checked first: KvbmError ENOSPC, nothing changed); filled blocks register."},
  {"destroy", (PyCFunction)hreq_destroy, METH_NOARGS, "destroy(): releases every block."},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef hreq_getset[] = {
  {"tables", (getter)hreq_get_tables, NULL,
   "One G1 block table per group (None where the group holds nothing).", NULL},
  {"hit_tokens", (getter)hreq_get_hit, NULL, "The hit hprefill found (before onboarding).", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HRequestType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "kvbm.HybridRequest",
  .tp_basicsize = sizeof(HRequestObject),
  .tp_dealloc = (destructor)hreq_dealloc,
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "A request of a Manager with KV cache groups (Manager.hprefill).",
  .tp_methods = hreq_methods,
  .tp_getset = hreq_getset,
};

int kvbmpy_manager_init(PyObject *m) {
  RequestInfoType = PyStructSequence_NewType(&info_desc);
  if (!RequestInfoType || PyModule_AddObjectRef(m, "RequestInfo", (PyObject *)RequestInfoType) < 0)
    return -1;
  if (PyType_Ready(&MemoryType) < 0 || PyType_Ready(&RequestType) < 0 ||
      PyType_Ready(&ManagerType) < 0)
    return -1;
  if (PyModule_AddObjectRef(m, "Manager", (PyObject *)&ManagerType) < 0 ||
      PyModule_AddObjectRef(m, "Request", (PyObject *)&RequestType) < 0 ||
      PyType_Ready(&HRequestType) < 0 ||
      PyModule_AddObjectRef(m, "HybridRequest", (PyObject *)&HRequestType) < 0)
    return -1;
  return PyModule_AddIntConstant(m, "TIER_COUNT", KVBM_TIER_COUNT);
}
