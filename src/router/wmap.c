/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wmap.c: one worker's blocks as the writer sees them (see wmap.h).
 *
 * Why a map per worker on top of the shared table: the shared table keeps
 * one bit per (worker, tier), but a worker may store the same hash twice
 * (duplicates allowed) and remove it once, a clear or a departure must find
 * every block of one worker without scanning everybody's, and in recompute
 * mode the engine's hashes (what BlockRemoved names, what a BlockStored's
 * parent is) must be translated to the index's own keys. Load stays at or
 * below one half so probes are short.
 */
#include "router/wmap.h"

#include <stdlib.h>
#include <string.h>

wentry *kvbm__wmap_find(const wmap *m, uint64_t ehash) {
  if (!m->cap) return NULL;
  size_t mask = m->cap - 1;
  for (size_t i = wmap_home(ehash, m->cap);; i = (i + 1) & mask) {
    wentry *e = &m->e[i];
    if (!e->used) return NULL;
    if (e->ehash == ehash) return e;
  }
}

static bool grow(wmap *m) {
  size_t cap = m->cap ? m->cap * 2 : 64;
  wentry *ne = calloc(cap, sizeof *ne);
  if (!ne) return false;
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->e[i].used) continue;
    size_t j = wmap_home(m->e[i].ehash, cap);
    while (ne[j].used) j = (j + 1) & (cap - 1);
    ne[j] = m->e[i];
  }
  free(m->e);
  m->e = ne;
  m->cap = cap;
  return true;
}

wentry *kvbm__wmap_upsert(wmap *m, uint64_t ehash, uint64_t rhash, bool *added) {
  *added = false;
  wentry *e = kvbm__wmap_find(m, ehash);
  if (e) return e;
  if ((m->n + 1) * 2 > m->cap && !grow(m)) return NULL;
  size_t i = wmap_home(ehash, m->cap);
  while (m->e[i].used) i = (i + 1) & (m->cap - 1);
  e = &m->e[i];
  memset(e, 0, sizeof *e);
  e->ehash = ehash;
  e->rhash = rhash;
  e->used = 1;
  m->n++;
  *added = true;
  return e;
}

void kvbm__wmap_erase(wmap *m, wentry *e) {
  size_t mask = m->cap - 1, i = (size_t)(e - m->e), j = i;
  for (;;) {
    j = (j + 1) & mask;
    if (!m->e[j].used) break;
    size_t k = wmap_home(m->e[j].ehash, m->cap);
    /* the entry at j may fill the hole at i when i lies on its probe path */
    if (((j - k) & mask) >= ((j - i) & mask)) {
      m->e[i] = m->e[j];
      i = j;
    }
  }
  m->e[i].used = 0;
  m->n--;
}

void kvbm__wmap_clear(wmap *m) {
  if (m->cap) memset(m->e, 0, m->cap * sizeof *m->e);
  m->n = 0;
}

void kvbm__wmap_free(wmap *m) {
  free(m->e);
  m->e = NULL;
  m->cap = m->n = 0;
}
