/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fabric_cli.h: what `kvbm fabric-node` and `kvbm transfer-bench` share:
 * block geometry options, UCX transport options, the deterministic block
 * content, and copying a block between a contiguous buffer and storage.
 */
#ifndef KVBM_FABRIC_CLI_H
#define KVBM_FABRIC_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "kvbm/fabric.h"
#include "kvbm/layout.h"
#include "kvbm/storage.h"

typedef struct fab_opts {
  /* geometry: W4's default block, 32 layers x 16 tokens x 2048 x 2 bytes */
  uint64_t blocks, layers, page, inner, dtype;
  kvbm_layout_kind kind;
  /* UCX */
  const char *tls, *net_devices;
  const char *host;
  uint64_t port;
  uint64_t timeout_ms;
  const char *name; /* this node's name (the fabric's label is the transport's) */
  /* the shared key (fab_key_load / fab_key_random) */
  uint8_t key[KVBM_FABRIC_SECRET_MAX];
  size_t key_len;
} fab_opts;

void fab_opts_init(fab_opts *o, const char *name);

/* Tries argv[*i] as one of the shared options: 1 consumed, 0 not ours,
 * -1 bad value (message printed). */
int fab_opts_parse(const char *cmd, fab_opts *o, int argc, char **argv, int *i);

/* Help text for the shared options. */
extern const char fab_opts_usage[];

/* The layout of the options' geometry (outer_dim 1: K and V are folded
 * into inner, as in W4's 2 MiB block). */
int fab_layout(const fab_opts *o, uint64_t blocks, kvbm_layout *out, kvbm_error *err);

/* UCX config from the options: --tls / --net-devices, else UCX_TLS /
 * UCX_NET_DEVICES from the environment, else shared memory plus TCP on
 * the loopback device. */
kvbm_fabric_ucx_config fab_ucx_config(const fab_opts *o);

/* The shared key both nodes must hold, from the first of: `path`
 * (--key-file), the file named by $KVBM_FABRIC_KEY_FILE, the secret in
 * $KVBM_FABRIC_KEY. A key file must be a regular file of this user that no
 * other user can read (mode 0600 or stricter), not a symbolic link; one
 * trailing newline is dropped. The secret is
 * KVBM_FABRIC_SECRET_MIN..KVBM_FABRIC_SECRET_MAX bytes. Returns 0, or -1
 * after printing what is wrong (prefixed with "kvbm CMD: "). */
int fab_key_load(const char *cmd, fab_opts *o, const char *path);

/* A fresh random 32-byte key, for a command whose two ends are its own
 * processes (transfer-bench). Returns 0 or -1 (message printed). */
int fab_key_random(const char *cmd, fab_opts *o);

/* Forgets the key. */
void fab_key_wipe(fab_opts *o);

/* Help text for the key options. */
extern const char fab_key_usage[];

/* Block contents derived from the block's sequence hash. */
void fab_fill_pattern(void *buf, uint64_t len, uint64_t seq_hash);
bool fab_check_pattern(const void *buf, uint64_t len, uint64_t seq_hash);

/* Copies block `b` of `layout` in `s` to / from a contiguous buffer of
 * num_layers * layer_stride bytes. */
int fab_block_get(const kvbm_storage *s, const kvbm_layout *layout, uint64_t b, void *out);
int fab_block_put(kvbm_storage *s, const kvbm_layout *layout, uint64_t b, const void *in);

/* Start of block b (FullyContiguous only): the whole block is contiguous. */
void *fab_block_ptr(const kvbm_storage *s, const kvbm_layout *layout, uint64_t b);

#endif
