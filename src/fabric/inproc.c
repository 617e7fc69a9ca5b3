/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inproc.c: the in-process fabric, two ends of a pair in one process.
 *
 * It exists so that everything above the fabric (framing, onboarding,
 * the block set bookkeeping) can be tested without UCX, and so that two
 * components in one process can use the same interface as two nodes.
 * Design: both ends share a core (mutex + condition variable) holding one
 * inbox per end and the list of live registrations. A push copies the
 * payload into the peer's inbox at once (so the caller's buffer is free
 * immediately, a stronger promise than the interface makes); a block read
 * or write is a memcpy done under the core's lock after checking that the
 * peer's registration is still live, so a stale import fails cleanly
 * instead of touching freed memory. Everything is complete when a call
 * returns, so flush only reports the state. The last end destroyed frees
 * the core.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/bytes.h"
#include "common/clock.h"
#include "fabric/fabric_impl.h"

typedef struct payload {
  struct payload *next;
  uint64_t id;
  size_t len;
  bool announced; /* already returned by next() */
  unsigned char data[];
} payload;

typedef struct registration {
  struct registration *next;
  uint64_t id;
  uint64_t base, len;
  int owner; /* side 0 or 1 */
} registration;

typedef struct core {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;
  bool open[2];
  uint64_t pushed[2];    /* pushes made by each side */
  payload *inbox[2];     /* payloads waiting at each side, oldest first */
  registration *regs;
  uint64_t next_reg_id;
} core;

typedef struct inproc {
  kvbm_fabric base;
  core *c;
  int side;
} inproc;

/* An imported key: which registration of the peer it names. */
typedef struct inproc_rkey {
  uint64_t reg_id;
} inproc_rkey;

static inproc *IP(kvbm_fabric *f) { return (inproc *)f; }


/* Waits on the core's condition; false once the deadline passed. */
static bool wait_until(core *c, int timeout_ms, const struct timespec *dl) {
  if (timeout_ms == 0) return false;
  if (timeout_ms < 0) {
    pthread_cond_wait(&c->cv, &c->mu);
    return true;
  }
  return pthread_cond_timedwait(&c->cv, &c->mu, dl) == 0;
}

static int ip_push(kvbm_fabric *f, const void *data, size_t len, uint64_t id, kvbm_error *err) {
  inproc *ip = IP(f);
  core *c = ip->c;
  int peer = 1 - ip->side;
  if (len > SIZE_MAX - sizeof(payload)) return kvbm_error_set(err, KVBM_ETOOLONG, "fabric: push: %zu bytes", len);
  payload *p = malloc(sizeof *p + len);
  if (!p) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: push: out of memory for %zu bytes", len);
  p->next = NULL;
  p->id = id;
  p->len = len;
  p->announced = false;
  if (len) memcpy(p->data, data, len);
  pthread_mutex_lock(&c->mu);
  if (!c->open[peer]) {
    pthread_mutex_unlock(&c->mu);
    free(p);
    return kvbm_error_set(err, KVBM_ECLOSED, "fabric: push: peer '%s' is closed", f->peer_name);
  }
  payload **pp = &c->inbox[peer];
  while (*pp) pp = &(*pp)->next;
  *pp = p;
  c->pushed[ip->side]++;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return KVBM_OK;
}

static int ip_next(kvbm_fabric *f, int timeout_ms, kvbm_fabric_handle *h, size_t *len, kvbm_error *err) {
  inproc *ip = IP(f);
  core *c = ip->c;
  struct timespec dl = kvbm__deadline_after_ms(CLOCK_MONOTONIC, timeout_ms);
  pthread_mutex_lock(&c->mu);
  for (;;) {
    for (payload *p = c->inbox[ip->side]; p; p = p->next)
      if (!p->announced) {
        p->announced = true;
        h->id = p->id;
        if (len) *len = p->len;
        pthread_mutex_unlock(&c->mu);
        return KVBM_OK;
      }
    if (!c->open[1 - ip->side]) {
      pthread_mutex_unlock(&c->mu);
      return kvbm_error_set(err, KVBM_ECLOSED, "fabric: next: peer '%s' closed, nothing left", f->peer_name);
    }
    if (!wait_until(c, timeout_ms, &dl)) {
      pthread_mutex_unlock(&c->mu);
      return kvbm_error_set(err, KVBM_ETIMEDOUT, "fabric: next: no payload within %d ms", timeout_ms);
    }
  }
}

static int ip_pull(kvbm_fabric *f, kvbm_fabric_handle h, void *buf, size_t cap, size_t *len, int timeout_ms,
                   kvbm_error *err) {
  inproc *ip = IP(f);
  core *c = ip->c;
  int peer = 1 - ip->side;
  struct timespec dl = kvbm__deadline_after_ms(CLOCK_MONOTONIC, timeout_ms);
  pthread_mutex_lock(&c->mu);
  for (;;) {
    payload **pp = &c->inbox[ip->side];
    while (*pp && (*pp)->id != h.id) pp = &(*pp)->next;
    payload *p = *pp;
    if (p) {
      if (p->len > cap) {
        size_t need = p->len;
        pthread_mutex_unlock(&c->mu);
        return kvbm_error_set(err, KVBM_ETOOLONG, "fabric: pull: payload %llu is %zu bytes, buffer %zu",
                              (unsigned long long)h.id, need, cap);
      }
      *pp = p->next;
      pthread_mutex_unlock(&c->mu);
      if (p->len) memcpy(buf, p->data, p->len);
      if (len) *len = p->len;
      free(p);
      return KVBM_OK;
    }
    if (h.id <= c->pushed[peer]) {
      pthread_mutex_unlock(&c->mu);
      return kvbm_error_set(err, KVBM_ENOTFOUND, "fabric: pull: payload %llu was already pulled",
                            (unsigned long long)h.id);
    }
    if (!c->open[peer]) {
      pthread_mutex_unlock(&c->mu);
      return kvbm_error_set(err, KVBM_ECLOSED, "fabric: pull: peer '%s' closed before sending payload %llu",
                            f->peer_name, (unsigned long long)h.id);
    }
    if (!wait_until(c, timeout_ms, &dl)) {
      pthread_mutex_unlock(&c->mu);
      return kvbm_error_set(err, KVBM_ETIMEDOUT, "fabric: pull: payload %llu not there within %d ms",
                            (unsigned long long)h.id, timeout_ms);
    }
  }
}

static int ip_flush(kvbm_fabric *f, int timeout_ms, kvbm_error *err) {
  (void)timeout_ms;
  return kvbm__fabric_check(f, err);
}

static int ip_mem_register(kvbm_fabric *f, void *base, uint64_t len, void **reg, uint8_t **key, size_t *key_len,
                           kvbm_error *err) {
  inproc *ip = IP(f);
  registration *r = calloc(1, sizeof *r);
  uint8_t *k = malloc(8);
  if (!r || !k) {
    free(r);
    free(k);
    return kvbm_error_set(err, KVBM_ENOMEM, "fabric: register: out of memory");
  }
  r->base = (uint64_t)(uintptr_t)base;
  r->len = len;
  r->owner = ip->side;
  pthread_mutex_lock(&ip->c->mu);
  r->id = ++ip->c->next_reg_id;
  r->next = ip->c->regs;
  ip->c->regs = r;
  pthread_mutex_unlock(&ip->c->mu);
  for (int i = 0; i < 8; i++) k[i] = (uint8_t)(r->id >> (8 * i));
  *reg = r;
  *key = k;
  *key_len = 8;
  return KVBM_OK;
}

static void ip_mem_deregister(kvbm_fabric *f, void *reg) {
  core *c = IP(f)->c;
  pthread_mutex_lock(&c->mu);
  for (registration **pp = &c->regs; *pp; pp = &(*pp)->next)
    if (*pp == reg) {
      *pp = ((registration *)reg)->next;
      break;
    }
  pthread_mutex_unlock(&c->mu);
  free(reg);
}

static int ip_mem_alloc(kvbm_fabric *f, uint64_t len, void **addr, void **alloc, kvbm_error *err) {
  (void)f;
  void *p = NULL;
  if (len > SIZE_MAX || posix_memalign(&p, 4096, len ? (size_t)len : 1) != 0)
    return kvbm_error_set(err, KVBM_ENOMEM, "fabric: cannot allocate %llu bytes", (unsigned long long)len);
  *addr = p;
  *alloc = p;
  return KVBM_OK;
}

static void ip_mem_free(kvbm_fabric *f, void *alloc) {
  (void)f;
  free(alloc);
}

/* The peer's live registration with this id, under the lock. */
static registration *find_reg(core *c, uint64_t id, int owner) {
  for (registration *r = c->regs; r; r = r->next)
    if (r->id == id && r->owner == owner) return r;
  return NULL;
}

static int ip_key_attach(kvbm_fabric *f, uint64_t base, uint64_t len, const uint8_t *key, size_t key_len,
                         void **rkey, kvbm_error *err) {
  inproc *ip = IP(f);
  if (key_len != 8) return kvbm_error_set(err, KVBM_EPROTO, "fabric: import: in-process key of %zu bytes", key_len);
  uint64_t id = kvbm__get_le64(key);
  pthread_mutex_lock(&ip->c->mu);
  registration *r = find_reg(ip->c, id, 1 - ip->side);
  bool ok = r && base >= r->base && base - r->base <= r->len && len <= r->len - (base - r->base);
  pthread_mutex_unlock(&ip->c->mu);
  if (!ok)
    return kvbm_error_set(err, KVBM_ERANGE, "fabric: import: [0x%llx, +%llu) is not memory the peer registered",
                          (unsigned long long)base, (unsigned long long)len);
  inproc_rkey *k = malloc(sizeof *k);
  if (!k) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: import: out of memory");
  k->reg_id = id;
  *rkey = k;
  return KVBM_OK;
}

static void ip_key_detach(kvbm_fabric *f, void *rkey) {
  (void)f;
  free(rkey);
}

static int ip_rma(kvbm_fabric *f, bool write, void *rkey, uint64_t raddr, void *local, size_t len, void *lreg,
                  kvbm_error *err) {
  (void)lreg;
  inproc *ip = IP(f);
  const inproc_rkey *k = rkey;
  pthread_mutex_lock(&ip->c->mu);
  registration *r = find_reg(ip->c, k->reg_id, 1 - ip->side);
  if (!r || raddr < r->base || raddr - r->base > r->len || len > r->len - (raddr - r->base)) {
    pthread_mutex_unlock(&ip->c->mu);
    return kvbm_error_set(err, KVBM_ERANGE, "fabric: the peer's registration of 0x%llx is gone",
                          (unsigned long long)raddr);
  }
  void *remote = (void *)(uintptr_t)raddr;
  if (write)
    memcpy(remote, local, len);
  else
    memcpy(local, remote, len);
  pthread_mutex_unlock(&ip->c->mu);
  return KVBM_OK;
}

static void ip_destroy(kvbm_fabric *f) {
  inproc *ip = IP(f);
  core *c = ip->c;
  pthread_mutex_lock(&c->mu);
  c->open[ip->side] = false;
  for (payload *p = c->inbox[ip->side], *n; p; p = n) {
    n = p->next;
    free(p);
  }
  c->inbox[ip->side] = NULL;
  /* Registrations this end forgot to release die with it. */
  for (registration **pp = &c->regs; *pp;) {
    registration *r = *pp;
    if (r->owner == ip->side) {
      *pp = r->next;
      free(r);
    } else {
      pp = &r->next;
    }
  }
  int left = --c->refs;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  free(ip);
  if (left == 0) {
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
  }
}

static const kvbm_fabric_vtable ip_vtable = {
    .kind = "inproc",
    /* ADR-0006: a synthetic fabric says so, so that nobody takes its
     * figures (memcpy under a lock) for a real transport's. */
    .label = "nixl-synth",
    .push = ip_push,
    .next = ip_next,
    .pull = ip_pull,
    .flush = ip_flush,
    .mem_register = ip_mem_register,
    .mem_deregister = ip_mem_deregister,
    .mem_alloc = ip_mem_alloc,
    .mem_free = ip_mem_free,
    .key_attach = ip_key_attach,
    .key_detach = ip_key_detach,
    .rma = ip_rma,
    .destroy = ip_destroy,
};

int kvbm_fabric_inproc_pair(const char *name_a, const char *name_b, kvbm_fabric **a, kvbm_fabric **b,
                            kvbm_error *err) {
  if (!a || !b) return kvbm_error_set(err, KVBM_EINVAL, "fabric: inproc_pair: NULL out");
  int rc = kvbm__fabric_name_check(name_a, err);
  if (!rc) rc = kvbm__fabric_name_check(name_b, err);
  if (rc) return rc;
  core *c = calloc(1, sizeof *c);
  inproc *x = calloc(1, sizeof *x), *y = calloc(1, sizeof *y);
  if (!c || !x || !y) {
    free(c);
    free(x);
    free(y);
    return kvbm_error_set(err, KVBM_ENOMEM, "fabric: inproc_pair: out of memory");
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&c->mu, NULL);
  c->refs = 2;
  c->open[0] = c->open[1] = true;
  const char *na = name_a ? name_a : "inproc-a", *nb = name_b ? name_b : "inproc-b";
  kvbm__fabric_base_init(&x->base, &ip_vtable, na);
  kvbm__fabric_base_init(&y->base, &ip_vtable, nb);
  strcpy(x->base.peer_name, y->base.name);
  strcpy(y->base.peer_name, x->base.name);
  x->c = y->c = c;
  x->side = 0;
  y->side = 1;
  *a = &x->base;
  *b = &y->base;
  return KVBM_OK;
}
