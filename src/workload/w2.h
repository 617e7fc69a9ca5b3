/* SPDX-License-Identifier: Apache-2.0 */
/*
 * workload/w2.h: workload W2 (../shared/WORKLOADS.md), W1's sequential
 * replay through the tiered manager, with real bytes.
 *
 * Policy (docs/areas/tiers.md has the full text). Per request, in file
 * order: prefill through the manager (the walk takes each matchable prompt
 * block from the fastest tier holding it, G1 then G2 then G3 then G4, and
 * onboards the lower-tier ones into new G1 blocks); wait for the onboards; check
 * every onboarded block's bytes against the pattern derived from its
 * sequence hash (a block that fails, and all after it, count as misses and
 * are recomputed); write the pattern into every block the request must
 * compute; append the output tokens (pattern into the new full blocks);
 * commit (each full block is used once: G2 write-through by default, G3
 * behind the frequency filter by default); wait for the copies (so that
 * the next request sees them: the replay is deterministic); free the
 * request (tail first). G1 behaves exactly as W1's pool: with no G2 and G3
 * every W1 count is reproduced.
 *
 * With groups (`groups`, `kvbm replay --w2-flags --groups full,sw:128`),
 * the manager is a hybrid model's (kvbm_manager_config.groups) and every
 * request a hybrid one: kvbm_manager_hprefill (the hit every group can
 * serve, each group onboarding only what it needs for it), the onboarded
 * blocks checked, the blocks each group must compute written (a pattern
 * keyed by the block's hash and group), kvbm_hreq_commit; then the output
 * tokens are appended up to each block boundary in turn (kvbm_hreq_append,
 * one step a block), each step written and committed, so a window group
 * releases (to the cache) what left its window while the request runs;
 * flush and destroy as above. Per group it reports the blocks of the hit
 * (in G1 already or onboarded), the onboards and the peak of G1 blocks the
 * running request's table held. A tier's hit_tokens are then the hit's
 * blocks every group took from it (one group: exactly W2's; several: the
 * sum over tiers counts a hit block once per group that needed it). With
 * `groups` of one full group every count is W2's without groups.
 */
#ifndef KVSIM_TIER_REPLAY_H
#define KVSIM_TIER_REPLAY_H

#include "kvbm/manager.h"
#include "workload/w1.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvsim_w2_result;

/* The calls W2 makes for each request, in order, as an engine would
 * (kvbm_manager.h), plus W2's own flush, which an engine does not make. */
typedef enum kvsim_w2_call {
  KVSIM_W2_CALL_PREFILL = 0, /* kvbm_manager_prefill */
  KVSIM_W2_CALL_WAIT,        /* kvbm_mreq_wait for the prefill's onboards */
  KVSIM_W2_CALL_APPEND,      /* kvbm_mreq_append of the output tokens */
  KVSIM_W2_CALL_COMMIT,      /* kvbm_mreq_commit */
  KVSIM_W2_CALL_FLUSH,       /* kvbm_manager_flush: W2's, not an engine's */
  KVSIM_W2_CALL_DESTROY,     /* kvbm_mreq_destroy */
  KVSIM_W2_CALL_COUNT
} kvsim_w2_call;

typedef struct kvsim_w2_config {
  kvsim_w1_config w1;      /* block size, capacity (= C1), limit, hashes,
                               progress (listener and on_finish unused) */
  uint32_t g2_blocks;       /* C2 (0: no G2) */
  uint64_t g3_blocks;       /* C3 (0: no G3) */
  const char *g3_dir;       /* NULL: /tmp */
  bool g3_direct;           /* O_DIRECT (true) */
  kvbm_memory_type g1_memory; /* G1's memory: SYSTEM (default; 0 means it
                                 too), PINNED or DEVICE (CUDA builds; G2 is
                                 then pinned). See kvbm_manager_config. */
  uint64_t block_bytes;     /* bytes per block, a multiple of 16 (256) */
  kvbm_offload_policy g2_policy, g3_policy; /* all, frequency */
  const char *g4_url;       /* G4's store (NULL: no G4), shared with other runs */
  uint32_t g4_blocks;       /* G4's index (0: the manager's default) */
  kvbm_offload_policy g4_policy; /* all */
  int32_t g4_lookup_timeout_ms;  /* 1000: the replay counts hits, it does
                                    not race the store (a late lookup would
                                    make the counts depend on timing) */
  const char *model_id;     /* namespace of G4's keys (NULL: the default) */
  const char *g4_key_file;  /* G4's cluster key, a file (kvbm_manager_config;
                               never the secret on a command line) */
  const void *g4_key;       /* ... or the secret (DYN_KVBM_G4_KEY only) */
  size_t g4_key_len;
  /* The manager's settings W2 does not set itself (queue depths,
   * timeouts, ...), e.g. from kvbm_manager_config_env; NULL: defaults. */
  const kvbm_manager_config *base;
  /* Optional observers, on the replay's thread (kvbm replay --metrics-port
   * and --plot): the manager once it exists, before the first request;
   * after every request, the counts so far (hit tokens per tier, verify
   * failures; the copy counters are filled at the end); and once before
   * the manager is destroyed, with the final result (NULL when the run
   * failed). */
  void (*on_start)(void *user, kvbm_manager *m);
  void (*on_request)(void *user, size_t done, size_t total, const struct kvsim_w2_result *so_far,
                     kvbm_manager *m);
  void (*on_finish)(void *user, kvbm_manager *m, const struct kvsim_w2_result *res);
  void *observer_user;
  /* Optional, on the replay's thread (bench_engine_latency): how long each
   * of the calls above took, in seconds on CLOCK_MONOTONIC, once it has
   * returned. The clock is read only when this is set; the observer's own
   * time is outside every measured call. */
  void (*on_call)(void *user, kvsim_w2_call call, double seconds);
  /* The manager's metrics endpoint (kvbm_manager_config.metrics); NULL:
   * none. */
  const kvbm_metrics_server_config *metrics;
  /* KV cache groups (kvbm/group.h; NULL/0: none, W2 as above). Checked
   * by the manager (a hostile list is KVBM_EINVAL with its message). */
  const kvbm_group_spec *groups;
  size_t num_groups;
} kvsim_w2_config;

typedef struct kvsim_w2_tier {
  uint64_t hit_tokens;
  uint64_t offloaded_blocks, offloaded_bytes;
  uint64_t onboarded_blocks, onboarded_bytes;
  uint64_t skipped;            /* offloads skipped, every reason */
  uint64_t onboard_failures;   /* onboards that failed (the match shortened) */
  uint64_t missing, foreign;   /* why, for volume tiers (see kvbm_tier_stats) */
  uint64_t lookups, lookup_found, lookup_timeouts, lookup_errors; /* G4 */
  uint64_t checksum_failures;
  uint64_t auth_failures;      /* G4 values refused by the cluster key */
  uint64_t evictions;
  double busy_seconds;         /* worker time copying into or out of it */
} kvsim_w2_tier;

/* Per group of a run with groups (kvsim_w2_config.groups). */
typedef struct kvsim_w2_group {
  uint64_t hit_blocks;      /* blocks of the hits this group took (in G1
                               already, or onboarded) */
  uint64_t onboarded_blocks;/* of those, onboarded from G2..G4 */
  uint64_t peak_held;       /* most G1 blocks one request's table held */
} kvsim_w2_group;

typedef struct kvsim_w2_result {
  kvsim_w1_result w1;       /* hit_tokens is the total over the tiers
                               (with groups: the hits every group served) */
  kvsim_w2_group groups[KVBM_GROUPS_MAX]; /* with groups only */
  kvsim_w2_tier tiers[KVBM_TIER_COUNT];
  uint64_t verify_failures;    /* onboarded blocks whose bytes were wrong */
  char g3_mode[64];            /* "io_uring+O_DIRECT", ... or "" */
  char g3_error[KVBM_ERROR_MSG_MAX]; /* why G3 was unavailable, or "" */
  char g4_mode[64];            /* G4's store (its URL without user info) or "" */
  char g4_error[KVBM_ERROR_MSG_MAX]; /* why G4 was unavailable, or "" */
} kvsim_w2_result;

kvsim_w2_config kvsim_w2_config_default(void);

/* Runs W2. Errors as kvsim_w1_run (KVBM_ENOSPC when a request does not
 * fit in G1), KVBM_EINVAL for bad options. */
int kvsim_w2_run(const kvsim_trace *trace, const kvsim_w2_config *opts,
                   kvsim_w2_result *out, kvbm_error *err);

#ifdef __cplusplus
}
#endif
#endif
