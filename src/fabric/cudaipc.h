/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cudaipc.h (private): the pieces of the CUDA IPC fabric (cudaipc.c) that
 * need no device, exposed so that tests/fabric/test_cudaipc_wire.c can
 * check every refusal on a machine without a GPU.
 *
 *   region key  what an exported region carries for the importer (88 bytes,
 *               little-endian): "CIPK", u32 version 1, the 64-byte
 *               cudaIpcMemHandle_t of the allocation holding the region,
 *               u64 offset of the region's base inside that allocation,
 *               u64 size of the allocation as the exporter saw it.
 *   hello addr  the "address" a CUDA IPC end sends in its hello (hello.h):
 *               "CIPA", u32 version 1, u32 pid, u32 reserved (zero), the
 *               36-character boot id of its host
 *               (/proc/sys/kernel/random/boot_id), the 16-byte UUID of its
 *               device: 68 bytes. Two ends on different hosts are refused
 *               at the handshake (CUDA IPC is one node only) instead of at
 *               the first cudaIpcOpenMemHandle.
 */
#ifndef KVBM_FABRIC_CUDAIPC_H
#define KVBM_FABRIC_CUDAIPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/fabric.h"

#define KVBM__CIPC_KEY_TAG "CIPK"
#define KVBM__CIPC_KEY_VERSION 1u
#define KVBM__CIPC_HANDLE 64u /* sizeof(cudaIpcMemHandle_t) */
#define KVBM__CIPC_KEY_LEN 88u
#define KVBM__CIPC_ADDR_TAG "CIPA"
#define KVBM__CIPC_ADDR_VERSION 1u
#define KVBM__CIPC_BOOT_ID 36u
#define KVBM__CIPC_ADDR_LEN 68u

typedef struct kvbm__cipc_key {
  uint8_t handle[KVBM__CIPC_HANDLE];
  uint64_t offset;     /* region base - allocation base, at the exporter */
  uint64_t alloc_size; /* the allocation's size, at the exporter */
} kvbm__cipc_key;

/* Writes k into out[KVBM__CIPC_KEY_LEN]. */
void kvbm__cipc_key_encode(const kvbm__cipc_key *k, uint8_t out[KVBM__CIPC_KEY_LEN]);

/* Decodes a peer's key for a registered extent of `len` bytes and checks
 * it: KVBM_EPROTO for a key of another length, tag or version (not a CUDA
 * IPC key: e.g. a UCX rkey), KVBM_ERANGE when [offset, offset + len) is not
 * inside an allocation of alloc_size bytes (or alloc_size is 0). */
int kvbm__cipc_key_decode(const uint8_t *in, size_t in_len, uint64_t len, kvbm__cipc_key *k,
                          kvbm_error *err);

typedef struct kvbm__cipc_addr {
  uint32_t pid;
  char boot_id[KVBM__CIPC_BOOT_ID];
  uint8_t uuid[16];
} kvbm__cipc_addr;

void kvbm__cipc_addr_encode(const kvbm__cipc_addr *a, uint8_t out[KVBM__CIPC_ADDR_LEN]);

/* Decodes a peer's hello address and checks that it is a CUDA IPC end
 * (KVBM_EPROTO otherwise: a UCX end, garbage) on this host (`ours`: a boot
 * id that differs is KVBM_EUNSUPPORTED naming both). */
int kvbm__cipc_addr_decode(const uint8_t *in, size_t len, const kvbm__cipc_addr *ours,
                           kvbm__cipc_addr *out, kvbm_error *err);

/* This process's address (pid, boot id; uuid zero: filled by the fabric
 * from its device). */
void kvbm__cipc_addr_self(kvbm__cipc_addr *a);

/* Test seam: accept / connect without requiring a device, so that the
 * handshake, the messages and every refusal before CUDA is reached can be
 * tested on a machine without a GPU (and without the CUDA toolkit). Such a
 * fabric's block operations that would need CUDA return KVBM_EDEVICE (or
 * KVBM_EUNSUPPORTED in a build without CUDA) after the checks that need
 * none. */
int kvbm__fabric_cudaipc_accept_nodev(kvbm_fabric_cudaipc_listener *l, kvbm_fabric **out, kvbm_error *err);
int kvbm__fabric_cudaipc_connect_nodev(const kvbm_fabric_cudaipc_config *cfg, const char *host, uint16_t port,
                                       kvbm_fabric **out, kvbm_error *err);

#endif
