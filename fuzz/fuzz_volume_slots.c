/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_volume_slots.c: libFuzzer target for the Redis Cluster client's
 * reply handling: the reply reader of src/volume/resp.c (our object
 * functions under hiredis's parser) and the slot-map and redirection
 * parsers of src/volume/cluster_map.c.
 * fuzz-modules: common volume/resp.c volume/cluster_map.c
 * fuzz-libs: hiredis
 *
 * Beyond "no crash, no leak, no UB, no abort in hiredis": every range of
 * an accepted slot map lies within the 16384 slots with a host and a port,
 * every accepted redirection names a slot, a host and a port.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "volume/cluster.h"
#include "volume/resp.h"

static kvbm__slot_range ranges[KVBM__CLUSTER_SLOTS];

static void check(const redisReply *r) {
  size_t n = 0;
  if (kvbm__cluster_parse_slots(r, "asked.host", ranges, KVBM__CLUSTER_SLOTS, &n, NULL) == KVBM_OK) {
    for (size_t i = 0; i < n; i++)
      if (ranges[i].start > ranges[i].end || ranges[i].end >= KVBM__CLUSTER_SLOTS ||
          ranges[i].port == 0 || ranges[i].host[0] == 0)
        abort();
  }
  if (r->type == REDIS_REPLY_ERROR || r->type == REDIS_REPLY_STATUS ||
      r->type == REDIS_REPLY_STRING) {
    kvbm__redirect rd;
    if (r->str && kvbm__cluster_parse_redirect(r->str, r->len, "cur", &rd) &&
        (rd.slot >= KVBM__CLUSTER_SLOTS || rd.port == 0 || rd.host[0] == 0))
      abort();
  }
  if (r->type == REDIS_REPLY_STRING && r->str)
    (void)kvbm__cluster_keyslot(r->str, r->len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  redisReader *rd = kvbm__resp_reader();
  if (!rd) return 0;
  /* fed in two pieces: replies split across reads are the normal case */
  size_t half = size / 2;
  for (int part = 0; part < 2; part++) {
    const char *p = (const char *)data + (part ? half : 0);
    size_t n = part ? size - half : half;
    if (n && redisReaderFeed(rd, p, n) != REDIS_OK) break;
    for (;;) {
      void *r = NULL;
      if (redisReaderGetReply(rd, &r) != REDIS_OK || !r) break;
      check(r);
      kvbm__resp_reply_free(r);
    }
  }
  redisReaderFree(rd);
  return 0;
}
