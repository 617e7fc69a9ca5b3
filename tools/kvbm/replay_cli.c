/* SPDX-License-Identifier: Apache-2.0 */
/* replay_cli.c: the argument handling W1 and W2 share (see replay_cli.h). */
#include "replay_cli.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "metrics_cli.h"

void replay_cli_init(replay_cli *c) {
  c->trace = NULL;
  c->json = false;
  c->progress = isatty(STDERR_FILENO);
}

int replay_cli_take(int argc, char **argv, int *i, kvsim_w1_config *o, replay_cli *c) {
  const char *a = argv[*i], *v;
  uint64_t x;
  int r;
  if (!strcmp(a, "--json")) {
    c->json = true;
  } else if (!strcmp(a, "--no-progress")) {
    c->progress = false;
  } else if ((r = cli_opt_value("replay", argc, argv, i, "--block-size", &v))) {
    if (r < 0 || !cli_parse_u64("replay", "--block-size", v, 1, KVBM_POOL_MAX_BLOCK_SIZE, &x)) return -1;
    o->block_size = (uint32_t)x;
  } else if ((r = cli_opt_value("replay", argc, argv, i, "--capacity", &v))) {
    if (r < 0 || !cli_parse_u64("replay", "--capacity", v, 1, KVBM_POOL_MAX_BLOCKS, &x)) return -1;
    o->capacity = (uint32_t)x;
  } else if ((r = cli_opt_value("replay", argc, argv, i, "--limit", &v))) {
    if (r < 0 || !cli_parse_u64("replay", "--limit", v, 0, SIZE_MAX, &x)) return -1;
    o->limit = (size_t)x;
  } else if ((r = cli_opt_value("replay", argc, argv, i, "--hash", &v))) {
    if (r < 0 || !kvbm_hash_scheme_parse(v, &o->scheme)) {
      fprintf(stderr, "kvbm replay: --hash: '%s' is not native or dynamo\n", r < 0 ? "" : v);
      return -1;
    }
  } else if (a[0] == '-' && a[1]) {
    return 0;
  } else if (!c->trace) {
    c->trace = a;
  } else {
    fprintf(stderr, "kvbm replay: more than one trace given\n");
    return -1;
  }
  return 1;
}

void replay_cli_usage(FILE *f) {
  fprintf(f,
          "usage: kvbm replay [TRACE] [--block-size 16] [--capacity 16384] [--limit N]\n"
          "                   [--hash native|dynamo] [--json] [--no-progress]\n"
          "                   [--g2-blocks N --g3-blocks N [--g3-dir DIR] [--block-bytes 256]\n"
          "                    [--g2-policy all|frequency|never] [--g3-policy frequency|all|never]\n"
          "                    [--g3-buffered] [--g1-memory system|pinned|device]\n"
          "                    [--g4 URL] [--g4-blocks N] [--g4-policy P] [--g4-lookup-ms MS]\n"
          "                    [--g4-key-file PATH]\n"
          "                    [--model-id ID]]\n"
          "                   [--groups LIST [--max-num-batched-tokens N]\n"
          "                    [--prefix-cache-retention-interval none|0]]\n"
          "                   [--metrics-port N [--metrics-host 0.0.0.0]\n"
          "                    [--metrics-port-file PATH] [--hold]] [--plot FILE.svg]\n"
          "TRACE is Mooncake JSON lines, plain or .gz; default: the bundled\n"
          "Mooncake conversation trace (%s).\n"
          "W1: the trace through one block pool of --capacity blocks.\n"
          "W2: any of the tier flags adds a host tier G2, a disk tier G3 and a store G4\n"
          "shared with other runs below G1 (--capacity blocks); see docs/areas/tiers.md\n"
          "for the policy. The environment gives W2's defaults (DYN_KVBM_CPU_CACHE_GB,\n"
          "DYN_KVBM_DISK_CACHE_GB, KVBM_G4_URL, ...: kvbm_manager_config_env); flags win.\n"
          "  --g2-blocks N      G2 (host) blocks\n"
          "  --g3-blocks N      G3 (disk) blocks\n"
          "  --g3-dir DIR       G3 directory (default: the private /tmp/kvbm-<uid>)\n"
          "  --block-bytes N    bytes of KV per block, a multiple of 16 (default 256)\n"
          "  --g2-policy P      what is copied to G2 (default all)\n"
          "  --g3-policy P      what is copied to G3 (default frequency)\n"
          "  --g3-buffered      G3 through the page cache (default O_DIRECT)\n"
          "  --g1-memory M      G1 in system, pinned or device memory (default system)\n"
          "  --g4 URL           G4's store: redis://H:P, redis+cluster://H:P[,H:P], file:///DIR\n"
          "  --g4-blocks N      G4's index of the store's blocks (default 100000)\n"
          "  --g4-policy P      what is copied to G4 (default all)\n"
          "  --g4-lookup-ms MS  longest a prefill waits for its G4 lookup (default 1000)\n"
          "  --g4-key-file PATH G4's cluster key: values are MACed with it, others refused\n"
          "                     (or $KVBM_G4_KEY_FILE; 16..4096 bytes, chmod 600)\n"
          "  --model-id ID      the model part of G4's key namespace (default \"default\")\n"
          "W1-hybrid (a hybrid model's KV cache groups over one pool of --capacity blocks,\n"
          "as vLLM's KVCacheManager runs them; docs/areas/hybrid.md):\n"
          "  --groups LIST      comma list of full, sw:W (sliding window of W tokens),\n"
          "                     chunk:C (chunked local attention), mamba (vLLM's \"all\" mode),\n"
          "                     mamba-align (\"align\" mode); e.g. full,sw:128\n"
          "  --max-num-batched-tokens N\n"
          "                     prefill in chunks of at most N tokens (default: one step)\n"
          "  --prefix-cache-retention-interval none|0\n"
          "                     vLLM's setting: 0 (the default, vLLM's since 2026-08) caches\n"
          "                     window and Mamba blocks only at the prompt's end and the\n"
          "                     shared-prefix junction; none caches every full block\n"
          "  With --groups only W1's flags apply (--block-size, --capacity, --limit, --hash,\n"
          "  --json, --no-progress), or W2's: with tier flags --groups runs W2 with the\n"
          "  groups (per group: hit blocks, onboards, peak G1 blocks held; no\n"
          "  --max-num-batched-tokens or --prefix-cache-retention-interval: W2 caches every\n"
          "  full block).\n"
          "Watching a run:\n",
          KVBM_DEFAULT_TRACE);
  metrics_cli_usage(f);
  fprintf(f,
          "  --hold             after the summary, keep serving until SIGINT/SIGTERM\n"
          "  --plot FILE.svg    draw hit rate and tier occupancy over the replay\n");
}

void replay_cli_progress(void *user, size_t done, size_t total) {
  (void)user;
  int width = 40, filled = total ? (int)((double)done / (double)total * width) : width;
  fprintf(stderr, "\r  [%.*s%*s] %zu/%zu requests", filled,
          "========================================", width - filled, "", done, total);
  if (done == total) fputc('\n', stderr);
  fflush(stderr);
}
