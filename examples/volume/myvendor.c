/* SPDX-License-Identifier: Apache-2.0 */
/*
 * myvendor.c: a storage vendor's backend for kvbm, written against
 * <kvbm/volume.h> alone. "myvendor://NAME" is an in-memory store of a
 * fixed number of values, each kept with a checksum: small enough to read
 * in one sitting, complete enough to show every part of the contract.
 *
 *   open   once per I/O thread of the volume; every thread's state points
 *          at the one store the caller passed as backend_user (a real
 *          vendor would open a connection or a device queue here)
 *   run    executes a batch: every op gets a status; it stops at the
 *          deadline (KVBM_ETIMEDOUT for the rest); a value whose checksum
 *          no longer matches is reported KVBM_ECHECKSUM, which kvbm counts
 *          as corrupt (a miss, never the bytes)
 *   close  frees a state (not the store: the caller owns it)
 *
 *   cc -c myvendor.c $(pkg-config --cflags kvbm)
 */
#include "myvendor.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct myvendor_store {
  pthread_mutex_t mu;
  size_t capacity;
  struct entry {
    uint64_t key;
    unsigned char *bytes; /* NULL: free */
    size_t len;
    uint64_t sum;
  } *entries;
  uint64_t opens; /* states opened, for the demo's report */
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* FNV-1a: enough to catch a flipped byte in a demo. */
static uint64_t checksum(const unsigned char *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

myvendor_store *myvendor_store_create(size_t capacity) {
  myvendor_store *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->entries = calloc(capacity ? capacity : 1, sizeof *s->entries);
  if (!s->entries) {
    free(s);
    return NULL;
  }
  s->capacity = capacity;
  pthread_mutex_init(&s->mu, NULL);
  return s;
}

void myvendor_store_destroy(myvendor_store *s) {
  if (!s) return;
  for (size_t i = 0; i < s->capacity; i++) free(s->entries[i].bytes);
  free(s->entries);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

int myvendor_store_damage(myvendor_store *s, uint64_t key) {
  int found = 0;
  pthread_mutex_lock(&s->mu);
  for (size_t i = 0; i < s->capacity; i++)
    if (s->entries[i].bytes && s->entries[i].key == key && s->entries[i].len) {
      s->entries[i].bytes[0] ^= 1;
      found = 1;
    }
  pthread_mutex_unlock(&s->mu);
  return found;
}

uint64_t myvendor_store_opens(myvendor_store *s) {
  pthread_mutex_lock(&s->mu);
  uint64_t n = s->opens;
  pthread_mutex_unlock(&s->mu);
  return n;
}

static int mv_open(const kvbm_volume_config *cfg, void *user, void **state, kvbm_error *err) {
  myvendor_store *s = user;
  if (!s) return kvbm_error_set(err, KVBM_EINVAL, "myvendor: %s: no store (backend_user)", cfg->url);
  pthread_mutex_lock(&s->mu);
  s->opens++;
  pthread_mutex_unlock(&s->mu);
  *state = s;
  return KVBM_OK;
}

static struct entry *find(myvendor_store *s, uint64_t key) {
  for (size_t i = 0; i < s->capacity; i++)
    if (s->entries[i].bytes && s->entries[i].key == key) return &s->entries[i];
  return NULL;
}

static int put(myvendor_store *s, const kvbm_volume_op *op) {
  struct entry *e = find(s, op->key);
  for (size_t i = 0; !e && i < s->capacity; i++)
    if (!s->entries[i].bytes) e = &s->entries[i];
  if (!e) return KVBM_ENOSPC; /* full: the tier above evicts with delete */
  unsigned char *copy = malloc(op->len);
  if (!copy) return KVBM_EIO;
  memcpy(copy, op->src, op->len);
  free(e->bytes);
  *e = (struct entry){op->key, copy, op->len, checksum(copy, op->len)};
  return KVBM_OK;
}

static int get(myvendor_store *s, kvbm_volume_op *op) {
  struct entry *e = find(s, op->key);
  if (!e) return KVBM_ENOTFOUND;
  op->size = e->len;
  if (e->len > op->cap) return KVBM_ENOSPC;
  if (checksum(e->bytes, e->len) != e->sum) return KVBM_ECHECKSUM; /* never hand out bad bytes */
  memcpy(op->dst, e->bytes, e->len);
  return KVBM_OK;
}

static void mv_run(void *state, kvbm_volume_op *ops, size_t n, uint64_t deadline_ns) {
  myvendor_store *s = state;
  for (size_t i = 0; i < n; i++) {
    kvbm_volume_op *op = &ops[i];
    if (now_ns() >= deadline_ns) {
      op->status = KVBM_ETIMEDOUT;
      continue;
    }
    pthread_mutex_lock(&s->mu);
    struct entry *e;
    switch (op->kind) {
    case KVBM_VOLUME_PUT: op->status = put(s, op); break;
    case KVBM_VOLUME_GET: op->status = get(s, op); break;
    case KVBM_VOLUME_EXISTS:
      e = find(s, op->key);
      op->status = e ? KVBM_OK : KVBM_ENOTFOUND;
      op->size = e ? e->len : 0;
      break;
    case KVBM_VOLUME_DELETE:
      e = find(s, op->key);
      op->status = e ? KVBM_OK : KVBM_ENOTFOUND;
      if (e) {
        free(e->bytes);
        e->bytes = NULL;
      }
      break;
    default: op->status = KVBM_EIO; break;
    }
    pthread_mutex_unlock(&s->mu);
  }
}

static void mv_close(void *state) { (void)state; /* the store is the caller's */ }

static const kvbm_volume_backend kBackend = {
    .scheme = "myvendor",
    .max_threads = 0, /* any number of I/O threads */
    .open = mv_open,
    .run = mv_run,
    .close = mv_close,
};

const kvbm_volume_backend *myvendor_backend(void) { return &kBackend; }
