/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ucx.c: the fabric over UCX (ucp), one connection per fabric.
 *
 * Bootstrap. A TCP side channel (sidechan.c) first proves that both ends
 * hold the shared key (auth.c: challenge and keyed-BLAKE3 response, both
 * ways, before anything else is read; a listener authenticates up to 16
 * connections at once and refuses the failures without ending). Only then
 * is a UCX context created and a hello sent each way: node name and UCX worker
 * address under a MAC of this handshake (hello.c), checked before any field
 * of it is read, so no byte from an unauthenticated peer ever reaches UCX's
 * address unpacker (which trusts its input: a hello of 0xff bytes made it
 * assert). Each end then creates its endpoint from the peer's address and
 * both swap a "ready" byte, so that a fabric returned by accept/connect is
 * wired at both ends. The socket stays open for the life of the
 * connection: a "bye" byte on it (or EOF) is how an end learns that its
 * peer is closing, and the close waits for it.
 *
 * Payloads (push/pull). A push is a UCX active message whose 8-byte header
 * is the handle id. Small payloads arrive eagerly and are copied into the
 * inbox by the receive callback; large ones arrive as a rendezvous
 * descriptor that stays in the inbox until pulled, and the pull asks UCX to
 * fetch the bytes straight into the puller's buffer (ucp_am_recv_data_nbx),
 * so a big payload is moved once, by the transport, into its final place.
 * The sender's buffer must therefore live until the pull happened; flush
 * waits for that. The peer is not trusted: a payload above max_payload, too
 * many waiting payloads, or a malformed header are protocol errors that
 * make the fabric fatal, never allocations sized by the peer.
 *
 * Blocks (read/write). Regions are registered with ucp_mem_map and the
 * packed rkey goes into the export envelope (prefixed "UCXK" so that a key
 * from another kind of fabric is refused, not handed to UCX's unpacker).
 * Reads and writes are ucp_get_nbx / ucp_put_nbx on addresses the generic
 * layer has already range-checked; completion is by kvbm_fabric_flush(),
 * which waits for every request and then flushes the endpoint (remote
 * completion), after which the writer notifies the target with a push.
 * When ucp_rkey_ptr maps the peer's region here (UCX's shared-memory
 * transports, into memory UCX allocated), a read or write is instead a
 * copy by the calling thread, done when it returns: UCX's put would do the
 * same copy with glibc's memcpy, and large writes go faster with
 * non-temporal stores (see copy_out). Host memory only: the generic layer
 * refuses DEVICE memory before a region gets here.
 *
 * Progress. UCX makes progress only inside ucp_worker_progress(), which
 * every waiting call runs in a loop. The loop spins while there is work and
 * backs off (yield, then short sleeps) while idle, so a waiting node does
 * not steal a core from a busy peer on a small machine. Only one thread may
 * use a fabric (UCS_THREAD_MODE_SINGLE).
 *
 * Peer failure. Endpoints use UCP_ERR_HANDLING_MODE_NONE: UCX's shared
 * memory transports cannot detect a dead peer, and asking for PEER mode
 * would exclude them. A dead or closing peer is instead seen on the side
 * channel (EOF or bye), which every waiting loop watches, so no wait
 * outlives the peer; the error handler is still installed for transports
 * that report failures anyway.
 *
 * Transports are UCX's choice, limited by the config's TLS / NET_DEVICES,
 * set with ucp_config_modify() on this context only: the environment is
 * never changed.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif
#include <ucp/api/ucp.h>

#include "fabric/auth.h"
#include "fabric/fabric_impl.h"
#include "fabric/hello.h"
#include "fabric/sidechan.h"

#define AM_PAYLOAD 7u
#define KEY_TAG "UCXK"
#define SC_READY 'R'
#define SC_BYE 'B'
#define SC_CLOSED 'C'

typedef struct inbox_entry {
  struct inbox_entry *next;
  uint64_t id;
  size_t len;
  bool announced;
  void *rndv;          /* rendezvous descriptor: bytes still at the sender */
  unsigned char *data; /* eager copy */
} inbox_entry;

/* Memory the fabric allocated (mem_alloc): registering a range inside it
 * reuses its handle, whose rkey lets a peer on the same host map it. */
typedef struct ucx_alloc {
  struct ucx_alloc *next;
  uint64_t base, len;
  ucp_mem_h memh;
} ucx_alloc;

/* A registration: its own handle, or borrowed from an allocation. */
typedef struct ucx_reg {
  ucp_mem_h memh;
  bool borrowed;
} ucx_reg;

typedef struct ucx_fabric {
  kvbm_fabric base;
  int timeout_ms;
  uint64_t max_payload, max_pending;
  int sock;
  ucp_context_h ctx;
  ucp_worker_h worker;
  ucp_ep_h ep;
  inbox_entry *head, *tail;
  uint64_t pending;      /* entries in the inbox */
  uint64_t max_received; /* highest payload id received */
  uint64_t inflight;     /* our requests not completed yet */
  bool peer_closed;      /* the peer said bye (or its socket closed) */
  bool peer_gone;        /* its socket closed without a bye: it died */
  unsigned idle;         /* consecutive idle progress calls */
  ucx_alloc *allocs;
} ucx_fabric;

static ucx_fabric *U(kvbm_fabric *f) { return (ucx_fabric *)f; }

struct kvbm_fabric_listener {
  int fd;
  uint16_t port;
  kvbm__gate *gate; /* authenticates connections; holds the derived key */
  kvbm_fabric_ucx_config cfg;
  char name[KVBM_FABRIC_NAME_MAX + 1];
  char *transports, *net_devices;
};

kvbm_fabric_ucx_config kvbm_fabric_ucx_config_default(void) {
  return (kvbm_fabric_ucx_config){
      .name = NULL, .timeout_ms = 10000, .max_payload = 1ull << 30, .max_pending = 65536};
}

static int ucs_fail(kvbm_error *err, const char *what, ucs_status_t st) {
  return kvbm_error_set(err, KVBM_EIO, "fabric: ucx: %s: %s", what, ucs_status_string(st));
}

/* ---- Side channel watch ---- */

/* Looks (without waiting) at the side channel: a bye or EOF means the peer
 * is closing; anything else breaks the protocol. */
static void watch_socket(ucx_fabric *u) {
  if (u->peer_closed || u->sock < 0) return;
  unsigned char b;
  ssize_t n = recv(u->sock, &b, 1, MSG_DONTWAIT);
  if (n == 0 || (n == 1 && b == SC_BYE)) {
    u->peer_closed = true;
    u->peer_gone = n == 0;
  } else if (n == 1) {
    kvbm__fabric_set_fatal(&u->base, NULL, KVBM_EPROTO, "fabric: ucx: peer sent byte 0x%02x on the side channel", b);
  }
}

/* One turn of the progress loop. Returns after doing some work, or after a
 * short back-off when there was none. */
static void progress(ucx_fabric *u) {
  if (ucp_worker_progress(u->worker)) {
    u->idle = 0;
    return;
  }
  u->idle++;
  if ((u->idle & 255) == 0) watch_socket(u);
  if (u->idle < 2000) return;
  if (u->idle < 20000) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, 50000};
  nanosleep(&ts, NULL);
}

/* ---- Active messages: the receive side ---- */

static ucs_status_t am_recv(void *arg, const void *header, size_t header_length, void *data, size_t length,
                            const ucp_am_recv_param_t *param) {
  ucx_fabric *u = arg;
  if (u->base.fatal) return UCS_OK; /* drop: the connection is over */
  if (header_length != 8) {
    kvbm__fabric_set_fatal(&u->base, NULL, KVBM_EPROTO, "fabric: ucx: payload header of %zu bytes", header_length);
    return UCS_OK;
  }
  uint64_t id;
  memcpy(&id, header, 8);
  if (length > u->max_payload) {
    kvbm__fabric_set_fatal(&u->base, NULL, KVBM_EPROTO, "fabric: ucx: peer pushed %zu bytes (limit %llu)", length,
                          (unsigned long long)u->max_payload);
    return UCS_OK;
  }
  if (u->pending >= u->max_pending) {
    kvbm__fabric_set_fatal(&u->base, NULL, KVBM_EPROTO, "fabric: ucx: more than %llu payloads waiting",
                          (unsigned long long)u->max_pending);
    return UCS_OK;
  }
  if (id <= u->max_received) {
    kvbm__fabric_set_fatal(&u->base, NULL, KVBM_EPROTO, "fabric: ucx: payload id %llu after %llu",
                          (unsigned long long)id, (unsigned long long)u->max_received);
    return UCS_OK;
  }
  inbox_entry *e = calloc(1, sizeof *e);
  bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (e && !rndv && length) {
    e->data = malloc(length);
    if (!e->data) {
      free(e);
      e = NULL;
    }
  }
  if (!e) {
    kvbm__fabric_set_fatal(&u->base, NULL, KVBM_ENOMEM, "fabric: ucx: out of memory for a %zu-byte payload", length);
    return UCS_OK;
  }
  e->id = id;
  e->len = length;
  if (rndv)
    e->rndv = data;
  else if (length)
    memcpy(e->data, data, length);
  if (u->tail)
    u->tail->next = e;
  else
    u->head = e;
  u->tail = e;
  u->pending++;
  u->max_received = id;
  return rndv ? UCS_INPROGRESS : UCS_OK;
}

/* ---- Requests we started ---- */

/* A send-side request (push, put, get) finished. */
static void op_done(void *request, ucs_status_t status, void *user_data) {
  ucx_fabric *u = user_data;
  u->inflight--;
  if (status != UCS_OK && status != UCS_ERR_CANCELED)
    kvbm__fabric_set_fatal(&u->base, NULL, status == UCS_ERR_CONNECTION_RESET || status == UCS_ERR_ENDPOINT_TIMEOUT
                                              ? KVBM_ECLOSED : KVBM_EIO,
                          "fabric: ucx: transfer failed: %s", ucs_status_string(status));
  ucp_request_free(request);
}

/* Accounts for a request just started: NULL (done), an error, or pending. */
static int track(ucx_fabric *u, ucs_status_ptr_t sp, const char *what, kvbm_error *err) {
  if (sp == NULL) return KVBM_OK;
  if (UCS_PTR_IS_ERR(sp)) return ucs_fail(err, what, UCS_PTR_STATUS(sp));
  u->inflight++;
  return KVBM_OK;
}

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
  (void)ep;
  ucx_fabric *u = arg;
  u->peer_closed = true;
  kvbm__fabric_set_fatal(&u->base, NULL, KVBM_ECLOSED, "fabric: ucx: connection to '%s' lost: %s",
                        u->base.peer_name, ucs_status_string(status));
}

/* ---- vtable ---- */

/* A push in flight: UCX reads the header until the send completes (a
 * rendezvous sends it with the RTS, possibly later), so it lives here. */
typedef struct push_ctx {
  ucx_fabric *u;
  uint64_t hdr;
} push_ctx;

static void push_done(void *request, ucs_status_t status, void *user_data) {
  push_ctx *pc = user_data;
  op_done(request, status, pc->u);
  free(pc);
}

static int ux_push(kvbm_fabric *f, const void *data, size_t len, uint64_t id, kvbm_error *err) {
  ucx_fabric *u = U(f);
  watch_socket(u);
  if (u->peer_closed)
    return kvbm_error_set(err, KVBM_ECLOSED, "fabric: push: peer '%s' is closed", f->peer_name);
  if (len > u->max_payload)
    return kvbm_error_set(err, KVBM_ETOOLONG, "fabric: push: %zu bytes above the limit of %llu", len,
                          (unsigned long long)u->max_payload);
  push_ctx *pc = malloc(sizeof *pc);
  if (!pc) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: push: out of memory");
  pc->u = u;
  pc->hdr = id;
  ucp_request_param_t p = {0};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = push_done;
  p.user_data = pc;
  ucs_status_ptr_t sp = ucp_am_send_nbx(u->ep, AM_PAYLOAD, &pc->hdr, sizeof pc->hdr, data, len, &p);
  if (sp == NULL || UCS_PTR_IS_ERR(sp)) free(pc);
  return track(u, sp, "push", err);
}

/* Whether the deadline passed. Reading the clock costs about as much as an
 * idle progress call, so spinning loops look at it one call in 32. */
static bool timed_out_every(unsigned *tick, int64_t deadline) {
  if (deadline == INT64_MAX) return false;
  if ((++*tick & 31) != 1) return false;
  return kvbm__sc_now_ms() >= deadline;
}
static bool timed_out(int64_t deadline) { return deadline != INT64_MAX && kvbm__sc_now_ms() >= deadline; }

static int ux_next(kvbm_fabric *f, int timeout_ms, kvbm_fabric_handle *h, size_t *len, kvbm_error *err) {
  ucx_fabric *u = U(f);
  int64_t deadline = kvbm__sc_deadline(timeout_ms);
  unsigned tick = 0;
  for (;;) {
    for (inbox_entry *e = u->head; e; e = e->next)
      if (!e->announced) {
        e->announced = true;
        h->id = e->id;
        if (len) *len = e->len;
        return KVBM_OK;
      }
    int rc = kvbm__fabric_check(f, err);
    if (rc) return rc;
    if (u->peer_closed)
      return kvbm_error_set(err, KVBM_ECLOSED, "fabric: next: peer '%s' closed, nothing left", f->peer_name);
    if (timeout_ms == 0 || timed_out_every(&tick, deadline)) {
      ucp_worker_progress(u->worker);
      if (u->tail && !u->tail->announced) continue;
      return kvbm_error_set(err, KVBM_ETIMEDOUT, "fabric: next: no payload within %d ms", timeout_ms);
    }
    progress(u);
  }
}

typedef struct recv_wait {
  bool done;
  ucs_status_t status;
  size_t length;
} recv_wait;

static void recv_done(void *request, ucs_status_t status, size_t length, void *user_data) {
  recv_wait *w = user_data;
  w->done = true;
  w->status = status;
  w->length = length;
  ucp_request_free(request);
}

/* Fetches a rendezvous payload into buf. Once started, the transfer owns
 * buf, so a timeout cancels it and still waits for UCX to let go. */
static int fetch_rndv(ucx_fabric *u, inbox_entry *e, void *buf, int64_t deadline, kvbm_error *err) {
  recv_wait w = {false, UCS_OK, 0};
  ucp_request_param_t p = {0};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = recv_done;
  p.user_data = &w;
  void *desc = e->rndv;
  e->rndv = NULL; /* UCX owns the descriptor from here on, even on failure */
  ucs_status_ptr_t sp = ucp_am_recv_data_nbx(u->worker, desc, buf, e->len, &p);
  if (UCS_PTR_IS_ERR(sp))
    return kvbm__fabric_set_fatal(&u->base, err, KVBM_EIO, "fabric: pull: %s", ucs_status_string(UCS_PTR_STATUS(sp)));
  if (sp == NULL) return KVBM_OK;
  bool cancelled = false;
  unsigned tick = 0;
  while (!w.done) {
    if (!cancelled && (timed_out_every(&tick, deadline) || u->base.fatal)) {
      ucp_request_cancel(u->worker, sp);
      cancelled = true;
    }
    progress(u);
  }
  if (w.status == UCS_OK) return KVBM_OK;
  if (cancelled && !u->base.fatal)
    return kvbm__fabric_set_fatal(&u->base, err, KVBM_ETIMEDOUT, "fabric: pull: payload %llu timed out in flight",
                                 (unsigned long long)e->id);
  return kvbm__fabric_set_fatal(&u->base, err, KVBM_EIO, "fabric: pull: %s", ucs_status_string(w.status));
}

static int ux_pull(kvbm_fabric *f, kvbm_fabric_handle h, void *buf, size_t cap, size_t *len, int timeout_ms,
                   kvbm_error *err) {
  ucx_fabric *u = U(f);
  int64_t deadline = kvbm__sc_deadline(timeout_ms);
  unsigned tick = 0;
  for (;;) {
    inbox_entry **pp = &u->head, *prev = NULL;
    while (*pp && (*pp)->id != h.id) {
      prev = *pp;
      pp = &(*pp)->next;
    }
    inbox_entry *e = *pp;
    if (e) {
      if (e->len > cap)
        return kvbm_error_set(err, KVBM_ETOOLONG, "fabric: pull: payload %llu is %zu bytes, buffer %zu",
                              (unsigned long long)h.id, e->len, cap);
      *pp = e->next;
      if (u->tail == e) u->tail = prev;
      u->pending--;
      int rc = KVBM_OK;
      if (e->rndv)
        rc = fetch_rndv(u, e, buf, deadline, err);
      else if (e->len)
        memcpy(buf, e->data, e->len);
      if (rc == KVBM_OK && len) *len = e->len;
      free(e->data);
      free(e);
      return rc;
    }
    if (h.id <= u->max_received)
      return kvbm_error_set(err, KVBM_ENOTFOUND, "fabric: pull: payload %llu was already pulled",
                            (unsigned long long)h.id);
    int rc = kvbm__fabric_check(f, err);
    if (rc) return rc;
    if (u->peer_closed)
      return kvbm_error_set(err, KVBM_ECLOSED, "fabric: pull: peer '%s' closed before sending payload %llu",
                            f->peer_name, (unsigned long long)h.id);
    if (timeout_ms == 0 || timed_out_every(&tick, deadline)) {
      if (ucp_worker_progress(u->worker)) continue;
      return kvbm_error_set(err, KVBM_ETIMEDOUT, "fabric: pull: payload %llu not there within %d ms",
                            (unsigned long long)h.id, timeout_ms);
    }
    progress(u);
  }
}

/* The endpoint flush's completion. Heap-allocated: when the caller's
 * deadline passes first, the wait is abandoned and the callback frees it. */
typedef struct flush_wait {
  bool done, abandoned;
  ucs_status_t status;
} flush_wait;

static void flush_done(void *request, ucs_status_t status, void *user_data) {
  flush_wait *w = user_data;
  ucp_request_free(request);
  if (w->abandoned) {
    free(w);
    return;
  }
  w->done = true;
  w->status = status;
}

/* Why a wait must stop early: the deadline, a fatal error, a dead peer. */
static int wait_check(ucx_fabric *u, unsigned *tick, int64_t deadline, int timeout_ms, const char *what,
                      kvbm_error *err) {
  int rc = kvbm__fabric_check(&u->base, err);
  if (rc) return rc;
  if (u->peer_gone)
    return kvbm_error_set(err, KVBM_ECLOSED, "fabric: %s: peer '%s' is gone", what, u->base.peer_name);
  if (timed_out_every(tick, deadline))
    return kvbm_error_set(err, KVBM_ETIMEDOUT, "fabric: %s: not complete after %d ms", what, timeout_ms);
  return KVBM_OK;
}

static int ux_flush(kvbm_fabric *f, int timeout_ms, kvbm_error *err) {
  ucx_fabric *u = U(f);
  int64_t deadline = kvbm__sc_deadline(timeout_ms);
  unsigned tick = 0;
  while (u->inflight > 0) {
    int rc = wait_check(u, &tick, deadline, timeout_ms, "flush", err);
    if (rc) return rc;
    progress(u);
  }
  int rc = kvbm__fabric_check(f, err);
  if (rc) return rc;
  /* Remote completion of the puts: the endpoint flush. */
  flush_wait *w = calloc(1, sizeof *w);
  if (!w) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: flush: out of memory");
  ucp_request_param_t p = {0};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = flush_done;
  p.user_data = w;
  ucs_status_ptr_t sp = ucp_ep_flush_nbx(u->ep, &p);
  if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
    free(w);
    return sp ? ucs_fail(err, "flush", UCS_PTR_STATUS(sp)) : KVBM_OK;
  }
  while (!w->done) {
    rc = wait_check(u, &tick, deadline, timeout_ms, "flush", err);
    if (rc) {
      w->abandoned = true;
      return rc;
    }
    progress(u);
  }
  ucs_status_t st = w->status;
  free(w);
  if (st != UCS_OK) return ucs_fail(err, "flush", st);
  return kvbm__fabric_check(f, err);
}

static int ux_mem_register(kvbm_fabric *f, void *base, uint64_t len, void **reg, uint8_t **key, size_t *key_len,
                           kvbm_error *err) {
  ucx_fabric *u = U(f);
  ucx_reg *r = calloc(1, sizeof *r);
  if (!r) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: register: out of memory");
  uint64_t a = (uint64_t)(uintptr_t)base;
  for (ucx_alloc *al = u->allocs; al; al = al->next)
    if (a >= al->base && a - al->base <= al->len && len <= al->len - (a - al->base)) {
      r->memh = al->memh;
      r->borrowed = true;
      break;
    }
  ucs_status_t st = UCS_OK;
  if (!r->borrowed) {
    ucp_mem_map_params_t mp = {0};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = base;
    mp.length = len;
    st = ucp_mem_map(u->ctx, &mp, &r->memh);
    if (st != UCS_OK) {
      free(r);
      return ucs_fail(err, "ucp_mem_map", st);
    }
  }
  void *rb = NULL;
  size_t rlen = 0;
  st = ucp_rkey_pack(u->ctx, r->memh, &rb, &rlen);
  uint8_t *k = st == UCS_OK ? malloc(4 + rlen) : NULL;
  if (!k) {
    if (st == UCS_OK) ucp_rkey_buffer_release(rb);
    if (!r->borrowed) ucp_mem_unmap(u->ctx, r->memh);
    free(r);
    return st != UCS_OK ? ucs_fail(err, "ucp_rkey_pack", st)
                        : kvbm_error_set(err, KVBM_ENOMEM, "fabric: register: out of memory");
  }
  memcpy(k, KEY_TAG, 4);
  memcpy(k + 4, rb, rlen);
  ucp_rkey_buffer_release(rb);
  *reg = r;
  *key = k;
  *key_len = 4 + rlen;
  return KVBM_OK;
}

static void ux_mem_deregister(kvbm_fabric *f, void *reg) {
  ucx_reg *r = reg;
  if (!r->borrowed) ucp_mem_unmap(U(f)->ctx, r->memh);
  free(r);
}

static int ux_mem_alloc(kvbm_fabric *f, uint64_t len, void **addr, void **alloc, kvbm_error *err) {
  ucx_fabric *u = U(f);
  ucx_alloc *al = calloc(1, sizeof *al);
  if (!al) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: allocate: out of memory");
  ucp_mem_map_params_t mp = {0};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = NULL;
  mp.length = len ? len : 1;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucs_status_t st = ucp_mem_map(u->ctx, &mp, &al->memh);
  if (st != UCS_OK) {
    free(al);
    return kvbm_error_set(err, st == UCS_ERR_NO_MEMORY ? KVBM_ENOMEM : KVBM_EIO,
                          "fabric: allocate %llu bytes: %s", (unsigned long long)len, ucs_status_string(st));
  }
  ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
  st = ucp_mem_query(al->memh, &ma);
  if (st != UCS_OK || ma.length < len || ((uintptr_t)ma.address & 4095) != 0) {
    ucp_mem_unmap(u->ctx, al->memh);
    free(al);
    return kvbm_error_set(err, KVBM_EIO, "fabric: allocate: UCX returned an unusable region");
  }
  al->base = (uint64_t)(uintptr_t)ma.address;
  al->len = ma.length;
  al->next = u->allocs;
  u->allocs = al;
  *addr = ma.address;
  *alloc = al;
  return KVBM_OK;
}

static void ux_mem_free(kvbm_fabric *f, void *alloc) {
  ucx_fabric *u = U(f);
  for (ucx_alloc **pp = &u->allocs; *pp; pp = &(*pp)->next)
    if (*pp == alloc) {
      *pp = ((ucx_alloc *)alloc)->next;
      break;
    }
  ucp_mem_unmap(u->ctx, ((ucx_alloc *)alloc)->memh);
  free(alloc);
}

static int ux_key_attach(kvbm_fabric *f, uint64_t base, uint64_t len, const uint8_t *key, size_t key_len,
                         void **rkey, kvbm_error *err) {
  (void)base;
  (void)len;
  ucx_fabric *u = U(f);
  if (key_len <= 4 || memcmp(key, KEY_TAG, 4) != 0)
    return kvbm_error_set(err, KVBM_EPROTO, "fabric: import: region key is not a UCX key");
  ucp_rkey_h rk;
  ucs_status_t st = ucp_ep_rkey_unpack(u->ep, key + 4, &rk);
  if (st != UCS_OK)
    return kvbm_error_set(err, KVBM_EPROTO, "fabric: import: UCX refused the region key: %s", ucs_status_string(st));
  *rkey = rk;
  return KVBM_OK;
}

static void ux_key_detach(kvbm_fabric *f, void *rkey) {
  (void)f;
  ucp_rkey_destroy(rkey);
}

/* A copy with non-temporal stores when both ends are 16-byte aligned and
 * the copy is large (the destination is not read for ownership and does
 * not evict the cache), memcpy otherwise. The non-temporal stores end
 * with a store fence (they are weakly ordered); regular stores need none
 * here: the later message about the bytes goes through UCX, whose
 * shared-memory FIFO fences before it publishes an element. */
static void copy_out(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
  if (n >= 65536 && ((uintptr_t)dst | (uintptr_t)src) % 16 == 0) {
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      __m128i a = _mm_load_si128((const __m128i *)(s + i)), b = _mm_load_si128((const __m128i *)(s + i + 16));
      __m128i c = _mm_load_si128((const __m128i *)(s + i + 32)), e = _mm_load_si128((const __m128i *)(s + i + 48));
      _mm_stream_si128((__m128i *)(d + i), a);
      _mm_stream_si128((__m128i *)(d + i + 16), b);
      _mm_stream_si128((__m128i *)(d + i + 32), c);
      _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + i, s + i, n - i);
    _mm_sfence();
    return;
  }
#endif
  memcpy(dst, src, n);
}

static int ux_rma(kvbm_fabric *f, bool write, void *rkey, uint64_t raddr, void *local, size_t len, void *lreg,
                  kvbm_error *err) {
  ucx_fabric *u = U(f);
  if (u->peer_closed)
    return kvbm_error_set(err, KVBM_ECLOSED, "fabric: peer '%s' is closed", f->peer_name);
  /* The peer's memory mapped here (UCX's shared-memory transports): the
   * access is a copy by this thread, complete when it returns, with no
   * UCX request at all. Otherwise a put or get. */
  void *mapped;
  if (ucp_rkey_ptr(rkey, raddr, &mapped) == UCS_OK) {
    if (write)
      copy_out(mapped, local, len);
    else
      memcpy(local, mapped, len);
    return KVBM_OK;
  }
  ucp_request_param_t p = {0};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = op_done;
  p.user_data = u;
  if (lreg) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = ((ucx_reg *)lreg)->memh;
  }
  ucs_status_ptr_t sp = write ? ucp_put_nbx(u->ep, local, len, raddr, rkey, &p)
                              : ucp_get_nbx(u->ep, local, len, raddr, rkey, &p);
  return track(u, sp, write ? "put" : "get", err);
}

/* The peer's memory as mapped here, when a shared-memory transport maps
 * it (the same ucp_rkey_ptr the mapped copy above uses); the mapping is
 * the rkey's, alive until the remote set releases it. */
static int ux_map(kvbm_fabric *f, void *rkey, uint64_t raddr, size_t len, const void **out) {
  (void)len;
  ucx_fabric *u = U(f);
  if (u->peer_closed) return KVBM_ECLOSED;
  void *mapped;
  if (ucp_rkey_ptr(rkey, raddr, &mapped) != UCS_OK) return KVBM_EUNSUPPORTED;
  *out = mapped;
  return KVBM_OK;
}

/* Drops what is left in the inbox. Rendezvous descriptors are not ours to
 * free; the worker reclaims them when it is destroyed. */
static void inbox_clear(ucx_fabric *u) {
  for (inbox_entry *e = u->head, *n; e; e = n) {
    n = e->next;
    free(e->data);
    free(e);
  }
  u->head = u->tail = NULL;
  u->pending = 0;
}

/* Closes the endpoint: gracefully (flushing) while the peer is alive,
 * forcibly if it died or stops answering. */
static void close_ep(ucx_fabric *u, int64_t deadline) {
  if (!u->ep) return;
  ucp_request_param_t p = {0};
  if (u->peer_gone) {
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  }
  ucs_status_ptr_t sp = ucp_ep_close_nbx(u->ep, &p);
  if (sp && !UCS_PTR_IS_ERR(sp)) {
    bool cancelled = false;
    while (ucp_request_check_status(sp) == UCS_INPROGRESS) {
      if (!cancelled && timed_out(deadline)) {
        ucp_request_cancel(u->worker, sp);
        cancelled = true;
      }
      progress(u);
    }
    ucp_request_free(sp);
  }
  u->ep = NULL;
}

/* Waits for the peer's byte `want` on the side channel (or EOF), running
 * the worker meanwhile so that the peer's operations on us can finish. */
static void await_peer(ucx_fabric *u, unsigned char want, int64_t deadline) {
  while (!timed_out(deadline)) {
    ucp_worker_progress(u->worker);
    unsigned char b;
    ssize_t n = recv(u->sock, &b, 1, MSG_DONTWAIT);
    if (n == 0) {
      u->peer_gone = u->peer_closed = true;
      return;
    }
    if (n == 1 && b == want) return;
    if (n == 1) continue; /* a late bye while waiting for closed: skip */
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  u->peer_gone = true; /* it stopped answering: do not wait for it again */
}

/* The close, in three steps so that neither end tears down what the other
 * still uses: (1) bye both ways, serving the peer's pulls and gets until its
 * bye comes; (2) close the endpoint; (3) "closed" both ways, and only then
 * destroy the worker. A dead peer shortcuts every wait. */
static void ux_destroy(kvbm_fabric *f) {
  ucx_fabric *u = U(f);
  if (u->worker) {
    int64_t deadline = kvbm__sc_deadline(u->timeout_ms);
    unsigned char b = SC_BYE;
    if (kvbm__sc_send_all(u->sock, &b, 1, deadline, NULL) != KVBM_OK) u->peer_gone = u->peer_closed = true;
    if (!u->peer_closed) await_peer(u, SC_BYE, deadline);
    while (u->inflight > 0 && !u->peer_gone && !timed_out(deadline)) progress(u);
    close_ep(u, deadline);
    if (!u->peer_gone) {
      b = SC_CLOSED;
      if (kvbm__sc_send_all(u->sock, &b, 1, deadline, NULL) == KVBM_OK) await_peer(u, SC_CLOSED, deadline);
    }
    inbox_clear(u);
    ucp_worker_destroy(u->worker);
  }
  /* Allocations whose storage outlived the fabric (a caller's bug): the
   * memory goes with the context. */
  for (ucx_alloc *al = u->allocs, *n; al; al = n) {
    n = al->next;
    ucp_mem_unmap(u->ctx, al->memh);
    free(al);
  }
  if (u->ctx) ucp_cleanup(u->ctx);
  if (u->sock >= 0) close(u->sock);
  free(u);
}

static const kvbm_fabric_vtable ux_vtable = {
    .kind = "ucx",
    .label = "ucx",
    .push = ux_push,
    .next = ux_next,
    .pull = ux_pull,
    .flush = ux_flush,
    .mem_register = ux_mem_register,
    .mem_deregister = ux_mem_deregister,
    .mem_alloc = ux_mem_alloc,
    .mem_free = ux_mem_free,
    .key_attach = ux_key_attach,
    .key_detach = ux_key_detach,
    .rma = ux_rma,
    .map = ux_map,
    .destroy = ux_destroy,
};

/* ---- Setting up a connection ---- */

static int create_context(ucx_fabric *u, const char *transports, const char *net_devices, kvbm_error *err) {
  ucp_config_t *config;
  ucs_status_t st = ucp_config_read(NULL, NULL, &config);
  if (st != UCS_OK) return ucs_fail(err, "ucp_config_read", st);
  if (transports && (st = ucp_config_modify(config, "TLS", transports)) != UCS_OK) {
    ucp_config_release(config);
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: ucx: transports '%s': %s", transports, ucs_status_string(st));
  }
  if (net_devices && (st = ucp_config_modify(config, "NET_DEVICES", net_devices)) != UCS_OK) {
    ucp_config_release(config);
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: ucx: net devices '%s': %s", net_devices,
                          ucs_status_string(st));
  }
  ucp_params_t pp = {0};
  pp.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  pp.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  pp.name = "kvbm";
  st = ucp_init(&pp, config, &u->ctx);
  ucp_config_release(config);
  if (st != UCS_OK) {
    u->ctx = NULL;
    return ucs_fail(err, "ucp_init", st);
  }
  ucp_worker_params_t wp = {0};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(u->ctx, &wp, &u->worker);
  if (st != UCS_OK) {
    u->worker = NULL;
    return ucs_fail(err, "ucp_worker_create", st);
  }
  ucp_am_handler_param_t ap = {0};
  ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  ap.id = AM_PAYLOAD;
  ap.cb = am_recv;
  ap.arg = u;
  st = ucp_worker_set_am_recv_handler(u->worker, &ap);
  if (st != UCS_OK) return ucs_fail(err, "ucp_worker_set_am_recv_handler", st);
  return KVBM_OK;
}

/* Sends this end's hello: node name and worker address, MAC'd for this
 * handshake (hello.h). */
static int send_hello(ucx_fabric *u, const kvbm__hs *hs, int64_t deadline, kvbm_error *err) {
  ucp_address_t *addr;
  size_t alen;
  ucs_status_t st = ucp_worker_get_address(u->worker, &addr, &alen);
  if (st != UCS_OK) return ucs_fail(err, "ucp_worker_get_address", st);
  size_t n = kvbm__hello_size(strlen(u->base.name), alen);
  uint8_t *b = n ? malloc(n) : NULL;
  int rc = b ? kvbm__hs_hello_encode(hs, u->base.name, addr, alen, b, n, &n, err)
             : kvbm_error_set(err, n ? KVBM_ENOMEM : KVBM_EOVERFLOW, "fabric: ucx: hello of a %zu-byte address", alen);
  ucp_worker_release_address(u->worker, addr);
  if (!rc) rc = kvbm__sc_send_record(u->sock, b, n, deadline, err);
  free(b);
  return rc;
}

/* Reads the peer's hello, checks its MAC and fields (hello.c), and only
 * then hands the address to UCX. */
static int recv_hello(ucx_fabric *u, const kvbm__hs *hs, int64_t deadline, kvbm_error *err) {
  void *rec;
  size_t n;
  int rc = kvbm__sc_recv_record(u->sock, KVBM__HELLO_MAX, &rec, &n, deadline, err);
  if (rc) return rc;
  kvbm__hello h;
  rc = kvbm__hs_hello_decode(hs, rec, n, &h, err);
  if (rc && rc != KVBM_EAUTH) {
    if (err) err->code = KVBM_EPROTO;
    rc = KVBM_EPROTO;
  }
  if (!rc) {
    memcpy(u->base.peer_name, h.name, sizeof h.name);
    ucp_ep_params_t ep = {0};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = (const ucp_address_t *)h.addr;
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE; /* see "Peer failure" above */
    ep.err_handler.cb = ep_error;
    ep.err_handler.arg = u;
    ucs_status_t st = ucp_ep_create(u->worker, &ep, &u->ep);
    if (st != UCS_OK) {
      u->ep = NULL;
      rc = ucs_fail(err, "ucp_ep_create", st);
    }
  }
  free(rec);
  return rc;
}

/* Both ends, once the peer proved the key: hello out, hello in, endpoint,
 * ready out, ready in. */
static int handshake(ucx_fabric *u, const kvbm__hs *hs, kvbm_error *err) {
  int64_t deadline = kvbm__sc_deadline(u->timeout_ms);
  int rc = send_hello(u, hs, deadline, err);
  if (!rc) rc = recv_hello(u, hs, deadline, err);
  if (rc) return rc;
  unsigned char b = SC_READY;
  rc = kvbm__sc_send_all(u->sock, &b, 1, deadline, err);
  if (rc) return rc;
  /* Progress while waiting: the peer's wire-up may need our worker. */
  for (;;) {
    ucp_worker_progress(u->worker);
    ssize_t n = recv(u->sock, &b, 1, MSG_DONTWAIT);
    if (n == 1) {
      if (b != SC_READY) return kvbm_error_set(err, KVBM_EPROTO, "fabric: ucx: expected ready, got 0x%02x", b);
      return KVBM_OK;
    }
    if (n == 0) return kvbm_error_set(err, KVBM_EPROTO, "fabric: ucx: peer hung up during wire-up");
    if (timed_out(deadline)) return kvbm_error_set(err, KVBM_ETIMEDOUT, "fabric: ucx: peer never became ready");
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
}

/* A fabric on a side channel whose peer proved the key (hs): UCX context,
 * hello both ways, endpoint, ready. *ours tells a failure on this side
 * (UCX would not start, memory) from one of the peer's. */
static int new_fabric(const kvbm_fabric_ucx_config *cfg, const char *name, int sock, const kvbm__hs *hs,
                      kvbm_fabric **out, bool *ours, kvbm_error *err) {
  *ours = true;
  ucx_fabric *u = calloc(1, sizeof *u);
  if (!u) {
    close(sock);
    return kvbm_error_set(err, KVBM_ENOMEM, "fabric: ucx: out of memory");
  }
  kvbm__fabric_base_init(&u->base, &ux_vtable, name ? name : "ucx");
  u->sock = sock;
  u->timeout_ms = cfg->timeout_ms;
  u->max_payload = cfg->max_payload;
  u->max_pending = cfg->max_pending;
  int rc = create_context(u, cfg->transports, cfg->net_devices, err);
  if (!rc) {
    *ours = false;
    rc = handshake(u, hs, err);
    if (rc == KVBM_ENOMEM) *ours = true;
  }
  if (rc) {
    /* No bye dance with a peer that never got going. */
    if (u->ep) {
      ucp_request_param_t p = {0};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t sp = ucp_ep_close_nbx(u->ep, &p);
      if (sp && !UCS_PTR_IS_ERR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS) ucp_worker_progress(u->worker);
        ucp_request_free(sp);
      }
    }
    if (u->worker) ucp_worker_destroy(u->worker);
    if (u->ctx) ucp_cleanup(u->ctx);
    close(sock);
    free(u);
    return rc;
  }
  *out = &u->base;
  return KVBM_OK;
}

static int check_cfg(const kvbm_fabric_ucx_config *cfg, uint8_t key[KVBM__HELLO_KEY], kvbm_error *err) {
  if (!cfg) return kvbm_error_set(err, KVBM_EINVAL, "fabric: ucx: NULL config");
  if (cfg->timeout_ms <= 0) return kvbm_error_set(err, KVBM_EINVAL, "fabric: ucx: timeout_ms must be positive");
  if (cfg->max_pending == 0) return kvbm_error_set(err, KVBM_EINVAL, "fabric: ucx: max_pending must be positive");
  if (!cfg->key)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "fabric: ucx: a shared key is required (kvbm_fabric_ucx_config.key): peers prove it "
                          "before they exchange anything");
  int rc = kvbm__hello_derive(cfg->key, cfg->key_len, key, err);
  if (rc) return rc;
  return kvbm__fabric_name_check(cfg->name, err);
}

int kvbm_fabric_ucx_listen(const kvbm_fabric_ucx_config *cfg, const char *host, uint16_t port,
                           kvbm_fabric_listener **out, kvbm_error *err) {
  uint8_t key[KVBM__HELLO_KEY];
  int rc = check_cfg(cfg, key, err);
  if (!rc && !out) rc = kvbm_error_set(err, KVBM_EINVAL, "fabric: ucx: NULL out");
  kvbm_fabric_listener *l = rc ? NULL : calloc(1, sizeof *l);
  if (!rc && !l) rc = kvbm_error_set(err, KVBM_ENOMEM, "fabric: ucx: out of memory");
  if (rc) {
    explicit_bzero(key, sizeof key);
    return rc;
  }
  l->fd = -1;
  l->cfg = *cfg;
  l->cfg.key = NULL; /* the caller's; we keep the derived key in the gate */
  l->cfg.key_len = 0;
  snprintf(l->name, sizeof l->name, "%s", cfg->name ? cfg->name : "ucx");
  l->transports = cfg->transports ? strdup(cfg->transports) : NULL;
  l->net_devices = cfg->net_devices ? strdup(cfg->net_devices) : NULL;
  l->cfg.name = l->name;
  l->cfg.transports = l->transports;
  l->cfg.net_devices = l->net_devices;
  if ((cfg->transports && !l->transports) || (cfg->net_devices && !l->net_devices))
    rc = kvbm_error_set(err, KVBM_ENOMEM, "fabric: ucx: out of memory");
  if (!rc) rc = kvbm__sc_listen(host, port, &l->fd, &l->port, err);
  if (!rc) rc = kvbm__gate_create(l->fd, key, cfg->timeout_ms, cfg->on_refused, cfg->on_refused_user, &l->gate, err);
  explicit_bzero(key, sizeof key);
  if (rc) {
    kvbm_fabric_listener_destroy(l);
    return rc;
  }
  *out = l;
  return KVBM_OK;
}

uint16_t kvbm_fabric_listener_port(const kvbm_fabric_listener *l) { return l ? l->port : 0; }

uint64_t kvbm_fabric_listener_refused(const kvbm_fabric_listener *l) {
  return l ? kvbm__gate_refused_count(l->gate) : 0;
}

/* Peers are taken until one completes the whole handshake; every failure of
 * the peer's making is a refusal (counted, reported) and the wait goes on
 * until the one deadline. */
int kvbm_fabric_ucx_accept(kvbm_fabric_listener *l, kvbm_fabric **out, kvbm_error *err) {
  if (!l || !out) return kvbm_error_set(err, KVBM_EINVAL, "fabric: ucx: accept: NULL argument");
  int64_t deadline = kvbm__sc_deadline(l->cfg.timeout_ms);
  for (;;) {
    int sock;
    kvbm__hs hs;
    char peer[KVBM__PEER_NAME];
    int rc = kvbm__gate_accept(l->gate, deadline, &sock, &hs, peer, err);
    if (rc) return rc;
    kvbm_error e = {0};
    bool ours;
    rc = new_fabric(&l->cfg, l->name, sock, &hs, out, &ours, &e);
    kvbm__hs_wipe(&hs);
    if (rc == KVBM_OK) return KVBM_OK;
    if (ours) return kvbm_error_set(err, rc, "%s", e.msg);
    kvbm__gate_refused(l->gate, peer, rc, e.msg);
  }
}

void kvbm_fabric_listener_destroy(kvbm_fabric_listener *l) {
  if (!l) return;
  kvbm__gate_destroy(l->gate);
  if (l->fd >= 0) close(l->fd);
  free(l->transports);
  free(l->net_devices);
  free(l);
}

int kvbm_fabric_ucx_connect(const kvbm_fabric_ucx_config *cfg, const char *host, uint16_t port, kvbm_fabric **out,
                            kvbm_error *err) {
  uint8_t key[KVBM__HELLO_KEY];
  int rc = check_cfg(cfg, key, err);
  if (!rc && !out) rc = kvbm_error_set(err, KVBM_EINVAL, "fabric: ucx: NULL out");
  if (!rc && port == 0) rc = kvbm_error_set(err, KVBM_EINVAL, "fabric: ucx: connect needs a port");
  int sock = -1;
  if (!rc) rc = kvbm__sc_connect(host, port, cfg->timeout_ms, &sock, err);
  kvbm__hs hs;
  if (!rc) rc = kvbm__auth_connect(sock, key, kvbm__sc_deadline(cfg->timeout_ms), &hs, err);
  explicit_bzero(key, sizeof key);
  if (rc) {
    if (sock >= 0) close(sock);
    return rc;
  }
  bool ours;
  rc = new_fabric(cfg, cfg->name, sock, &hs, out, &ours, err);
  kvbm__hs_wipe(&hs);
  return rc;
}
