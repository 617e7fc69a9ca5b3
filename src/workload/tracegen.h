/* SPDX-License-Identifier: Apache-2.0 */
/*
 * workload/tracegen.h: synthetic request traces in Mooncake's format
 * (workload/trace.h) from a small, documented model of multi-round chat
 * and agent workloads (`kvbm trace-gen`; docs/areas/policies.md).
 *
 * The model. Sessions arrive as a Poisson process (session_rate a
 * second). Each picks a shared system prompt by Zipf popularity (exponent
 * zipf over system_prompts prompts, rank 1 the most popular; each prompt
 * system_tokens long) and a number of turns (geometric, mean turns). A
 * turn's prompt is the whole conversation so far: the system prompt, every
 * earlier user message and answer, and a new user message (user_tokens on
 * average); its answer is output_tokens on average (both lognormal, sigma
 * 0.8, at least 1 token). Turns of one session are think_s seconds apart
 * on average (exponential). A session ends after its turns or when its
 * context would pass max_context tokens. Requests are written in time
 * order.
 *
 * Hash ids (512-token blocks): a system prompt's blocks have ids of their
 * own, shared by every session that uses it; a session's blocks have fresh
 * ids. The block a prompt ends in keeps its id as the conversation grows
 * into it (equal ids at equal positions mean an equal prefix: its first
 * tokens are the same), so turn t+1 shares turn t's prompt as a prefix.
 *
 * Deterministic: the same config (seed included) gives the same bytes.
 */
#ifndef KVSIM_WORKLOAD_TRACEGEN_H
#define KVSIM_WORKLOAD_TRACEGEN_H

#include <stdint.h>
#include <stdio.h>

#include "kvbm/status.h"

typedef struct kvsim_tracegen_config {
  uint64_t requests;        /* requests to write */
  uint64_t seed;
  double session_rate;      /* new sessions a second */
  double turns;             /* mean turns per session (>= 1) */
  double think_s;           /* mean seconds between a session's turns */
  uint32_t system_prompts;  /* distinct shared system prompts (>= 1) */
  uint32_t system_tokens;   /* tokens of each system prompt */
  double zipf;              /* popularity exponent of the system prompts (>= 0) */
  double user_tokens;       /* mean new user tokens per turn */
  double output_tokens;     /* mean answer tokens */
  uint32_t max_context;     /* a session ends before its prompt passes this */
} kvsim_tracegen_config;

/* Multi-round chat: 2 sessions/s, 4 turns, 60 s apart, 16 system prompts
 * of 1,500 tokens (Zipf 1.0), 1,500 new user tokens (a message with what
 * it pastes: documents, code) and 400 answer tokens a turn, contexts up to
 * 32,768 tokens; 10,000 requests, seed 1. */
kvsim_tracegen_config kvsim_tracegen_chat(void);

/* Agents: 2 sessions/s, 20 turns, 4 s apart, 8 tool-laden system prompts
 * of 6,000 tokens (Zipf 1.2), 700 tokens of tool output and 120 answer
 * tokens a turn, contexts up to 65,536 tokens; 10,000 requests, seed 1. */
kvsim_tracegen_config kvsim_tracegen_agent(void);

typedef struct kvsim_tracegen_stats {
  uint64_t requests, sessions, input_tokens, output_tokens, hash_ids;
  double duration_s;
} kvsim_tracegen_stats;

/* Writes the trace as JSON lines. KVBM_EINVAL naming the parameter that
 * is out of range; KVBM_ERANGE when the trace would need a hash id above
 * the reader's limit (KVSIM_TRACE_MAX_HASH_ID); KVBM_EIO when writing
 * fails; KVBM_ENOMEM. stats may be NULL. */
int kvsim_tracegen_write(const kvsim_tracegen_config *cfg, FILE *out, kvsim_tracegen_stats *stats,
                        kvbm_error *err);

#endif
