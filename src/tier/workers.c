/* SPDX-License-Identifier: Apache-2.0 */
/*
 * workers.c: the job queues and the threads that move bytes.
 *
 * Every tier below G1 has one worker and one fixed ring of jobs
 * (queue_capacity): G2's copies between G1 and G2 memory, G3's and G4's
 * puts and gets on their volumes. The engine's calls decide and index
 * every copy under the lock and push a job; a worker takes jobs, moves the
 * bytes outside the lock, and finishes the jobs under it (byte states,
 * counters, pool references). A full ring is never waited on: the caller
 * skips and counts instead.
 *
 * The host worker (G2) takes up to batch_max jobs at once. On device G1 it
 * queues the whole batch as CUDA copies with an event after each job, then
 * waits for the events in order, so each job gets its own result. An
 * offload that also goes to G3 or G4 is forwarded to their queues once its
 * G2 copy is done (their put then reads G2).
 *
 * A volume worker (G3, G4) keeps up to `depth` operations in flight: it
 * takes jobs while it has free slots, prepares them (a framed value is
 * gathered and sealed in the slot's buffer; a bare block moves straight
 * between tier memory and the volume when it is one host piece), submits
 * them to the volume as one batch, and goes on taking work while the
 * volume runs it. The volume's completion (on one of its I/O threads)
 * only hands the batch back under the lock; the worker checks what was
 * read (frame, namespace, key, layout) and copies it into G1 on its own
 * thread, so a slow check never holds a volume thread or the lock.
 *
 * G3's slot file (disk://) streams inside the volume: its one I/O thread
 * keeps g3_queue_depth transfers in flight, checks each read as it
 * completes and starts the next queued batch before the previous one has
 * drained; the worker keeps two large batches queued, so the disk never
 * waits for it, and the bytes go straight between tier memory and the disk
 * when the block is one aligned host piece.
 *
 * Onboards that are of no use any more (store.c, "One deadline per
 * prefill"): a get whose request gave it up, whose match already ended
 * before it, or whose prefill's deadline passed is not sent when taken,
 * and what it brings back is dropped when its batch is handed back. The
 * check is made under the lock just before the copy into G1 starts, and
 * from then on the block is LANDING: its request can no longer give it up,
 * so nothing reaches a block the engine is writing.
 *
 * Shutdown: stop is set under the lock; with drain_on_destroy the workers
 * empty their queues first, otherwise every job taken is finished as not
 * run (its target FAILED, an onboard's match shortened). Volume workers
 * wait for their operations in flight either way.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "tier/internal.h"

/* ---- queues and batches ---- */

bool kvbm__q_push(kvbm__jqueue *q, const kvbm__job *j) {
  if (q->count == q->cap) return false;
  q->ring[(q->head + q->count) % q->cap] = *j;
  q->count++;
  return true;
}

uint32_t kvbm__q_free(const kvbm__jqueue *q) { return q->cap - q->count; }

static kvbm__job q_pop(kvbm__jqueue *q) {
  kvbm__job j = q->ring[q->head];
  q->head = (q->head + 1) % q->cap;
  q->count--;
  return j;
}

void kvbm__batch_pin(kvbm__batch *b, uint8_t tier, uint32_t id) {
  assert(b->n < b->cap);
  b->pins[b->n++] = (kvbm__pin){tier, id};
}

void kvbm__batch_done(kvbm_manager *m, kvbm__batch *b) {
  for (uint32_t i = 0; i < b->n; i++)
    KVBM__MUST(kvbm_block_release(m->t[b->pins[i].tier].pool, b->pins[i].id, 0));
  free(b->pins);
  free(b);
}

static void batch_job_done(kvbm_manager *m, kvbm__batch *b) {
  if (b && --b->pending == 0) kvbm__batch_done(m, b);
}

void kvbm__workers_kick(kvbm_manager *m) {
  for (int ti = KVBM_TIER_G2; ti < KVBM_TIER_COUNT; ti++)
    if (m->t[ti].running) pthread_cond_signal(&m->t[ti].work_cv);
}

void kvbm__queue_delete(kvbm_manager *m, kvbm__tier *t, uint64_t hash) {
  kvbm__job j = {.kind = KVBM__J_DEL, .tier = (uint8_t)t->id, .hash = hash};
  for (int i = 0; i < KVBM_TIER_COUNT; i++) j.id[i] = KVBM__NONE;
  /* Best effort: a value left behind is overwritten by the next put of
   * its key, or dropped by the store. */
  if (t->running && t->dq.ring && kvbm__q_push(&t->dq, &j)) pthread_cond_signal(&t->work_cv);
  (void)m;
}

/* ---- finishing jobs (lock held) ---- */

/* A put into volume (or slot) tier t is over. */
static void put_done(kvbm_manager *m, kvbm__tier *t, kvbm__job *j, bool ran) {
  bool ok = ran && j->result == KVBM_OK;
  t->state[j->id[t->id]] = ok ? KVBM__READY : KVBM__FAILED;
  if (ok) {
    uint64_t bytes = t->framed ? m->gbytes[j->grp] : m->block_bytes; /* what the value carries */
    t->st.offloaded_blocks++;
    t->st.offloaded_bytes += bytes;
    kvbm__tier_metrics_count(&m->tm, j->src, t->id, 1, bytes);
  } else if (ran && j->result == KVBM_EDEVICE) {
    t->st.copy_errors++; /* staging out of device G1 failed */
  } else if (ran) {
    t->st.skipped_io++; /* the store refused or failed it */
  }
  if (j->src == KVBM_TIER_G1)
    KVBM__MUST(kvbm_block_release(m->t[KVBM_TIER_G1].pool, j->id[KVBM_TIER_G1], j->prio));
  if (j->hint) kvbm__hint_put_done(m, t, j, ok);
  batch_job_done(m, j->b);
}

/* A block a G4 lookup found and a get brought in: the index learns it. */
static void index_found(kvbm_manager *m, kvbm__tier *t, const kvbm__job *j) {
  uint32_t id, got;
  if (kvbm_pool_peek(t->pool, j->hash, &id, NULL) == KVBM_OK) {
    if (t->state[id] == KVBM__FAILED) t->state[id] = KVBM__READY; /* healed */
    return;
  }
  if (kvbm_pool_alloc(t->pool, 1, &id) != KVBM_OK) return; /* all pinned: stay unindexed */
  KVBM__MUST(kvbm__fill_grp(t, j->grp, id, 0, j->parent, j->has_parent, m->zero_tokens, j->hash,
                            &got));
  assert(got == id && "peeked: not registered");
  t->state[got] = KVBM__READY;
  KVBM__MUST(kvbm_block_release(t->pool, got, 0));
}

/* Counts why a get from tier t failed. */
static void count_get_failure(kvbm__tier *t, int result) {
  t->st.onboard_failures++;
  switch (result) {
  case KVBM_EDEVICE: t->st.copy_errors++; break;  /* the value was good */
  case KVBM_ENOTFOUND: t->st.missing++; break;
  case KVBM_ECHECKSUM: t->st.checksum_failures++; break;
  case KVBM_EAUTH: t->st.auth_failures++; break; /* not under the cluster key */
  case KVBM_EFORMAT:
  case KVBM_ETRUNCATED:
  case KVBM_ETOOLONG: t->st.foreign++; break;
  default: t->st.read_errors++; break;              /* EIO, ETIMEDOUT, ECLOSED */
  }
}

/* Whether a get's result says the store failed (down, late, an error, a
 * value that is not ours), as opposed to the key being absent. */
static bool store_failed(int result) {
  return result != KVBM_OK && result != KVBM_ENOTFOUND && result != KVBM_EDEVICE &&
         result != KVBM_ENOMEM;
}

/* A get that was of no use any more (kvbm__onboard_given_up): what it
 * brought was dropped before G1; only its references go, and a store that
 * failed it still counts toward the back-off. */
static void get_abandoned(kvbm_manager *m, kvbm__tier *t, kvbm__job *j, bool ran) {
  uint32_t sid = j->id[t->id];
  if (ran && store_failed(j->result)) {
    kvbm__read_result(m, t, true);
    if (sid != KVBM__NONE) t->state[sid] = KVBM__FAILED;
  }
  if (sid != KVBM__NONE) KVBM__MUST(kvbm_block_release(t->pool, sid, 0));
  KVBM__MUST(kvbm_block_release(m->t[KVBM_TIER_G1].pool, j->id[KVBM_TIER_G1], j->prio));
  kvbm__onboards_release(j->og);
}

/* A get from volume (or slot) tier t into G1 is over. */
static void get_done(kvbm_manager *m, kvbm__tier *t, kvbm__job *j, bool ran) {
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1];
  bool ok = ran && j->result == KVBM_OK;
  uint32_t sid = j->id[t->id];
  if (j->hint) { /* a promotion into G2 */
    kvbm__hint_get_done(m, t, j, ok);
    return;
  }
  if (kvbm__onboard_given_up(m, t, j)) {
    get_abandoned(m, t, j, ran);
    return;
  }
  /* (no memory, a CUDA copy: nothing the store did, either way) */
  if (ran && j->result != KVBM_ENOMEM && j->result != KVBM_EDEVICE)
    kvbm__read_result(m, t, store_failed(j->result));
  g1->state[j->id[KVBM_TIER_G1]] = ok ? KVBM__READY : KVBM__FAILED;
  /* The match ends here at the latest: the prefill's later onboards from
   * this store are not sent, and those in flight are dropped. */
  if (!ok && j->og && j->k < j->og->cut) j->og->cut = j->k;
  kvbm__onboards_release(j->og);
  if (ok) {
    uint64_t bytes = t->framed ? m->gbytes[j->grp] : m->block_bytes;
    t->st.onboarded_blocks++;
    t->st.onboarded_bytes += bytes;
    kvbm__tier_metrics_count(&m->tm, t->id, KVBM_TIER_G1, 1, bytes);
    if (sid == KVBM__NONE) index_found(m, t, j);
  } else if (ran) {
    count_get_failure(t, j->result);
    /* The store cannot serve this hash now: not a hit again until it is
     * rewritten (or, in a shared tier, found by a lookup). */
    if (sid != KVBM__NONE && j->result != KVBM_EDEVICE) t->state[sid] = KVBM__FAILED;
  } else {
    t->st.onboard_failures++;
  }
  if (sid != KVBM__NONE) KVBM__MUST(kvbm_block_release(t->pool, sid, 0));
  KVBM__MUST(kvbm_block_release(g1->pool, j->id[KVBM_TIER_G1], j->prio));
}

static void job_done(kvbm_manager *m, kvbm__tier *t, kvbm__job *j, bool ran) {
  if (j->kind == KVBM__J_PUT) put_done(m, t, j, ran);
  else if (j->kind == KVBM__J_GET) get_done(m, t, j, ran);
}

/* ---- the host worker (G2) ---- */

/* Hands a finished G1 -> G2 copy on to the volume tiers that take the
 * block from G2. Returns how many jobs now carry the commit's batch. */
static uint32_t forward_down(kvbm_manager *m, const kvbm__job *j, bool ok) {
  uint32_t carried = 0;
  for (int ti = KVBM_TIER_G3; ti < KVBM_TIER_COUNT; ti++) {
    if (!(j->fwd & (1u << ti))) continue;
    kvbm__tier *t = &m->t[ti];
    kvbm__job d = *j;
    d.kind = KVBM__J_PUT;
    d.tier = (uint8_t)ti;
    d.src = KVBM_TIER_G2;
    d.result = KVBM_OK;
    if (ok && kvbm__q_push(&t->q, &d)) {
      pthread_cond_signal(&t->work_cv);
      carried++;
      continue;
    }
    t->state[j->id[ti]] = KVBM__FAILED;
    if (ok) t->st.skipped_queue++;
  }
  return carried;
}

static void host_done(kvbm_manager *m, kvbm__job *j, bool ran) {
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1], *g2 = &m->t[KVBM_TIER_G2];
  bool ok = ran && j->result == KVBM_OK; /* only CUDA copies can fail */
  if (ran && !ok) g2->st.copy_errors++;
  if (j->kind == KVBM__J_DOWN) {
    g2->state[j->id[KVBM_TIER_G2]] = ok ? KVBM__READY : KVBM__FAILED;
    if (ok) {
      g2->st.offloaded_blocks++;
      g2->st.offloaded_bytes += m->block_bytes;
      kvbm__tier_metrics_count(&m->tm, KVBM_TIER_G1, KVBM_TIER_G2, 1, m->block_bytes);
    }
    KVBM__MUST(kvbm_block_release(g1->pool, j->id[KVBM_TIER_G1], j->prio));
    uint32_t carried = forward_down(m, j, ok);
    if (carried) j->b->pending += carried - 1; /* the puts carry the batch on */
    else batch_job_done(m, j->b);
  } else { /* J_UP */
    g1->state[j->id[KVBM_TIER_G1]] = ok ? KVBM__READY : KVBM__FAILED;
    if (ok) {
      g2->st.onboarded_blocks++;
      g2->st.onboarded_bytes += m->block_bytes;
      kvbm__tier_metrics_count(&m->tm, KVBM_TIER_G2, KVBM_TIER_G1, 1, m->block_bytes);
    } else {
      g2->st.onboard_failures++;
    }
    KVBM__MUST(kvbm_block_release(g2->pool, j->id[KVBM_TIER_G2], 0));
    KVBM__MUST(kvbm_block_release(g1->pool, j->id[KVBM_TIER_G1], j->prio));
  }
}

static void host_run(kvbm_manager *m, kvbm__job *j) {
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1], *g2 = &m->t[KVBM_TIER_G2];
  uint32_t b1 = j->id[KVBM_TIER_G1], b2 = j->id[KVBM_TIER_G2];
  if (j->kind == KVBM__J_DOWN) kvbm__copy_block(g2, b2, g1, b1);
  else kvbm__copy_block(g1, b1, g2, b2);
}

/* Device G1: queue every job's copies with an event after each, then wait
 * for the events in order, so each job gets its own result. */
static void host_run_gpu(kvbm_manager *m, kvbm__job *jobs, uint32_t n) {
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1], *g2 = &m->t[KVBM_TIER_G2];
  kvbm_gpu_stream *s = g2->gs;
  for (uint32_t i = 0; i < n; i++) {
    kvbm__job *j = &jobs[i];
    uint32_t b1 = j->id[KVBM_TIER_G1], b2 = j->id[KVBM_TIER_G2];
    j->result = j->kind == KVBM__J_DOWN ? kvbm__copy_block_gpu(s, g2, b2, g1, b1)
                                        : kvbm__copy_block_gpu(s, g1, b1, g2, b2);
    if (!j->result) j->result = kvbm__gpu_mark(s, i);
  }
  for (uint32_t i = 0; i < n; i++)
    if (!jobs[i].result) jobs[i].result = kvbm__gpu_wait(s, i);
}

static void host_worker(kvbm_manager *m) {
  kvbm__tier *g2 = &m->t[KVBM_TIER_G2];
  kvbm__jqueue *q = &g2->q;
  uint32_t max = m->cfg.batch_max;
  kvbm__job *jobs = malloc(max * sizeof *jobs);
  pthread_mutex_lock(&m->mu);
  for (;;) {
    while (!q->count && !m->stop) pthread_cond_wait(&g2->work_cv, &m->mu);
    if (!q->count) break;
    uint32_t n = 0;
    /* Without scratch memory the worker still drains, one job at a time. */
    kvbm__job one;
    kvbm__job *take = jobs ? jobs : &one;
    uint32_t lim = jobs ? max : 1;
    while (q->count && n < lim) take[n++] = q_pop(q);
    bool run = !m->cancel;
    g2->busy += n;
    pthread_mutex_unlock(&m->mu);
    double t0 = kvbm_clock_seconds();
    /* time per direction (down G1 -> G2, up G2 -> G1) for the metrics: a
     * batch of one direction (the usual case) is timed whole; a mixed one
     * job by job, or, on a device (one stream), shared out */
    double dir_s[2] = {0, 0};
    uint32_t dir_n[2] = {0, 0};
    for (uint32_t i = 0; i < n; i++) dir_n[take[i].kind != KVBM__J_DOWN]++;
    bool mixed = dir_n[0] && dir_n[1];
    if (run && g2->gs) {
      host_run_gpu(m, take, n);
    } else if (run && mixed) {
      for (uint32_t i = 0; i < n; i++) {
        double tj = kvbm_clock_seconds();
        host_run(m, &take[i]);
        dir_s[take[i].kind != KVBM__J_DOWN] += kvbm_clock_seconds() - tj;
      }
    } else if (run) {
      for (uint32_t i = 0; i < n; i++) host_run(m, &take[i]);
    }
    double dt = kvbm_clock_seconds() - t0;
    if (!mixed) dir_s[dir_n[1] != 0] = dt;
    else if (run && g2->gs)
      for (int k = 0; k < 2; k++) dir_s[k] = dt * dir_n[k] / n;
    pthread_mutex_lock(&m->mu);
    g2->st.busy_seconds += dt;
    for (int k = 0; run && k < 2; k++)
      if (dir_n[k])
        kvbm__tier_metrics_transfer(&m->tm, k ? KVBM_TIER_G2 : KVBM_TIER_G1,
                                    k ? KVBM_TIER_G1 : KVBM_TIER_G2,
                                    (uint64_t)dir_n[k] * m->block_bytes, dir_s[k]);
    for (uint32_t i = 0; i < n; i++) host_done(m, &take[i], run);
    g2->busy -= n;
    pthread_cond_broadcast(&m->done_cv);
  }
  /* Nothing more can be forwarded: let the volume workers finish. */
  m->host_running = false;
  kvbm__workers_kick(m);
  pthread_mutex_unlock(&m->mu);
  free(jobs);
}

/* ---- a volume worker (G3, G4) ---- */

typedef struct vslot {
  kvbm__job job;
  uint8_t *buf;  /* staging: a framed value, or a bare block that is not
                    one host piece (allocated on first use) */
  bool ran;      /* false: cancelled, finished without running */
  bool drop;     /* a get given up while in flight: its answer is dropped */
} vslot;

/* One submitted batch: its operations, contiguous as the volume wants
 * them, and the slot each belongs to. */
typedef struct vbatch {
  struct vbatch *next;
  kvbm_manager *m;
  kvbm__tier *t;
  double t_submit; /* for the metrics: the batch's time in the store */
  uint32_t n;
  uint32_t *slot;
  kvbm_volume_op ops[];
} vbatch;

struct kvbm__vworker {
  uint32_t nslots, nfree;
  uint32_t *freel;
  vslot *slots;
  size_t buflen;
  vbatch *done_head, *done_tail; /* completed by the volume, not finished */
  uint32_t inflight;             /* operations submitted and not finished */
  double busy_since;             /* when inflight last became non-zero */
};

/* The volume's completion (an I/O thread): hand the batch back. */
static void vbatch_complete(void *user, kvbm_volume_op *ops, size_t n) {
  (void)ops;
  (void)n;
  vbatch *vb = user;
  kvbm_manager *m = vb->m;
  kvbm__vworker *vw = vb->t->vw;
  pthread_mutex_lock(&m->mu);
  vb->next = NULL;
  if (vw->done_tail) vw->done_tail->next = vb;
  else vw->done_head = vb;
  vw->done_tail = vb;
  pthread_cond_signal(&vb->t->work_cv);
  pthread_mutex_unlock(&m->mu);
}

static uint8_t *slot_buf(const kvbm__vworker *vw, vslot *s) {
  if (!s->buf) s->buf = aligned_alloc(4096, (vw->buflen + 4095) / 4096 * 4096);
  return s->buf;
}

/* Fills op for a put: the block's bytes from G1 or G2, framed or bare.
 * Returns KVBM_OK, or why the job fails before reaching the store. */
static int prepare_put(kvbm_manager *m, kvbm__tier *t, vslot *s, kvbm_volume_op *op) {
  kvbm__job *j = &s->job;
  const kvbm__tier *src = &m->t[j->src];
  uint32_t b = j->id[j->src];
  /* The tag: the block's group, which the slot file keeps for a warm
   * restart (manager.c, restore_key); other stores ignore it. */
  *op = (kvbm_volume_op){.kind = KVBM_VOLUME_PUT, .key = j->hash, .tag = j->grp};
  uint8_t *p = t->framed ? NULL : kvbm__block_contiguous(src, b);
  if (p) { /* zero copy: the volume reads tier memory, pinned by the job */
    op->src = p;
    op->len = (size_t)m->block_bytes;
    return KVBM_OK;
  }
  uint8_t *buf = slot_buf(t->vw, s);
  if (!buf) return KVBM_ENOMEM;
  uint8_t *data = buf + kvbm__value_data_off(t);
  if (src->device) {
    if (kvbm__gather_gpu(t->gs, data, src, b) != KVBM_OK) return KVBM_EDEVICE;
  } else {
    kvbm__gather(data, src, b);
  }
  if (t->framed)
    kvbm__value_seal(m, t, buf, j->hash, j->parent, j->has_parent, (kvbm_frame_phase)j->phase, j->grp);
  op->src = buf;
  op->len = kvbm__value_len_group(m, t, j->grp);
  return KVBM_OK;
}

/* Fills op for a get: straight into the destination block (G1, or G2
 * for a promotion) when it is a bare block and one host piece, else into
 * the slot's buffer. */
static int prepare_get(kvbm_manager *m, kvbm__tier *t, vslot *s, kvbm_volume_op *op) {
  const kvbm__tier *g1 = &m->t[s->job.dst];
  *op = (kvbm_volume_op){.kind = KVBM_VOLUME_GET, .key = s->job.hash};
  uint8_t *p = t->framed ? NULL : kvbm__block_contiguous(g1, s->job.id[s->job.dst]);
  if (!p && !(p = slot_buf(t->vw, s))) return KVBM_ENOMEM;
  op->dst = p;
  op->cap = p == s->buf ? kvbm__value_len(m, t) : (size_t)m->block_bytes;
  return KVBM_OK;
}

/* After the store answered a get: check what came and copy it into G1
 * (or G2, a promotion: host memory, hints.c refuses a device G2). */
static int finish_get(kvbm_manager *m, kvbm__tier *t, vslot *s, const kvbm_volume_op *op) {
  kvbm__tier *g1 = &m->t[s->job.dst];
  uint32_t b = s->job.id[s->job.dst];
  if (op->status == KVBM_ENOSPC) return KVBM_ETOOLONG; /* more than a value of ours */
  if (op->status != KVBM_OK) return op->status;
  if (t->framed) {
    int rc = kvbm__value_check(m, t, s->buf, op->size, s->job.hash, s->job.grp);
    if (rc) return rc;
    /* A group smaller than the slot: the rest of the slot is not its KV;
     * zeroed rather than left as whatever the buffer held. */
    uint64_t gb = m->gbytes[s->job.grp];
    if (gb < m->block_bytes)
      memset(s->buf + kvbm__value_data_off(t) + gb, 0, (size_t)(m->block_bytes - gb));
  } else if (op->size != m->block_bytes) {
    return op->size < m->block_bytes ? KVBM_ETRUNCATED : KVBM_ETOOLONG;
  }
  if (op->dst != s->buf) return KVBM_OK; /* landed in G1 */
  const uint8_t *data = s->buf + kvbm__value_data_off(t);
  if (g1->device) return kvbm__scatter_gpu(t->gs, g1, b, data);
  kvbm__scatter(g1, b, data);
  return KVBM_OK;
}

static void vw_free(kvbm__vworker *vw) {
  if (!vw) return;
  for (uint32_t i = 0; vw->slots && i < vw->nslots; i++) free(vw->slots[i].buf);
  free(vw->slots);
  free(vw->freel);
  free(vw);
}

static kvbm__vworker *vw_new(kvbm_manager *m, kvbm__tier *t) {
  kvbm__vworker *vw = calloc(1, sizeof *vw);
  if (!vw) return NULL;
  vw->nslots = vw->nfree = t->depth;
  vw->buflen = kvbm__value_len(m, t);
  vw->slots = calloc(t->depth, sizeof *vw->slots);
  vw->freel = calloc(t->depth, sizeof *vw->freel);
  if (!vw->slots || !vw->freel) {
    vw_free(vw);
    return NULL;
  }
  for (uint32_t i = 0; i < t->depth; i++) vw->freel[i] = i;
  return vw;
}

/* Lock held. One store batch's transfers for the metrics: per direction
 * present (a put from G1 or G2, a get to G1), the bytes of the operations
 * that succeeded and the batch's time from submission to completion. */
static void batch_transfers(kvbm_manager *m, kvbm__tier *t, const vbatch *vb, double seconds) {
  uint64_t bytes[KVBM_TIER_COUNT] = {0}, got = 0;
  bool put[KVBM_TIER_COUNT] = {false}, get = false;
  for (uint32_t i = 0; i < vb->n; i++) {
    const kvbm__job *j = &t->vw->slots[vb->slot[i]].job;
    if (j->result != KVBM_OK || t->vw->slots[vb->slot[i]].drop) continue; /* dropped: not moved */
    if (j->kind == KVBM__J_PUT && j->src < KVBM_TIER_COUNT) {
      put[j->src] = true;
      bytes[j->src] += m->block_bytes;
    } else if (j->kind == KVBM__J_GET) {
      get = true;
      got += m->block_bytes;
    }
  }
  for (int s = 0; s < KVBM_TIER_COUNT; s++)
    if (put[s]) kvbm__tier_metrics_transfer(&m->tm, s, t->id, bytes[s], seconds);
  if (get) kvbm__tier_metrics_transfer(&m->tm, t->id, KVBM_TIER_G1, got, seconds);
}

/* Lock held. Finishes the batches the volume handed back: checks and
 * copies outside the lock, then the jobs' bookkeeping under it. */
static void vw_finish(kvbm_manager *m, kvbm__tier *t) {
  kvbm__vworker *vw = t->vw;
  vbatch *list = vw->done_head;
  vw->done_head = vw->done_tail = NULL;
  /* Before the lock goes: a get whose request still waits is LANDING from
   * now on (its request can no longer give it up), one given up already
   * is dropped here, so nothing reaches a G1 block its engine now writes. */
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1];
  /* First where each prefill's match now ends (gets the store failed), so
   * that an answer behind a failure handed back with it is dropped too. */
  for (vbatch *vb = list; vb; vb = vb->next)
    for (uint32_t i = 0; i < vb->n; i++) {
      const kvbm__job *j = &vw->slots[vb->slot[i]].job;
      if (j->kind == KVBM__J_GET && j->og && vb->ops[i].status != KVBM_OK && j->k < j->og->cut)
        j->og->cut = j->k;
    }
  for (vbatch *vb = list; vb; vb = vb->next)
    for (uint32_t i = 0; i < vb->n; i++) {
      vslot *s = &vw->slots[vb->slot[i]];
      s->drop = false;
      if (s->job.kind != KVBM__J_GET || s->job.hint) continue;
      if (kvbm__onboard_given_up(m, t, &s->job)) s->drop = true;
      else g1->state[s->job.id[KVBM_TIER_G1]] = KVBM__LANDING;
    }
  pthread_mutex_unlock(&m->mu);
  for (vbatch *vb = list; vb; vb = vb->next)
    for (uint32_t i = 0; i < vb->n; i++) {
      vslot *s = &vw->slots[vb->slot[i]];
      if (s->job.kind == KVBM__J_GET && !s->drop) s->job.result = finish_get(m, t, s, &vb->ops[i]);
      else s->job.result = vb->ops[i].status;
    }
  double now = kvbm_clock_seconds();
  pthread_mutex_lock(&m->mu);
  while (list) {
    vbatch *vb = list;
    list = vb->next;
    batch_transfers(m, t, vb, now - vb->t_submit);
    for (uint32_t i = 0; i < vb->n; i++) {
      job_done(m, t, &vw->slots[vb->slot[i]].job, true);
      vw->freel[vw->nfree++] = vb->slot[i];
    }
    vw->inflight -= vb->n;
    t->busy -= vb->n;
    free(vb);
  }
  if (!vw->inflight) t->st.busy_seconds += kvbm_clock_seconds() - vw->busy_since;
  pthread_cond_broadcast(&m->done_cv);
}

/* Lock held. Finishes jobs that never reached the store (cancelled,
 * refused before or at submission) and frees their slots. */
static void vw_fail(kvbm_manager *m, kvbm__tier *t, const uint32_t *slots, uint32_t n) {
  kvbm__vworker *vw = t->vw;
  for (uint32_t i = 0; i < n; i++) {
    vslot *s = &vw->slots[slots[i]];
    job_done(m, t, &s->job, s->ran);
    vw->freel[vw->nfree++] = slots[i];
  }
  vw->inflight -= n;
  t->busy -= n;
  if (n && !vw->inflight) t->st.busy_seconds += kvbm_clock_seconds() - vw->busy_since;
  if (n) pthread_cond_broadcast(&m->done_cv);
}

/* Lock held. Takes jobs (as many as there are free slots, batch_max at
 * most) and submits them as one batch, preparing them outside the lock. */
static void vw_start(kvbm_manager *m, kvbm__tier *t) {
  kvbm__vworker *vw = t->vw;
  /* Deletions first: a put of the same key queued later must land after. */
  uint32_t queued = t->q.count + t->dq.count;
  uint32_t n = vw->nfree < queued ? vw->nfree : queued;
  if (n > t->batch_ops) n = t->batch_ops;
  if (n > m->cfg.batch_max) n = m->cfg.batch_max;
  vbatch *vb = malloc(sizeof *vb + n * sizeof vb->ops[0] + 2 * n * sizeof(uint32_t));
  if (!vb) { /* no memory for a batch: fail one job, keep draining */
    kvbm__job j = q_pop(t->dq.count ? &t->dq : &t->q);
    j.result = KVBM_ENOMEM;
    job_done(m, t, &j, true);
    pthread_cond_broadcast(&m->done_cv);
    return;
  }
  vb->m = m;
  vb->t = t;
  vb->slot = (uint32_t *)(vb->ops + n);
  uint32_t *taken = vb->slot + n, nfail = 0, nops = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t sl = vw->freel[--vw->nfree];
    vslot *s = &vw->slots[sl];
    s->job = q_pop(t->dq.count ? &t->dq : &t->q);
    /* A get its request gave up is never sent (counted when given up). */
    s->ran = !m->cancel && !kvbm__onboard_given_up(m, t, &s->job);
    if (s->ran && s->job.kind == KVBM__J_GET && s->job.og) s->job.og->sent++;
    taken[i] = sl;
  }
  t->busy += n;
  if (!vw->inflight) vw->busy_since = kvbm_clock_seconds();
  vw->inflight += n;
  pthread_mutex_unlock(&m->mu);
  for (uint32_t i = 0; i < n; i++) {
    vslot *s = &vw->slots[taken[i]];
    int rc = KVBM_OK;
    kvbm_volume_op op = {.kind = KVBM_VOLUME_DELETE, .key = s->job.hash};
    if (s->ran && s->job.kind == KVBM__J_PUT) rc = prepare_put(m, t, s, &op);
    else if (s->ran && s->job.kind == KVBM__J_GET) rc = prepare_get(m, t, s, &op);
    s->job.result = rc;
    if (s->ran && !rc) {
      vb->ops[nops] = op;
      vb->slot[nops++] = taken[i];
    } else {
      taken[nfail++] = taken[i]; /* nfail <= i: compacts in place */
    }
  }
  vb->n = nops;
  vb->t_submit = kvbm_clock_seconds();
  int rc = nops ? kvbm_volume_submit(t->vol, vb->ops, nops, vbatch_complete, vb) : KVBM_OK;
  pthread_mutex_lock(&m->mu);
  if (rc) { /* the volume refused the batch: its jobs fail as I/O errors */
    for (uint32_t i = 0; i < nops; i++) {
      vw->slots[vb->slot[i]].job.result = rc == KVBM_EAGAIN ? KVBM_EIO : rc;
      taken[nfail++] = vb->slot[i];
    }
  }
  vw_fail(m, t, taken, nfail);
  if (rc || !nops) free(vb);
}

static void volume_worker(kvbm_manager *m, kvbm__tier *t) {
  kvbm__vworker *vw = t->vw;
  pthread_mutex_lock(&m->mu);
  for (;;) {
    if (vw->done_head) {
      vw_finish(m, t);
      continue;
    }
    if (vw->nfree && (t->q.count || t->dq.count)) {
      vw_start(m, t);
      continue;
    }
    if (m->stop && !t->q.count && !t->dq.count && !vw->inflight && !m->host_running) break;
    pthread_cond_wait(&t->work_cv, &m->mu);
  }
  pthread_mutex_unlock(&m->mu);
}

/* ---- start, stop, flush ---- */

typedef struct worker_arg {
  kvbm_manager *m;
  kvbm__tier *t;
} worker_arg;

static void *worker_main(void *arg) {
  kvbm_manager *m = ((worker_arg *)arg)->m;
  kvbm__tier *t = ((worker_arg *)arg)->t;
  free(arg);
  /* CUDA's current device is per thread; a failed bind fails each copy. */
  if (t->gs) (void)kvbm__gpu_bind(t->gs);
  if (t->store == KVBM__STORE_MEMORY) host_worker(m);
  else volume_worker(m, t);
  return NULL;
}

int kvbm__workers_start(kvbm_manager *m, kvbm_error *err) {
  for (int ti = KVBM_TIER_G2; ti < KVBM_TIER_COUNT; ti++) {
    kvbm__tier *t = &m->t[ti];
    if (!t->present || !t->usable) continue;
    t->q.cap = m->cfg.queue_capacity;
    if (!(t->q.ring = malloc(t->q.cap * sizeof *t->q.ring)))
      return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
    if (t->store == KVBM__STORE_VOLUME && !t->shared) {
      t->dq.cap = m->cfg.queue_capacity;
      if (!(t->dq.ring = malloc(t->dq.cap * sizeof *t->dq.ring)))
        return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
    }
    if (t->store == KVBM__STORE_VOLUME && !(t->vw = vw_new(m, t)))
      return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
    pthread_cond_init(&t->work_cv, NULL);
    worker_arg *a = malloc(sizeof *a);
    if (!a) return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
    *a = (worker_arg){m, t};
    if (ti == KVBM_TIER_G2) m->host_running = true;
    t->running = true;
    if (pthread_create(&t->th, NULL, worker_main, a)) {
      if (ti == KVBM_TIER_G2) m->host_running = false;
      t->running = false;
      pthread_cond_destroy(&t->work_cv);
      free(a);
      return kvbm_error_set(err, KVBM_ENOMEM, "manager: cannot start a worker thread");
    }
  }
  return KVBM_OK;
}

void kvbm__workers_stop(kvbm_manager *m) {
  if (!m->mu_ready) return;
  pthread_mutex_lock(&m->mu);
  m->stop = true;
  m->cancel = !m->cfg.drain_on_destroy;
  for (int ti = KVBM_TIER_G2; ti < KVBM_TIER_COUNT; ti++)
    if (m->t[ti].running) pthread_cond_broadcast(&m->t[ti].work_cv);
  pthread_mutex_unlock(&m->mu);
  for (int ti = KVBM_TIER_G2; ti < KVBM_TIER_COUNT; ti++) {
    kvbm__tier *t = &m->t[ti];
    if (!t->running) continue;
    pthread_join(t->th, NULL);
    t->running = false;
    pthread_cond_destroy(&t->work_cv);
  }
  for (int ti = KVBM_TIER_G2; ti < KVBM_TIER_COUNT; ti++) {
    kvbm__tier *t = &m->t[ti];
    free(t->q.ring);
    free(t->dq.ring);
    t->q.ring = t->dq.ring = NULL;
    vw_free(t->vw);
    t->vw = NULL;
  }
}

/* Waits until the workers of tiers G2..last have nothing queued or
 * running. Each worker signals done_cv when a job ends. */
static void flush_through(kvbm_manager *m, int last) {
  if (!m || !m->mu_ready) return;
  pthread_mutex_lock(&m->mu);
  for (;;) {
    bool idle = true;
    for (int ti = KVBM_TIER_G2; ti <= last; ti++)
      if (m->t[ti].q.count || m->t[ti].dq.count || m->t[ti].busy) idle = false;
    if (idle) break;
    pthread_cond_wait(&m->done_cv, &m->mu);
  }
  pthread_mutex_unlock(&m->mu);
}

void kvbm_manager_flush(kvbm_manager *m) { flush_through(m, KVBM_TIER_COUNT - 1); }

/* G4 is the network: its copies end at g4_timeout_ms at worst, and an
 * engine that waits for them between steps stalls for as long as Redis is
 * unreachable. */
void kvbm_manager_flush_local(kvbm_manager *m) { flush_through(m, KVBM_TIER_G3); }
