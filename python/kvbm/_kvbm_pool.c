/* SPDX-License-Identifier: Apache-2.0 */
/*
 * _kvbm_pool.c: kvbm.Pool (one tier's blocks, kvbm/pool.h) and kvbm.Seq (a
 * request's block table, kvbm/sequence.h), plus Pool.run_request, W1's
 * whole request in one call.
 *
 * Threads. A kvbm_pool is not thread-safe: one thread drives it. Here that
 * one thread is whoever holds the GIL: no Pool or Seq call releases it, and
 * none runs Python code once it has started on the pool (arguments are
 * converted first, see _kvbm.h), so Python threads sharing a Pool take
 * turns, call by call. The calls are short: a prefill hashes its prompt at
 * memory speed and touches each block once.
 *
 * Lifetime. A Seq holds a reference to its Pool, so a pool is freed after
 * its sequences. Pool.close() destroys the live sequences first (releasing
 * their blocks; their later use raises ClosedError), then the pool.
 *
 * Hybrid models. Pool(..., groups="full,sw:128") (or a list of (kind,
 * tokens) tuples, what kvbm.groups_from_vllm makes of vLLM's
 * KVCacheConfig) makes a pool of KV cache groups (kvbm/group.h);
 * Pool.hybrid_sequence() is one request with a block table per group
 * (kvbm.HybridSequence over kvbm/hybrid.h). Its buffers are sized at
 * creation for max_tokens (default: the pool's num_blocks * block_size, the
 * most one group could hold), so its steps allocate nothing. A pool with
 * groups still serves Seq and run_request in group 0.
 *
 * Blocks needed. Pool.blocks_needed(tokens) answers, without changing
 * anything, how many available blocks (free + cached) a prefill of tokens
 * would take now: the blocks it cannot match, plus the matched ones that
 * sit in the cache (matching reactivates them, so they stop being
 * available). This is the dry run kvbm_seq_prefill itself makes, so
 * prefill succeeds exactly when blocks_needed(tokens) <= available; the
 * nano-vllm shaped BlockManager's can_allocate is built on it.
 */
#include "_kvbm.h"

#include <string.h>

#include "kvbm/group.h"
#include "kvbm/hybrid.h"
#include "kvbm/pool.h"
#include "kvbm/sequence.h"

typedef struct SeqObject SeqObject;
typedef struct HSeqObject HSeqObject;

typedef struct PoolObject {
  PyObject_HEAD
  kvbm_pool *pool;   /* NULL once closed */
  SeqObject *seqs;   /* live sequences (borrowed; each unlinks itself) */
  HSeqObject *hseqs; /* live hybrid sequences (likewise) */
  kvbm_group_spec groups[KVBM_GROUPS_MAX];
  size_t ngroups;    /* 1 (full) unless configured with groups */
  uint32_t num_blocks, block_size;
  kvbm_hash_scheme scheme;
  kvbm_pool_stats final_st; /* as close() left it: what stats() answers then */
  bool final_ok;
} PoolObject;

struct SeqObject {
  PyObject_HEAD
  PoolObject *pool;  /* strong */
  kvbm_seq *s;       /* NULL once destroyed */
  PyObject *cow;     /* fork's copy-on-write pair (src, dst), or None */
  uint64_t salt_hash;
  uint8_t priority;
  SeqObject *prev, *next;
};

struct HSeqObject {
  PyObject_HEAD
  PoolObject *pool;  /* strong */
  kvbm_hseq *s;      /* NULL once destroyed */
  HSeqObject *prev, *next;
};

static PyTypeObject PoolType, SeqType, HSeqType;

static int pool_open(PoolObject *self) {
  if (!self->pool) {
    kvbmpy_closed("Pool");
    return -1;
  }
  return 0;
}

static void seq_link(PoolObject *p, SeqObject *s) {
  s->pool = (PoolObject *)Py_NewRef(p);
  s->prev = NULL;
  s->next = p->seqs;
  if (p->seqs) p->seqs->prev = s;
  p->seqs = s;
}

static void seq_unlink(SeqObject *s) {
  if (!s->pool) return;
  if (s->prev) s->prev->next = s->next;
  else if (s->pool->seqs == s) s->pool->seqs = s->next;
  if (s->next) s->next->prev = s->prev;
  s->prev = s->next = NULL;
}

static SeqObject *seq_alloc(void) {
  SeqObject *s = PyObject_New(SeqObject, &SeqType);
  if (!s) return NULL;
  s->pool = NULL;
  s->s = NULL;
  s->cow = Py_NewRef(Py_None);
  s->salt_hash = 0;
  s->priority = 0;
  s->prev = s->next = NULL;
  return s;
}

/* --------------------------------------------------------------- Pool */

/* Pool(groups=...): a string ("full,sw:128") or a sequence whose items are
 * a kind string or a (kind, tokens) pair (tokens an int, or None for full
 * and mamba). The list goes to kvbm_groups_parse as text, so the C
 * library's rules and messages (naming the item) apply to both forms; an
 * item that cannot be written as text is refused here, naming its index. */
int kvbmpy_groups_get(PyObject *o, const char *who, kvbm_group_spec *out, size_t *n) {
  kvbm_error err = {0};
  if (PyUnicode_Check(o)) {
    const char *text = PyUnicode_AsUTF8(o);
    if (!text) return -1;
    int rc = kvbm_groups_parse(text, out, KVBM_GROUPS_MAX, n, &err);
    if (rc) kvbmpy_raise_kvbm(rc, &err, who);
    return rc ? -1 : 0;
  }
  PyObject *seq = PySequence_Fast(o, "groups is a string or a list of (kind, tokens)");
  if (!seq) {
    PyErr_Clear();
    kvbmpy_raise(KVBM_EINVAL, "%s: groups is a string or a list of (kind, tokens), not %s", who,
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  if (count > KVBM_GROUPS_MAX) {
    Py_DECREF(seq);
    kvbmpy_raise(KVBM_EINVAL, "%s: groups: more than %d groups", who, KVBM_GROUPS_MAX);
    return -1;
  }
  char text[KVBM_GROUPS_MAX * 48 + 1];
  size_t len = 0;
  int bad = 0;
  for (Py_ssize_t i = 0; i < count && !bad; i++) {
    PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *ko = item, *to = Py_None;
    if (PyTuple_Check(item) || PyList_Check(item)) {
      Py_ssize_t k = PySequence_Size(item);
      if (k < 1 || k > 2) {
        kvbmpy_raise(KVBM_EINVAL, "%s: groups item %zd: a (kind, tokens) pair, not %zd values", who, i, k);
        bad = 1;
        break;
      }
      ko = PySequence_Fast_GET_ITEM(item, 0); /* a tuple or list: no new reference */
      to = k == 2 ? PySequence_Fast_GET_ITEM(item, 1) : Py_None;
    }
    const char *kind = PyUnicode_Check(ko) ? PyUnicode_AsUTF8(ko) : NULL;
    if (!kind || !*kind || strlen(kind) > 24 || strpbrk(kind, ",: ")) {
      PyErr_Clear();
      kvbmpy_raise(KVBM_EINVAL, "%s: groups item %zd: kind '%.40s' is not a kind name (full, sw, chunk, mamba, mamba-align)", who,
                   i, kind ? kind : Py_TYPE(ko)->tp_name);
      bad = 1;
      break;
    }
    len += (size_t)snprintf(text + len, sizeof text - len, "%s%s", i ? "," : "", kind);
    if (to != Py_None) {
      long long t = PyLong_Check(to) && !PyBool_Check(to) ? PyLong_AsLongLong(to) : -1;
      if (t < 0 || t > (long long)KVBM_GROUP_MAX_TOKENS) {
        PyErr_Clear();
        kvbmpy_raise(KVBM_EINVAL, "%s: groups item %zd (%s): tokens must be an int in [1, 2^30] or None (got %s %lld)", who,
                     i, kind, Py_TYPE(to)->tp_name, t);
        bad = 1;
        break;
      }
      len += (size_t)snprintf(text + len, sizeof text - len, ":%lld", t);
    }
  }
  Py_DECREF(seq);
  if (bad) return -1;
  text[len] = 0;
  int rc = kvbm_groups_parse(text, out, KVBM_GROUPS_MAX, n, &err);
  if (rc) kvbmpy_raise_kvbm(rc, &err, who);
  return rc ? -1 : 0;
}

static PyObject *pool_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"num_blocks", "block_size", "scheme", "allow_duplicates", "groups", NULL};
  PyObject *nbo, *bso, *so = NULL, *go = NULL;
  int dup = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$OpO:Pool", kwlist, &nbo, &bso, &so, &dup, &go))
    return NULL;
  uint64_t nb, bs;
  kvbm_hash_scheme scheme = KVBM_HASH_NATIVE;
  if (kvbmpy_uint(nbo, "num_blocks", UINT32_MAX, &nb) ||
      kvbmpy_uint(bso, "block_size", UINT32_MAX, &bs) || (so && kvbmpy_scheme(so, &scheme)))
    return NULL;
  kvbm_group_spec groups[KVBM_GROUPS_MAX] = {{KVBM_GROUP_FULL, 0}};
  size_t ngroups = 1;
  if (go && go != Py_None && kvbmpy_groups_get(go, "Pool", groups, &ngroups)) return NULL;
  if (ngroups > nb)
    return kvbmpy_raise(KVBM_EINVAL, "Pool: %zu groups cannot share %llu blocks: each needs at least one",
                        ngroups, (unsigned long long)nb);
  PoolObject *self = (PoolObject *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  memcpy(self->groups, groups, sizeof groups);
  self->ngroups = ngroups;
  kvbm_pool_config cfg = kvbm_pool_config_default((uint32_t)nb, (uint32_t)bs);
  cfg.num_groups = go && go != Py_None ? (uint32_t)ngroups : 0;
  cfg.scheme = scheme;
  cfg.allow_duplicates = dup;
  cfg.keep_tokens = false; /* nobody reads them back through the binding */
  kvbm_error err = {0};
  int rc = kvbm_pool_create(&cfg, &self->pool, &err);
  if (rc) {
    Py_DECREF(self);
    return kvbmpy_raise_kvbm(rc, &err, NULL);
  }
  self->num_blocks = (uint32_t)nb;
  self->block_size = (uint32_t)bs;
  self->scheme = scheme;
  return (PyObject *)self;
}

static PyObject *pool_close(PoolObject *self, PyObject *unused) {
  (void)unused;
  if (!self->pool) Py_RETURN_NONE;
  for (SeqObject *s = self->seqs; s; s = s->next) {
    kvbm_seq_destroy(s->s);
    s->s = NULL;
  }
  for (HSeqObject *h = self->hseqs; h; h = h->next) {
    kvbm_hseq_destroy(h->s);
    h->s = NULL;
  }
  kvbm_pool_stats_get(self->pool, &self->final_st); /* the sequences' releases counted */
  self->final_ok = true;
  kvbm_pool_destroy(self->pool);
  self->pool = NULL;
  Py_RETURN_NONE;
}

static void pool_dealloc(PoolObject *self) {
  kvbm_pool_destroy(self->pool); /* no Seq alive: each holds a reference */
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *pool_enter(PyObject *self, PyObject *unused) {
  (void)unused;
  return Py_NewRef(self);
}

static PyObject *pool_exit(PoolObject *self, PyObject *args) {
  (void)args;
  return pool_close(self, NULL);
}

static PyObject *pool_stats(PoolObject *self, PyObject *unused) {
  (void)unused;
  kvbm_pool_stats s;
  if (!self->pool && self->final_ok) { /* closed: the final counts */
    s = self->final_st;
  } else {
    if (pool_open(self)) return NULL;
    kvbm_pool_stats_get(self->pool, &s);
  }
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  if (kvbmpy_dict_u64(d, "num_blocks", s.num_blocks) ||
      kvbmpy_dict_u64(d, "block_size", s.block_size) || kvbmpy_dict_u64(d, "free", s.free) ||
      kvbmpy_dict_u64(d, "cached", s.cached) || kvbmpy_dict_u64(d, "active", s.active) ||
      kvbmpy_dict_u64(d, "registered", s.registered) ||
      kvbmpy_dict_u64(d, "allocated", s.allocated) || kvbmpy_dict_u64(d, "evicted", s.evicted) ||
      kvbmpy_dict_u64(d, "dedup", s.dedup) || kvbmpy_dict_u64(d, "match_hits", s.match_hits)) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

static PyObject *pool_sequence(PoolObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"salt_hash", "priority", NULL};
  PyObject *so = NULL, *po = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:sequence", kwlist, &so, &po)) return NULL;
  uint64_t salt = 0, prio = 0;
  if ((so && kvbmpy_hash(so, "salt_hash", &salt)) || (po && kvbmpy_uint(po, "priority", 255, &prio)))
    return NULL;
  SeqObject *s = seq_alloc();
  if (!s) return NULL;
  if (pool_open(self)) {
    Py_DECREF(s);
    return NULL;
  }
  int rc = kvbm_seq_create(self->pool, salt, (uint8_t)prio, &s->s);
  if (rc) {
    Py_DECREF(s);
    return kvbmpy_raise_kvbm(rc, NULL, "Pool.sequence");
  }
  s->salt_hash = salt;
  s->priority = (uint8_t)prio;
  seq_link(self, s);
  return (PyObject *)s;
}

/* Parses (tokens, output, salt_hash) for run_request, positional-fast. */
static PyObject *pool_run_request(PoolObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames) {
  PyObject *po = NULL, *oo = NULL, *so = NULL;
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs < 2 || nargs > 3 || (nkw && (nkw != 1 || nargs != 2))) goto usage;
  po = args[0];
  oo = args[1];
  if (nargs == 3) so = args[2];
  if (nkw) {
    if (!PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0)) ||
        PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "salt_hash"))
      goto usage;
    so = args[2];
  }
  uint64_t salt = 0;
  if (so && kvbmpy_hash(so, "salt_hash", &salt)) return NULL;
  kvbmpy_tokens p, o;
  int bad = kvbmpy_tokens_get(po, "prompt", &p);
  if (!bad) bad = kvbmpy_tokens_get(oo, "output", &o);
  else o.has_view = false, o.owned = NULL;
  if (bad || pool_open(self)) {
    kvbmpy_tokens_release(&p);
    kvbmpy_tokens_release(&o);
    return NULL;
  }
  kvbm_seq *s;
  size_t matched = 0;
  int rc = kvbm_seq_create(self->pool, salt, 0, &s);
  if (!rc) {
    if (p.n) rc = kvbm_seq_prefill(s, p.data, p.n, &matched);
    if (!rc) rc = kvbm_seq_append(s, o.data, o.n);
    kvbm_seq_destroy(s);
  }
  size_t np = p.n, no = o.n;
  kvbmpy_tokens_release(&p);
  kvbmpy_tokens_release(&o);
  if (rc == KVBM_ENOSPC)
    return kvbmpy_raise(rc, "Pool.run_request: %zu prompt + %zu output tokens do not fit in the pool",
                        np, no);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Pool.run_request");
  return PyLong_FromSize_t(matched);
usage:
  PyErr_SetString(PyExc_TypeError, "run_request(prompt, output, salt_hash=0)");
  return NULL;
}

static PyObject *pool_blocks_needed(PoolObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"tokens", "salt_hash", NULL};
  PyObject *tok, *so = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:blocks_needed", kwlist, &tok, &so)) return NULL;
  uint64_t salt = 0;
  if (so && kvbmpy_hash(so, "salt_hash", &salt)) return NULL;
  kvbmpy_tokens t;
  if (kvbmpy_tokens_get(tok, "tokens", &t) || pool_open(self)) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  if (t.n == 0) {
    kvbmpy_tokens_release(&t);
    return kvbmpy_raise(KVBM_EINVAL, "Pool.blocks_needed: a prompt has at least one token");
  }
  const size_t B = self->block_size, total = t.n / B + (t.n % B != 0), matchable = (t.n - 1) / B;
  uint64_t *h = PyMem_Malloc((matchable ? matchable : 1) * sizeof *h);
  if (!h) {
    kvbmpy_tokens_release(&t);
    return PyErr_NoMemory();
  }
  kvbm_hash_chain(self->scheme, salt, t.data, matchable * B, B, h, matchable);
  kvbmpy_tokens_release(&t);
  size_t m = 0, from_cache = 0;
  bool cached;
  while (m < matchable && kvbm_pool_peek(self->pool, h[m], NULL, &cached) == KVBM_OK) {
    from_cache += cached;
    m++;
  }
  PyMem_Free(h);
  return PyLong_FromSize_t(total - m + from_cache);
}

static PyObject *pool_contains(PoolObject *self, PyObject *arg) {
  uint64_t h;
  if (kvbmpy_hash(arg, "hash", &h) || pool_open(self)) return NULL;
  return PyBool_FromLong(kvbm_pool_contains(self->pool, h));
}

static PyObject *pool_block_info(PoolObject *self, PyObject *arg) {
  uint64_t id;
  if (kvbmpy_uint(arg, "block", UINT32_MAX, &id) || pool_open(self)) return NULL;
  if (id >= self->num_blocks)
    return kvbmpy_raise(KVBM_ERANGE, "Pool.block_info: block %llu, but the pool has %u",
                        (unsigned long long)id, self->num_blocks);
  kvbm_block_info bi;
  int rc = kvbm_block_info_get(self->pool, (uint32_t)id, &bi);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Pool.block_info");
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  bool full = bi.state == KVBM_BLOCK_COMPLETE || bi.state == KVBM_BLOCK_REGISTERED;
  if (kvbmpy_dict_obj(d, "state", PyUnicode_FromString(kvbm_block_state_name(bi.state))) ||
      kvbmpy_dict_u64(d, "refcount", bi.refcount) || kvbmpy_dict_u64(d, "num_tokens", bi.num_tokens) ||
      kvbmpy_dict_obj(d, "seq_hash", full ? PyLong_FromUnsignedLongLong(bi.seq_hash) : Py_NewRef(Py_None)) ||
      kvbmpy_dict_obj(d, "parent_hash",
                      bi.has_parent ? PyLong_FromUnsignedLongLong(bi.parent_hash) : Py_NewRef(Py_None)) ||
      kvbmpy_dict_u64(d, "salt_hash", bi.salt_hash) || kvbmpy_dict_u64(d, "priority", bi.priority)) {
    Py_DECREF(d);
    return NULL;
  }
  return d;
}

static PyObject *pool_clear_cache(PoolObject *self, PyObject *unused) {
  (void)unused;
  if (pool_open(self)) return NULL;
  int rc = kvbm_pool_clear_cache(self->pool);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Pool.clear_cache");
  Py_RETURN_NONE;
}

static PyObject *pool_get_available(PoolObject *self, void *c) {
  (void)c;
  if (pool_open(self)) return NULL;
  return PyLong_FromUnsignedLong(kvbm_pool_available(self->pool));
}

static PyObject *pool_get_num_blocks(PoolObject *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLong(self->num_blocks);
}

static PyObject *pool_get_block_size(PoolObject *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLong(self->block_size);
}

static PyObject *pool_get_scheme(PoolObject *self, void *c) {
  (void)c;
  return PyUnicode_FromString(kvbm_hash_scheme_name(self->scheme));
}

static PyObject *pool_get_closed(PoolObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(self->pool == NULL);
}

/* The CLI name of a kind ("sw"), the form Pool(groups=...) reads. */
static const char *group_cli_name(kvbm_group_kind k) {
  switch (k) {
    case KVBM_GROUP_SLIDING_WINDOW: return "sw";
    case KVBM_GROUP_CHUNKED_LOCAL: return "chunk";
    case KVBM_GROUP_MAMBA: return "mamba";
    case KVBM_GROUP_MAMBA_ALIGN: return "mamba-align";
    default: return "full";
  }
}

static PyObject *pool_get_groups(PoolObject *self, void *c) {
  (void)c;
  PyObject *l = PyList_New((Py_ssize_t)self->ngroups);
  for (size_t i = 0; l && i < self->ngroups; i++) {
    const kvbm_group_spec *g = &self->groups[i];
    bool param = g->kind == KVBM_GROUP_SLIDING_WINDOW || g->kind == KVBM_GROUP_CHUNKED_LOCAL;
    PyObject *t = param ? Py_BuildValue("(sI)", group_cli_name(g->kind), g->tokens)
                        : Py_BuildValue("(sO)", group_cli_name(g->kind), Py_None);
    if (!t) {
      Py_DECREF(l);
      return NULL;
    }
    PyList_SET_ITEM(l, (Py_ssize_t)i, t);
  }
  return l;
}

static PyObject *pool_hybrid_sequence(PoolObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"salt_hash", "max_tokens", "prefix_cache_retention_interval", NULL};
  PyObject *so = NULL, *mo = NULL, *ro = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O$OO:hybrid_sequence", kwlist, &so, &mo, &ro)) return NULL;
  kvbm_hseq_retention ret;
  if (kvbmpy_retention(ro, "Pool.hybrid_sequence", &ret)) return NULL;
  uint64_t salt = 0, maxt = 0;
  if ((so && kvbmpy_hash(so, "salt_hash", &salt)) ||
      (mo && mo != Py_None && kvbmpy_uint(mo, "max_tokens", KVBM_HSEQ_MAX_TOKENS, &maxt)) || pool_open(self))
    return NULL;
  if (!mo || mo == Py_None) {
    maxt = (uint64_t)self->num_blocks * self->block_size;
    if (maxt > KVBM_HSEQ_MAX_TOKENS) maxt = KVBM_HSEQ_MAX_TOKENS;
  }
  HSeqObject *h = PyObject_New(HSeqObject, &HSeqType);
  if (!h) return NULL;
  h->s = NULL;
  h->prev = h->next = NULL;
  h->pool = (PoolObject *)Py_NewRef(self);
  kvbm_error err = {0};
  int rc = kvbm_hseq_create(self->pool, self->groups, self->ngroups, salt, (size_t)maxt, &h->s, &err);
  if (rc) {
    Py_DECREF(h);
    return kvbmpy_raise_kvbm(rc, &err, "Pool.hybrid_sequence");
  }
  (void)kvbm_hseq_set_retention(h->s, ret); /* a fresh request: cannot fail */
  h->next = self->hseqs;
  if (self->hseqs) self->hseqs->prev = h;
  self->hseqs = h;
  return (PyObject *)h;
}

static PyMethodDef pool_methods[] = {
  {"hybrid_sequence", (PyCFunction)(void (*)(void))pool_hybrid_sequence, METH_VARARGS | METH_KEYWORDS,
   "hybrid_sequence(salt_hash=0, *, max_tokens=None, prefix_cache_retention_interval=None)\n"
   "    -> HybridSequence\n\n"
   "A request with a block table per KV cache group (Pool(groups=...)); its\n"
   "buffers hold max_tokens tokens (default num_blocks * block_size).\n"
   "prefix_cache_retention_interval is vLLM's setting: None caches every full\n"
   "block, 0 (vLLM's default) only the window and Mamba blocks a hit at the\n"
   "prompt's end or the shared-prefix junction can use."},
  {"sequence", (PyCFunction)(void (*)(void))pool_sequence, METH_VARARGS | METH_KEYWORDS,
   "sequence(salt_hash=0, priority=0) -> Seq\n\nA new, empty request on this pool; its blocks are\n"
   "released at `priority` (0 = evicted first)."},
  {"run_request", (PyCFunction)(void (*)(void))pool_run_request, METH_FASTCALL | METH_KEYWORDS,
   "run_request(prompt, output, salt_hash=0) -> int\n\n"
   "One whole request in one call, as workload W1 runs it: create a sequence,\n"
   "prefill the prompt (an empty prompt is skipped), append the output tokens,\n"
   "destroy it (tail first). Returns the prompt tokens that hit the cache.\n"
   "NoSpaceError when it does not fit (then nothing stays allocated)."},
  {"blocks_needed", (PyCFunction)(void (*)(void))pool_blocks_needed, METH_VARARGS | METH_KEYWORDS,
   "blocks_needed(tokens, salt_hash=0) -> int\n\n"
   "How many available blocks a prefill of tokens would take now (unmatched\n"
   "blocks plus matched ones sitting in the cache). A prefill succeeds exactly\n"
   "when this is <= available. Changes nothing."},
  {"contains", (PyCFunction)pool_contains, METH_O,
   "contains(hash) -> bool\n\nWhether a sequence hash is registered (matchable)."},
  {"block_info", (PyCFunction)pool_block_info, METH_O,
   "block_info(block) -> dict\n\nOne block's state ('reset', 'partial', 'complete',\n"
   "'registered'), refcount, num_tokens, seq_hash, parent_hash, salt_hash, priority."},
  {"stats", (PyCFunction)pool_stats, METH_NOARGS,
   "stats() -> dict\n\nnum_blocks, block_size, free, cached, active, registered, and the\n"
   "counters allocated, evicted, dedup, match_hits."},
  {"clear_cache", (PyCFunction)pool_clear_cache, METH_NOARGS,
   "clear_cache()\n\nDrops every cached (registered, unused) block."},
  {"close", (PyCFunction)pool_close, METH_NOARGS,
   "close()\n\nDestroys the live sequences and frees the pool. Idempotent."},
  {"__enter__", pool_enter, METH_NOARGS, NULL},
  {"__exit__", (PyCFunction)pool_exit, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef pool_getset[] = {
  {"num_blocks", (getter)pool_get_num_blocks, NULL, "Blocks in the pool.", NULL},
  {"block_size", (getter)pool_get_block_size, NULL, "Tokens per block.", NULL},
  {"scheme", (getter)pool_get_scheme, NULL, "The hash scheme ('native' or 'dynamo').", NULL},
  {"available", (getter)pool_get_available, NULL, "Blocks an allocation could take now: free + cached.", NULL},
  {"closed", (getter)pool_get_closed, NULL, "Whether close() ran.", NULL},
  {"groups", (getter)pool_get_groups, NULL,
   "The KV cache groups, a list of (kind, tokens): [('full', None)] unless configured.", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PoolType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "kvbm.Pool",
  .tp_basicsize = sizeof(PoolObject),
  .tp_dealloc = (destructor)pool_dealloc,
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "Pool(num_blocks, block_size, *, scheme='native', allow_duplicates=False, groups=None)\n\n"
            "The blocks of one tier: registered blocks are shared by sequence hash,\n"
            "released ones stay cached until evicted (lowest priority, then least\n"
            "recently released). Calls keep the GIL, which makes a Pool safe to share\n"
            "between Python threads. Use as a context manager or call close().",
  .tp_methods = pool_methods,
  .tp_getset = pool_getset,
  .tp_new = pool_new,
};

/* ---------------------------------------------------------------- Seq */

static int seq_ready(SeqObject *self) {
  if (!self->s) {
    if (self->pool && !self->pool->pool) kvbmpy_raise(KVBM_ECLOSED, "Seq: its Pool is closed");
    else kvbmpy_raise(KVBM_ECLOSED, "Seq is destroyed");
    return -1;
  }
  return 0;
}

static PyObject *seq_prefill(SeqObject *self, PyObject *arg) {
  kvbmpy_tokens t;
  if (kvbmpy_tokens_get(arg, "tokens", &t) || seq_ready(self)) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  size_t matched = 0, n = t.n;
  int rc = kvbm_seq_prefill(self->s, t.data, t.n, &matched);
  kvbmpy_tokens_release(&t);
  if (rc == KVBM_ENOSPC)
    return kvbmpy_raise(rc, "Seq.prefill: the pool cannot hold %zu tokens (nothing changed)", n);
  if (rc == KVBM_ESTATE) return kvbmpy_raise(rc, "Seq.prefill: the sequence is not empty");
  if (rc == KVBM_EINVAL) return kvbmpy_raise(rc, "Seq.prefill: a prompt has at least one token");
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Seq.prefill");
  return PyLong_FromSize_t(matched);
}

static PyObject *seq_append(SeqObject *self, PyObject *arg) {
  kvbmpy_tokens t;
  if (kvbmpy_tokens_get(arg, "tokens", &t) || seq_ready(self)) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  size_t n = t.n;
  int rc = kvbm_seq_append(self->s, t.data, t.n);
  kvbmpy_tokens_release(&t);
  if (rc == KVBM_ENOSPC)
    return kvbmpy_raise(rc, "Seq.append: no block for %zu more token(s) (nothing changed)", n);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Seq.append");
  Py_RETURN_NONE;
}

static PyObject *seq_fork(SeqObject *self, PyObject *unused) {
  (void)unused;
  SeqObject *c = seq_alloc();
  if (!c) return NULL;
  PyObject *cow = PyTuple_New(2);
  if (!cow || seq_ready(self)) {
    Py_XDECREF(cow);
    Py_DECREF(c);
    return NULL;
  }
  uint32_t src, dst;
  int rc = kvbm_seq_fork(self->s, &c->s, &src, &dst);
  if (rc) {
    Py_DECREF(cow);
    Py_DECREF(c);
    if (rc == KVBM_ENOSPC) return kvbmpy_raise(rc, "Seq.fork: no block for the copied tail (nothing changed)");
    return kvbmpy_raise_kvbm(rc, NULL, "Seq.fork");
  }
  c->salt_hash = self->salt_hash;
  c->priority = self->priority;
  seq_link(self->pool, c);
  if (src != UINT32_MAX) {
    PyTuple_SET_ITEM(cow, 0, PyLong_FromUnsignedLong(src));
    PyTuple_SET_ITEM(cow, 1, PyLong_FromUnsignedLong(dst));
    Py_SETREF(c->cow, cow);
  } else {
    Py_DECREF(cow);
  }
  return (PyObject *)c;
}

static PyObject *seq_block_hash(SeqObject *self, PyObject *arg) {
  uint64_t k;
  if (kvbmpy_uint(arg, "k", UINT64_MAX, &k) || seq_ready(self)) return NULL;
  size_t full = kvbm_seq_num_tokens(self->s) / self->pool->block_size;
  if (k >= full)
    return kvbmpy_raise(KVBM_ERANGE, "Seq.block_hash: block %llu, but the sequence has %zu full block(s)",
                        (unsigned long long)k, full);
  uint64_t h;
  int rc = kvbm_seq_block_hash(self->s, (size_t)k, &h);
  if (rc) return kvbmpy_raise_kvbm(rc, NULL, "Seq.block_hash");
  return PyLong_FromUnsignedLongLong(h);
}

static PyObject *seq_destroy(SeqObject *self, PyObject *unused) {
  (void)unused;
  if (self->s) {
    kvbm_seq_destroy(self->s);
    self->s = NULL;
  }
  seq_unlink(self);
  Py_RETURN_NONE;
}

static PyObject *seq_exit(SeqObject *self, PyObject *args) {
  (void)args;
  return seq_destroy(self, NULL);
}

static void seq_dealloc(SeqObject *self) {
  if (self->s) kvbm_seq_destroy(self->s);
  seq_unlink(self);
  Py_XDECREF(self->pool);
  Py_XDECREF(self->cow);
  PyObject_Free(self);
}

static PyObject *seq_get_block_table(SeqObject *self, void *c) {
  (void)c;
  if (seq_ready(self)) return NULL;
  const uint32_t *ids;
  size_t n;
  kvbm_seq_blocks(self->s, &ids, &n);
  uint32_t *copy = PyMem_Malloc((n ? n : 1) * sizeof *copy);
  if (!copy) return PyErr_NoMemory();
  memcpy(copy, ids, n * sizeof *copy);
  PyObject *list = kvbmpy_list_u32(copy, n);
  PyMem_Free(copy);
  return list;
}

static PyObject *seq_get_num_tokens(SeqObject *self, void *c) {
  (void)c;
  if (seq_ready(self)) return NULL;
  return PyLong_FromSize_t(kvbm_seq_num_tokens(self->s));
}

static PyObject *seq_get_cow(SeqObject *self, void *c) {
  (void)c;
  return Py_NewRef(self->cow);
}

static PyObject *seq_get_closed(SeqObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(self->s == NULL);
}

static PyObject *seq_get_salt(SeqObject *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLongLong(self->salt_hash);
}

static PyMethodDef seq_methods[] = {
  {"prefill", (PyCFunction)seq_prefill, METH_O,
   "prefill(tokens) -> int\n\nMatches the longest registered prefix (at most len - 1 tokens, in\n"
   "whole blocks) and allocates the rest; returns the matched (cached) token count.\n"
   "NoSpaceError, with nothing changed, when the pool cannot hold it; StateError\n"
   "on a sequence that is not empty."},
  {"append", (PyCFunction)seq_append, METH_O,
   "append(tokens)\n\nAppends decode tokens: a token that opens a block allocates one, a\n"
   "block that fills is registered. NoSpaceError, with nothing changed, when the\n"
   "blocks are not available."},
  {"fork", (PyCFunction)seq_fork, METH_NOARGS,
   "fork() -> Seq\n\nA new sequence sharing every full block. When this one ends in a\n"
   "partial block the child gets its own copy of it: child.cow is then (src, dst),\n"
   "the block whose KV the engine must copy and where; None otherwise."},
  {"block_hash", (PyCFunction)seq_block_hash, METH_O,
   "block_hash(k) -> int\n\nThe sequence hash of full block k."},
  {"destroy", (PyCFunction)seq_destroy, METH_NOARGS,
   "destroy()\n\nReleases every block, tail first. Idempotent."},
  {"__enter__", pool_enter, METH_NOARGS, NULL},
  {"__exit__", (PyCFunction)seq_exit, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef seq_getset[] = {
  {"block_table", (getter)seq_get_block_table, NULL, "Block ids in token order.", NULL},
  {"num_tokens", (getter)seq_get_num_tokens, NULL, "Tokens in the sequence.", NULL},
  {"cow", (getter)seq_get_cow, NULL,
   "For a forked child: (src, dst) blocks to copy (copy-on-write of the tail), or None.", NULL},
  {"salt_hash", (getter)seq_get_salt, NULL, "The sequence's salt hash.", NULL},
  {"closed", (getter)seq_get_closed, NULL, "Whether destroy() ran (or the pool closed).", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SeqType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "kvbm.Seq",
  .tp_basicsize = sizeof(SeqObject),
  .tp_dealloc = (destructor)seq_dealloc,
  .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
  .tp_doc = "One request's block table in a Pool (from Pool.sequence()): prefill, append,\n"
            "fork (copy-on-write), destroy (also `with`).",
  .tp_methods = seq_methods,
  .tp_getset = seq_getset,
};

/* ------------------------------------------------------ HybridSequence */

static int hseq_ready(HSeqObject *self) {
  if (!self->s) {
    if (self->pool && !self->pool->pool) kvbmpy_raise(KVBM_ECLOSED, "HybridSequence: its Pool is closed");
    else kvbmpy_raise(KVBM_ECLOSED, "HybridSequence is destroyed");
    return -1;
  }
  return 0;
}

static void hseq_unlink(HSeqObject *h) {
  if (!h->pool) return;
  if (h->prev) h->prev->next = h->next;
  else if (h->pool->hseqs == h) h->pool->hseqs = h->next;
  if (h->next) h->next->prev = h->prev;
  h->prev = h->next = NULL;
}

static PyObject *hseq_append(HSeqObject *self, PyObject *arg) {
  kvbmpy_tokens t;
  if (kvbmpy_tokens_get(arg, "tokens", &t) || hseq_ready(self)) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  kvbm_error err = {0};
  int rc = kvbm_hseq_append(self->s, t.data, t.n, &err);
  kvbmpy_tokens_release(&t);
  if (rc) return kvbmpy_raise_kvbm(rc, &err, "HybridSequence.append");
  Py_RETURN_NONE;
}

static PyObject *hseq_find_hit(HSeqObject *self, PyObject *unused) {
  (void)unused;
  if (hseq_ready(self)) return NULL;
  uint64_t hit = 0;
  kvbm_error err = {0};
  int rc = kvbm_hseq_find_hit(self->s, &hit, &err);
  if (rc) return kvbmpy_raise_kvbm(rc, &err, "HybridSequence.find_hit");
  return PyLong_FromUnsignedLongLong(hit);
}

static PyObject *hseq_step(HSeqObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"tokens", "num_new", NULL};
  PyObject *to = NULL, *no = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:step", kwlist, &to, &no)) return NULL;
  uint64_t n_new = KVBM_HSEQ_REST;
  if (no && no != Py_None && kvbmpy_uint(no, "num_new", UINT64_MAX - 1, &n_new)) return NULL;
  kvbmpy_tokens t = {0};
  if ((to && to != Py_None && kvbmpy_tokens_get(to, "tokens", &t)) || hseq_ready(self)) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  kvbm_error err = {0};
  int rc = kvbm_hseq_step(self->s, t.n ? t.data : NULL, t.n, n_new, &err);
  kvbmpy_tokens_release(&t);
  if (rc) return kvbmpy_raise_kvbm(rc, &err, "HybridSequence.step");
  Py_RETURN_NONE;
}

static PyObject *hseq_stats(HSeqObject *self, PyObject *unused) {
  (void)unused;
  if (hseq_ready(self)) return NULL;
  size_t n = kvbm_hseq_num_groups(self->s);
  PyObject *l = PyList_New((Py_ssize_t)n);
  for (uint32_t g = 0; l && g < n; g++) {
    kvbm_hseq_group_stats st;
    kvbm_hseq_group_stats_get(self->s, g, &st);
    PyObject *d = PyDict_New();
    if (!d || kvbmpy_dict_u64(d, "held", st.held) || kvbmpy_dict_u64(d, "peak_held", st.peak_held) ||
        kvbmpy_dict_u64(d, "allocated", st.allocated)) {
      Py_XDECREF(d);
      Py_DECREF(l);
      return NULL;
    }
    PyList_SET_ITEM(l, (Py_ssize_t)g, d);
  }
  if (!l) return NULL;
  PyObject *d = PyDict_New();
  if (!d || kvbmpy_dict_u64(d, "peak_held", kvbm_hseq_peak_held(self->s)) || kvbmpy_dict_obj(d, "groups", l)) {
    Py_XDECREF(d);
    return NULL;
  }
  return d;
}

static PyObject *hseq_destroy(HSeqObject *self, PyObject *unused) {
  (void)unused;
  kvbm_hseq_destroy(self->s);
  self->s = NULL;
  hseq_unlink(self);
  Py_RETURN_NONE;
}

static void hseq_dealloc(HSeqObject *self) {
  kvbm_hseq_destroy(self->s);
  hseq_unlink(self);
  Py_XDECREF(self->pool);
  PyObject_Free(self);
}

static PyObject *hseq_get_block_tables(HSeqObject *self, void *c) {
  (void)c;
  if (hseq_ready(self)) return NULL;
  size_t ng = kvbm_hseq_num_groups(self->s);
  PyObject *out = PyList_New((Py_ssize_t)ng);
  for (uint32_t g = 0; out && g < ng; g++) {
    const uint32_t *ids;
    size_t n;
    kvbm_hseq_table(self->s, g, &ids, &n);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
      PyObject *v = ids[i] == KVBM_HSEQ_NULL ? Py_NewRef(Py_None) : PyLong_FromUnsignedLong(ids[i]);
      if (!v) Py_CLEAR(l);
      else PyList_SET_ITEM(l, (Py_ssize_t)i, v);
    }
    if (!l) Py_CLEAR(out);
    else PyList_SET_ITEM(out, (Py_ssize_t)g, l);
  }
  return out;
}

static PyObject *hseq_get_hit_tokens(HSeqObject *self, void *c) {
  (void)c;
  if (hseq_ready(self)) return NULL;
  return PyLong_FromUnsignedLongLong(kvbm_hseq_hit_tokens(self->s));
}

static PyObject *hseq_get_num_tokens(HSeqObject *self, void *c) {
  (void)c;
  if (hseq_ready(self)) return NULL;
  return PyLong_FromUnsignedLongLong(kvbm_hseq_num_tokens(self->s));
}

static PyObject *hseq_get_num_computed(HSeqObject *self, void *c) {
  (void)c;
  if (hseq_ready(self)) return NULL;
  return PyLong_FromUnsignedLongLong(kvbm_hseq_num_computed(self->s));
}

static PyObject *hseq_get_destroyed(HSeqObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(self->s == NULL);
}

static PyMethodDef hseq_methods[] = {
  {"append", (PyCFunction)hseq_append, METH_O,
   "append(tokens): known tokens (the prompt), hashed; the pool is not touched."},
  {"find_hit", (PyCFunction)hseq_find_hit, METH_NOARGS,
   "find_hit() -> int: before the first step, the prefix hit every group can serve\n"
   "(at most len - 1 tokens); the first step takes it. Changes nothing."},
  {"step", (PyCFunction)(void (*)(void))hseq_step, METH_VARARGS | METH_KEYWORDS,
   "step(tokens=(), num_new=None): appends tokens, then computes num_new more\n"
   "(None: every known token not computed yet; from the hit on the first step).\n"
   "Raises NoSpaceError (nothing changed) when the blocks do not fit."},
  {"stats", (PyCFunction)hseq_stats, METH_NOARGS,
   "stats() -> {'peak_held', 'groups': [{'held', 'peak_held', 'allocated'}]}"},
  {"destroy", (PyCFunction)hseq_destroy, METH_NOARGS,
   "destroy(): releases every block (group 0 first, each table tail first)."},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef hseq_getset[] = {
  {"block_tables", (getter)hseq_get_block_tables, NULL,
   "A list per group of block ids, None where the group holds nothing.", NULL},
  {"hit_tokens", (getter)hseq_get_hit_tokens, NULL, "The prefix hit taken (or found), in tokens.", NULL},
  {"num_tokens", (getter)hseq_get_num_tokens, NULL, "Tokens known.", NULL},
  {"num_computed", (getter)hseq_get_num_computed, NULL, "Tokens computed (the hit included).", NULL},
  {"destroyed", (getter)hseq_get_destroyed, NULL, "Whether destroy() (or the pool's close) ran.", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HSeqType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "kvbm.HybridSequence",
  .tp_basicsize = sizeof(HSeqObject),
  .tp_dealloc = (destructor)hseq_dealloc,
  .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
  .tp_doc = "A request of a hybrid model: a block table per KV cache group (kvbm/hybrid.h).\n"
            "Made by Pool.hybrid_sequence().",
  .tp_methods = hseq_methods,
  .tp_getset = hseq_getset,
};

int kvbmpy_pool_init(PyObject *m) {
  if (PyType_Ready(&SeqType) < 0 || PyType_Ready(&PoolType) < 0 || PyType_Ready(&HSeqType) < 0) return -1;
  if (PyModule_AddObjectRef(m, "Pool", (PyObject *)&PoolType) < 0 ||
      PyModule_AddObjectRef(m, "Seq", (PyObject *)&SeqType) < 0 ||
      PyModule_AddObjectRef(m, "HybridSequence", (PyObject *)&HSeqType) < 0)
    return -1;
  return 0;
}
