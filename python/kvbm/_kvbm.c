/* SPDX-License-Identifier: Apache-2.0 */
/*
 * _kvbm.c: the CPython extension kvbm._kvbm, written over kvbm's public C
 * API only (include/kvbm/ headers). This file holds the module itself, the
 * kvbm.Error hierarchy and the argument converters every part uses; the
 * parts live one per file (_kvbm_hash.c, _kvbm_pool.c, _kvbm_manager.c,
 * _kvbm_events.c, _kvbm_router.c, _kvbm_volume.c) and each adds its types and functions to
 * the module at import.
 *
 * Errors. Every kvbm status has one exception class, all deriving from
 * kvbm.Error, which carries `.status` ("KVBM_ENOSPC"), `.code` (-5) and
 * `.message` (kvbm's text, e.g. the kvbm_error message naming what was
 * wrong). Where Python has an obvious builtin counterpart the class derives
 * from it too, so idiomatic handlers work: InvalidArgumentError is a
 * ValueError, RangeError an IndexError, TimedOutError a TimeoutError,
 * NotFoundError a LookupError, IoError an OSError, NoMemoryError a
 * MemoryError. The malformed-input statuses (truncated, too long, bad
 * magic, version, padding) derive from FormatError. Two conditions are the
 * binding's own and map onto kvbm's vocabulary: an object used after
 * close()/destroy() raises ClosedError (KVBM_ECLOSED), and an object used
 * from a second thread while a first one is inside a call that released
 * the GIL raises BusyError, a StateError (KVBM_ESTATE).
 *
 * Process-wide state: only the type and exception objects created once at
 * import (single-phase initialisation, as CPython's own modules of that
 * kind); nothing changes them afterwards.
 *
 * Tokens. kvbm takes u32 token ids. Any buffer of 4-byte unsigned items in
 * native order (numpy uint32, array('I'), memoryview.cast('I')) is used in
 * place, without a copy (a strided one is gathered); any other iterable of
 * ints is copied, each value checked to be a uint32. A buffer of another
 * format (bytes, int64 arrays) is a TypeError rather than a silent
 * reinterpretation.
 */
#include "_kvbm.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#ifndef KVBMPY_VERSION
#define KVBMPY_VERSION "0"
#endif

/* ------------------------------------------------------------ errors */

typedef struct errclass {
  int code;             /* kvbm status, or KVBMPY_BUSY */
  const char *name;     /* class name in module kvbm */
  int parent;           /* index of the kvbm parent in this table, -1: Error */
  PyObject **builtin;   /* a builtin base as well, or NULL */
  const char *doc;
} errclass;

/* Parents come before children. */
static const errclass ERRCLASSES[] = {
  {KVBM_EINVAL, "InvalidArgumentError", -1, &PyExc_ValueError,
   "An argument is out of range or inconsistent (KVBM_EINVAL)."},
  {KVBM_ENOMEM, "NoMemoryError", -1, &PyExc_MemoryError, "An allocation failed (KVBM_ENOMEM)."},
  {KVBM_EOVERFLOW, "SizeOverflowError", -1, &PyExc_OverflowError,
   "A size computation would overflow (KVBM_EOVERFLOW)."},
  {KVBM_ESTATE, "StateError", -1, NULL,
   "An operation not allowed in the object's state (KVBM_ESTATE)."},
  {KVBM_ENOSPC, "NoSpaceError", -1, NULL,
   "Not enough free blocks, slots or space (KVBM_ENOSPC); nothing was changed."},
  {KVBM_ENOTFOUND, "NotFoundError", -1, &PyExc_LookupError,
   "No such key, block or handle (KVBM_ENOTFOUND)."},
  {KVBM_EFORMAT, "FormatError", -1, &PyExc_ValueError,
   "Malformed input: a parse error or a wrong type inside it (KVBM_EFORMAT)."},
  {KVBM_ETRUNCATED, "TruncatedError", 6, NULL, "Input shorter than it declares (KVBM_ETRUNCATED)."},
  {KVBM_ETOOLONG, "TooLongError", 6, NULL,
   "Input longer than it declares or than allowed (KVBM_ETOOLONG)."},
  {KVBM_EVERSION, "VersionError", 6, NULL, "Unknown format version (KVBM_EVERSION)."},
  {KVBM_ECHECKSUM, "ChecksumError", -1, NULL,
   "A checksum does not match the bytes (KVBM_ECHECKSUM)."},
  {KVBM_EIO, "IoError", -1, &PyExc_OSError, "An I/O call failed (KVBM_EIO)."},
  {KVBM_EAGAIN, "WouldBlockError", -1, NULL,
   "The call would block, or its input was dropped; try again (KVBM_EAGAIN)."},
  {KVBM_EUNSUPPORTED, "UnsupportedError", -1, NULL,
   "Not available in this build or on this machine (KVBM_EUNSUPPORTED)."},
  {KVBM_ECLOSED, "ClosedError", -1, NULL,
   "The object is shut down, closed or destroyed (KVBM_ECLOSED)."},
  {KVBM_ETIMEDOUT, "TimedOutError", -1, &PyExc_TimeoutError,
   "A wait ran out of time (KVBM_ETIMEDOUT)."},
  {KVBM_EMAGIC, "MagicError", 6, NULL, "Wrong magic number (KVBM_EMAGIC)."},
  {KVBM_EPADDING, "PaddingError", 6, NULL, "Reserved bytes are not zero (KVBM_EPADDING)."},
  {KVBM_ETIER, "TierError", -1, &PyExc_ValueError, "Unknown or absent tier (KVBM_ETIER)."},
  {KVBM_EEXIST, "ExistsError", -1, NULL, "Already present (KVBM_EEXIST)."},
  {KVBM_EPROTO, "ProtocolError", -1, NULL, "A peer broke the protocol (KVBM_EPROTO)."},
  {KVBM_ERANGE, "RangeError", -1, &PyExc_IndexError,
   "An index or access outside a region (KVBM_ERANGE)."},
  {KVBM_EDEVICE, "DeviceError", -1, NULL, "No device, or a device call failed (KVBM_EDEVICE)."},
  {KVBM_EAUTH, "AuthError", -1, NULL, "A peer failed to prove the shared key (KVBM_EAUTH)."},
  {KVBM_EPHASE, "PhaseError", -1, &PyExc_ValueError,
   "Unknown phase label: a frame's byte 12 is 0..2 (KVBM_EPHASE)."},
  {KVBM_EDISAGG, "DisaggregationUnavailableError", -1, NULL,
   "Disaggregation unavailable: the manager has no fabric attached (KVBM_EDISAGG)."},
  {KVBMPY_BUSY, "BusyError", 3, NULL,
   "The object is in use by another thread (a call that released the GIL is still\n"
   "running on it). Carries status KVBM_ESTATE."},
};
#define NERR (sizeof ERRCLASSES / sizeof ERRCLASSES[0])

static PyObject *err_base;          /* kvbm.Error */
static PyObject *err_class[NERR];

static const char ERROR_DOC[] =
    "Base of every error kvbm raises.\n\n"
    "Attributes:\n"
    "  status   the kvbm status name, e.g. 'KVBM_ENOSPC'\n"
    "  code     its integer value, e.g. -5\n"
    "  message  kvbm's message naming what was wrong\n";

int kvbmpy_errors_init(PyObject *module) {
  err_base = PyErr_NewExceptionWithDoc("kvbm.Error", ERROR_DOC, PyExc_Exception, NULL);
  if (!err_base || PyModule_AddObjectRef(module, "Error", err_base) < 0) return -1;
  for (size_t i = 0; i < NERR; i++) {
    const errclass *e = &ERRCLASSES[i];
    PyObject *parent = e->parent < 0 ? err_base : err_class[e->parent];
    PyObject *bases = e->builtin ? PyTuple_Pack(2, parent, *e->builtin) : PyTuple_Pack(1, parent);
    if (!bases) return -1;
    char qual[64];
    snprintf(qual, sizeof qual, "kvbm.%s", e->name);
    err_class[i] = PyErr_NewExceptionWithDoc(qual, e->doc, bases, NULL);
    Py_DECREF(bases);
    if (!err_class[i] || PyModule_AddObjectRef(module, e->name, err_class[i]) < 0) return -1;
  }
  return 0;
}

static size_t err_index(int code) {
  for (size_t i = 0; i < NERR; i++)
    if (ERRCLASSES[i].code == code) return i;
  return NERR;
}

static PyObject *raise_text(int code, const char *text) {
  size_t i = err_index(code);
  PyObject *cls = i < NERR ? err_class[i] : err_base;
  int status = code == KVBMPY_BUSY ? KVBM_ESTATE : code;
  const char *name = kvbm_status_name(status);
  PyObject *str = PyUnicode_FromFormat("%s (%s)", text, name);
  if (!str) return NULL;
  PyObject *exc = PyObject_CallOneArg(cls, str);
  Py_DECREF(str);
  if (!exc) return NULL;
  PyObject *st = PyUnicode_FromString(name), *cd = PyLong_FromLong(status),
           *msg = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
  if (st && cd && msg && PyObject_SetAttrString(exc, "status", st) == 0 &&
      PyObject_SetAttrString(exc, "code", cd) == 0 &&
      PyObject_SetAttrString(exc, "message", msg) == 0)
    PyErr_SetObject(cls, exc);
  Py_XDECREF(st);
  Py_XDECREF(cd);
  Py_XDECREF(msg);
  Py_DECREF(exc);
  return NULL;
}

PyObject *kvbmpy_raise(int code, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return raise_text(code, buf);
}

PyObject *kvbmpy_raise_kvbm(int code, const kvbm_error *err, const char *what) {
  const char *text = err && err->code == code && err->msg[0] ? err->msg : kvbm_strerror(code);
  if (what) return kvbmpy_raise(code, "%s: %s", what, text);
  return raise_text(code, text);
}

PyObject *kvbmpy_closed(const char *what) {
  return kvbmpy_raise(KVBM_ECLOSED, "%s is closed", what);
}

PyObject *kvbmpy_busy(const char *what) {
  return kvbmpy_raise(KVBMPY_BUSY, "%s is in use by another thread", what);
}

/* --------------------------------------------------------- arguments */

/* Reads an int-like object as (value, sign): 0 ok, -1 TypeError set.
 * *neg is set for negative values, *big for values beyond 64 bits. */
static int read_int(PyObject *o, const char *what, uint64_t *v, bool *neg, bool *big) {
  PyObject *idx;
  if (PyLong_Check(o)) {
    idx = Py_NewRef(o);
  } else {
    idx = PyNumber_Index(o);
    if (!idx) {
      if (PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected an int, got %.100s", what, Py_TYPE(o)->tp_name);
      }
      return -1;
    }
  }
  int overflow = 0;
  long long s = PyLong_AsLongLongAndOverflow(idx, &overflow);
  *neg = *big = false;
  if (s == -1 && PyErr_Occurred()) {
    Py_DECREF(idx);
    return -1;
  }
  if (overflow < 0 || (overflow == 0 && s < 0)) {
    *neg = true;
    *big = overflow < 0;
    *v = (uint64_t)s;
  } else if (overflow > 0) {
    unsigned long long u = PyLong_AsUnsignedLongLong(idx);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
      PyErr_Clear();
      *big = true;
    }
    *v = u;
  } else {
    *v = (uint64_t)s;
  }
  Py_DECREF(idx);
  return 0;
}

int kvbmpy_retention(PyObject *o, const char *who, kvbm_hseq_retention *out) {
  *out = KVBM_HSEQ_RETAIN_ALL;
  if (!o || o == Py_None) return 0;
  if (!PyLong_Check(o) || PyBool_Check(o) || PyLong_AsLongLong(o) != 0) {
    if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "%s: prefix_cache_retention_interval must be None (every full block "
                                     "cached) or 0 (vLLM's sparse retention), not %R; other intervals are "
                                     "not modelled", who, o);
    }
    return -1;
  }
  *out = KVBM_HSEQ_RETAIN_BOUNDARIES;
  return 0;
}

int kvbmpy_uint(PyObject *o, const char *what, uint64_t max, uint64_t *out) {
  uint64_t v;
  bool neg, big;
  if (read_int(o, what, &v, &neg, &big)) return -1;
  if (neg || big || v > max) {
    PyObject *r = PyObject_Repr(o);
    const char *rs = r ? PyUnicode_AsUTF8(r) : NULL;
    if (!rs) PyErr_Clear();
    kvbmpy_raise(KVBM_EINVAL, "%s: %.60s is out of range (0 .. %llu)", what, rs ? rs : "value",
                 (unsigned long long)max);
    Py_XDECREF(r);
    return -1;
  }
  *out = v;
  return 0;
}

int kvbmpy_hash(PyObject *o, const char *what, uint64_t *out) {
  uint64_t v;
  bool neg, big;
  if (read_int(o, what, &v, &neg, &big)) return -1;
  if (big) {
    kvbmpy_raise(KVBM_EINVAL, "%s: not a 64-bit hash (-2**63 <= h < 2**64)", what);
    return -1;
  }
  *out = v;
  return 0;
}

int kvbmpy_hashes(PyObject *o, const char *what, uint64_t **out, size_t *n) {
  *out = NULL;
  *n = 0;
  if (PyUnicode_Check(o) || PyBytes_Check(o) || PyByteArray_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s: expected a sequence of int hashes, got %.100s", what,
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  PyObject *tup = PyTuple_CheckExact(o) ? Py_NewRef(o) : PySequence_Tuple(o);
  if (!tup) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s: expected a sequence of int hashes, got %.100s", what,
                   Py_TYPE(o)->tp_name);
    }
    return -1;
  }
  Py_ssize_t len = PyTuple_GET_SIZE(tup);
  uint64_t *v = PyMem_Malloc((size_t)(len ? len : 1) * sizeof *v);
  if (!v) {
    Py_DECREF(tup);
    PyErr_NoMemory();
    return -1;
  }
  char item[96];
  for (Py_ssize_t i = 0; i < len; i++) {
    snprintf(item, sizeof item, "%s[%zd]", what, i);
    if (kvbmpy_hash(PyTuple_GET_ITEM(tup, i), item, &v[i])) {
      PyMem_Free(v);
      Py_DECREF(tup);
      return -1;
    }
  }
  Py_DECREF(tup);
  *out = v;
  *n = (size_t)len;
  return 0;
}

int kvbmpy_str(PyObject *o, const char *what, const char **out) {
  if (!PyUnicode_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s: expected a str, got %.100s", what, Py_TYPE(o)->tp_name);
    return -1;
  }
  Py_ssize_t len;
  const char *s = PyUnicode_AsUTF8AndSize(o, &len);
  if (!s) return -1;
  if ((size_t)len != strlen(s)) {
    kvbmpy_raise(KVBM_EINVAL, "%s: contains a NUL character", what);
    return -1;
  }
  *out = s;
  return 0;
}

int kvbmpy_scheme(PyObject *o, kvbm_hash_scheme *out) {
  const char *s;
  if (kvbmpy_str(o, "scheme", &s)) return -1;
  if (!kvbm_hash_scheme_parse(s, out)) {
    kvbmpy_raise(KVBM_EINVAL, "scheme: '%.50s' is not 'native' or 'dynamo'", s);
    return -1;
  }
  return 0;
}

int kvbmpy_timeout(PyObject *o, double *seconds) {
  if (o == NULL || o == Py_None) {
    *seconds = -1;
    return 0;
  }
  if (!PyFloat_Check(o) && !PyLong_Check(o)) {
    PyErr_Format(PyExc_TypeError, "timeout: expected seconds (a number) or None, got %.100s",
                 Py_TYPE(o)->tp_name);
    return -1;
  }
  double s = PyFloat_AsDouble(o);
  if (s == -1.0 && PyErr_Occurred()) return -1;
  if (!(s >= 0)) { /* negative or NaN */
    kvbmpy_raise(KVBM_EINVAL, "timeout: %g is not a non-negative number of seconds", s);
    return -1;
  }
  *seconds = s;
  return 0;
}

/* ------------------------------------------------------------ tokens */

/* Whether a buffer format describes native-order 4-byte unsigned ints. */
static bool format_is_u32(const char *f, Py_ssize_t itemsize) {
  if (itemsize != 4 || !f) return false;
  const uint16_t probe = 1;
  const bool little = *(const uint8_t *)&probe == 1;
  if (*f == '@' || *f == '=' || (*f == '<' && little) || ((*f == '>' || *f == '!') && !little)) f++;
  return (f[0] == 'I' || f[0] == 'L') && f[1] == '\0';
}

static int tokens_from_buffer(PyObject *obj, const char *what, kvbmpy_tokens *t) {
  if (PyObject_GetBuffer(obj, &t->view, PyBUF_RECORDS_RO) < 0) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s: the buffer of %.100s cannot be read as uint32 items", what,
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  t->has_view = true;
  Py_buffer *v = &t->view;
  if (!format_is_u32(v->format, v->itemsize)) {
    PyErr_Format(PyExc_TypeError,
                 "%s: a buffer of format '%.20s' (%zd-byte items); tokens need uint32 ('I'), "
                 "e.g. numpy.asarray(x, dtype=numpy.uint32)",
                 what, v->format ? v->format : "B", v->itemsize);
    return -1;
  }
  if (v->ndim != 1) {
    PyErr_Format(PyExc_TypeError, "%s: a %d-dimensional buffer; tokens must be 1-dimensional",
                 what, v->ndim);
    return -1;
  }
  t->n = (size_t)(v->len / 4);
  if (PyBuffer_IsContiguous(v, 'C')) {
    t->data = v->buf;
    return 0;
  }
  uint32_t *copy = t->n <= 32 ? t->small : PyMem_Malloc(t->n * sizeof *copy);
  if (!copy) {
    PyErr_NoMemory();
    return -1;
  }
  if (copy != t->small) t->owned = copy;
  if (PyBuffer_ToContiguous(copy, v, v->len, 'C') < 0) return -1;
  t->data = copy;
  return 0;
}

static int token_value(PyObject *item, const char *what, Py_ssize_t i, uint32_t *out) {
  char name[96];
  snprintf(name, sizeof name, "%s[%zd]", what, i);
  uint64_t v;
  bool neg, big;
  if (read_int(item, name, &v, &neg, &big)) return -1;
  if (neg || big || v > UINT32_MAX) {
    PyObject *r = PyObject_Repr(item);
    const char *rs = r ? PyUnicode_AsUTF8(r) : NULL;
    if (!rs) PyErr_Clear();
    kvbmpy_raise(KVBM_EINVAL, "%s: %.60s is not a token id (0 <= t < 2**32)", name,
                 rs ? rs : "value");
    Py_XDECREF(r);
    return -1;
  }
  *out = (uint32_t)v;
  return 0;
}

static int tokens_from_sequence(PyObject *obj, const char *what, kvbmpy_tokens *t) {
  if (PyUnicode_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s: a str is not a sequence of token ids", what);
    return -1;
  }
  /* A tuple cannot change while __index__ of an item runs Python code. */
  PyObject *tup = PyTuple_CheckExact(obj) ? Py_NewRef(obj) : PySequence_Tuple(obj);
  if (!tup) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError,
                   "%s: expected a uint32 buffer or a sequence of ints, got %.100s", what,
                   Py_TYPE(obj)->tp_name);
    }
    return -1;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(tup);
  uint32_t *v = (size_t)n <= 32 ? t->small : PyMem_Malloc((size_t)n * sizeof *v);
  if (!v) {
    Py_DECREF(tup);
    PyErr_NoMemory();
    return -1;
  }
  if (v != t->small) t->owned = v;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item = PyTuple_GET_ITEM(tup, i);
    if (PyLong_CheckExact(item)) { /* the common case, without Python code */
      int overflow;
      long long s = PyLong_AsLongLongAndOverflow(item, &overflow);
      if (!overflow && s >= 0 && s <= (long long)UINT32_MAX) {
        v[i] = (uint32_t)s;
        continue;
      }
    }
    if (token_value(item, what, i, &v[i])) {
      Py_DECREF(tup);
      return -1;
    }
  }
  Py_DECREF(tup);
  t->data = v;
  t->n = (size_t)n;
  return 0;
}

int kvbmpy_tokens_get(PyObject *obj, const char *what, kvbmpy_tokens *t) {
  t->data = t->small;
  t->n = 0;
  t->has_view = false;
  t->owned = NULL;
  if (PyObject_CheckBuffer(obj)) return tokens_from_buffer(obj, what, t);
  return tokens_from_sequence(obj, what, t);
}

void kvbmpy_tokens_release(kvbmpy_tokens *t) {
  if (t->has_view) PyBuffer_Release(&t->view);
  t->has_view = false;
  PyMem_Free(t->owned);
  t->owned = NULL;
}

/* ---------------------------------------------------------- builders */

PyObject *kvbmpy_list_u32(const uint32_t *v, size_t n) {
  PyObject *list = PyList_New((Py_ssize_t)n); /* callers pass a snapshot */
  if (!list) return NULL;
  for (size_t i = 0; i < n; i++) {
    PyObject *x = PyLong_FromUnsignedLong(v[i]);
    if (!x) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SET_ITEM(list, (Py_ssize_t)i, x);
  }
  return list;
}

PyObject *kvbmpy_list_u64(const uint64_t *v, size_t n) {
  PyObject *list = PyList_New((Py_ssize_t)n);
  if (!list) return NULL;
  for (size_t i = 0; i < n; i++) {
    PyObject *x = PyLong_FromUnsignedLongLong(v[i]);
    if (!x) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SET_ITEM(list, (Py_ssize_t)i, x);
  }
  return list;
}

int kvbmpy_dict_obj(PyObject *d, const char *key, PyObject *v) {
  if (!v) return -1;
  int rc = PyDict_SetItemString(d, key, v);
  Py_DECREF(v);
  return rc;
}

int kvbmpy_dict_u64(PyObject *d, const char *key, uint64_t v) {
  return kvbmpy_dict_obj(d, key, PyLong_FromUnsignedLongLong(v));
}

/* ------------------------------------------------------------ waiting */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int kvbmpy_wait_sliced(double seconds, int (*step)(void *user, int slice_ms), void *user) {
  const int SLICE_MS = 100; /* how soon Ctrl-C is seen */
  double deadline = seconds < 0 ? -1 : now_s() + seconds;
  for (;;) {
    int slice = SLICE_MS;
    if (deadline >= 0) {
      double left = deadline - now_s();
      slice = left <= 0 ? 0 : left * 1000 < SLICE_MS ? (int)ceil(left * 1000) : SLICE_MS;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = step(user, slice);
    Py_END_ALLOW_THREADS
    if (rc != KVBM_ETIMEDOUT) return rc;
    if (deadline >= 0 && now_s() >= deadline) return KVBM_ETIMEDOUT;
    if (PyErr_CheckSignals() < 0) return KVBMPY_INTERRUPTED;
  }
}

/* ------------------------------------------------------------- module */

static PyObject *status_name(PyObject *self, PyObject *arg) {
  (void)self;
  long code = PyLong_AsLong(arg);
  if (code == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(kvbm_status_name((int)code));
}

static PyMethodDef module_methods[] = {
  {"status_name", status_name, METH_O,
   "status_name(code) -> str\n\nThe symbolic name of a kvbm status code ('KVBM_ENOSPC' for -5)."},
  {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
  PyModuleDef_HEAD_INIT,
  "kvbm._kvbm",
  "The C extension under package kvbm (import kvbm, not this).",
  -1,
  module_methods,
  NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kvbm(void) {
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  if (PyModule_AddStringConstant(m, "__version__", KVBMPY_VERSION) < 0 ||
      kvbmpy_errors_init(m) < 0 || kvbmpy_hash_init(m) < 0 || kvbmpy_pool_init(m) < 0 ||
      kvbmpy_manager_init(m) < 0 || kvbmpy_events_init(m) < 0 || kvbmpy_router_init(m) < 0 ||
      kvbmpy_volume_init(m) < 0 || kvbmpy_tierindex_init(m) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
