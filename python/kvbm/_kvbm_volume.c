/* SPDX-License-Identifier: Apache-2.0 */
/*
 * _kvbm_volume.c: kvbm.Volume, a store of values by 64-bit key over
 * kvbm/volume.h (disk://, file://, redis://, redis+cluster://, chosen by
 * the URL), for Python code that keeps blocks in G3/G4 stores itself: an
 * engine's storage plug-in (kvbm.sglang) or a tool.
 *
 * Calls are batched like the C API: put(keys, values), get_into(keys,
 * buffers), get(keys), exists(keys), delete(keys) each make one batch,
 * run synchronously (kvbm_volume_run) with the GIL released, and return
 * one result per key. A miss is a result, never an exception: a store that
 * lost a block is normal. Exceptions are for what the caller got wrong
 * (a bad URL, a read-only or non-contiguous buffer, keys and buffers of
 * different lengths, a key outside 64 bits, a closed volume) and raise the
 * kvbm.Error subclass of the status, naming the argument.
 *
 * Results. put: 0 or a negative kvbm status per key; get_into: the value's
 * size (>= 0) or a negative status (kvbm.status_name() names it); get:
 * bytes or None; exists and delete: bools.
 *
 * Zero copy. put reads the caller's buffers in place and get_into writes
 * the values straight into the caller's writable buffers (numpy arrays,
 * bytearrays, memoryviews of a torch tensor's numpy(), ctypes arrays over
 * a host pool's pages): the bytes move once, between the store and that
 * memory. The buffers are held (their exporters cannot resize them) until
 * the batch has completed.
 *
 * Framed values (framed=True). file:// and redis:// keep opaque bytes, so
 * a value damaged or replaced under a key would come back as it is. With
 * framed=True a value is stored as an MRDN v1 frame (kvbm/frame.h: magic,
 * length, BLAKE3-128 of the body) whose body is an 8-byte little-endian
 * "check" followed by the payload; get_into(framed=True) verifies the
 * frame, that the payload is exactly the buffer's size and that the check
 * is the caller's (the caller derives key and check from one 128-bit
 * digest of its own name for the block, so two names whose 64-bit keys
 * collide are told apart), and only then copies the payload into the
 * buffer: a failed check leaves the buffer as it was. Framing costs one
 * copy through a scratch buffer (bounded per chunk of a batch; the last
 * one is kept for the next call, as fresh memory costs a page fault per
 * 4 KiB) and the hash, both with the GIL released; the hashes of a chunk
 * run together on a BLAKE3 pool of `hash_threads` workers plus the calling
 * thread (0, the default: the calling thread alone); failures are counted per kind in
 * stats() (frames_corrupt, frames_wrong_size, frames_foreign).
 *
 * Threads. The C volume may be used from any thread, so several Python
 * threads may run batches on one Volume at once (an engine's prefetch and
 * backup threads do). `calls` counts the calls in progress (from the check
 * that the volume is open to the last use of it, chunks of a framed batch
 * included); close() first refuses new calls, then waits (GIL released)
 * until those have returned, then unregisters the volume. stats() after close() returns the counters
 * as close() left them.
 */
#include "_kvbm.h"

#include <structmember.h>

#include <string.h>
#include <time.h>

#include "kvbm/blake3.h"
#include "kvbm/frame.h"
#include "kvbm/volume.h"

#define MAX_BATCH 65536
#define CHECK_LEN 8
#define FRAME_OVERHEAD (KVBM_FRAME_HEADER_LEN + CHECK_LEN)
/* The most scratch memory one chunk of a framed batch takes (a chunk has
 * at least one op). */
#define SCRATCH_CHUNK (64u << 20)

typedef struct VolumeObject {
  PyObject_HEAD
  kvbm_volume *v;            /* NULL once closed */
  unsigned calls;            /* calls in progress (call_begin..call_end) */
  bool closing;
  uint64_t max_value;        /* the volume's max_value_bytes */
  int timeout_ms;
  PyObject *name, *url, *mode; /* snapshotted at open */
  uint64_t frames_ok, frames_corrupt, frames_wrong_size, frames_foreign;
  kvbm_blake3_pool *hasher;  /* hashes framed bodies (0 workers: the caller) */
  uint8_t *spare;            /* a framed call's scratch, kept for the next */
  size_t spare_cap;
  kvbm_volume_stats final_st; /* as close() left them */
  bool final_ok;
} VolumeObject;

static PyTypeObject VolumeType;

/* ------------------------------------------------------------ helpers */

static int vol_open(VolumeObject *self) {
  if (!self->v || self->closing) {
    kvbmpy_closed("Volume");
    return -1;
  }
  return 0;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Enters a call on an open volume: counted in `calls` until call_end, so
 * that close() (which may run whenever a call releases the GIL: between
 * the chunks of a framed batch, say) waits for it. -1: ClosedError set. */
static int call_begin(VolumeObject *self) {
  if (vol_open(self)) return -1;
  self->calls++;
  return 0;
}

static void call_end(VolumeObject *self) {
  self->calls--;
}

/* The start the batch calls share: *ops gets n zeroed ops, the call is
 * counted (*counted: call_end at the end) and an empty batch is answered at
 * once (*res = []). Returns 1 to go on, 0 when *res is the answer, -1 with
 * an exception raised. */
static int batch_begin(VolumeObject *self, size_t n, kvbm_volume_op **ops, bool *counted,
                       PyObject **res) {
  *ops = PyMem_Calloc(n ? n : 1, sizeof **ops);
  if (!*ops) {
    PyErr_NoMemory();
    return -1;
  }
  if (call_begin(self)) return -1;
  *counted = true;
  if (n) return 1;
  *res = PyList_New(0);
  return *res ? 0 : -1;
}

/* Runs a batch with the GIL released; retries a full queue until the
 * volume's timeout. Only inside call_begin/call_end. */
static int run_batch(VolumeObject *self, kvbm_volume_op *ops, size_t n, kvbm_error *err) {
  int rc;
  kvbm_volume *v = self->v;
  int waited = 0;
  Py_BEGIN_ALLOW_THREADS
  for (;;) {
    rc = kvbm_volume_run(v, ops, n, err);
    if (rc != KVBM_EAGAIN || waited >= self->timeout_ms) break;
    sleep_ms(1);
    waited++;
  }
  Py_END_ALLOW_THREADS
  return rc;
}

/* The keys argument: a sequence of 1..65536 64-bit ints (PyMem). */
static int get_keys(PyObject *o, uint64_t **keys, size_t *n) {
  if (kvbmpy_hashes(o, "keys", keys, n)) return -1;
  if (*n > MAX_BATCH) {
    PyMem_Free(*keys);
    *keys = NULL;
    kvbmpy_raise(KVBM_EINVAL, "keys: %zu keys; a batch holds at most %d", *n, MAX_BATCH);
    return -1;
  }
  return 0;
}

/* The checks argument (framed calls): None (all 0) or one int per key. */
static int get_checks(PyObject *o, bool framed, size_t n, uint64_t **checks) {
  *checks = NULL;
  if (!o || o == Py_None) return 0;
  if (!framed) {
    kvbmpy_raise(KVBM_EINVAL, "checks: only framed values carry a check (pass framed=True)");
    return -1;
  }
  size_t m;
  if (kvbmpy_hashes(o, "checks", checks, &m)) return -1;
  if (m != n) {
    PyMem_Free(*checks);
    *checks = NULL;
    kvbmpy_raise(KVBM_EINVAL, "checks: %zu checks for %zu keys", m, n);
    return -1;
  }
  return 0;
}

/* Buffers of a batch, held until released. */
typedef struct views {
  Py_buffer *v;
  size_t n; /* how many are held */
} views;

static void views_release(views *vw) {
  for (size_t i = 0; i < vw->n; i++) PyBuffer_Release(&vw->v[i]);
  PyMem_Free(vw->v);
  vw->v = NULL;
  vw->n = 0;
}

/* Holds one contiguous buffer per item of `seq` (n of them), writable ones
 * when `writable`. Refuses what cannot be used, naming the item. */
static int views_get(PyObject *seq, const char *what, size_t n, bool writable, views *vw) {
  vw->v = NULL;
  vw->n = 0;
  if (PyUnicode_Check(seq) || PyObject_CheckBuffer(seq)) {
    PyErr_Format(PyExc_TypeError, "%s: expected a sequence of buffers, got one %.100s", what,
                 Py_TYPE(seq)->tp_name);
    return -1;
  }
  PyObject *tup = PySequence_Tuple(seq);
  if (!tup) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s: expected a sequence of buffers, got %.100s", what,
                   Py_TYPE(seq)->tp_name);
    }
    return -1;
  }
  size_t m = (size_t)PyTuple_GET_SIZE(tup);
  if (m != n) {
    Py_DECREF(tup);
    kvbmpy_raise(KVBM_EINVAL, "%s: %zu %s for %zu keys", what, m, what, n);
    return -1;
  }
  vw->v = PyMem_Calloc(n ? n : 1, sizeof *vw->v);
  if (!vw->v) {
    Py_DECREF(tup);
    PyErr_NoMemory();
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    PyObject *o = PyTuple_GET_ITEM(tup, (Py_ssize_t)i);
    Py_buffer *b = &vw->v[i];
    if (PyObject_GetBuffer(o, b, PyBUF_RECORDS_RO) < 0) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s[%zu]: %.100s is not a buffer", what, i,
                   Py_TYPE(o)->tp_name);
      goto fail;
    }
    vw->n++;
    if (writable && b->readonly) {
      kvbmpy_raise(KVBM_EINVAL, "%s[%zu]: a read-only buffer (%.60s); the values are written into it",
                   what, i, Py_TYPE(o)->tp_name);
      goto fail;
    }
    if (!PyBuffer_IsContiguous(b, 'C')) {
      kvbmpy_raise(KVBM_EINVAL, "%s[%zu]: not C-contiguous; pass a contiguous buffer", what, i);
      goto fail;
    }
    if (b->len == 0) {
      kvbmpy_raise(KVBM_EINVAL, "%s[%zu]: empty; a value is 1 byte or more", what, i);
      goto fail;
    }
  }
  Py_DECREF(tup);
  return 0;
fail:
  Py_DECREF(tup);
  views_release(vw);
  return -1;
}

static PyObject *status_list(const kvbm_volume_op *ops, size_t n, bool sizes) {
  PyObject *list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; list && i < n; i++) {
    long long r = ops[i].status == KVBM_OK && sizes ? (long long)ops[i].size : ops[i].status;
    PyObject *x = PyLong_FromLongLong(r);
    if (!x) Py_CLEAR(list);
    else PyList_SET_ITEM(list, (Py_ssize_t)i, x);
  }
  return list;
}

/* ------------------------------------------------------ framed values */

static void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Where a framed chunk starting at op `i` ends: scratch bounded by
 * SCRATCH_CHUNK, at least one op. *bytes: the chunk's scratch size. */
static size_t chunk_end(const Py_buffer *b, size_t i, size_t n, size_t *bytes) {
  size_t j = i, sum = 0;
  while (j < n) {
    size_t need = (size_t)b[j].len + FRAME_OVERHEAD;
    if (j > i && sum + need > SCRATCH_CHUNK) break;
    sum += need;
    j++;
  }
  *bytes = sum;
  return j;
}

/* A scratch of at least `bytes` (GIL held): the kept one when it is large
 * enough, else a new one. Fresh memory costs a page fault per 4 KiB (the
 * kernel zeroes it) and the munmap: about as much as the copy it serves. */
static uint8_t *scratch_take(VolumeObject *self, size_t bytes, size_t *cap) {
  if (self->spare && self->spare_cap >= bytes) {
    uint8_t *p = self->spare;
    *cap = self->spare_cap;
    self->spare = NULL;
    return p;
  }
  *cap = bytes;
  return PyMem_RawMalloc(bytes);
}

/* Keeps the larger of the returned scratch and the kept one (GIL held). */
static void scratch_give(VolumeObject *self, uint8_t *p, size_t cap) {
  if (!p) return;
  if (self->spare && self->spare_cap >= cap) {
    PyMem_RawFree(p);
    return;
  }
  PyMem_RawFree(self->spare);
  self->spare = p;
  self->spare_cap = cap;
}

/* Per-op state of a framed chunk (allocated with the GIL, used without). */
typedef struct frame_work {
  kvbm_blake3_job *jobs;
  uint8_t (*sums)[KVBM_FRAME_CHECKSUM_LEN];
  kvbm_frame_header *hdr;
  size_t *job_of; /* op -> its job, or SIZE_MAX */
} frame_work;

static void work_free(frame_work *w) {
  PyMem_Free(w->jobs);
  PyMem_Free(w->sums);
  PyMem_Free(w->hdr);
  PyMem_Free(w->job_of);
}

static int work_alloc(frame_work *w, size_t n) {
  size_t m = n ? n : 1;
  w->jobs = PyMem_Calloc(m, sizeof *w->jobs);
  w->sums = PyMem_Calloc(m, sizeof *w->sums);
  w->hdr = PyMem_Calloc(m, sizeof *w->hdr);
  w->job_of = PyMem_Calloc(m, sizeof *w->job_of);
  if (w->jobs && w->sums && w->hdr && w->job_of) return 0;
  work_free(w);
  PyErr_NoMemory();
  return -1;
}

/* Hashes the jobs on the volume's BLAKE3 pool (its workers and this
 * thread); with 0 workers, on this thread alone. */
static int hash_jobs(kvbm_blake3_pool *pool, const kvbm_blake3_job *jobs, size_t n) {
  uint64_t ticket;
  if (n == 0) return KVBM_OK;
  int rc = kvbm_blake3_pool_submit(pool, jobs, n, &ticket, NULL);
  return rc ? rc : kvbm_blake3_pool_wait(pool, ticket, NULL);
}

/* Builds the frames of ops i..j into scratch (no GIL needed): payloads and
 * checks copied in, the bodies hashed together, then the headers. */
static int frames_encode(kvbm_volume_op *ops, const Py_buffer *b, const uint64_t *checks,
                         int phase, size_t i, size_t j, uint8_t *scratch, frame_work *w,
                         kvbm_blake3_pool *pool) {
  for (size_t k = i; k < j; k++) {
    size_t len = (size_t)b[k].len;
    uint8_t *f = scratch;
    scratch += len + FRAME_OVERHEAD;
    put_le64(f + KVBM_FRAME_HEADER_LEN, checks ? checks[k] : 0);
    memcpy(f + FRAME_OVERHEAD, b[k].buf, len);
    w->jobs[k - i] = (kvbm_blake3_job){f + KVBM_FRAME_HEADER_LEN, len + CHECK_LEN, w->sums[k - i],
                                       KVBM_FRAME_CHECKSUM_LEN};
    ops[k].src = f;
    ops[k].len = len + FRAME_OVERHEAD;
  }
  int rc = hash_jobs(pool, w->jobs, j - i);
  if (rc) return rc;
  for (size_t k = i; k < j; k++) /* cannot fail: phase and length were checked */
    kvbm_frame_encode_header_sum((kvbm_frame_phase)phase, ops[k].len - KVBM_FRAME_HEADER_LEN,
                                 w->sums[k - i], (uint8_t *)ops[k].src, NULL);
  return KVBM_OK;
}

typedef struct frame_counts {
  uint64_t ok, corrupt, wrong_size, foreign;
} frame_counts;

/* The checks of one fetched frame before its hash: header, lengths.
 * KVBM_OK: hash the body. */
static int frame_precheck(kvbm_volume_op *op, size_t want, kvbm_frame_header *h,
                          frame_counts *fc) {
  if (op->status == KVBM_ENOSPC) { /* longer than this key's frame can be */
    fc->wrong_size++;
    return op->status = KVBM_ETOOLONG;
  }
  if (op->status != KVBM_OK) return op->status; /* a miss the volume reported */
  size_t max = want + CHECK_LEN > UINT32_MAX ? UINT32_MAX : want + CHECK_LEN;
  int rc = kvbm_frame_parse_header(op->dst, op->size, (uint32_t)max, h, NULL);
  if (rc == KVBM_OK && op->size - KVBM_FRAME_HEADER_LEN < h->body_len)
    rc = KVBM_ETRUNCATED; /* a body shorter than declared: a torn value */
  if (rc != KVBM_OK && rc != KVBM_ETOOLONG) {
    fc->corrupt++;
    return op->status = rc;
  }
  if (rc == KVBM_ETOOLONG || op->size - KVBM_FRAME_HEADER_LEN > h->body_len ||
      h->body_len != want + CHECK_LEN) {
    fc->wrong_size++;
    return op->status = rc == KVBM_OK && h->body_len < want + CHECK_LEN ? KVBM_ETRUNCATED
                                                                       : KVBM_ETOOLONG;
  }
  return KVBM_OK;
}

/* Verifies the frames ops i..j fetched into scratch (bodies hashed
 * together) and copies each good payload into its buffer (no GIL needed).
 * A failure sets the op's status and leaves its buffer untouched. */
static void frames_decode(kvbm_volume_op *ops, const Py_buffer *b, const uint64_t *checks,
                          size_t i, size_t j, frame_counts *fc, frame_work *w,
                          kvbm_blake3_pool *pool) {
  size_t nj = 0;
  for (size_t k = i; k < j; k++) {
    w->job_of[k - i] = SIZE_MAX;
    if (frame_precheck(&ops[k], (size_t)b[k].len, &w->hdr[k - i], fc) != KVBM_OK) continue;
    w->jobs[nj] = (kvbm_blake3_job){(uint8_t *)ops[k].dst + KVBM_FRAME_HEADER_LEN,
                                    w->hdr[k - i].body_len, w->sums[nj], KVBM_FRAME_CHECKSUM_LEN};
    w->job_of[k - i] = nj++;
  }
  int hrc = hash_jobs(pool, w->jobs, nj);
  for (size_t k = i; k < j; k++) {
    kvbm_volume_op *op = &ops[k];
    if (w->job_of[k - i] == SIZE_MAX) continue;
    const uint8_t *body = (const uint8_t *)op->dst + KVBM_FRAME_HEADER_LEN;
    size_t want = (size_t)b[k].len;
    int rc = hrc ? hrc
                 : kvbm_frame_check_sum(&w->hdr[k - i], want + CHECK_LEN, w->sums[w->job_of[k - i]],
                                        NULL);
    if (rc != KVBM_OK) {
      op->status = rc;
      fc->corrupt++;
    } else if (get_le64(body) != (checks ? checks[k] : 0)) {
      op->status = KVBM_EFORMAT; /* another name's value under a colliding key */
      fc->foreign++;
    } else {
      memcpy(b[k].buf, body + CHECK_LEN, want);
      op->size = want;
      fc->ok++;
    }
  }
}

/* --------------------------------------------------------- lifecycle */

static int opt_u64(PyObject *o, const char *what, uint64_t max, uint64_t *out) {
  return o ? kvbmpy_uint(o, what, max, out) : 0;
}

static PyObject *vol_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"url", "namespace", "name", "timeout_ms", "threads", "queue_capacity",
                           "max_value_bytes", "slots", "block_bytes", "persist", "disk_key",
                           "cluster_refresh_ms", "hash_threads", NULL};
  PyObject *urlo, *nso = NULL, *nameo = Py_None, *to = NULL, *tho = NULL, *qo = NULL, *mo = NULL,
                  *so = NULL, *bo = NULL, *dko = Py_None, *cro = NULL, *hto = NULL;
  int persist = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OOOOOOOOpOOO:Volume", kwlist, &urlo, &nso, &nameo,
                                   &to, &tho, &qo, &mo, &so, &bo, &persist, &dko, &cro, &hto))
    return NULL;
  const char *url, *ns = "", *name = NULL;
  if (kvbmpy_str(urlo, "url", &url) || (nso && kvbmpy_str(nso, "namespace", &ns)) ||
      (nameo != Py_None && kvbmpy_str(nameo, "name", &name)))
    return NULL;
  kvbm_volume_config cfg = kvbm_volume_config_default(url);
  uint64_t t = 0, th = 0, q = 0, m = 0, s = 0, bb = 0, cr = 0, ht = 0;
  if (opt_u64(to, "timeout_ms", INT32_MAX, &t) || opt_u64(tho, "threads", UINT32_MAX, &th) ||
      opt_u64(qo, "queue_capacity", UINT32_MAX, &q) ||
      opt_u64(mo, "max_value_bytes", UINT64_MAX, &m) || opt_u64(so, "slots", UINT64_MAX, &s) ||
      opt_u64(bo, "block_bytes", UINT64_MAX, &bb) ||
      opt_u64(cro, "cluster_refresh_ms", UINT32_MAX, &cr) ||
      opt_u64(hto, "hash_threads", KVBM_BLAKE3_POOL_MAX_THREADS, &ht))
    return NULL;
  cfg.key_namespace = ns;
  cfg.name = name;
  if (t) cfg.timeout_ms = (int)t;
  if (th) cfg.threads = (uint32_t)th;
  if (q) cfg.queue_capacity = (uint32_t)q;
  if (m) cfg.max_value_bytes = m;
  cfg.slots = s;
  cfg.block_bytes = bb;
  cfg.persist = persist;
  cfg.cluster_refresh_ms = (uint32_t)cr;
  Py_buffer key = {0};
  if (dko != Py_None) {
    if (PyObject_GetBuffer(dko, &key, PyBUF_SIMPLE) < 0) {
      PyErr_Clear();
      return PyErr_Format(PyExc_TypeError, "disk_key: expected bytes, got %.100s",
                          Py_TYPE(dko)->tp_name);
    }
    cfg.disk_key = key.buf;
    cfg.disk_key_len = (size_t)key.len;
  }
  VolumeObject *self = (VolumeObject *)type->tp_alloc(type, 0);
  if (!self) {
    if (dko != Py_None) PyBuffer_Release(&key);
    return NULL;
  }
  kvbm_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS /* disk:// may read its slot file */
  rc = kvbm_volume_register(&cfg, &self->v, &err);
  Py_END_ALLOW_THREADS
  if (dko != Py_None) PyBuffer_Release(&key);
  if (rc == KVBM_OK) rc = kvbm_blake3_pool_create((unsigned)ht, 0, &self->hasher, &err);
  if (rc) {
    Py_DECREF(self);
    return kvbmpy_raise_kvbm(rc, &err, "Volume");
  }
  self->max_value = cfg.max_value_bytes;
  self->timeout_ms = cfg.timeout_ms;
  self->name = PyUnicode_FromString(kvbm_volume_name(self->v));
  self->url = PyUnicode_FromString(kvbm_volume_url(self->v));
  self->mode = PyUnicode_FromString(kvbm_volume_mode(self->v));
  if (!self->name || !self->url || !self->mode) {
    Py_DECREF(self);
    return NULL;
  }
  return (PyObject *)self;
}

static void vol_dealloc(VolumeObject *self) {
  /* No call can be in flight: each holds a reference. */
  kvbm_volume_unregister(self->v);
  kvbm_blake3_pool_destroy(self->hasher);
  PyMem_RawFree(self->spare);
  Py_XDECREF(self->name);
  Py_XDECREF(self->url);
  Py_XDECREF(self->mode);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *vol_close(VolumeObject *self, PyObject *unused) {
  (void)unused;
  if (!self->v) Py_RETURN_NONE;
  if (self->closing) return kvbmpy_busy("Volume (closing on another thread)");
  self->closing = true; /* new calls raise ClosedError */
  while (self->calls) {
    Py_BEGIN_ALLOW_THREADS
    sleep_ms(1);
    Py_END_ALLOW_THREADS
  }
  kvbm_volume *v = self->v;
  kvbm_volume_stats_get(v, &self->final_st);
  self->final_ok = true;
  Py_BEGIN_ALLOW_THREADS
  kvbm_volume_unregister(v);
  Py_END_ALLOW_THREADS
  self->v = NULL;
  self->closing = false;
  kvbm_blake3_pool_destroy(self->hasher); /* no call is in progress */
  self->hasher = NULL;
  PyMem_RawFree(self->spare);
  self->spare = NULL;
  self->spare_cap = 0;
  Py_RETURN_NONE;
}

static PyObject *vol_enter(VolumeObject *self, PyObject *unused) {
  (void)unused;
  if (vol_open(self)) return NULL;
  return Py_NewRef(self);
}

static PyObject *vol_exit(VolumeObject *self, PyObject *args) {
  (void)args;
  return vol_close(self, NULL);
}

/* ------------------------------------------------------------ batches */

static PyObject *vol_put(VolumeObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"keys", "values", "framed", "checks", "phase", NULL};
  PyObject *ko, *vo, *co = Py_None;
  int framed = 0, phase = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$pOi:put", kwlist, &ko, &vo, &framed, &co, &phase))
    return NULL;
  uint64_t *keys = NULL, *checks = NULL;
  size_t n;
  views vw = {0};
  kvbm_volume_op *ops = NULL;
  PyObject *res = NULL;
  bool counted = false;
  if (get_keys(ko, &keys, &n) || get_checks(co, framed, n, &checks) ||
      views_get(vo, "values", n, false, &vw))
    goto out;
  if (framed && (phase < 0 || phase >= KVBM_FRAME_PHASE_COUNT)) {
    kvbmpy_raise(KVBM_EPHASE, "phase: %d is not a phase label (0..2)", phase);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t len = (uint64_t)vw.v[i].len + (framed ? FRAME_OVERHEAD : 0);
    if (len > self->max_value || (framed && len - KVBM_FRAME_HEADER_LEN > UINT32_MAX)) {
      kvbmpy_raise(KVBM_ETOOLONG, "values[%zu]: %llu bytes%s, above the volume's max_value_bytes %llu",
                   i, (unsigned long long)len, framed ? " framed" : "",
                   (unsigned long long)self->max_value);
      goto out;
    }
  }
  if (batch_begin(self, n, &ops, &counted, &res) <= 0) goto out;
  for (size_t i = 0; i < n; i++)
    ops[i] = (kvbm_volume_op){.kind = KVBM_VOLUME_PUT, .key = keys[i], .src = vw.v[i].buf,
                              .len = (size_t)vw.v[i].len};
  kvbm_error err = {0};
  int rc = KVBM_OK;
  if (!framed) {
    rc = run_batch(self, ops, n, &err);
  } else {
    frame_work w;
    if (work_alloc(&w, n)) goto out;
    for (size_t i = 0; i < n && rc == KVBM_OK;) {
      size_t bytes, cap, j = chunk_end(vw.v, i, n, &bytes);
      uint8_t *scratch = scratch_take(self, bytes, &cap);
      if (!scratch) {
        work_free(&w);
        PyErr_NoMemory();
        goto out;
      }
      kvbm_blake3_pool *pool = self->hasher;
      Py_BEGIN_ALLOW_THREADS
      rc = frames_encode(ops, vw.v, checks, phase, i, j, scratch, &w, pool);
      Py_END_ALLOW_THREADS
      if (rc == KVBM_OK) rc = run_batch(self, ops + i, j - i, &err);
      scratch_give(self, scratch, cap);
      for (size_t k = i; k < j; k++) ops[k].src = NULL; /* scratch is gone */
      i = j;
    }
    work_free(&w);
  }
  if (rc) kvbmpy_raise_kvbm(rc, &err, "Volume.put");
  else res = status_list(ops, n, false);
out:
  if (counted) call_end(self);
  views_release(&vw);
  PyMem_Free(ops);
  PyMem_Free(keys);
  PyMem_Free(checks);
  return res;
}

static PyObject *vol_get_into(VolumeObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"keys", "buffers", "framed", "checks", NULL};
  PyObject *ko, *bo, *co = Py_None;
  int framed = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$pO:get_into", kwlist, &ko, &bo, &framed, &co))
    return NULL;
  uint64_t *keys = NULL, *checks = NULL;
  size_t n;
  views vw = {0};
  kvbm_volume_op *ops = NULL;
  PyObject *res = NULL;
  bool counted = false;
  if (get_keys(ko, &keys, &n) || get_checks(co, framed, n, &checks) ||
      views_get(bo, "buffers", n, true, &vw))
    goto out;
  if (batch_begin(self, n, &ops, &counted, &res) <= 0) goto out;
  kvbm_error err = {0};
  int rc = KVBM_OK;
  if (!framed) {
    for (size_t i = 0; i < n; i++)
      ops[i] = (kvbm_volume_op){.kind = KVBM_VOLUME_GET, .key = keys[i], .dst = vw.v[i].buf,
                                .cap = (size_t)vw.v[i].len};
    rc = run_batch(self, ops, n, &err);
  } else {
    frame_counts fc = {0};
    frame_work w;
    if (work_alloc(&w, n)) goto out;
    kvbm_blake3_pool *pool = self->hasher;
    for (size_t i = 0; i < n && rc == KVBM_OK;) {
      size_t bytes, cap, j = chunk_end(vw.v, i, n, &bytes);
      uint8_t *scratch = scratch_take(self, bytes, &cap), *p = scratch;
      if (!scratch) {
        work_free(&w);
        PyErr_NoMemory();
        goto out;
      }
      for (size_t k = i; k < j; k++) {
        size_t cap = (size_t)vw.v[k].len + FRAME_OVERHEAD;
        ops[k] = (kvbm_volume_op){.kind = KVBM_VOLUME_GET, .key = keys[k], .dst = p, .cap = cap};
        p += cap;
      }
      rc = run_batch(self, ops + i, j - i, &err);
      if (rc == KVBM_OK) {
        Py_BEGIN_ALLOW_THREADS
        frames_decode(ops, vw.v, checks, i, j, &fc, &w, pool);
        Py_END_ALLOW_THREADS
      }
      scratch_give(self, scratch, cap);
      for (size_t k = i; k < j; k++) ops[k].dst = NULL;
      i = j;
    }
    work_free(&w);
    self->frames_ok += fc.ok;
    self->frames_corrupt += fc.corrupt;
    self->frames_wrong_size += fc.wrong_size;
    self->frames_foreign += fc.foreign;
  }
  if (rc) kvbmpy_raise_kvbm(rc, &err, "Volume.get_into");
  else res = status_list(ops, n, true);
out:
  if (counted) call_end(self);
  views_release(&vw);
  PyMem_Free(ops);
  PyMem_Free(keys);
  PyMem_Free(checks);
  return res;
}

/* get(): each value into a new bytes object, sized by a first try of
 * size_hint bytes and, for the values that did not fit, a second batch of
 * exactly the size the volume reported. */
static PyObject *vol_get(VolumeObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"keys", "size_hint", NULL};
  PyObject *ko, *ho = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:get", kwlist, &ko, &ho)) return NULL;
  uint64_t *keys = NULL, hint = 65536;
  size_t n;
  if (get_keys(ko, &keys, &n)) return NULL;
  if (ho && kvbmpy_uint(ho, "size_hint", 1ull << 40, &hint)) {
    PyMem_Free(keys);
    return NULL;
  }
  if (hint == 0) hint = 1;
  kvbm_volume_op *ops = PyMem_Calloc(n ? n : 1, sizeof *ops);
  size_t *idx = PyMem_Calloc(n ? n : 1, sizeof *idx); /* op -> key of this round */
  PyObject **vals = PyMem_Calloc(n ? n : 1, sizeof *vals);
  PyObject *res = NULL;
  bool counted = false;
  if (!ops || !idx || !vals) {
    PyErr_NoMemory();
    goto out;
  }
  if (call_begin(self)) goto out;
  counted = true;
  if (hint > self->max_value) hint = self->max_value;
  size_t m = n; /* ops of this round */
  for (size_t i = 0; i < n; i++) {
    vals[i] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)hint);
    if (!vals[i]) goto out;
    idx[i] = i;
    ops[i] = (kvbm_volume_op){.kind = KVBM_VOLUME_GET, .key = keys[i],
                              .dst = PyBytes_AS_STRING(vals[i]), .cap = (size_t)hint};
  }
  for (int round = 0; round < 2 && m; round++) {
    kvbm_error err = {0};
    int rc = run_batch(self, ops, m, &err);
    if (rc) {
      kvbmpy_raise_kvbm(rc, &err, "Volume.get");
      goto out;
    }
    size_t again = 0;
    for (size_t o = 0; o < m; o++) {
      kvbm_volume_op op = ops[o];
      size_t i = idx[o];
      if (op.status == KVBM_ENOSPC && round == 0 && op.size > op.cap &&
          op.size <= self->max_value) { /* did not fit: once more, exactly sized */
        Py_SETREF(vals[i], PyBytes_FromStringAndSize(NULL, (Py_ssize_t)op.size));
        if (!vals[i]) goto out;
        idx[again] = i;
        ops[again++] = (kvbm_volume_op){.kind = KVBM_VOLUME_GET, .key = keys[i],
                                        .dst = PyBytes_AS_STRING(vals[i]), .cap = op.size};
      } else if (op.status == KVBM_OK) {
        if (_PyBytes_Resize(&vals[i], (Py_ssize_t)op.size) < 0) goto out;
      } else {
        Py_SETREF(vals[i], Py_NewRef(Py_None));
      }
    }
    m = again;
  }
  res = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; res && i < n; i++) {
    PyList_SET_ITEM(res, (Py_ssize_t)i, vals[i]);
    vals[i] = NULL;
  }
out:
  if (counted) call_end(self);
  for (size_t i = 0; vals && i < n; i++) Py_XDECREF(vals[i]);
  PyMem_Free(vals);
  PyMem_Free(idx);
  PyMem_Free(ops);
  PyMem_Free(keys);
  return res;
}

static PyObject *bool_batch(VolumeObject *self, PyObject *ko, kvbm_volume_op_kind kind,
                            const char *what) {
  uint64_t *keys = NULL;
  size_t n;
  if (get_keys(ko, &keys, &n)) return NULL;
  kvbm_volume_op *ops = NULL;
  PyObject *res = NULL;
  bool counted = false;
  if (batch_begin(self, n, &ops, &counted, &res) <= 0) goto out;
  for (size_t i = 0; i < n; i++) ops[i] = (kvbm_volume_op){.kind = kind, .key = keys[i]};
  kvbm_error err = {0};
  int rc = run_batch(self, ops, n, &err);
  if (rc) {
    kvbmpy_raise_kvbm(rc, &err, what);
    goto out;
  }
  res = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; res && i < n; i++)
    PyList_SET_ITEM(res, (Py_ssize_t)i, PyBool_FromLong(ops[i].status == KVBM_OK));
out:
  if (counted) call_end(self);
  PyMem_Free(ops);
  PyMem_Free(keys);
  return res;
}

static PyObject *vol_exists(VolumeObject *self, PyObject *keys) {
  return bool_batch(self, keys, KVBM_VOLUME_EXISTS, "Volume.exists");
}

static PyObject *vol_delete(VolumeObject *self, PyObject *keys) {
  return bool_batch(self, keys, KVBM_VOLUME_DELETE, "Volume.delete");
}

static PyObject *vol_stats(VolumeObject *self, PyObject *unused) {
  (void)unused;
  kvbm_volume_stats s;
  if (self->v && !self->closing) kvbm_volume_stats_get(self->v, &s);
  else if (self->final_ok) s = self->final_st;
  else return kvbmpy_closed("Volume");
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  const struct {
    const char *k;
    uint64_t v;
  } f[] = {{"puts", s.puts}, {"gets", s.gets}, {"hits", s.hits}, {"misses", s.misses},
           {"exists", s.exists}, {"deletes", s.deletes}, {"bytes_put", s.bytes_put},
           {"bytes_got", s.bytes_got}, {"timeouts", s.timeouts}, {"io_errors", s.io_errors},
           {"full", s.full}, {"corrupt", s.corrupt}, {"rejected", s.rejected},
           {"reconnects", s.reconnects}, {"queued", s.queued},
           {"slot_refreshes", s.slot_refreshes}, {"slot_refreshes_limited", s.slot_refreshes_limited},
           {"redirect_loops", s.redirect_loops}, {"slot_maps_refused", s.slot_maps_refused},
           {"frames_ok", self->frames_ok}, {"frames_corrupt", self->frames_corrupt},
           {"frames_wrong_size", self->frames_wrong_size}, {"frames_foreign", self->frames_foreign}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (kvbmpy_dict_u64(d, f[i].k, f[i].v)) {
      Py_DECREF(d);
      return NULL;
    }
  return d;
}

static PyObject *vol_repr(VolumeObject *self) {
  return PyUnicode_FromFormat("<kvbm.Volume %R%s>", self->url, self->v ? "" : " closed");
}

static PyObject *get_closed(VolumeObject *self, void *c) {
  (void)c;
  return PyBool_FromLong(self->v == NULL);
}

static PyObject *get_calls(VolumeObject *self, void *c) {
  (void)c;
  return PyLong_FromUnsignedLong(self->calls);
}

static PyMemberDef vol_members[] = {
  {"name", T_OBJECT_EX, offsetof(VolumeObject, name), READONLY,
   "The volume's id in storage events (the URL without user info by default)."},
  {"url", T_OBJECT_EX, offsetof(VolumeObject, url), READONLY, "The URL without user info."},
  {"mode", T_OBJECT_EX, offsetof(VolumeObject, mode), READONLY,
   "How the backend runs ('io_uring+O_DIRECT', ...; '' when it does not say)."},
  {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef vol_getset[] = {
  {"closed", (getter)get_closed, NULL, "Whether close() has run.", NULL},
  {"calls", (getter)get_calls, NULL, "Calls in progress now (on any thread).", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef vol_methods[] = {
  {"put", (PyCFunction)(void (*)(void))vol_put, METH_VARARGS | METH_KEYWORDS,
   "put(keys, values, *, framed=False, checks=None, phase=0) -> list[int]\n\n"
   "Stores each value (a contiguous buffer, read in place) under its key;\n"
   "0 or a negative kvbm status per key. framed=True stores an MRDN frame\n"
   "whose body is the 8-byte check (checks[i], default 0) and the value."},
  {"get_into", (PyCFunction)(void (*)(void))vol_get_into, METH_VARARGS | METH_KEYWORDS,
   "get_into(keys, buffers, *, framed=False, checks=None) -> list[int]\n\n"
   "Reads each value straight into its writable buffer; per key the value's\n"
   "size, or a negative kvbm status (a miss). framed=True: the frame must\n"
   "verify, carry checks[i] and hold exactly len(buffer) bytes, else a miss\n"
   "and the buffer is untouched."},
  {"get", (PyCFunction)(void (*)(void))vol_get, METH_VARARGS | METH_KEYWORDS,
   "get(keys, size_hint=65536) -> list[Optional[bytes]]\n\n"
   "Each value as new bytes, None for a miss."},
  {"exists", (PyCFunction)vol_exists, METH_O, "exists(keys) -> list[bool]"},
  {"delete", (PyCFunction)vol_delete, METH_O, "delete(keys) -> list[bool] (False: there was none)"},
  {"stats", (PyCFunction)vol_stats, METH_NOARGS,
   "stats() -> dict[str, int]: the volume's counters and the framed gets' checks."},
  {"close", (PyCFunction)vol_close, METH_NOARGS,
   "close(): waits for batches running on other threads, then unregisters."},
  {"__enter__", (PyCFunction)vol_enter, METH_NOARGS, NULL},
  {"__exit__", (PyCFunction)vol_exit, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL},
};

static PyTypeObject VolumeType = {
  PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvbm.Volume",
  .tp_basicsize = sizeof(VolumeObject),
  .tp_dealloc = (destructor)vol_dealloc,
  .tp_repr = (reprfunc)vol_repr,
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "Volume(url, *, namespace='', name=None, timeout_ms=1000, threads=1,\n"
            "       queue_capacity=256, max_value_bytes=64 MiB, slots=0, block_bytes=0,\n"
            "       persist=False, disk_key=None, cluster_refresh_ms=100, hash_threads=0)\n\n"
            "A store of values by 64-bit key (kvbm/volume.h): disk:///DIR (needs slots\n"
            "and block_bytes), file:///DIR, redis://HOST:PORT,\n"
            "redis+cluster://HOST:PORT[,HOST:PORT...]. Batches run with the GIL released.",
  .tp_methods = vol_methods,
  .tp_members = vol_members,
  .tp_getset = vol_getset,
  .tp_new = vol_new,
};

int kvbmpy_volume_init(PyObject *m) {
  if (PyType_Ready(&VolumeType) < 0) return -1;
  return PyModule_AddObjectRef(m, "Volume", (PyObject *)&VolumeType);
}
