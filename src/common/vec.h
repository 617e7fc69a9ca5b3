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
  size_t bound = (size_t)PTRDIFF_MAX / elem_size;
  if (max_items < bound) bound = max_items;
  if (need > bound) return KVBM_EOVERFLOW;
  size_t nc = *cap ? *cap : (min_items ? min_items : 1);
  while (nc < need) nc = nc > bound / 2 ? bound : nc * 2;
  if (nc > bound) nc = bound; /* a min_items above the bound */
  void *old;
  memcpy(&old, itemsp, sizeof old);
  void *p = realloc(old, nc * elem_size);
  if (!p) return KVBM_ENOMEM;
  memcpy(itemsp, &p, sizeof p);
  *cap = nc;
  return KVBM_OK;
}

/* kvbm__vec_reserve for a typed array: `pp` is a T ** (&s->ids), elem_size
 * is sizeof(T). Passing a T * by mistake does not compile (**pp). */
#define kvbm__vec_reserve_of(pp, capp, need, min_items, max_items) \
  kvbm__vec_reserve((pp), (capp), (need), sizeof **(pp), (min_items), (max_items))

#endif
