/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker/worker.h: `kvbm worker`, an engine simulator (issue 23). Private
 * to the kvbm command (tools/kvbm/cmd_worker.c) and its tests, not the
 * library's API: like the workload simulators (src/workload/) it drives
 * the library as an engine would, and it uses their trace tokens, which
 * are no part of libkvbm. Hence the kvsim_ prefix.
 *
 * What it is. A process that behaves like an engine toward a cluster: it
 * takes generation requests over HTTP (POST /generate, token ids or a
 * Mooncake trace line), runs each through its own tiered manager (G1, G2,
 * G3 on a persistent slot file, a shared G4) for real (hashing, pools,
 * copies, checksums, G4 frames with the cluster key), writes every block
 * it computes with bytes that are a function of the block's hash and
 * checks every onboarded block against them, publishes its KV events
 * (G1 GPU, G2 CPU, G3 DISK) and the manager's storage events, and answers
 * when the simulated request completes. Only the model's compute is
 * simulated (docs/areas/cluster.md, "## kvbm worker", has the contract):
 *   queue: at most `batch` requests run at once, the others wait (FIFO);
 *   prefill: (prompt tokens - hit tokens) / prefill_tps seconds;
 *   onboard: the measured time of the copies into G1 (real, unscaled);
 *   decode: output tokens / decode_tps seconds;
 *   ttft = queue wait + onboard + prefill; e2e = ttft + decode;
 *   every simulated wait is slept divided by time_scale, and the answer
 *   reports the unscaled times (the queue wait is measured, so multiplied
 *   back by time_scale).
 *
 * Threads: kvsim_worker_run serves HTTP on the caller's thread until
 * kvsim_worker_stop (safe from any thread and from a signal handler: an
 * atomic store and a pipe write); `batch` executor threads run requests.
 *
 * Errors: create validates the configuration (KVBM_EINVAL naming the
 * field), refuses tiers that do not fit the memory budget (KVBM_ENOSPC,
 * saying what each part takes), and says what failed to start (events,
 * listening socket) with the status of the failing call.
 */
#ifndef KVSIM_WORKER_H
#define KVSIM_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbm/manager.h"
#include "kvbm/status.h"

typedef struct kvsim_worker kvsim_worker;

typedef struct kvsim_worker_config {
  uint32_t id;                /* the worker's number (in answers, /blocks) */
  const char *host;           /* IPv4 address to listen on (127.0.0.1) */
  uint16_t port;              /* 0: any (kvsim_worker_port says which) */
  uint32_t g1_blocks;         /* G1 (4096) */
  uint32_t g2_blocks;         /* 0: no G2 (0) */
  const char *g3_dir;         /* NULL: no G3; a directory: the persistent
                                 slot file there (warm restart) */
  uint64_t g3_blocks;         /* with g3_dir (65536) */
  const char *g4_url;         /* NULL: no G4 */
  const char *g4_key_file;    /* G4's cluster key, a file (never the secret) */
  kvbm_offload_policy g2_policy, g3_policy; /* ALL, FREQUENCY */
  const char *events;         /* KV events: tcp://HOST:PORT (ZMQ PUB bound
                                 there, replay ROUTER on PORT+1) or
                                 nats://HOST:PORT/STREAM/SUBJECT (JetStream);
                                 NULL: none */
  const char *storage_events; /* the same forms (NATS: plain publish on
                                 SUBJECT); NULL: none */
  bool events_coalesce;       /* --events publisher's coalesce option:
                                 chained one-block events as multi-block
                                 ones (docs/areas/events.md); false */
  uint32_t block_size;        /* tokens per block (16, W1's) */
  uint64_t block_bytes;       /* bytes per block, a multiple of 16 (1024) */
  double prefill_tps;         /* prefill tokens a second (10000) */
  double decode_tps;          /* decode tokens a second, per request (50) */
  uint32_t batch;             /* requests running at once (8; at most 1024) */
  double time_scale;          /* simulated times are slept / this (1) */
  uint64_t memory_budget_mb;  /* what the worker may allocate (1024) */
  uint32_t max_queue;         /* requests waiting beyond the batch (1024) */
  uint32_t max_tokens;        /* prompt + output tokens of one request (131072) */
  double request_timeout_s;   /* a request not answered by then: 504 (600) */
} kvsim_worker_config;

kvsim_worker_config kvsim_worker_config_default(void);

int kvsim_worker_create(const kvsim_worker_config *cfg, kvsim_worker **out, kvbm_error *err);

/* Serves until kvsim_worker_stop; KVBM_EIO if the loop failed. */
int kvsim_worker_run(kvsim_worker *w, kvbm_error *err);

/* Any thread or a signal handler. */
void kvsim_worker_stop(kvsim_worker *w);

/* Joins the executors (running requests end; their answers are dropped),
 * closes the manager (G3's file kept), the publishers and the socket. */
void kvsim_worker_destroy(kvsim_worker *w);

uint16_t kvsim_worker_port(const kvsim_worker *w);

/* The memory the configuration needs (bytes), as create checks it
 * against memory_budget_mb; parts (may be NULL) gets a one-line account. */
uint64_t kvsim_worker_memory_need(const kvsim_worker_config *cfg, char *parts, size_t cap);

#endif
