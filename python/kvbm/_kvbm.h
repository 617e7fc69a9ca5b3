/* SPDX-License-Identifier: Apache-2.0 */
/*
 * _kvbm.h: what the files of the CPython extension kvbm._kvbm share
 * (private to the extension; the library's public headers are the only kvbm
 * headers it includes).
 *
 * Conventions every file follows:
 *  - Arguments are converted (and may run Python code: __index__, buffer
 *    exports) BEFORE the object they act on is checked for being open and
 *    before any kvbm call, so that Python code run during a conversion can
 *    never see, or free, a half-done kvbm operation.
 *  - Results are snapshotted from kvbm into plain C memory before Python
 *    objects are built from them: allocating a container may run the cyclic
 *    GC and with it any finalizer, which could destroy the kvbm object the
 *    result came from.
 *  - Wrong Python types raise TypeError; values kvbm refuses raise the
 *    kvbm.Error subclass of the status (kvbmpy_raise*).
 */
#ifndef KVBMPY_H
#define KVBMPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/group.h"
#include "kvbm/hash.h"
#include "kvbm/hybrid.h"
#include "kvbm/status.h"

/* ---- errors (_kvbm.c) ---- */

/* Not a kvbm status: an object used from two threads at once. Raised as
 * kvbm.BusyError, a StateError carrying KVBM_ESTATE. */
#define KVBMPY_BUSY 1

int kvbmpy_errors_init(PyObject *module);
/* Raises the class of `code` with a printf-style message; returns NULL. */
PyObject *kvbmpy_raise(int code, const char *fmt, ...);
/* Raises for a failed kvbm call: err's message when it is for this code,
 * else kvbm_strerror(code), prefixed by `what` when not NULL. */
PyObject *kvbmpy_raise_kvbm(int code, const kvbm_error *err, const char *what);
/* kvbm.ClosedError "<what> is closed". */
PyObject *kvbmpy_closed(const char *what);
/* kvbm.BusyError "<what> is in use by another thread". */
PyObject *kvbmpy_busy(const char *what);

/* ---- arguments (_kvbm.c) ---- */

/* Tokens from a uint32 buffer (no copy) or a sequence of ints (copied). */
typedef struct kvbmpy_tokens {
  const uint32_t *data;
  size_t n;
  Py_buffer view;   /* held while the tokens are in use */
  bool has_view;
  uint32_t *owned;  /* a copy (sequence, or a non-contiguous buffer) */
  uint32_t small[32];
} kvbmpy_tokens;

/* 0 on success; -1 with an exception set. Release with
 * kvbmpy_tokens_release even on failure. */
int kvbmpy_tokens_get(PyObject *obj, const char *what, kvbmpy_tokens *t);

/* groups=: a string ("full,sw:128") or a list of kinds / (kind, tokens)
 * pairs, parsed by kvbm_groups_parse (messages name the item, prefixed by
 * `who`). 0, or -1 with the exception set. (_kvbm_pool.c) */
int kvbmpy_groups_get(PyObject *o, const char *who, kvbm_group_spec *out, size_t *n);
void kvbmpy_tokens_release(kvbmpy_tokens *t);

/* An int (anything with __index__, not bool-special-cased) in [0, max]:
 * TypeError for non-ints, kvbm.InvalidArgumentError when out of range. */
int kvbmpy_uint(PyObject *o, const char *what, uint64_t max, uint64_t *out);
/* A 64-bit hash: any int in [-2**63, 2**64), negative ones read as their
 * two's complement (Dynamo's Python API uses signed 64-bit hashes). */
int kvbmpy_hash(PyObject *o, const char *what, uint64_t *out);
/* A sequence of hashes into a PyMem_Malloc'd array (*out NULL when n is 0;
 * PyMem_Free it). */
int kvbmpy_hashes(PyObject *o, const char *what, uint64_t **out, size_t *n);
/* "native" / "dynamo". */
int kvbmpy_scheme(PyObject *o, kvbm_hash_scheme *out);
/* prefix_cache_retention_interval=: vLLM's setting. NULL or None: every
 * full block cached (KVBM_HSEQ_RETAIN_ALL); 0 (vLLM's default since
 * 2026-08): sparse retention (KVBM_HSEQ_RETAIN_BOUNDARIES). Anything else
 * (other intervals are not modelled, bools, floats, strings): ValueError
 * naming `who` and the value, so an engine configured with one learns it
 * at once rather than getting a rule it did not ask for. 0, or -1 with
 * the exception set. */
int kvbmpy_retention(PyObject *o, const char *who, kvbm_hseq_retention *out);
/* None -> -1 (forever); a non-negative number of seconds -> seconds. */
int kvbmpy_timeout(PyObject *o, double *seconds);
/* A str argument (NUL bytes refused); *out borrows from o. */
int kvbmpy_str(PyObject *o, const char *what, const char **out);

/* Builders (copy the input first; see the conventions above). */
PyObject *kvbmpy_list_u32(const uint32_t *v, size_t n);
PyObject *kvbmpy_list_u64(const uint64_t *v, size_t n);
int kvbmpy_dict_u64(PyObject *d, const char *key, uint64_t v);
int kvbmpy_dict_obj(PyObject *d, const char *key, PyObject *v); /* steals v */

/* Waits in slices so that signals (Ctrl-C) are seen: calls
 * step(user, slice_ms) with the GIL released until it returns something
 * other than KVBM_ETIMEDOUT or `seconds` (< 0: forever) have passed.
 * Returns step's status, KVBM_ETIMEDOUT, or -1000 with an exception set
 * when a signal handler raised. */
#define KVBMPY_INTERRUPTED (-1000)
int kvbmpy_wait_sliced(double seconds, int (*step)(void *user, int slice_ms), void *user);

/* ---- the parts, one file each: each adds its types and functions ---- */

int kvbmpy_hash_init(PyObject *m);    /* _kvbm_hash.c: hashes, BLAKE3, frames */
int kvbmpy_pool_init(PyObject *m);    /* _kvbm_pool.c: Pool, Seq */
int kvbmpy_manager_init(PyObject *m); /* _kvbm_manager.c: Manager, Request */
int kvbmpy_events_init(PyObject *m);  /* _kvbm_events.c: publisher, subscriber */
int kvbmpy_router_init(PyObject *m);  /* _kvbm_router.c: Index */
int kvbmpy_volume_init(PyObject *m);  /* _kvbm_volume.c: Volume */
int kvbmpy_tierindex_init(PyObject *m); /* _kvbm_tierindex.c: TierIndex */

/* Event dicts (_kvbm_events.c), shared with the router's Index.apply. */
#include "kvbm/events.h"

typedef struct kvbmpy_event {
  kvbm_event ev;
  uint64_t *hashes;  /* PyMem_Malloc'd */
  kvbmpy_tokens tokens;
  PyObject *keep;    /* strings the event points into */
} kvbmpy_event;

/* Reads an event dict ({"type": "BlockStored", "block_hashes": [...], ...},
 * the keys Subscriber.recv gives). Release with kvbmpy_event_release. */
int kvbmpy_event_from_dict(PyObject *d, kvbmpy_event *out);
void kvbmpy_event_release(kvbmpy_event *e);
PyObject *kvbmpy_event_to_dict(const kvbm_event *ev);
/* The EventBatch struct sequence type (for Index.apply to recognise). */
extern PyTypeObject *kvbmpy_EventBatchType;

#endif /* KVBMPY_H */
