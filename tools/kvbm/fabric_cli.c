/* SPDX-License-Identifier: Apache-2.0 */
/* fabric_cli.c: helpers shared by the fabric commands (see fabric_cli.h). */
#include "fabric_cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "common/secret.h"

const char fab_opts_usage[] =
    "  --layers N         layers per block (default 32)\n"
    "  --page-size N      tokens per block (default 16)\n"
    "  --inner N          elements per token per layer, K and V (default 2048)\n"
    "  --dtype-size N     bytes per element (default 2)\n"
    "  --layer-separate   one region per layer (default: fully contiguous)\n"
    "  --tls LIST         UCX transports (default: $UCX_TLS, else shm,self,tcp)\n"
    "  --net-devices LIST UCX network devices (default: $UCX_NET_DEVICES, else lo)\n"
    "  --host H           side-channel address (default 127.0.0.1)\n"
    "  --port N           side-channel TCP port (0: any free port when listening)\n"
    "  --timeout-ms N     connect and wait limit (default 30000)\n"
    "  --name NAME        this node's name, told to the peer\n";

void fab_opts_init(fab_opts *o, const char *name) {
  memset(o, 0, sizeof *o);
  o->blocks = 64;
  o->layers = 32;
  o->page = 16;
  o->inner = 2048;
  o->dtype = 2;
  o->kind = KVBM_LAYOUT_FULLY_CONTIGUOUS;
  o->host = "127.0.0.1";
  o->timeout_ms = 30000;
  o->name = name;
}

int fab_opts_parse(const char *cmd, fab_opts *o, int argc, char **argv, int *i) {
  const char *v;
  int r;
  struct {
    const char *name;
    uint64_t *dst, lo, hi;
  } nums[] = {
      {"--layers", &o->layers, 1, 4096},      {"--page-size", &o->page, 1, 65535},
      {"--inner", &o->inner, 1, 1u << 20},    {"--dtype-size", &o->dtype, 1, 16},
      {"--port", &o->port, 0, 65535},         {"--timeout-ms", &o->timeout_ms, 1, 3600000},
  };
  for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
    r = cli_opt_value(cmd, argc, argv, i, nums[k].name, &v);
    if (r < 0) return -1;
    if (r > 0) return cli_parse_u64(cmd, nums[k].name, v, nums[k].lo, nums[k].hi, nums[k].dst) ? 1 : -1;
  }
  struct {
    const char *name;
    const char **dst;
  } strs[] = {{"--tls", &o->tls}, {"--net-devices", &o->net_devices}, {"--host", &o->host}, {"--name", &o->name}};
  for (size_t k = 0; k < sizeof strs / sizeof strs[0]; k++) {
    r = cli_opt_value(cmd, argc, argv, i, strs[k].name, &v);
    if (r < 0) return -1;
    if (r > 0) {
      *strs[k].dst = v;
      return 1;
    }
  }
  if (strcmp(argv[*i], "--layer-separate") == 0) {
    o->kind = KVBM_LAYOUT_LAYER_SEPARATE;
    return 1;
  }
  return 0;
}

int fab_layout(const fab_opts *o, uint64_t blocks, kvbm_layout *out, kvbm_error *err) {
  kvbm_layout_config c = {.num_blocks = blocks, .num_layers = o->layers, .outer_dim = 1, .page_size = o->page,
                          .inner_dim = o->inner, .dtype_size = o->dtype, .alignment = 4096};
  return kvbm_layout_init(out, o->kind, &c, err);
}

const char fab_key_usage[] =
    "  --key-file FILE    the secret both nodes share (16..4096 bytes, e.g. from\n"
    "                     `head -c 32 /dev/urandom`); a regular file of yours that\n"
    "                     no other user can read (chmod 600). Default:\n"
    "                     $KVBM_FABRIC_KEY_FILE, else the secret in $KVBM_FABRIC_KEY.\n"
    "                     Each node proves it (keyed BLAKE3) before the other reads\n"
    "                     anything it sends.\n";

static int key_take(const char *cmd, fab_opts *o, const uint8_t *b, size_t n, const char *from) {
  if (n < KVBM_FABRIC_SECRET_MIN || n > KVBM_FABRIC_SECRET_MAX) {
    fprintf(stderr, "kvbm %s: the shared key in %s is %zu bytes; it must be %u..%u\n", cmd, from, n,
            KVBM_FABRIC_SECRET_MIN, KVBM_FABRIC_SECRET_MAX);
    return -1;
  }
  memcpy(o->key, b, n);
  o->key_len = n;
  return 0;
}

/* Reads a key file with the checks of common/secret.h. */
static int key_file(const char *cmd, fab_opts *o, const char *path) {
  uint8_t buf[KVBM_FABRIC_SECRET_MAX + 3];
  size_t len = 0;
  kvbm_error e = {0};
  int rc = kvbm__secret_file_read(path, buf, sizeof buf, &len, &e) ? -1 : 0;
  if (rc) fprintf(stderr, "kvbm %s: %s\n", cmd, e.msg);
  else rc = key_take(cmd, o, buf, len, path);
  explicit_bzero(buf, sizeof buf);
  return rc;
}

int fab_key_load(const char *cmd, fab_opts *o, const char *path) {
  if (path) return key_file(cmd, o, path);
  const char *env = getenv("KVBM_FABRIC_KEY_FILE");
  if (env && *env) return key_file(cmd, o, env);
  env = getenv("KVBM_FABRIC_KEY");
  if (env && *env) return key_take(cmd, o, (const uint8_t *)env, strlen(env), "$KVBM_FABRIC_KEY");
  fprintf(stderr,
          "kvbm %s: no shared key: give --key-file FILE (or set KVBM_FABRIC_KEY_FILE or KVBM_FABRIC_KEY);\n"
          "both nodes need the same one, e.g. head -c 32 /dev/urandom > key && chmod 600 key\n",
          cmd);
  return -1;
}

int fab_key_random(const char *cmd, fab_opts *o) {
  size_t got = 0;
  while (got < 32) {
    ssize_t n = getrandom(o->key + got, 32 - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fprintf(stderr, "kvbm %s: getrandom: %s\n", cmd, n < 0 ? strerror(errno) : "no bytes");
      return -1;
    }
    got += (size_t)n;
  }
  o->key_len = 32;
  return 0;
}

void fab_key_wipe(fab_opts *o) {
  explicit_bzero(o->key, sizeof o->key);
  o->key_len = 0;
}

kvbm_fabric_ucx_config fab_ucx_config(const fab_opts *o) {
  kvbm_fabric_ucx_config c = kvbm_fabric_ucx_config_default();
  c.name = o->name;
  c.key = o->key_len ? o->key : NULL;
  c.key_len = o->key_len;
  c.timeout_ms = (int)o->timeout_ms;
  c.transports = o->tls ? o->tls : getenv("UCX_TLS") ? NULL : "shm,self,tcp";
  c.net_devices = o->net_devices ? o->net_devices : getenv("UCX_NET_DEVICES") ? NULL : "lo";
  return c;
}

/* xorshift64 seeded by the hash: cheap, and any change of hash changes
 * every word. */
static uint64_t seed_of(uint64_t h) { return h ? h : 0x9E3779B97F4A7C15ull; }

void fab_fill_pattern(void *buf, uint64_t len, uint64_t seq_hash) {
  uint64_t x = seed_of(seq_hash);
  unsigned char *p = buf;
  uint64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    memcpy(p + i, &x, 8);
  }
  x ^= x << 13;
  for (; i < len; i++) p[i] = (unsigned char)(x >> (8 * (i & 7)));
}

bool fab_check_pattern(const void *buf, uint64_t len, uint64_t seq_hash) {
  uint64_t x = seed_of(seq_hash);
  const unsigned char *p = buf;
  uint64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    if (memcmp(p + i, &x, 8) != 0) return false;
  }
  x ^= x << 13;
  for (; i < len; i++)
    if (p[i] != (unsigned char)(x >> (8 * (i & 7)))) return false;
  return true;
}

static int block_copy(const kvbm_storage *s, const kvbm_layout *l, uint64_t b, void *buf, bool to_storage) {
  for (uint64_t layer = 0; layer < l->config.num_layers; layer++) {
    void *ptr;
    size_t size;
    int rc = kvbm_storage_block_layer_ptr(s, l, b, layer, &ptr, &size, NULL);
    if (rc) return rc;
    char *c = (char *)buf + layer * l->layer_stride;
    if (to_storage)
      memcpy(ptr, c, size);
    else
      memcpy(c, ptr, size);
  }
  return KVBM_OK;
}

int fab_block_get(const kvbm_storage *s, const kvbm_layout *l, uint64_t b, void *out) {
  return block_copy(s, l, b, out, false);
}

int fab_block_put(kvbm_storage *s, const kvbm_layout *l, uint64_t b, const void *in) {
  return block_copy(s, l, b, (void *)(uintptr_t)in, true);
}

void *fab_block_ptr(const kvbm_storage *s, const kvbm_layout *l, uint64_t b) {
  void *ptr = NULL;
  if (kvbm_storage_block_layer_ptr(s, l, b, 0, &ptr, NULL, NULL) != KVBM_OK) return NULL;
  return ptr;
}
