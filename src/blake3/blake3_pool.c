/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blake3_pool.c: hashing inputs on several threads (kvbm_blake3_pool).
 *
 * Design. A submission is a set of jobs, each job an input cut into
 * pieces (blake3.c: a piece's chaining value depends on its bytes and
 * position only, and the tree above the pieces is rebuilt from their
 * values). The pool keeps outstanding submissions in a list in submit
 * order, each with a cursor to its next piece not yet handed out; a
 * thread that wants work takes the first such piece under the lock,
 * hashes it without the lock, and records it done under the lock. The
 * thread that finishes a job's last piece combines its pieces (a few
 * dozen compressions) and writes the job's output; the one that finishes
 * a submission's last job wakes its waiter. So pieces need no allocation
 * of their own: a submission is one allocation (header, jobs, chaining
 * values), freed by its wait.
 *
 * The waiter helps: kvbm_blake3_pool_wait runs queued pieces (its own
 * submission's first, then anyone's) until none is left, and only then
 * sleeps until the workers finish the pieces they hold. A pool with no
 * workers therefore hashes on the caller's thread, and a caller that
 * submits, does other work (a transfer) and then waits gets hashing
 * overlapped with that work on the workers plus its own thread at the end.
 *
 * A submission may also move its inputs (submit_copy): each piece is copied and then
 * hashed by the same thread, back to back, so the hash reads what the
 * copy just left in that core's cache, and the pieces of one block spread
 * the copy over the threads as they spread the hash. A block received
 * from a peer is thus moved and verified in one pass over memory.
 *
 * Trade-offs: one lock for the whole pool. A piece is 256 KiB by default,
 * about 70 us of hashing on this machine, so two lock round trips per
 * piece are noise; smaller pieces would spread small inputs wider at the
 * cost of more trips. Inputs no longer than a piece are hashed whole by
 * one thread (kvbm_blake3_hash): the tree gives nothing to share.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "blake3/blake3_impl.h"
#include "kvbm/blake3.h"

typedef struct b3_jobst {
  kvbm_blake3_job job;
  void *copy_to; /* kvbm_blake3_pool_submit_copy: where the input lands */
  size_t npieces; /* 1: hashed whole */
  size_t left;    /* pieces not finished */
  uint8_t (*cvs)[32];
} b3_jobst;

typedef struct b3_sub {
  struct b3_sub *next;
  uint64_t ticket;
  size_t njobs, jobs_left;
  size_t next_job, next_piece; /* the next piece to hand out */
  bool waited;                 /* a thread is in wait() for it */
  b3_jobst jobs[];             /* then the chaining values */
} b3_sub;

struct kvbm_blake3_pool {
  pthread_mutex_t mu;
  pthread_cond_t work; /* workers: pieces queued, or stop */
  pthread_cond_t done; /* waiters: a submission finished */
  b3_sub *head, *tail;
  size_t queued; /* pieces not yet handed out, over all submissions */
  uint64_t next_ticket;
  bool stop;
  size_t piece;
  unsigned nthreads;
  pthread_t *threads;
};

/* A piece handed out: which job of which submission, and which piece. */
typedef struct b3_task {
  b3_sub *sub;
  b3_jobst *job;
  size_t index;
} b3_task;

/* Takes the next piece of `s` (which has one). Lock held. */
static b3_task take_from(kvbm_blake3_pool *p, b3_sub *s) {
  b3_task t = {s, &s->jobs[s->next_job], s->next_piece};
  if (++s->next_piece == t.job->npieces) {
    s->next_job++;
    s->next_piece = 0;
  }
  p->queued--;
  return t;
}

/* Takes a queued piece, `mine`'s first if it has any. Lock held,
 * p->queued > 0. */
static b3_task take(kvbm_blake3_pool *p, b3_sub *mine) {
  if (mine && mine->next_job < mine->njobs) return take_from(p, mine);
  b3_sub *s = p->head;
  while (s->next_job == s->njobs) s = s->next;
  return take_from(p, s);
}

/* A copying job's piece `index`: copied to its place in copy_to just
 * before it is hashed from there, by the same thread, so that the hash
 * reads the bytes from this core's cache (a piece is at most the pool's
 * piece, 256 KiB by default, which fits L2; glibc's memcpy keeps regular,
 * caching stores at that size). Returns the input to hash. */
static const void *land_piece(const b3_jobst *j, size_t piece, size_t index) {
  if (!j->copy_to || j->job.len == 0) return j->job.in;
  size_t off = index * piece, n = j->job.len - off < piece ? j->job.len - off : piece;
  memcpy((uint8_t *)j->copy_to + off, (const uint8_t *)j->job.in + off, n);
  return j->copy_to;
}

/* Hashes the piece (lock not held), then records it; the last piece of a
 * job combines the job's pieces, the last job of a submission wakes its
 * waiter. Called and returns with the lock held. */
static void run(kvbm_blake3_pool *p, b3_task t) {
  b3_jobst *j = t.job;
  pthread_mutex_unlock(&p->mu);
  if (j->npieces == 1)
    kvbm_blake3_hash(land_piece(j, j->job.len, 0), j->job.len, j->job.out, j->job.out_len);
  else
    kvbm__b3_piece_cv(land_piece(j, p->piece, t.index), j->job.len, p->piece, t.index, j->cvs[t.index]);
  pthread_mutex_lock(&p->mu);
  if (--j->left > 0) return;
  if (j->npieces > 1) {
    /* Only this thread touches the job now: combine outside the lock. */
    pthread_mutex_unlock(&p->mu);
    kvbm__b3_root_from_pieces((const uint8_t(*)[32])j->cvs, j->job.len, p->piece, j->job.out,
                              j->job.out_len);
    pthread_mutex_lock(&p->mu);
  }
  if (--t.sub->jobs_left == 0) pthread_cond_broadcast(&p->done);
}

static void *worker(void *arg) {
  kvbm_blake3_pool *p = arg;
  pthread_mutex_lock(&p->mu);
  while (!p->stop) {
    if (p->queued > 0)
      run(p, take(p, NULL));
    else
      pthread_cond_wait(&p->work, &p->mu);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static void stop_workers(kvbm_blake3_pool *p, unsigned started) {
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  for (unsigned i = 0; i < started; i++) pthread_join(p->threads[i], NULL);
}

int kvbm_blake3_pool_create(unsigned threads, size_t piece_len, kvbm_blake3_pool **out,
                            kvbm_error *err) {
  if (!out) return kvbm_error_set(err, KVBM_EINVAL, "blake3 pool: out is NULL");
  if (threads > KVBM_BLAKE3_POOL_MAX_THREADS)
    return kvbm_error_set(err, KVBM_EINVAL, "blake3 pool: %u threads (at most %u)", threads,
                          KVBM_BLAKE3_POOL_MAX_THREADS);
  if (piece_len == 0) piece_len = KVBM_BLAKE3_POOL_PIECE_DEFAULT;
  if (piece_len < KVBM_BLAKE3_CHUNK_LEN || piece_len > ((size_t)1 << 30) ||
      (piece_len & (piece_len - 1)))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "blake3 pool: a piece of %zu bytes (a power of two, 1 KiB .. 1 GiB)",
                          piece_len);
  kvbm_blake3_pool *p = calloc(1, sizeof *p);
  if (p && threads) p->threads = calloc(threads, sizeof *p->threads);
  if (!p || (threads && !p->threads)) {
    if (p) free(p->threads);
    free(p);
    return kvbm_error_set(err, KVBM_ENOMEM, "blake3 pool: out of memory");
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->done, NULL);
  p->piece = piece_len;
  p->next_ticket = 1;
  for (unsigned i = 0; i < threads; i++) {
    if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
      stop_workers(p, i);
      p->nthreads = 0;
      kvbm_blake3_pool_destroy(p);
      return kvbm_error_set(err, KVBM_EIO, "blake3 pool: thread %u of %u would not start", i + 1,
                            threads);
    }
  }
  p->nthreads = threads;
  *out = p;
  return KVBM_OK;
}

/* Both submits: copy_to NULL (hash in place) or one destination a job. */
static int submit(kvbm_blake3_pool *p, const kvbm_blake3_job *jobs, void *const *copy_to, size_t n,
                  uint64_t *ticket, kvbm_error *err) {
  if (!p || !jobs || !ticket || n == 0)
    return kvbm_error_set(err, KVBM_EINVAL, "blake3 pool: submit: NULL argument or no job");
  size_t cvs = 0;
  for (size_t i = 0; i < n; i++) {
    const kvbm_blake3_job *j = &jobs[i];
    if ((!j->in && j->len) || !j->out || j->out_len == 0 || j->out_len > 64)
      return kvbm_error_set(err, KVBM_EINVAL,
                            "blake3 pool: job %zu: NULL input or output, or %zu output bytes (1..64)",
                            i, j->out_len);
    /* a copy onto its own input would hash bytes half overwritten */
    uintptr_t in = (uintptr_t)j->in, to = copy_to ? (uintptr_t)copy_to[i] : 0;
    if (copy_to && !copy_to[i])
      return kvbm_error_set(err, KVBM_EINVAL, "blake3 pool: job %zu: NULL copy_to", i);
    if (copy_to && j->len && in < to + j->len && to < in + j->len)
      return kvbm_error_set(err, KVBM_EINVAL, "blake3 pool: job %zu: copy_to overlaps its input", i);
    if (j->len > p->piece) cvs += (j->len + p->piece - 1) / p->piece;
  }
  if (n > (SIZE_MAX - sizeof(b3_sub)) / sizeof(b3_jobst) / 2 || cvs > SIZE_MAX / 64)
    return kvbm_error_set(err, KVBM_ENOMEM, "blake3 pool: submit: %zu jobs", n);
  b3_sub *s = malloc(sizeof *s + n * sizeof(b3_jobst) + cvs * 32);
  if (!s) return kvbm_error_set(err, KVBM_ENOMEM, "blake3 pool: submit: out of memory");
  uint8_t(*cv)[32] = (uint8_t(*)[32])(void *)&s->jobs[n];
  size_t pieces = 0;
  for (size_t i = 0; i < n; i++) {
    b3_jobst *j = &s->jobs[i];
    j->job = jobs[i];
    j->copy_to = copy_to ? copy_to[i] : NULL;
    j->npieces = j->job.len > p->piece ? (j->job.len + p->piece - 1) / p->piece : 1;
    j->left = j->npieces;
    j->cvs = j->npieces > 1 ? cv : NULL;
    if (j->npieces > 1) cv += j->npieces;
    pieces += j->npieces;
  }
  s->next = NULL;
  s->njobs = s->jobs_left = n;
  s->next_job = s->next_piece = 0;
  s->waited = false;
  pthread_mutex_lock(&p->mu);
  s->ticket = p->next_ticket++;
  if (p->tail)
    p->tail->next = s;
  else
    p->head = s;
  p->tail = s;
  p->queued += pieces;
  if (p->nthreads) pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  *ticket = s->ticket;
  return KVBM_OK;
}

int kvbm_blake3_pool_submit(kvbm_blake3_pool *p, const kvbm_blake3_job *jobs, size_t n,
                            uint64_t *ticket, kvbm_error *err) {
  return submit(p, jobs, NULL, n, ticket, err);
}

int kvbm_blake3_pool_submit_copy(kvbm_blake3_pool *p, const kvbm_blake3_job *jobs, void *const *copy_to,
                                 size_t n, uint64_t *ticket, kvbm_error *err) {
  if (!copy_to) return kvbm_error_set(err, KVBM_EINVAL, "blake3 pool: submit_copy: NULL copy_to");
  return submit(p, jobs, copy_to, n, ticket, err);
}

/* Unlinks `s` from the outstanding list. Lock held. */
static void unlink_sub(kvbm_blake3_pool *p, b3_sub *s) {
  b3_sub **pp = &p->head, *prev = NULL;
  while (*pp != s) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  *pp = s->next;
  if (p->tail == s) p->tail = prev;
}

int kvbm_blake3_pool_wait(kvbm_blake3_pool *p, uint64_t ticket, kvbm_error *err) {
  if (!p) return kvbm_error_set(err, KVBM_EINVAL, "blake3 pool: wait: NULL pool");
  pthread_mutex_lock(&p->mu);
  b3_sub *s = p->head;
  while (s && s->ticket != ticket) s = s->next;
  if (!s || s->waited) {
    pthread_mutex_unlock(&p->mu);
    return kvbm_error_set(err, KVBM_ENOTFOUND, "blake3 pool: ticket %llu is not outstanding",
                          (unsigned long long)ticket);
  }
  s->waited = true;
  while (s->jobs_left > 0) {
    if (p->queued > 0)
      run(p, take(p, s));
    else
      pthread_cond_wait(&p->done, &p->mu);
  }
  unlink_sub(p, s);
  pthread_mutex_unlock(&p->mu);
  free(s);
  return KVBM_OK;
}

int kvbm_blake3_pool_hash(kvbm_blake3_pool *p, const void *in, size_t len, uint8_t *out,
                          size_t out_len, kvbm_error *err) {
  kvbm_blake3_job j = {in, len, out, out_len};
  uint64_t t;
  int rc = kvbm_blake3_pool_submit(p, &j, 1, &t, err);
  return rc ? rc : kvbm_blake3_pool_wait(p, t, err);
}

unsigned kvbm_blake3_pool_threads(const kvbm_blake3_pool *p) { return p ? p->nthreads : 0; }
size_t kvbm_blake3_pool_piece_len(const kvbm_blake3_pool *p) { return p ? p->piece : 0; }

void kvbm_blake3_pool_destroy(kvbm_blake3_pool *p) {
  if (!p) return;
  stop_workers(p, p->nthreads);
  while (p->head) {
    b3_sub *s = p->head;
    p->head = s->next;
    free(s);
  }
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->done);
  pthread_mutex_destroy(&p->mu);
  free(p->threads);
  free(p);
}
