/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sequence/hseq_internal.h: what the workload simulator W1-hybrid
 * (src/workload/w1h.c) needs of a hybrid request beyond kvbm/hybrid.h.
 *
 * W1-hybrid refuses a request whose steps would not fit a pool it runs
 * alone in, before the request changes anything (the Python reference's
 * rule). It decides by running the request's steps on counts alone: a dry
 * request touches no pool, and a step fails with KVBM_ENOSPC when the
 * blocks the request holds after it exceed `capacity`. Then it rewinds the
 * request to where it stood before its first step and runs it for real.
 * An engine has no use for this (its steps are checked against the pool
 * one by one), so it is not public.
 */
#ifndef KVBM_SEQUENCE_HSEQ_INTERNAL_H
#define KVBM_SEQUENCE_HSEQ_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kvbm/hybrid.h"

/* Steps from now on count blocks only (dry) or use the pool (not dry). */
void kvbm__hseq_set_dry(kvbm_hseq *seq, bool dry, uint64_t capacity);
/* Back to just before the first step: tables empty, statistics cleared,
 * tokens, hashes and the hit found kept. Only after dry steps. */
void kvbm__hseq_rewind(kvbm_hseq *seq);

/* n decode steps of one token each, exactly as n calls of
 * kvbm_hseq_step(seq, NULL, 0, 1, err), stopping at the first that fails
 * (its status returned, the steps before it done). A run of tokens whose
 * steps would only count their token (no block opened or filled, nothing
 * released in any group: quiet_end in hseq.c) is counted at once instead
 * of a call a token. W1-hybrid decodes a request's output with it; an
 * engine steps once per scheduler iteration and has no use for it. */
int kvbm__hseq_decode(kvbm_hseq *seq, uint64_t n, kvbm_error *err);

/* Where the next n tokens go (NULL past max_tokens): a caller that writes
 * them there and appends that pointer saves the copy (W1-hybrid decodes
 * its trace's tokens straight into the request). */
uint32_t *kvbm__hseq_tail(kvbm_hseq *seq, size_t n);

#endif
