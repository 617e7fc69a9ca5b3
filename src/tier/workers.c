/*
 * workers.c: the job queues and the threads that move bytes.
 *
 * Two workers, each with a fixed ring of jobs (queue_capacity): the host
 * worker copies between G1 and G2 memory, the disk worker reads and writes
 * G3 slots. The engine's calls decide and index every copy under the lock
 * and push a job; a worker takes jobs, runs them outside the lock, and
 * finishes them under it (byte states, counters, pool references). A full
 * ring is never waited on: the caller skips and counts instead.
 *
 * The host worker takes up to batch_max jobs at once. On device G1 it
 * queues the whole batch as CUDA copies with an event after each job, then
 * waits for the events in order, so each job gets its own result. An
 * offload that also goes to G3 is forwarded to the disk queue from the
 * host worker once its G2 copy is done (the G3 write then reads G2).
 *
 * The disk worker streams: it keeps up to g3_queue_depth slot transfers in
 * flight, finishes them one at a time as they complete (checking a read
 * while the next ones are still on their way) and refills from its queue,
 * so the disk never idles between batches. Slots (a staging buffer plus an
 * io) are its unit: a job holds one from its start until it is finished.
 *
 * Shutdown: stop is set under the lock; with drain_on_destroy the workers
 * empty their queues first, otherwise every job taken is finished as not
 * run (its target FAILED, an onboard's match shortened).
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
  pthread_cond_signal(&m->work_cv[KVBM__W_HOST]);
  pthread_cond_signal(&m->work_cv[KVBM__W_DISK]);
}

/* ---- finishing jobs (lock held) ---- */

static void host_done(kvbm_manager *m, kvbm__job *j, bool ran) {
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1], *g2 = &m->t[KVBM_TIER_G2], *g3 = &m->t[KVBM_TIER_G3];
  bool ok = ran && j->result == KVBM_OK; /* only CUDA copies can fail */
  if (ran && !ok) g2->st.copy_errors++;
  if (j->kind == KVBM__J_OFFLOAD) {
    g2->state[j->g2] = ok ? KVBM__READY : KVBM__FAILED;
    if (ok) {
      g2->st.offloaded_blocks++;
      g2->st.offloaded_bytes += m->block_bytes;
    }
    KVBM__MUST(kvbm_block_release(g1->pool, j->g1, j->prio));
    if (j->g3_write) {
      kvbm__job d = *j;
      d.kind = KVBM__J_DISK_WRITE;
      d.src_tier = KVBM_TIER_G2;
      d.result = KVBM_OK;
      if (ok && kvbm__q_push(&m->q[KVBM__W_DISK], &d)) {
        pthread_cond_signal(&m->work_cv[KVBM__W_DISK]);
        return; /* the disk job carries the batch on */
      }
      g3->state[j->g3] = KVBM__FAILED;
      if (ok) g3->st.skipped_queue++;
    }
    batch_job_done(m, j->b);
  } else { /* J_ONBOARD_HOST */
    g1->state[j->g1] = ok ? KVBM__READY : KVBM__FAILED;
    if (ok) {
      g2->st.onboarded_blocks++;
      g2->st.onboarded_bytes += m->block_bytes;
    } else {
      g2->st.onboard_failures++;
    }
    KVBM__MUST(kvbm_block_release(g2->pool, j->g2, 0));
    KVBM__MUST(kvbm_block_release(g1->pool, j->g1, j->prio));
  }
}

static void disk_done(kvbm_manager *m, kvbm__job *j, bool ran) {
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1], *g3 = &m->t[KVBM_TIER_G3];
  bool ok = ran && j->result == KVBM_OK;
  if (j->kind == KVBM__J_DISK_WRITE) {
    g3->state[j->g3] = ok ? KVBM__READY : KVBM__FAILED;
    if (ok) {
      g3->st.offloaded_blocks++;
      g3->st.offloaded_bytes += m->block_bytes;
    } else if (ran && j->result == KVBM_EDEVICE) {
      g3->st.copy_errors++; /* staging out of device G1 failed */
    } else if (ran) {
      g3->st.skipped_io++;
    }
    if (j->src_tier == KVBM_TIER_G1) KVBM__MUST(kvbm_block_release(g1->pool, j->g1, j->prio));
    batch_job_done(m, j->b);
  } else { /* J_DISK_READ */
    g1->state[j->g1] = ok ? KVBM__READY : KVBM__FAILED;
    if (ok) {
      g3->st.onboarded_blocks++;
      g3->st.onboarded_bytes += m->block_bytes;
    } else {
      g3->st.onboard_failures++;
      if (ran && j->result == KVBM_EDEVICE) {
        g3->st.copy_errors++; /* the slot was good; the copy into G1 failed */
      } else if (ran) {
        /* The slot cannot serve this hash: never a hit again until rewritten. */
        g3->state[j->g3] = KVBM__FAILED;
        if (j->result == KVBM_EIO) g3->st.read_errors++;
        else g3->st.checksum_failures++;
      }
    }
    KVBM__MUST(kvbm_block_release(g3->pool, j->g3, 0));
    KVBM__MUST(kvbm_block_release(g1->pool, j->g1, j->prio));
  }
}

/* ---- the host worker ---- */

static void host_run(kvbm_manager *m, kvbm__job *j) {
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1], *g2 = &m->t[KVBM_TIER_G2];
  if (j->kind == KVBM__J_OFFLOAD) kvbm__copy_block(g2, j->g2, g1, j->g1);
  else kvbm__copy_block(g1, j->g1, g2, j->g2);
}

/* Device G1: queue every job's copies with an event after each, then wait
 * for the events in order, so each job gets its own result. */
static void host_run_gpu(kvbm_manager *m, kvbm__job *jobs, uint32_t n) {
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1], *g2 = &m->t[KVBM_TIER_G2];
  kvbm_gpu_stream *s = m->gs[KVBM__W_HOST];
  for (uint32_t i = 0; i < n; i++) {
    kvbm__job *j = &jobs[i];
    j->result = j->kind == KVBM__J_OFFLOAD ? kvbm__copy_block_gpu(s, g2, j->g2, g1, j->g1)
                                           : kvbm__copy_block_gpu(s, g1, j->g1, g2, j->g2);
    if (!j->result) j->result = kvbm__gpu_mark(s, i);
  }
  for (uint32_t i = 0; i < n; i++)
    if (!jobs[i].result) jobs[i].result = kvbm__gpu_wait(s, i);
}

static void host_worker(kvbm_manager *m) {
  kvbm__jqueue *q = &m->q[KVBM__W_HOST];
  uint32_t max = m->cfg.batch_max;
  kvbm__job *jobs = malloc(max * sizeof *jobs);
  pthread_mutex_lock(&m->mu);
  for (;;) {
    while (!q->count && !m->stop) pthread_cond_wait(&m->work_cv[KVBM__W_HOST], &m->mu);
    if (!q->count) break;
    uint32_t n = 0;
    /* Without scratch memory the worker still drains, one job at a time. */
    kvbm__job one;
    kvbm__job *take = jobs ? jobs : &one;
    uint32_t lim = jobs ? max : 1;
    while (q->count && n < lim) take[n++] = q_pop(q);
    bool run = !m->cancel;
    m->busy[KVBM__W_HOST] += n;
    pthread_mutex_unlock(&m->mu);
    double t0 = kvbm_clock_seconds();
    if (run && m->gs[KVBM__W_HOST])
      host_run_gpu(m, take, n);
    else if (run)
      for (uint32_t i = 0; i < n; i++) host_run(m, &take[i]);
    double dt = kvbm_clock_seconds() - t0;
    pthread_mutex_lock(&m->mu);
    m->t[KVBM_TIER_G2].st.busy_seconds += dt;
    for (uint32_t i = 0; i < n; i++) host_done(m, &take[i], run);
    m->busy[KVBM__W_HOST] -= n;
    pthread_cond_broadcast(&m->done_cv);
  }
  /* Nothing more can be forwarded: let the disk worker finish. */
  m->host_running = false;
  pthread_cond_broadcast(&m->work_cv[KVBM__W_DISK]);
  pthread_mutex_unlock(&m->mu);
  free(jobs);
}

/* ---- the disk worker ---- */

/* Block b of tier t as zero-copy slot data, or 0 pieces when some piece is
 * not page-aligned or the memory is a device's (then the slot is staged). */
static int data_pieces(const kvbm_manager *m, const kvbm__tier *t, uint32_t b, struct iovec *iov) {
  int n = kvbm__block_pieces(t, b, iov, KVBM_DISK_MAX_IOV);
  for (int i = 0; i < n; i++)
    if (t->device || !kvbm__disk_direct_ok(m->disk, iov[i].iov_base, iov[i].iov_len)) return 0;
  return n;
}

/* Prepares and starts job i: a write is sealed (its checksum taken from the
 * tier's memory, or from the staged copy), a read targets G1 directly when
 * it can. */
static void disk_start(kvbm_manager *m, kvbm__job *j, uint32_t i) {
  kvbm__disk_io *io = &m->ios[i];
  uint8_t *buf = m->bounce[i];
  bool write = j->kind == KVBM__J_DISK_WRITE;
  const kvbm__tier *t = &m->t[write ? j->src_tier : KVBM_TIER_G1];
  uint32_t b = write && j->src_tier == KVBM_TIER_G2 ? j->g2 : j->g1;
  int n = data_pieces(m, t, b, m->pieces[i]);
  io->slot = j->slot;
  io->buf = buf;
  io->write = write;
  io->user = j;
  io->data = (kvbm__disk_data){n ? m->pieces[i] : NULL, n};
  if (write) {
    if (!n && t->device && kvbm__gather_gpu(m->gs[KVBM__W_DISK], buf, t, b) != KVBM_OK) {
      j->result = KVBM_EDEVICE;
      io->user = NULL; /* finished: failed */
      return;
    }
    if (!n && !t->device) kvbm__gather(buf, t, b);
    kvbm_slot_header h = {.seq_hash = j->hash, .parent_hash = j->parent,
                          .has_parent = j->has_parent};
    kvbm__disk_seal(m->disk, buf, &io->data, &h);
  }
  j->result = KVBM_EIO;
  if (kvbm__disk_begin(m->disk, io) != KVBM_OK) io->user = NULL;
}

/* A finished transfer: a read is checked (header, hash, data checksum)
 * where it landed, then copied out of the staging buffer if it was staged. */
static void disk_end(kvbm_manager *m, kvbm__disk_io *io) {
  kvbm__job *j = io->user;
  if (io->result != 0) {
    j->result = KVBM_EIO;
    return;
  }
  j->result = KVBM_OK;
  if (io->write) return;
  kvbm__tier *g1 = &m->t[KVBM_TIER_G1];
  if (kvbm__disk_check(m->disk, io->buf, &io->data, true, &j->hash, NULL) != KVBM_OK)
    j->result = KVBM_ECHECKSUM;
  else if (!io->data.iov && g1->device)
    j->result = kvbm__scatter_gpu(m->gs[KVBM__W_DISK], g1, j->g1, io->buf);
  else if (!io->data.iov)
    kvbm__scatter(g1, j->g1, io->buf);
}

static void disk_worker(kvbm_manager *m) {
  kvbm__jqueue *q = &m->q[KVBM__W_DISK];
  uint32_t ns = m->nbounce, nfree = ns, depth = m->cfg.g3_queue_depth;
  kvbm__job *jobs = calloc(ns, sizeof *jobs);
  uint32_t *freel = calloc(ns, sizeof *freel), *took = calloc(ns, sizeof *took);
  bool *ran = calloc(ns, sizeof *ran);
  uint32_t *ready = calloc(ns, sizeof *ready);
  bool ok = jobs && freel && took && ran && ready;
  for (uint32_t i = 0; ok && i < ns; i++) freel[i] = i;
  pthread_mutex_lock(&m->mu);
  for (;;) {
    uint32_t nt = 0;
    if (ok)
      while (nfree && q->count && kvbm__disk_pending(m->disk) + nt < depth) {
        uint32_t sl = freel[--nfree];
        jobs[sl] = q_pop(q);
        ran[sl] = !m->cancel;
        took[nt++] = sl;
      }
    else if (q->count) { /* no scratch memory: cancel what is queued */
      kvbm__job j = q_pop(q);
      disk_done(m, &j, false);
      pthread_cond_broadcast(&m->done_cv);
      continue;
    }
    if (!nt && nfree == ns) {
      if (m->stop && !q->count && !m->host_running) break;
      pthread_cond_wait(&m->work_cv[KVBM__W_DISK], &m->mu);
      continue;
    }
    m->busy[KVBM__W_DISK] += nt;
    pthread_mutex_unlock(&m->mu);
    double t0 = kvbm_clock_seconds();
    uint32_t nready = 0;
    for (uint32_t i = 0; i < nt; i++) {
      uint32_t sl = took[i];
      if (ran[sl]) disk_start(m, &jobs[sl], sl);
      if (!ran[sl] || !m->ios[sl].user) ready[nready++] = sl; /* cancelled or refused */
    }
    if (!nready) {
      kvbm__disk_io *io = kvbm__disk_reap(m->disk);
      if (io) {
        disk_end(m, io);
        ready[nready++] = (uint32_t)(io - m->ios);
      }
    }
    double dt = kvbm_clock_seconds() - t0;
    pthread_mutex_lock(&m->mu);
    m->t[KVBM_TIER_G3].st.busy_seconds += dt;
    for (uint32_t i = 0; i < nready; i++) {
      uint32_t sl = ready[i];
      disk_done(m, &jobs[sl], ran[sl]);
      freel[nfree++] = sl;
      m->busy[KVBM__W_DISK]--;
    }
    pthread_cond_broadcast(&m->done_cv);
  }
  pthread_mutex_unlock(&m->mu);
  free(jobs);
  free(freel);
  free(took);
  free(ran);
  free(ready);
}

/* ---- start, stop, flush ---- */

typedef struct worker_arg {
  kvbm_manager *m;
  int w;
} worker_arg;

static void *worker_main(void *arg) {
  kvbm_manager *m = ((worker_arg *)arg)->m;
  int w = ((worker_arg *)arg)->w;
  free(arg);
  /* CUDA's current device is per thread; a failed bind fails each copy. */
  if (m->gs[w]) (void)kvbm__gpu_bind(m->gs[w]);
  if (w == KVBM__W_DISK) disk_worker(m);
  else host_worker(m);
  return NULL;
}

int kvbm__workers_start(kvbm_manager *m, kvbm_error *err) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->done_cv, &ca);
  for (int w = 0; w < KVBM__NWORKERS; w++) pthread_cond_init(&m->work_cv[w], NULL);
  pthread_condattr_destroy(&ca);
  for (int w = 0; w < KVBM__NWORKERS; w++) {
    m->q[w].cap = m->cfg.queue_capacity;
    if (!(m->q[w].ring = malloc(m->q[w].cap * sizeof *m->q[w].ring)))
      return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
  }
  for (int w = 0; w < KVBM__NWORKERS; w++) {
    if (w == KVBM__W_HOST && !m->t[KVBM_TIER_G2].present) continue;
    if (w == KVBM__W_DISK && !m->disk) continue;
    worker_arg *a = malloc(sizeof *a);
    if (!a) return kvbm_error_set(err, KVBM_ENOMEM, "manager: out of memory");
    *a = (worker_arg){m, w};
    if (w == KVBM__W_HOST) m->host_running = true;
    if (pthread_create(&m->th[m->nthreads], NULL, worker_main, a)) {
      if (w == KVBM__W_HOST) m->host_running = false;
      free(a);
      return kvbm_error_set(err, KVBM_ENOMEM, "manager: cannot start a worker thread");
    }
    m->nthreads++;
  }
  return KVBM_OK;
}

void kvbm__workers_stop(kvbm_manager *m) {
  if (m->nthreads) {
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    m->cancel = !m->cfg.drain_on_destroy;
    for (int w = 0; w < KVBM__NWORKERS; w++) pthread_cond_broadcast(&m->work_cv[w]);
    pthread_mutex_unlock(&m->mu);
    for (int i = 0; i < m->nthreads; i++) pthread_join(m->th[i], NULL);
    m->nthreads = 0;
  }
  if (m->q[0].ring || m->q[1].ring) {
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->done_cv);
    for (int w = 0; w < KVBM__NWORKERS; w++) pthread_cond_destroy(&m->work_cv[w]);
  }
  for (int w = 0; w < KVBM__NWORKERS; w++) {
    free(m->q[w].ring);
    m->q[w].ring = NULL;
  }
}

void kvbm_manager_flush(kvbm_manager *m) {
  if (!m || !m->nthreads) return;
  pthread_mutex_lock(&m->mu);
  while (m->q[0].count || m->q[1].count || m->busy[0] || m->busy[1])
    pthread_cond_wait(&m->done_cv, &m->mu);
  pthread_mutex_unlock(&m->mu);
}
