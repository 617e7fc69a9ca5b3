/* SPDX-License-Identifier: Apache-2.0 */
/*
 * demo.c: kvbm storing blocks in a vendor's backend (myvendor.c). Registers
 * a volume on "myvendor://demo" with two I/O threads, stores and reads back
 * blocks in one asynchronous batch, shows a full store, a damaged value
 * (a counted miss, never bad bytes) and the counters.
 *
 *   cc demo.c myvendor.c $(pkg-config --cflags --libs kvbm) -o demo
 *
 * Exits 0 when every step behaved as the contract says.
 */
#include <stdio.h>
#include <string.h>

#include "myvendor.h"

#define BLOCK 4096
#define N 8

static int failures;

#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "demo: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                    \
    }                                                                \
  } while (0)

typedef struct completion {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
} completion;

/* Runs on a volume I/O thread when the whole batch has a status. */
static void on_done(void *user, kvbm_volume_op *ops, size_t n) {
  completion *c = user;
  (void)ops;
  (void)n;
  pthread_mutex_lock(&c->mu);
  c->done = 1;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

int main(void) {
  myvendor_store *store = myvendor_store_create(N + 1);
  kvbm_volume_config cfg = kvbm_volume_config_default("myvendor://demo");
  cfg.backend = myvendor_backend();
  cfg.backend_user = store;
  cfg.key_namespace = "demo-model:fp16:16";
  cfg.threads = 2;
  kvbm_volume *v;
  kvbm_error err;
  if (kvbm_volume_register(&cfg, &v, &err) != KVBM_OK) {
    fprintf(stderr, "demo: register: %s\n", err.msg);
    return 1;
  }
  CHECK(myvendor_store_opens(store) == 2); /* one state per I/O thread */

  /* One batch: N puts, then N gets of the same keys. */
  static unsigned char blocks[N][BLOCK], back[N][BLOCK];
  kvbm_volume_op ops[2 * N];
  for (int i = 0; i < N; i++) {
    memset(blocks[i], 'a' + i, BLOCK);
    ops[i] = (kvbm_volume_op){.kind = KVBM_VOLUME_PUT, .key = 100 + (uint64_t)i,
                              .src = blocks[i], .len = BLOCK};
    ops[N + i] = (kvbm_volume_op){.kind = KVBM_VOLUME_GET, .key = 100 + (uint64_t)i,
                                  .dst = back[i], .cap = BLOCK};
  }
  completion c = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  CHECK(kvbm_volume_submit(v, ops, 2 * N, on_done, &c) == KVBM_OK);
  pthread_mutex_lock(&c.mu);
  while (!c.done) pthread_cond_wait(&c.cv, &c.mu);
  pthread_mutex_unlock(&c.mu);
  for (int i = 0; i < 2 * N; i++) CHECK(ops[i].status == KVBM_OK);
  for (int i = 0; i < N; i++) CHECK(memcmp(back[i], blocks[i], BLOCK) == 0);

  /* The store holds N + 1 values: the second new key does not fit. */
  CHECK(kvbm_volume_put(v, 500, blocks[0], BLOCK) == KVBM_OK);
  CHECK(kvbm_volume_put(v, 501, blocks[0], BLOCK) == KVBM_ENOSPC);
  CHECK(kvbm_volume_delete(v, 500) == KVBM_OK);
  CHECK(kvbm_volume_put(v, 501, blocks[0], BLOCK) == KVBM_OK);

  /* A damaged value is a miss, counted as corrupt. */
  CHECK(myvendor_store_damage(store, 103));
  size_t size;
  CHECK(kvbm_volume_get(v, 103, back[0], BLOCK, &size) == KVBM_ECHECKSUM);
  CHECK(kvbm_volume_get(v, 104, back[0], BLOCK, &size) == KVBM_OK && size == BLOCK);

  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  printf("%s: %llu puts, %llu gets (%llu hits, %llu misses, %llu corrupt), %llu full\n",
         kvbm_volume_name(v), (unsigned long long)s.puts, (unsigned long long)s.gets,
         (unsigned long long)s.hits, (unsigned long long)s.misses, (unsigned long long)s.corrupt,
         (unsigned long long)s.full);
  CHECK(s.puts == N + 3 && s.gets == N + 2 && s.hits == N + 1 && s.corrupt == 1 && s.full == 1);
  kvbm_volume_unregister(v);
  myvendor_store_destroy(store);
  if (failures) fprintf(stderr, "demo: %d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
