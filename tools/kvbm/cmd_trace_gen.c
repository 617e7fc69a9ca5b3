/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_trace_gen.c: `kvbm trace-gen`, synthetic Mooncake-format traces of
 * multi-round chat and agent sessions (workload/tracegen.h).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "workload/tracegen.h"

const char kvbm_cmd_trace_gen_help[] = "write a synthetic chat or agent trace (Mooncake format)";

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvbm trace-gen [--profile chat|agent] [--requests N] [--seed S]\n"
          "                      [--session-rate R] [--turns T] [--think-s S]\n"
          "                      [--system-prompts K] [--system-tokens N] [--zipf A]\n"
          "                      [--user-tokens N] [--output-tokens N] [--max-context N]\n"
          "                      [--out FILE] [--quiet]\n"
          "Sessions arrive at R a second, pick one of K shared system prompts of N tokens\n"
          "by Zipf(A) popularity and run T turns on average, S seconds apart; each turn's\n"
          "prompt is the conversation so far plus a new user message, its answer joins\n"
          "the context of the next turn. Profiles set every parameter (flags after\n"
          "--profile override them): chat (2/s, 4 turns, 60 s, 16 x 1500 tokens, Zipf 1,\n"
          "1500 user + 400 answer tokens, 32768 max) and agent (2/s, 20 turns, 4 s,\n"
          "8 x 6000 tokens, Zipf 1.2, 700 + 120 tokens, 65536 max). 10000 requests, seed 1.\n"
          "Writes JSON lines to FILE (default stdout) and a summary to stderr.\n");
}

int kvbm_cmd_trace_gen(int argc, char **argv) {
  kvsim_tracegen_config c = kvsim_tracegen_chat();
  const char *out = NULL, *v;
  bool quiet = false;
  uint64_t x;
  double d;
  int r;
  for (int i = 1; i < argc; i++) {
#define U64(name, lo, hi, dst)                                               \
  if ((r = cli_opt_value("trace-gen", argc, argv, &i, name, &v))) {          \
    if (r < 0 || !cli_parse_u64("trace-gen", name, v, lo, hi, &x)) return 2; \
    dst = x;                                                                 \
    continue;                                                                \
  }
#define DBL(name, lo, hi, dst)                                                  \
  if ((r = cli_opt_value("trace-gen", argc, argv, &i, name, &v))) {             \
    if (r < 0 || !cli_parse_double("trace-gen", name, v, lo, hi, &d)) return 2; \
    dst = d;                                                                    \
    continue;                                                                   \
  }
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--quiet")) {
      quiet = true;
      continue;
    }
    if ((r = cli_opt_value("trace-gen", argc, argv, &i, "--profile", &v))) {
      if (r < 0) return 2;
      uint64_t req = c.requests, seed = c.seed;
      if (!strcmp(v, "chat")) c = kvsim_tracegen_chat();
      else if (!strcmp(v, "agent")) c = kvsim_tracegen_agent();
      else {
        fprintf(stderr, "kvbm trace-gen: --profile: '%s' is not chat or agent\n", v);
        return 2;
      }
      c.requests = req;
      c.seed = seed;
      continue;
    }
    if ((r = cli_opt_value("trace-gen", argc, argv, &i, "--out", &v))) {
      if (r < 0) return 2;
      out = v;
      continue;
    }
    U64("--requests", 1, 1ull << 32, c.requests)
    U64("--seed", 0, UINT64_MAX, c.seed)
    U64("--system-prompts", 1, 1000000, c.system_prompts)
    U64("--system-tokens", 0, 1u << 24, c.system_tokens)
    U64("--max-context", 1, 1u << 26, c.max_context)
    DBL("--session-rate", 1e-6, 1e6, c.session_rate)
    DBL("--turns", 1, 1e6, c.turns)
    DBL("--think-s", 0, 1e7, c.think_s)
    DBL("--zipf", 0, 10, c.zipf)
    DBL("--user-tokens", 1, 1e6, c.user_tokens)
    DBL("--output-tokens", 1, 65535, c.output_tokens)
    fprintf(stderr, "kvbm trace-gen: unknown option '%s'\n", argv[i]);
    usage(stderr);
    return 2;
  }
  FILE *f = out ? fopen(out, "w") : stdout;
  if (!f) {
    fprintf(stderr, "kvbm trace-gen: cannot create %s\n", out);
    return 1;
  }
  kvbm_error err = {0};
  kvsim_tracegen_stats st;
  int rc = kvsim_tracegen_write(&c, f, &st, &err);
  if (out && fclose(f) && !rc) rc = kvbm_error_set(&err, KVBM_EIO, "trace-gen: cannot write %s", out);
  if (rc) {
    fprintf(stderr, "kvbm %s\n", err.msg);
    return rc == KVBM_EINVAL || rc == KVBM_ERANGE ? 2 : 1;
  }
  if (!quiet)
    fprintf(stderr,
            "trace-gen: %llu requests, %llu sessions, %.0f s of trace, %llu input and %llu output "
            "tokens, %llu hash ids\n",
            (unsigned long long)st.requests, (unsigned long long)st.sessions, st.duration_s,
            (unsigned long long)st.input_tokens, (unsigned long long)st.output_tokens,
            (unsigned long long)st.hash_ids);
  return 0;
}
