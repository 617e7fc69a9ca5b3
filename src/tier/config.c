/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config.c: the manager's configuration (see kvbm/manager.h).
 *
 * Three sources meet here. The defaults (kvbm_manager_config_default) are
 * Dynamo's KVBM shape scaled to a test machine: write-through G2, G3
 * behind the frequency filter, write-through G4 when a URL names one. The
 * environment (kvbm_manager_config_env) is a compatibility layer: Dynamo's
 * DYN_KVBM_* names where Dynamo has a setting, kvbm's own KVBM_* names for
 * what Dynamo does not have (a G4 URL: Dynamo's G4 is an S3 bucket), applied
 * over whatever the caller set, all or nothing, so a bad value never leaves
 * a half-applied config. Validation
 * (kvbm__manager_check_config) runs at create and names the first bad
 * field; nothing past it has to re-check a range.
 *
 * Nothing here holds state: every function works on the caller's struct.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tier/internal.h"

const char *kvbm_offload_policy_name(int p) {
  static const char *const n[] = {"never", "all", "frequency"};
  return p >= 0 && p <= 2 ? n[p] : "?";
}

bool kvbm_offload_policy_parse(const char *s, kvbm_offload_policy *out) {
  for (int p = 0; p <= 2 && s; p++)
    if (!strcmp(s, kvbm_offload_policy_name(p))) {
      *out = (kvbm_offload_policy)p;
      return true;
    }
  return false;
}

kvbm_manager_config kvbm_manager_config_default(void) {
  kvbm_manager_config c;
  memset(&c, 0, sizeof c);
  c.block_size = 16;
  c.scheme = KVBM_HASH_NATIVE;
  c.layout = (kvbm_layout_config){.num_blocks = 1, .num_layers = 2, .outer_dim = 1,
                                  .page_size = 16, .inner_dim = 64, .dtype_size = 2,
                                  .alignment = 4096};
  c.g1_kind = c.g2_kind = KVBM_LAYOUT_FULLY_CONTIGUOUS;
  c.g1_memory = c.g2_memory = KVBM_MEMORY_SYSTEM;
  c.g1_blocks = 1024;
  c.g3_direct = true;
  c.g3_uring = true;
  c.g3_queue_depth = 8;
  c.g2_policy = KVBM_OFFLOAD_ALL;
  c.g3_policy = KVBM_OFFLOAD_FREQUENCY;
  c.freq_threshold = 2;
  c.freq_decay_uses = 65536;
  c.freq_max_entries = 1u << 20;
  c.queue_capacity = 4096;
  c.batch_max = 64;
  c.drain_on_destroy = true;
  c.g4_blocks = 100000;
  c.g4_policy = KVBM_OFFLOAD_ALL;
  c.g4_queue_depth = 16;
  c.g4_timeout_ms = 2000;
  c.g4_lookup_timeout_ms = 20;
  c.g4_lookup_max = 512;
  c.g4_backoff_ms = 1000;
  c.metrics = kvbm_metrics_server_config_default();
  c.offload_threshold_blocks = 8;
  c.output_pull = false;
  c.pull_timeout_ms = 200;
  return c;
}

/* ---- environment ---- */

static const char *env_get(const char *const *env, const char *name) {
  if (!env) return getenv(name);
  size_t n = strlen(name);
  for (; *env; env++)
    if (!strncmp(*env, name, n) && (*env)[n] == '=') return *env + n + 1;
  return NULL;
}

static int env_blocks(const char *name, const char *v, uint64_t max, uint64_t *out,
                      kvbm_error *err) {
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (!*v || *end || errno || v[0] == '-' || x > max)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: %s='%s' is not a block count in 0..%llu",
                          name, v, (unsigned long long)max);
  *out = x;
  return KVBM_OK;
}

static int env_gib(const char *name, const char *v, uint64_t block_bytes, uint64_t max,
                   uint64_t *out, kvbm_error *err) {
  char *end;
  errno = 0;
  double g = strtod(v, &end);
  if (!*v || *end || errno || !(g >= 0) || g > 1e9)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: %s='%s' is not a size in GiB", name, v);
  double blocks = g * 1073741824.0 / (double)block_bytes;
  if (blocks > (double)max)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: %s='%s' is more than %llu blocks", name, v,
                          (unsigned long long)max);
  *out = (uint64_t)blocks;
  return KVBM_OK;
}

static int env_bool(const char *name, const char *v, bool *out, kvbm_error *err) {
  if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
      !strcasecmp(v, "on"))
    *out = true;
  else if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
           !strcasecmp(v, "off") || !*v)
    *out = false;
  else
    return kvbm_error_set(err, KVBM_EINVAL, "manager: %s='%s' is not a boolean", name, v);
  return KVBM_OK;
}

static int env_policy(const char *name, const char *v, kvbm_offload_policy *out, kvbm_error *err) {
  if (!kvbm_offload_policy_parse(v, out))
    return kvbm_error_set(err, KVBM_EINVAL, "manager: %s='%s' is not never, all or frequency",
                          name, v);
  return KVBM_OK;
}

static int env_url(const char *name, const char *v, const char **out, kvbm_error *err) {
  if (!*v) return kvbm_error_set(err, KVBM_EINVAL, "manager: %s is empty", name);
  *out = v;
  return KVBM_OK;
}

/* An unsigned setting in lo..hi, stored by the caller's cast. */
static int env_uint(const char *const *env, const char *name, uint64_t lo, uint64_t hi,
                    bool *set, uint64_t *out, kvbm_error *err) {
  const char *v = env_get(env, name);
  *set = false;
  if (!v) return KVBM_OK;
  int rc = env_blocks(name, v, hi, out, err);
  if (!rc && *out < lo)
    rc = kvbm_error_set(err, KVBM_EINVAL, "manager: %s='%s' is below %llu", name, v,
                        (unsigned long long)lo);
  *set = !rc;
  return rc;
}

/* Dynamo's tier sizes and disk settings. */
static int env_dynamo_tiers(kvbm_manager_config *c, const char *const *env, uint64_t bb,
                            kvbm_error *err) {
  uint64_t x;
  const char *v;
  int rc;
  if ((v = env_get(env, "DYN_KVBM_CPU_CACHE_GB"))) {
    if ((rc = env_gib("DYN_KVBM_CPU_CACHE_GB", v, bb, KVBM_POOL_MAX_BLOCKS, &x, err))) return rc;
    c->g2_blocks = (uint32_t)x;
  }
  if ((v = env_get(env, "DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS"))) {
    if ((rc = env_blocks("DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS", v, KVBM_POOL_MAX_BLOCKS, &x,
                         err)))
      return rc;
    c->g2_blocks = (uint32_t)x;
  }
  if ((v = env_get(env, "DYN_KVBM_DISK_CACHE_GB"))) {
    if ((rc = env_gib("DYN_KVBM_DISK_CACHE_GB", v, bb, KVBM_POOL_MAX_BLOCKS, &x, err))) return rc;
    c->g3_blocks = x;
  }
  if ((v = env_get(env, "DYN_KVBM_DISK_CACHE_OVERRIDE_NUM_BLOCKS"))) {
    if ((rc = env_blocks("DYN_KVBM_DISK_CACHE_OVERRIDE_NUM_BLOCKS", v, KVBM_POOL_MAX_BLOCKS, &x,
                         err)))
      return rc;
    c->g3_blocks = x;
  }
  if ((v = env_get(env, "DYN_KVBM_DISK_CACHE_DIR"))) {
    if (!*v) return kvbm_error_set(err, KVBM_EINVAL, "manager: DYN_KVBM_DISK_CACHE_DIR is empty");
    c->g3_dir = v;
  }
  bool b;
  if ((v = env_get(env, "DYN_KVBM_DISK_DISABLE_O_DIRECT"))) {
    if ((rc = env_bool("DYN_KVBM_DISK_DISABLE_O_DIRECT", v, &b, err))) return rc;
    c->g3_direct = !b;
  }
  if ((v = env_get(env, "DYN_KVBM_DISABLE_DISK_OFFLOAD_FILTER"))) {
    if ((rc = env_bool("DYN_KVBM_DISABLE_DISK_OFFLOAD_FILTER", v, &b, err))) return rc;
    if (b) c->g3_policy = KVBM_OFFLOAD_ALL;
  }
  bool set;
  if ((rc = env_uint(env, "DYN_KVBM_TRANSFER_BATCH_SIZE", 1, 256, &set, &x, err))) return rc;
  if (set) c->batch_max = (uint32_t)x;
  return KVBM_OK;
}

/* G4: Dynamo's object-storage switches, kvbm's URL and knobs. */
static int env_g4(kvbm_manager_config *c, const char *const *env, kvbm_error *err) {
  const char *v;
  int rc;
  uint64_t x;
  bool set;
  if ((v = env_get(env, "KVBM_G3_URL")) && (rc = env_url("KVBM_G3_URL", v, &c->g3_url, err)))
    return rc;
  if ((v = env_get(env, "KVBM_G4_URL")) && (rc = env_url("KVBM_G4_URL", v, &c->g4_url, err)))
    return rc;
  if ((rc = env_uint(env, "DYN_KVBM_OBJECT_NUM_BLOCKS", 1, KVBM_POOL_MAX_BLOCKS, &set, &x, err)))
    return rc;
  if (set) c->g4_blocks = (uint32_t)x;
  static const struct {
    const char *name;
    size_t off;
  } pol[] = {{"KVBM_G2_POLICY", offsetof(kvbm_manager_config, g2_policy)},
             {"KVBM_G3_POLICY", offsetof(kvbm_manager_config, g3_policy)},
             {"KVBM_G4_POLICY", offsetof(kvbm_manager_config, g4_policy)}};
  for (size_t i = 0; i < sizeof pol / sizeof pol[0]; i++)
    if ((v = env_get(env, pol[i].name)) &&
        (rc = env_policy(pol[i].name, v, (kvbm_offload_policy *)((char *)c + pol[i].off), err)))
      return rc;
  if ((rc = env_uint(env, "KVBM_G4_QUEUE_DEPTH", 1, 1024, &set, &x, err))) return rc;
  if (set) c->g4_queue_depth = (uint32_t)x;
  if ((rc = env_uint(env, "KVBM_G4_TIMEOUT_MS", 1, 3600000, &set, &x, err))) return rc;
  if (set) c->g4_timeout_ms = (int32_t)x;
  if ((rc = env_uint(env, "KVBM_G4_LOOKUP_TIMEOUT_MS", 0, 3600000, &set, &x, err))) return rc;
  if (set) c->g4_lookup_timeout_ms = (int32_t)x;
  if ((rc = env_uint(env, "KVBM_G4_LOOKUP_MAX", 1, 65536, &set, &x, err))) return rc;
  if (set) c->g4_lookup_max = (uint32_t)x;
  if ((rc = env_uint(env, "KVBM_G4_BACKOFF_MS", 0, 3600000, &set, &x, err))) return rc;
  if (set) c->g4_backoff_ms = (int32_t)x;
  if ((v = env_get(env, "KVBM_MODEL_ID"))) {
    if (!*v) return kvbm_error_set(err, KVBM_EINVAL, "manager: KVBM_MODEL_ID is empty");
    c->model_id = v;
  }
  /* The cluster key: a file's path, or the secret itself; never both. */
  if ((v = env_get(env, "KVBM_G4_KEY_FILE")) &&
      (rc = env_url("KVBM_G4_KEY_FILE", v, &c->g4_key_file, err)))
    return rc;
  if ((v = env_get(env, "DYN_KVBM_G4_KEY"))) {
    if (!*v) return kvbm_error_set(err, KVBM_EINVAL, "manager: DYN_KVBM_G4_KEY is empty");
    c->g4_key = v;
    c->g4_key_len = strlen(v);
  }
  if ((v = env_get(env, "KVBM_G4_ENCRYPT")) &&
      (rc = env_bool("KVBM_G4_ENCRYPT", v, &c->g4_encrypt, err)))
    return rc;
  bool on;
  if ((v = env_get(env, "DYN_KVBM_OBJECT_ENABLED"))) {
    if ((rc = env_bool("DYN_KVBM_OBJECT_ENABLED", v, &on, err))) return rc;
    if (on && !c->g4_url)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "manager: DYN_KVBM_OBJECT_ENABLED is set but no G4 URL is "
                            "(KVBM_G4_URL, e.g. redis://host:6379)");
    if (!on) c->g4_url = NULL;
  }
  return KVBM_OK;
}

int kvbm_manager_config_env(kvbm_manager_config *cfg, const char *const *env, kvbm_error *err) {
  if (!cfg) return kvbm_error_set(err, KVBM_EINVAL, "manager: NULL config");
  kvbm_layout lay;
  kvbm_layout_config lc = cfg->layout;
  lc.num_blocks = 1;
  int rc = kvbm_layout_init(&lay, KVBM_LAYOUT_FULLY_CONTIGUOUS, &lc, err);
  if (rc) return rc;
  uint64_t bb = lay.config.num_layers * lay.layer_stride;
  kvbm_manager_config c = *cfg;
  if ((rc = env_dynamo_tiers(&c, env, bb, err)) || (rc = env_g4(&c, env, err)) ||
      (rc = kvbm_metrics_server_config_env(&c.metrics, env, err)))
    return rc;
  *cfg = c;
  return KVBM_OK;
}

/* ---- validation ---- */

static bool model_id_ok(const char *s) {
  size_t n = 0;
  for (; s[n]; n++) {
    char ch = s[n];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-';
    if (!ok || n >= 64) return false;
  }
  return n > 0;
}

static int check_g4(const kvbm_manager_config *c, kvbm_error *err) {
  if ((unsigned)c->g4_policy > KVBM_OFFLOAD_FREQUENCY)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: unknown g4_policy %d", (int)c->g4_policy);
  if (c->g4_url && (c->g4_blocks == 0 || c->g4_blocks > KVBM_POOL_MAX_BLOCKS))
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g4_blocks %u is not in 1..%u", c->g4_blocks,
                          KVBM_POOL_MAX_BLOCKS);
  if (c->g4_queue_depth == 0 || c->g4_queue_depth > 1024)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g4_queue_depth %u is not in 1..1024",
                          c->g4_queue_depth);
  if (c->g4_timeout_ms <= 0 || c->g4_timeout_ms > 3600000)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g4_timeout_ms %d is not in 1..3600000",
                          (int)c->g4_timeout_ms);
  if (c->g4_lookup_timeout_ms < 0 || c->g4_lookup_timeout_ms > 3600000)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "manager: g4_lookup_timeout_ms %d is not in 0..3600000",
                          (int)c->g4_lookup_timeout_ms);
  if (c->g4_lookup_max == 0 || c->g4_lookup_max > 65536)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g4_lookup_max %u is not in 1..65536",
                          c->g4_lookup_max);
  if (c->g4_backoff_ms < 0 || c->g4_backoff_ms > 3600000)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g4_backoff_ms %d is not in 0..3600000",
                          (int)c->g4_backoff_ms);
  if (c->model_id && !model_id_ok(c->model_id))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "manager: model_id '%.64s' is not 1..64 of [A-Za-z0-9._-]", c->model_id);
  if (c->g4_key && c->g4_key_file)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "manager: both g4_key and g4_key_file are set; give the G4 key once");
  if (c->g4_key && (c->g4_key_len < KVBM_MANAGER_G4_KEY_MIN || c->g4_key_len > KVBM_MANAGER_G4_KEY_MAX))
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g4_key must be %u..%u bytes, not %zu",
                          KVBM_MANAGER_G4_KEY_MIN, KVBM_MANAGER_G4_KEY_MAX, c->g4_key_len);
  if (c->g4_encrypt && !c->g4_key && !c->g4_key_file)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "manager: g4_encrypt needs a G4 key (g4_key or g4_key_file)");
  if (c->g4_key_file && !*c->g4_key_file)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g4_key_file is empty");
  if ((c->g3_url && !*c->g3_url) || (c->g4_url && !*c->g4_url))
    return kvbm_error_set(err, KVBM_EINVAL, "manager: an empty g3_url or g4_url");
  return KVBM_OK;
}

int kvbm__manager_check_config(const kvbm_manager_config *c, kvbm_error *err) {
  if (c->pull_timeout_ms < 0 || c->pull_timeout_ms > 600000)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: pull_timeout_ms %d is not in 0..600000", c->pull_timeout_ms);
  if (c->block_size == 0 || c->block_size > KVBM_POOL_MAX_BLOCK_SIZE)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: block_size %u is not in 1..%u",
                          c->block_size, KVBM_POOL_MAX_BLOCK_SIZE);
  if (c->g1_blocks == 0 || c->g1_blocks > KVBM_POOL_MAX_BLOCKS)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g1_blocks %u is not in 1..%u", c->g1_blocks,
                          KVBM_POOL_MAX_BLOCKS);
  if (c->g2_blocks > KVBM_POOL_MAX_BLOCKS)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g2_blocks %u is above %u", c->g2_blocks,
                          KVBM_POOL_MAX_BLOCKS);
  if (c->g3_key && (c->g3_key_len < KVBM_MANAGER_G3_KEY_MIN || c->g3_key_len > KVBM_MANAGER_G3_KEY_MAX))
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g3_key must be %u..%u bytes, not %zu",
                          KVBM_MANAGER_G3_KEY_MIN, KVBM_MANAGER_G3_KEY_MAX, c->g3_key_len);
  if (c->g3_blocks > KVBM_POOL_MAX_BLOCKS)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g3_blocks %llu is above %u",
                          (unsigned long long)c->g3_blocks, KVBM_POOL_MAX_BLOCKS);
  if (c->g1_memory != KVBM_MEMORY_SYSTEM && c->g1_memory != KVBM_MEMORY_PINNED &&
      c->g1_memory != KVBM_MEMORY_DEVICE)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g1_memory %d is not system, pinned or device",
                          (int)c->g1_memory);
  if (c->g2_memory != KVBM_MEMORY_SYSTEM && c->g2_memory != KVBM_MEMORY_PINNED)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g2_memory %d is not system or pinned",
                          (int)c->g2_memory);
  if (c->g1_memory == KVBM_MEMORY_DEVICE && c->g1_device < 0)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g1_device %d is negative", (int)c->g1_device);
  for (int k = 0; k < 2; k++) {
    int kind = k ? c->g2_kind : c->g1_kind;
    if (kind != KVBM_LAYOUT_FULLY_CONTIGUOUS && kind != KVBM_LAYOUT_LAYER_SEPARATE)
      return kvbm_error_set(err, KVBM_EINVAL, "manager: %s layout kind %d is unknown",
                            k ? "g2" : "g1", kind);
  }
  if ((unsigned)c->g2_policy > KVBM_OFFLOAD_FREQUENCY || (unsigned)c->g3_policy > KVBM_OFFLOAD_FREQUENCY)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: unknown offload policy");
  if (c->freq_threshold == 0 || c->freq_decay_uses == 0 || c->freq_max_entries == 0 ||
      c->freq_max_entries > (1u << 28))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "manager: freq_threshold, freq_decay_uses must be >= 1 and "
                          "freq_max_entries in 1..2^28");
  if (c->queue_capacity == 0 || c->queue_capacity > (1u << 24))
    return kvbm_error_set(err, KVBM_EINVAL, "manager: queue_capacity %u is not in 1..2^24",
                          c->queue_capacity);
  if (c->batch_max == 0 || c->batch_max > 256)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: batch_max %u is not in 1..256", c->batch_max);
  if (c->g3_queue_depth == 0 || c->g3_queue_depth > 128)
    return kvbm_error_set(err, KVBM_EINVAL, "manager: g3_queue_depth %u is not in 1..128",
                          c->g3_queue_depth);
  return check_g4(c, err);
}
