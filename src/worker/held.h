/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker/held.h (private to src/worker): the set of block hashes one tier
 * of the worker holds, as its KV events say (STORED adds, REMOVED takes
 * away, CLEARED empties), with each block's parent when the event gave
 * one. /blocks lists it, and a republish (start, publishing resumed)
 * sends it again, so what a router rebuilds from the events equals
 * /blocks by construction of the same stream.
 *
 * Open addressing with linear probing and backward-shift deletion: no
 * tombstones, so a long run of stores and removes never degrades it. The
 * table is sized once at create for the tier's block count (at most half
 * full): no allocation under the manager's lock, where the listener runs.
 */
#ifndef KVSIM_WORKER_HELD_H
#define KVSIM_WORKER_HELD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvsim_held {
  uint64_t *key, *parent;
  uint8_t *used; /* 0 empty, 1 used without a parent, 2 used with one */
  size_t cap, n, max;
} kvsim_held;

/* A set for at most max blocks; false when out of memory. */
bool kvsim_held_init(kvsim_held *h, size_t max);
void kvsim_held_free(kvsim_held *h);

/* Bytes a set for max blocks takes (for the memory budget). */
size_t kvsim_held_bytes(size_t max);

/* Adds (or refreshes the parent of) key; false when full (never, if the
 * tier holds at most max blocks). */
bool kvsim_held_add(kvsim_held *h, uint64_t key, const uint64_t *parent);
void kvsim_held_remove(kvsim_held *h, uint64_t key);
void kvsim_held_clear(kvsim_held *h);
bool kvsim_held_has(const kvsim_held *h, uint64_t key);

/* The i-th slot (0 <= i < cap): false when empty. */
bool kvsim_held_slot(const kvsim_held *h, size_t i, uint64_t *key, uint64_t *parent,
                     bool *has_parent);

#endif
