/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/vec.h: growing an array that the caller owns (private to src/;
 * header-only: one short function on paths that append).
 *
 * Why this shape. kvbm's growable arrays were written by hand in about
 * twenty places, each with its own pointer, count and capacity in its own
 * struct (a sequence's block table, a registry's collectors, a decoder's
 * events, a server's output bytes). They differ in what they hold and in
 * where the count lives, and agree on one step only: "make room for `need`
 * elements". So that step is the helper, and nothing else: no vector
 * struct to adopt, no count kept here, the caller's fields stay where they
 * are and the caller appends as it did. Two arrays kept in step (one
 * capacity for both) call it once each with copies of the capacity: the
 * rule below gives both the same new capacity.
 *
 * Growth rule. Nothing happens while need <= *cap. Otherwise the capacity
 * starts at min_items (when it was 0) and doubles until it holds `need`,
 * so n appends cost O(n) copies in all; a doubling that would pass the
 * bound stops at the bound instead (a buffer that may grow to exactly a
 * limit reaches it). The caller names the first size, because each array
 * knows its own usual size (a 4 KiB answer, 16 connections).
 *
 * Bounds. The bound is max_items, and never more than PTRDIFF_MAX bytes
 * (the largest object whose pointers C can subtract; glibc's malloc
 * refuses more anyway): a `need` past it is refused with KVBM_EOVERFLOW
 * before any allocation,
 * so neither a count read from hostile input nor a wrapped elem_size * n
 * makes the allocator ask for an arbitrary (or a wrapped, too small) size.
 * Callers with a limit of their own (a decoder's max_items, a request
 * body's limit) pass it; the others pass KVBM__VEC_NO_LIMIT and still get
 * the overflow check.
 *
 * Failure. On any failure nothing changes: *items and *cap are as they
 * were, the old array is still valid and still the caller's (realloc
 * leaves it in place when it fails).
 *
 * Exact sizing. Two kinds of array must not double, so vec.h has two
 * exact siblings with the same bound and failure rule:
 * kvbm__vec_resize (exactly n elements: a ring's per-slot byte buffers,
 * where doubling would leave up to half of every slot idle) and
 * kvbm__vec_fit (a decoder's output array, refilled whole by each
 * message: sized to the message, and given back when one far smaller
 * follows a huge one, so a hostile or unusual message does not pin its
 * memory for the decoder's life). Both were written by hand in the
 * storage-event and hint decoders and the ZMQ sink (Session 14).
 *
 * Ownership. *items is the caller's, before and after: the helper only
 * reallocs it, and the caller frees it (free(NULL) is fine when it never
 * grew). The elements are copied bytes (realloc), so they must not point
 * into themselves.
 */
#ifndef KVBM_COMMON_VEC_H
#define KVBM_COMMON_VEC_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvbm/status.h"

/* max_items for an array with no limit but the address space. */
#define KVBM__VEC_NO_LIMIT SIZE_MAX

/* The two steps every sizing below shares. kvbm__vec_bound_: the most
 * elements an array may hold (max_items, never past PTRDIFF_MAX bytes).
 * kvbm__vec_realloc_: the array resized to nc (> 0, <= the bound)
 * elements; on failure nothing changes. */
static inline size_t kvbm__vec_bound_(size_t elem_size, size_t max_items) {
  size_t bound = (size_t)PTRDIFF_MAX / elem_size;
  return max_items < bound ? max_items : bound;
}

static inline int kvbm__vec_realloc_(void *itemsp, size_t *cap, size_t nc, size_t elem_size) {
  void *old;
  memcpy(&old, itemsp, sizeof old);
  void *p = realloc(old, nc * elem_size);
  if (!p) return KVBM_ENOMEM;
  memcpy(itemsp, &p, sizeof p);
  *cap = nc;
  return KVBM_OK;
}

/* Makes room for `need` elements of elem_size bytes in the array whose
 * pointer is at `itemsp` (a T **, NULL pointer when empty) and whose
 * capacity, in elements, is *cap. Growth: from min_items (1 when 0),
 * doubling, stopping at the bound, which is max_items or PTRDIFF_MAX /
 * elem_size, the smaller.
 *
 * Returns KVBM_OK (need <= *cap, now or after growing; need 0 is always
 * OK and allocates nothing), KVBM_EOVERFLOW (need past the bound: nothing
 * allocated), KVBM_ENOMEM (realloc failed), KVBM_EINVAL (elem_size 0, or
 * a NULL itemsp or cap). On failure *itemsp and *cap are unchanged.
 *
 * itemsp is a void * and not a void ** so that a T ** can be passed
 * without a cast; the pointer is read and written with memcpy (no T *
 * object is accessed as a void *). kvbm__vec_reserve_of() fills elem_size
 * from the pointer's type. */
static inline int kvbm__vec_reserve(void *itemsp, size_t *cap, size_t need, size_t elem_size,
                                    size_t min_items, size_t max_items) {
  if (!itemsp || !cap || elem_size == 0) return KVBM_EINVAL;
  if (need <= *cap) return KVBM_OK;
  size_t bound = kvbm__vec_bound_(elem_size, max_items);
  if (need > bound) return KVBM_EOVERFLOW;
  size_t nc = *cap ? *cap : (min_items ? min_items : 1);
  while (nc < need) nc = nc > bound / 2 ? bound : nc * 2;
  if (nc > bound) nc = bound; /* a min_items above the bound */
  return kvbm__vec_realloc_(itemsp, cap, nc, elem_size);
}

/* Exact sizing, for the arrays that must not double.
 *
 * kvbm__vec_resize: the capacity becomes exactly `n` elements (n > 0),
 * larger or smaller. For a buffer kept per slot of a ring (a ZMQ sink's
 * replay copies), where doubling would leave up to half of every slot
 * unused.
 *
 * kvbm__vec_fit: for a decoder's output array, refilled whole by each
 * message. It resizes to exactly max(need, min_items) when the array is
 * too small, or when it is far too large: more than KVBM__VEC_FIT_KEEP
 * elements and need below an eighth of them, so one huge message does not
 * pin its memory for the decoder's life while messages of similar sizes
 * reallocate nothing. Otherwise (and for need 0 on an empty array)
 * nothing happens.
 *
 * Both: the same bound, statuses and failure guarantee as
 * kvbm__vec_reserve (a size past the bound is KVBM_EOVERFLOW before any
 * allocation; on any failure *itemsp and *cap are unchanged). */
#define KVBM__VEC_FIT_KEEP 4096

static inline int kvbm__vec_resize(void *itemsp, size_t *cap, size_t n, size_t elem_size,
                                   size_t max_items) {
  if (!itemsp || !cap || elem_size == 0 || n == 0) return KVBM_EINVAL;
  if (n > kvbm__vec_bound_(elem_size, max_items)) return KVBM_EOVERFLOW;
  return n == *cap ? KVBM_OK : kvbm__vec_realloc_(itemsp, cap, n, elem_size);
}

static inline int kvbm__vec_fit(void *itemsp, size_t *cap, size_t need, size_t elem_size,
                                size_t min_items, size_t max_items) {
  if (!itemsp || !cap || elem_size == 0) return KVBM_EINVAL;
  if (need <= *cap && !(*cap > KVBM__VEC_FIT_KEEP && need < *cap / 8)) return KVBM_OK;
  return kvbm__vec_resize(itemsp, cap, need > min_items ? need : (min_items ? min_items : 1),
                          elem_size, max_items);
}

/* kvbm__vec_reserve for a typed array: `pp` is a T ** (&s->ids), elem_size
 * is sizeof(T). Passing a T * by mistake does not compile (**pp). */
#define kvbm__vec_reserve_of(pp, capp, need, min_items, max_items) \
  kvbm__vec_reserve((pp), (capp), (need), sizeof **(pp), (min_items), (max_items))

/* The same for kvbm__vec_resize and kvbm__vec_fit. */
#define kvbm__vec_resize_of(pp, capp, n, max_items) \
  kvbm__vec_resize((pp), (capp), (n), sizeof **(pp), (max_items))
#define kvbm__vec_fit_of(pp, capp, need, min_items, max_items) \
  kvbm__vec_fit((pp), (capp), (need), sizeof **(pp), (min_items), (max_items))

#endif
