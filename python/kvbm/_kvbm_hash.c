/* SPDX-License-Identifier: Apache-2.0 */
/*
 * _kvbm_hash.c: the byte-level functions of the binding: chained block
 * hashes (kvbm/hash.h), BLAKE3 (kvbm/blake3.h) and MRDN v1 frames
 * (kvbm/frame.h).
 *
 * These are pure functions over the caller's bytes, so the only state is a
 * Blake3 object's hasher, embedded in the object (no allocation; copy()
 * forks it by copying the struct, as the C API allows). Large inputs are
 * hashed with the GIL released (the input buffer stays exported meanwhile,
 * so it cannot be resized under us); a Blake3 object being updated that
 * way is busy, and a second thread's call on it raises BusyError rather
 * than racing on the hasher.
 */
#include "_kvbm.h"

#include <string.h>

#include "kvbm/blake3.h"
#include "kvbm/frame.h"
#include "kvbm/hash.h"

/* Inputs at least this large are hashed without the GIL. */
#define NOGIL_BYTES (64 * 1024)
/* The longest BLAKE3 output the binding hands out at once. */
#define MAX_DIGEST (1u << 30)

/* ------------------------------------------------------- block hashes */

static PyObject *py_block_hashes(PyObject *mod, PyObject *args, PyObject *kw) {
  (void)mod;
  static char *kwlist[] = {"tokens", "block_size", "scheme", "salt_hash", NULL};
  PyObject *tok, *bso, *so = NULL, *salto = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$OO:block_hashes", kwlist, &tok, &bso, &so, &salto))
    return NULL;
  uint64_t bs, salt = 0;
  kvbm_hash_scheme scheme = KVBM_HASH_NATIVE;
  if (kvbmpy_uint(bso, "block_size", UINT32_MAX, &bs) || (so && kvbmpy_scheme(so, &scheme)) ||
      (salto && kvbmpy_hash(salto, "salt_hash", &salt)))
    return NULL;
  if (bs == 0) return kvbmpy_raise(KVBM_EINVAL, "block_size: must be at least 1");
  kvbmpy_tokens t;
  if (kvbmpy_tokens_get(tok, "tokens", &t)) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  size_t n = t.n / bs;
  uint64_t *out = PyMem_Malloc((n ? n : 1) * sizeof *out);
  if (!out) {
    kvbmpy_tokens_release(&t);
    return PyErr_NoMemory();
  }
  if (t.n * 4 >= NOGIL_BYTES) {
    Py_BEGIN_ALLOW_THREADS
    kvbm_hash_chain(scheme, salt, t.data, t.n, bs, out, n);
    Py_END_ALLOW_THREADS
  } else {
    kvbm_hash_chain(scheme, salt, t.data, t.n, bs, out, n);
  }
  kvbmpy_tokens_release(&t);
  PyObject *list = kvbmpy_list_u64(out, n);
  PyMem_Free(out);
  return list;
}

static PyObject *py_block_hash(PyObject *mod, PyObject *args, PyObject *kw) {
  (void)mod;
  static char *kwlist[] = {"tokens", "salt_hash", NULL};
  PyObject *tok, *salto = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:block_hash", kwlist, &tok, &salto)) return NULL;
  uint64_t salt = 0;
  if (salto && kvbmpy_hash(salto, "salt_hash", &salt)) return NULL;
  kvbmpy_tokens t;
  if (kvbmpy_tokens_get(tok, "tokens", &t)) {
    kvbmpy_tokens_release(&t);
    return NULL;
  }
  uint64_t h = kvbm_hash_block(salt, t.data, t.n);
  kvbmpy_tokens_release(&t);
  return PyLong_FromUnsignedLongLong(h);
}

static PyObject *py_salt_hash(PyObject *mod, PyObject *arg) {
  (void)mod;
  if (PyUnicode_Check(arg)) {
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(arg, &len);
    if (!s) return NULL;
    return PyLong_FromUnsignedLongLong(kvbm_hash_salt(s, (size_t)len));
  }
  Py_buffer b;
  if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) {
    PyErr_Clear();
    return PyErr_Format(PyExc_TypeError, "salt_hash: expected str or bytes, got %.100s",
                        Py_TYPE(arg)->tp_name);
  }
  uint64_t h = kvbm_hash_salt(b.buf, (size_t)b.len);
  PyBuffer_Release(&b);
  return PyLong_FromUnsignedLongLong(h);
}

/* ------------------------------------------------------------- BLAKE3 */

static int key_arg(PyObject *o, uint8_t key[KVBM_BLAKE3_KEY_LEN]) {
  Py_buffer b;
  if (PyObject_GetBuffer(o, &b, PyBUF_SIMPLE) < 0) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "key: expected 32 bytes, got %.100s", Py_TYPE(o)->tp_name);
    return -1;
  }
  int rc = 0;
  if (b.len != KVBM_BLAKE3_KEY_LEN) {
    kvbmpy_raise(KVBM_EINVAL, "key: %zd bytes; a BLAKE3 key is exactly 32", b.len);
    rc = -1;
  } else {
    memcpy(key, b.buf, KVBM_BLAKE3_KEY_LEN);
  }
  PyBuffer_Release(&b);
  return rc;
}

static int length_arg(PyObject *o, size_t *out) {
  uint64_t v = KVBM_BLAKE3_OUT_LEN;
  if (o && kvbmpy_uint(o, "length", MAX_DIGEST, &v)) return -1;
  *out = (size_t)v;
  return 0;
}

/* Feeds a buffer, without the GIL when it is large. */
static void feed(kvbm_blake3_hasher *h, const Py_buffer *b) {
  if (b->len >= NOGIL_BYTES) {
    Py_BEGIN_ALLOW_THREADS
    kvbm_blake3_hasher_update(h, b->buf, (size_t)b->len);
    Py_END_ALLOW_THREADS
  } else {
    kvbm_blake3_hasher_update(h, b->buf, (size_t)b->len);
  }
}

static PyObject *digest_bytes(const kvbm_blake3_hasher *h, size_t len) {
  PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
  if (!out) return NULL;
  kvbm_blake3_hasher_finalize(h, (uint8_t *)PyBytes_AS_STRING(out), len);
  return out;
}

static PyObject *py_blake3(PyObject *mod, PyObject *args, PyObject *kw) {
  (void)mod;
  static char *kwlist[] = {"data", "key", "length", NULL};
  Py_buffer data;
  PyObject *keyo = NULL, *leno = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|$OO:blake3", kwlist, &data, &keyo, &leno))
    return NULL;
  PyObject *res = NULL;
  uint8_t key[KVBM_BLAKE3_KEY_LEN];
  size_t len;
  kvbm_blake3_hasher h;
  if ((keyo && keyo != Py_None && key_arg(keyo, key)) || length_arg(leno, &len)) goto out;
  if (keyo && keyo != Py_None) kvbm_blake3_hasher_init_keyed(&h, key);
  else kvbm_blake3_hasher_init(&h);
  feed(&h, &data);
  res = digest_bytes(&h, len);
out:
  PyBuffer_Release(&data);
  return res;
}

typedef struct Blake3Object {
  PyObject_HEAD
  kvbm_blake3_hasher h;
  bool busy;
} Blake3Object;

static PyTypeObject Blake3Type;

static PyObject *b3_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"data", "key", "derive_key_context", NULL};
  PyObject *data = NULL, *keyo = NULL, *ctxo = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O$OO:Blake3", kwlist, &data, &keyo, &ctxo)) return NULL;
  uint8_t key[KVBM_BLAKE3_KEY_LEN];
  const char *ctx = NULL;
  bool keyed = keyo && keyo != Py_None;
  if (keyed && key_arg(keyo, key)) return NULL;
  if (ctxo && ctxo != Py_None && kvbmpy_str(ctxo, "derive_key_context", &ctx)) return NULL;
  if (keyed && ctx)
    return kvbmpy_raise(KVBM_EINVAL, "Blake3: give key or derive_key_context, not both");
  Py_buffer b = {0};
  if (data && data != Py_None && PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0) return NULL;
  Blake3Object *self = (Blake3Object *)type->tp_alloc(type, 0);
  if (self) {
    if (keyed) kvbm_blake3_hasher_init_keyed(&self->h, key);
    else if (ctx) kvbm_blake3_hasher_init_derive_key(&self->h, ctx);
    else kvbm_blake3_hasher_init(&self->h);
    if (b.obj) feed(&self->h, &b);
  }
  if (b.obj) PyBuffer_Release(&b);
  return (PyObject *)self;
}

static PyObject *b3_update(Blake3Object *self, PyObject *arg) {
  Py_buffer b;
  if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
  if (self->busy) {
    PyBuffer_Release(&b);
    return kvbmpy_busy("Blake3");
  }
  self->busy = true;
  feed(&self->h, &b);
  self->busy = false;
  PyBuffer_Release(&b);
  Py_RETURN_NONE;
}

static PyObject *b3_digest(Blake3Object *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"length", NULL};
  PyObject *leno = NULL;
  size_t len;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:digest", kwlist, &leno) || length_arg(leno, &len))
    return NULL;
  if (self->busy) return kvbmpy_busy("Blake3");
  kvbm_blake3_hasher snap = self->h;
  return digest_bytes(&snap, len);
}

static PyObject *b3_hexdigest(Blake3Object *self, PyObject *args, PyObject *kw) {
  PyObject *d = b3_digest(self, args, kw);
  if (!d) return NULL;
  PyObject *hex = PyObject_CallMethod(d, "hex", NULL);
  Py_DECREF(d);
  return hex;
}

static PyObject *b3_copy(Blake3Object *self, PyObject *unused) {
  (void)unused;
  if (self->busy) return kvbmpy_busy("Blake3");
  Blake3Object *c = (Blake3Object *)Blake3Type.tp_alloc(&Blake3Type, 0);
  if (!c) return NULL;
  c->h = self->h;
  return (PyObject *)c;
}

static PyObject *b3_reset(Blake3Object *self, PyObject *unused) {
  (void)unused;
  if (self->busy) return kvbmpy_busy("Blake3");
  kvbm_blake3_hasher_reset(&self->h);
  Py_RETURN_NONE;
}

static PyObject *b3_get_name(PyObject *self, void *c) {
  (void)self;
  (void)c;
  return PyUnicode_FromString("blake3");
}

static PyObject *b3_get_digest_size(PyObject *self, void *c) {
  (void)self;
  (void)c;
  return PyLong_FromLong(KVBM_BLAKE3_OUT_LEN);
}

static PyObject *b3_get_block_size(PyObject *self, void *c) {
  (void)self;
  (void)c;
  return PyLong_FromLong(KVBM_BLAKE3_BLOCK_LEN);
}

static PyMethodDef b3_methods[] = {
  {"update", (PyCFunction)b3_update, METH_O,
   "update(data)\n\nFeeds bytes (any bytes-like object). Large inputs release the GIL."},
  {"digest", (PyCFunction)(void (*)(void))b3_digest, METH_VARARGS | METH_KEYWORDS,
   "digest(length=32) -> bytes\n\nThe first `length` bytes of the output (any length: BLAKE3 is\n"
   "an XOF). Does not change the state."},
  {"hexdigest", (PyCFunction)(void (*)(void))b3_hexdigest, METH_VARARGS | METH_KEYWORDS,
   "hexdigest(length=32) -> str\n\ndigest() as hexadecimal."},
  {"copy", (PyCFunction)b3_copy, METH_NOARGS, "copy() -> Blake3\n\nA fork of the state."},
  {"reset", (PyCFunction)b3_reset, METH_NOARGS, "reset()\n\nForgets all input, keeping the mode and key."},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef b3_getset[] = {
  {"name", b3_get_name, NULL, "'blake3'", NULL},
  {"digest_size", b3_get_digest_size, NULL, "32 (the default output length)", NULL},
  {"block_size", b3_get_block_size, NULL, "64", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Blake3Type = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "kvbm.Blake3",
  .tp_basicsize = sizeof(Blake3Object),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_doc = "Blake3(data=None, *, key=None, derive_key_context=None)\n\n"
            "An incremental BLAKE3 hash, used like hashlib's objects: update(), digest(),\n"
            "hexdigest(), copy(). key (32 bytes) makes it a keyed hash (MAC);\n"
            "derive_key_context a key derivation whose key material is then fed.",
  .tp_methods = b3_methods,
  .tp_getset = b3_getset,
  .tp_new = b3_new,
};

/* ------------------------------------------------------------- frames */

static int frame_phase_arg(PyObject *o, kvbm_frame_phase *out) {
  uint64_t t;
  if (kvbmpy_uint(o, "phase", UINT64_MAX, &t)) return -1;
  if (t >= KVBM_FRAME_PHASE_COUNT) {
    kvbmpy_raise(KVBM_EPHASE,
                 "phase %llu: frames carry ThinkComplete 0, ThinkActive 1, OutputCritical 2",
                 (unsigned long long)t);
    return -1;
  }
  *out = (kvbm_frame_phase)t;
  return 0;
}

static PyObject *py_frame_encode(PyObject *mod, PyObject *args, PyObject *kw) {
  (void)mod;
  static char *kwlist[] = {"body", "phase", NULL};
  Py_buffer body;
  PyObject *to;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "y*O:frame_encode", kwlist, &body, &to)) return NULL;
  PyObject *out = NULL;
  kvbm_frame_phase phase;
  kvbm_error err = {0};
  size_t total, written;
  int rc;
  if (frame_phase_arg(to, &phase)) goto done;
  if ((rc = kvbm_frame_encoded_len((size_t)body.len, &total, &err))) {
    kvbmpy_raise_kvbm(rc, &err, NULL);
    goto done;
  }
  if (!(out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total))) goto done;
  char *dst = PyBytes_AS_STRING(out);
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_frame_encode(phase, body.buf, (size_t)body.len, dst, total, &written, &err);
  Py_END_ALLOW_THREADS
  if (rc) {
    Py_CLEAR(out);
    kvbmpy_raise_kvbm(rc, &err, NULL);
  }
done:
  PyBuffer_Release(&body);
  return out;
}

static PyObject *py_frame_decode(PyObject *mod, PyObject *args, PyObject *kw) {
  (void)mod;
  static char *kwlist[] = {"buf", "max_body", NULL};
  Py_buffer buf;
  PyObject *mo = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|$O:frame_decode", kwlist, &buf, &mo)) return NULL;
  PyObject *res = NULL;
  uint64_t max_body = KVBM_FRAME_DEFAULT_MAX_BODY;
  if (mo && kvbmpy_uint(mo, "max_body", UINT32_MAX, &max_body)) goto done;
  kvbm_frame_header hdr;
  const uint8_t *body = NULL;
  kvbm_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = kvbm_frame_decode(buf.buf, (size_t)buf.len, (uint32_t)max_body, &hdr, &body, &err);
  Py_END_ALLOW_THREADS
  if (rc) {
    kvbmpy_raise_kvbm(rc, &err, NULL);
    goto done;
  }
  res = Py_BuildValue("(iy#)", (int)hdr.phase, (const char *)body, (Py_ssize_t)hdr.body_len);
done:
  PyBuffer_Release(&buf);
  return res;
}

/* --------------------------------------------------------------- init */

static PyMethodDef hash_methods[] = {
  {"block_hashes", (PyCFunction)(void (*)(void))py_block_hashes, METH_VARARGS | METH_KEYWORDS,
   "block_hashes(tokens, block_size, *, scheme='native', salt_hash=0) -> list[int]\n\n"
   "The sequence hashes of the full blocks of `tokens` (len(tokens) // block_size\n"
   "of them), chained: equal hashes mean equal prefixes. scheme 'native' (xxh3\n"
   "chained by seed, kvbm's default) or 'dynamo' (the values NVIDIA Dynamo\n"
   "computes). tokens: a uint32 buffer (no copy) or a sequence of ints."},
  {"block_hash", (PyCFunction)(void (*)(void))py_block_hash, METH_VARARGS | METH_KEYWORDS,
   "block_hash(tokens, salt_hash=0) -> int\n\n"
   "The content hash of one block's tokens (Dynamo's 'local block hash')."},
  {"salt_hash", (PyCFunction)py_salt_hash, METH_O,
   "salt_hash(salt) -> int\n\nThe hash of a salt (LoRA adapter, cache salt; str as UTF-8, or\n"
   "bytes); 0 for an empty salt. Pass it as salt_hash= to the other calls."},
  {"blake3", (PyCFunction)(void (*)(void))py_blake3, METH_VARARGS | METH_KEYWORDS,
   "blake3(data, *, key=None, length=32) -> bytes\n\n"
   "The BLAKE3 hash of data (keyed with a 32-byte key when given), `length`\n"
   "bytes of output. Large inputs release the GIL."},
  {"frame_encode", (PyCFunction)(void (*)(void))py_frame_encode, METH_VARARGS | METH_KEYWORDS,
   "frame_encode(body, phase) -> bytes\n\n"
   "An MRDN v1 frame: the 32-byte header (magic, version, length, phase label,\n"
   "BLAKE3-128 of the body) followed by the body. phase: ADR-0006's label,\n"
   "0..2 (kvbm.Phase: THINK_COMPLETE, THINK_ACTIVE, OUTPUT_CRITICAL)."},
  {"frame_decode", (PyCFunction)(void (*)(void))py_frame_decode, METH_VARARGS | METH_KEYWORDS,
   "frame_decode(buf, *, max_body=64 MiB) -> (int, bytes)\n\n"
   "Validates a whole frame and returns (phase, body). kvbm.frame_decode wraps\n"
   "the phase in kvbm.Phase."},
  {NULL, NULL, 0, NULL},
};

int kvbmpy_hash_init(PyObject *m) {
  if (PyType_Ready(&Blake3Type) < 0 || PyModule_AddObjectRef(m, "Blake3", (PyObject *)&Blake3Type) < 0)
    return -1;
  return PyModule_AddFunctions(m, hash_methods);
}
