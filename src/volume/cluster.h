/* SPDX-License-Identifier: Apache-2.0 */
/*
 * volume/cluster.h: the Redis Cluster protocol's pure parts (private to
 * src/volume/): key slots, the CLUSTER SLOTS reply, MOVED/ASK
 * redirections. No I/O here: cluster.c drives connections with these, and
 * the fuzz target (fuzz/fuzz_volume_slots.c) feeds them hostile replies.
 */
#ifndef KVBM_VOLUME_CLUSTER_H
#define KVBM_VOLUME_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "kvbm/status.h"

#define KVBM__CLUSTER_SLOTS 16384u

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), as Redis Cluster
 * hashes keys. */
uint16_t kvbm__cluster_crc16(const char *buf, size_t len);

/* The slot of a key, as Redis computes it: the hash tag (the bytes between
 * the first '{' and the first '}' after it) when it is not empty, the whole
 * key otherwise; CRC16 mod 16384. */
uint16_t kvbm__cluster_keyslot(const char *key, size_t len);

/* One range of the slot map and its master. */
typedef struct kvbm__slot_range {
  uint16_t start, end; /* inclusive */
  char host[256];      /* "" in the reply: the node that answered */
  uint16_t port;
} kvbm__slot_range;

/* Parses a CLUSTER SLOTS reply into out[0 .. *n) (cap entries), resolving
 * an empty host to `asked_host`. Entries whose master has no usable
 * endpoint ("?", a NULL host, port 0) are left out (those slots stay
 * unknown). KVBM_EPROTO names what is malformed (an entry's shape, a
 * range outside 0..16383, two entries claiming one slot, more than 16384
 * entries or than cap); never reads outside the reply. One pass, no
 * allocation. */
int kvbm__cluster_parse_slots(const redisReply *r, const char *asked_host, kvbm__slot_range *out,
                              size_t cap, size_t *n, kvbm_error *err);

/* A redirection error reply: "MOVED <slot> <host>:<port>" or "ASK ...".
 * An empty host means `current_host`. Returns false when the text is not
 * a well-formed redirection. */
typedef struct kvbm__redirect {
  bool ask; /* ASK (one command, after ASKING) rather than MOVED */
  uint16_t slot;
  char host[256];
  uint16_t port;
} kvbm__redirect;

bool kvbm__cluster_parse_redirect(const char *msg, size_t len, const char *current_host,
                                  kvbm__redirect *out);

#endif
