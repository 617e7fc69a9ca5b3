/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cudaipc.c: the fabric between two processes of one node over CUDA IPC.
 *
 * What. Prefill and decode on two GPUs of one host (or two processes on one
 * GPU) move KV blocks device to device, without a host bounce and without
 * a UCX built with CUDA (Debian's has none). A block set registered here is
 * DEVICE memory; its export carries, per region, the cudaIpcMemHandle_t of
 * the allocation that holds it; the importer opens the handle
 * (cudaIpcOpenMemHandle, peer access enabled lazily when the two ends sit
 * on different GPUs) and its reads and writes are cudaMemcpyAsync on its
 * own stream, complete at kvbm_fabric_flush().
 *
 * Bootstrap, reused from the UCX fabric. The same TCP side channel
 * (sidechan.c), the same key proof (auth.c: a listener authenticates up to
 * 16 peers at once and refuses failures without ending) and the same MAC'd
 * hello (hello.c). The hello's "address" is not a worker address but who
 * this end is: a pid, the host's boot id and the device's UUID
 * (cudaipc.h). A peer whose boot id differs is on another host and is
 * refused there, with a message, rather than at the first handle it cannot
 * open. Then a ready byte each way, as UCX does, so that a fabric returned
 * by accept/connect is complete at both ends.
 *
 * Messages. With no transport but the socket, pushes travel on it as
 * frames: 'P' id len bytes; the puller answers 'K' id once it took the
 * payload, which is how flush knows that every push was pulled; 'B' is the
 * bye. The socket is non-blocking once the handshake is over and every
 * waiting call pumps both directions (poll), so two ends pushing large
 * payloads at each other at once cannot deadlock on full socket buffers.
 * The peer is hostile: a frame type we do not know, a payload above
 * max_payload, more than max_pending waiting, ids not increasing, an ack
 * for nothing are protocol errors (sticky), never allocations sized by the
 * peer beyond max_payload.
 *
 * Handles and offsets (the decision). cudaIpcGetMemHandle names a whole
 * allocation, and the importer's cudaIpcOpenMemHandle returns the
 * allocation's base. kvbm's device storage is one cudaMalloc per region,
 * but an engine's KV cache is often one allocation sliced into layers, so
 * instead of refusing a region base that is not an allocation base we find
 * the allocation (cuMemGetAddressRange, reached through
 * cudaGetDriverEntryPointByVersion so that nothing but libcudart is
 * linked) and export (handle, offset, allocation size). The importer
 * checks offset + extent against the size the peer claims, opens the
 * handle, and checks it again against the size of what was actually mapped
 * (cuMemGetAddressRange on its side): a lying peer gets KVBM_ERANGE, not a
 * copy outside its memory. Several regions in one allocation give one
 * handle; the importer opens each distinct handle once (reference
 * counted), since opening the same handle twice in one context is refused
 * by older drivers.
 *
 * Trade-offs. Copies are posted on one stream per end, in order; flush
 * polls cudaStreamQuery (spinning briefly, then sleeping) so that a
 * timeout can be honoured, which a cudaStreamSynchronize cannot. The
 * current device is switched to cfg.device around each CUDA call and put
 * back, so the caller's own device choice is not disturbed. Only legacy
 * IPC handles: memory from cudaMallocAsync pools or cuMemCreate needs
 * fabric/POSIX-fd handles and is refused at register with CUDA's reason.
 *
 * Close. 'B' both ways: an end being destroyed sends its bye and waits
 * (up to timeout_ms) for the peer's, serving its acks meanwhile. Remote
 * sets must be released before (each release waits for this end's copies
 * and closes its handle), so when the peer's bye arrives nothing of ours
 * is mapped any more, and the caller may free the memory.
 *
 * Without CUDA in the build, listen/accept/connect return
 * KVBM_EUNSUPPORTED; the codecs and the no-device test seam still build,
 * so the refusals are tested on any machine.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifdef KVBM_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

#include "common/bytes.h"
#include "fabric/auth.h"
#include "fabric/cudaipc.h"
#include "fabric/fabric_impl.h"
#include "fabric/hello.h"
#include "fabric/sidechan.h"

#define SC_READY 'R'
#define FR_PUSH 'P'
#define FR_ACK 'K'
#define FR_BYE 'B'
#define FR_HDR_MAX 17u

/* ---- Codecs (no CUDA) ---- */

void kvbm__cipc_key_encode(const kvbm__cipc_key *k, uint8_t out[KVBM__CIPC_KEY_LEN]) {
  memcpy(out, KVBM__CIPC_KEY_TAG, 4);
  kvbm__put_le32(out + 4, KVBM__CIPC_KEY_VERSION);
  memcpy(out + 8, k->handle, KVBM__CIPC_HANDLE);
  kvbm__put_le64(out + 8 + KVBM__CIPC_HANDLE, k->offset);
  kvbm__put_le64(out + 16 + KVBM__CIPC_HANDLE, k->alloc_size);
}

int kvbm__cipc_key_decode(const uint8_t *in, size_t in_len, uint64_t len, kvbm__cipc_key *k, kvbm_error *err) {
  if (!in || in_len != KVBM__CIPC_KEY_LEN || memcmp(in, KVBM__CIPC_KEY_TAG, 4) != 0)
    return kvbm_error_set(err, KVBM_EPROTO, "fabric: cudaipc: import: region key of %zu bytes is not a CUDA IPC key",
                          in_len);
  uint32_t v = kvbm__get_le32(in + 4);
  if (v != KVBM__CIPC_KEY_VERSION)
    return kvbm_error_set(err, KVBM_EPROTO, "fabric: cudaipc: import: region key version %u (this end reads %u)", v,
                          KVBM__CIPC_KEY_VERSION);
  memcpy(k->handle, in + 8, KVBM__CIPC_HANDLE);
  k->offset = kvbm__get_le64(in + 8 + KVBM__CIPC_HANDLE);
  k->alloc_size = kvbm__get_le64(in + 16 + KVBM__CIPC_HANDLE);
  if (k->alloc_size == 0 || k->offset > k->alloc_size || len > k->alloc_size - k->offset)
    return kvbm_error_set(err, KVBM_ERANGE,
                          "fabric: cudaipc: import: a region of %llu bytes at offset %llu does not fit the peer's "
                          "allocation of %llu bytes",
                          (unsigned long long)len, (unsigned long long)k->offset, (unsigned long long)k->alloc_size);
  return KVBM_OK;
}

void kvbm__cipc_addr_encode(const kvbm__cipc_addr *a, uint8_t out[KVBM__CIPC_ADDR_LEN]) {
  memcpy(out, KVBM__CIPC_ADDR_TAG, 4);
  kvbm__put_le32(out + 4, KVBM__CIPC_ADDR_VERSION);
  kvbm__put_le32(out + 8, a->pid);
  kvbm__put_le32(out + 12, 0);
  memcpy(out + 16, a->boot_id, KVBM__CIPC_BOOT_ID);
  memcpy(out + 16 + KVBM__CIPC_BOOT_ID, a->uuid, 16);
}

int kvbm__cipc_addr_decode(const uint8_t *in, size_t len, const kvbm__cipc_addr *ours, kvbm__cipc_addr *out,
                           kvbm_error *err) {
  if (!in || len != KVBM__CIPC_ADDR_LEN || memcmp(in, KVBM__CIPC_ADDR_TAG, 4) != 0)
    return kvbm_error_set(err, KVBM_EPROTO, "fabric: cudaipc: the peer is not a CUDA IPC fabric (hello address of %zu "
                          "bytes)", len);
  uint32_t v = kvbm__get_le32(in + 4);
  if (v != KVBM__CIPC_ADDR_VERSION)
    return kvbm_error_set(err, KVBM_EPROTO, "fabric: cudaipc: peer speaks version %u (this end %u)", v,
                          KVBM__CIPC_ADDR_VERSION);
  if (kvbm__get_le32(in + 12) != 0)
    return kvbm_error_set(err, KVBM_EPROTO, "fabric: cudaipc: reserved bytes of the peer's hello are not zero");
  out->pid = kvbm__get_le32(in + 8);
  memcpy(out->boot_id, in + 16, KVBM__CIPC_BOOT_ID);
  memcpy(out->uuid, in + 16 + KVBM__CIPC_BOOT_ID, 16);
  if (memcmp(out->boot_id, ours->boot_id, KVBM__CIPC_BOOT_ID) != 0)
    return kvbm_error_set(err, KVBM_EUNSUPPORTED,
                          "fabric: cudaipc: the peer is on another host (boot id %.36s, ours %.36s): CUDA IPC "
                          "works within one node; use the UCX fabric",
                          out->boot_id, ours->boot_id);
  return KVBM_OK;
}

void kvbm__cipc_addr_self(kvbm__cipc_addr *a) {
  memset(a, 0, sizeof *a);
  a->pid = (uint32_t)getpid();
  memset(a->boot_id, '-', KVBM__CIPC_BOOT_ID);
  FILE *fp = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (fp) {
    char b[64] = {0};
    if (fgets(b, sizeof b, fp) && strlen(b) >= KVBM__CIPC_BOOT_ID) memcpy(a->boot_id, b, KVBM__CIPC_BOOT_ID);
    fclose(fp);
  }
}

/* ---- CUDA, or its absence ---- */

#ifdef KVBM_HAVE_CUDA
typedef CUresult (*range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
typedef CUresult (*attr_fn)(void *data, CUpointer_attribute attribute, CUdeviceptr ptr);
#else
typedef void (*range_fn)(void);
typedef void (*attr_fn)(void);
#endif

typedef struct rx_msg {
  struct rx_msg *next;
  uint64_t id;
  size_t len;
  bool announced;
  uint8_t *data;
} rx_msg;

typedef struct tx_item {
  struct tx_item *next;
  uint8_t hdr[FR_HDR_MAX];
  size_t hdr_len;
  const uint8_t *data; /* the pusher's bytes, not copied (valid until flush) */
  size_t len, sent;    /* sent counts header then data */
} tx_item;

/* An opened peer allocation, shared by the regions that live in it. */
typedef struct ipc_map {
  struct ipc_map *next;
  uint8_t handle[KVBM__CIPC_HANDLE];
  void *ptr;   /* where it is mapped here */
  size_t size; /* its size as mapped (cuMemGetAddressRange here) */
  unsigned refs;
} ipc_map;

/* An allocation this end exported: its handle, asked of CUDA once and
 * shared by every registered region inside it (the importer then sees one
 * handle per allocation, whatever CUDA would answer a second time). */
typedef struct ipc_export {
  struct ipc_export *next;
  uint64_t base;
  size_t size;
  uint8_t handle[KVBM__CIPC_HANDLE];
  unsigned refs;
} ipc_export;

/* key_attach's result: a peer extent and where its bytes are here. */
typedef struct ipc_rkey {
  ipc_map *map;
  uint64_t peer_base, len;
  uint8_t *local;
} ipc_rkey;

typedef struct ipc_fabric {
  kvbm_fabric base;
  int timeout_ms, device;
  bool has_device; /* false: the no-device seam */
  uint64_t max_payload, max_pending;
  int sock;
  void *stream; /* cudaStream_t */
  range_fn get_range;
  attr_fn get_attr; /* cuPointerGetAttribute: asked when get_range cannot answer */
  /* receive */
  uint8_t rx_hdr[FR_HDR_MAX];
  size_t rx_hdr_got, rx_hdr_need;
  rx_msg *rx_cur;
  size_t rx_got;
  rx_msg *head, *tail;
  uint64_t pending, max_received;
  /* send */
  tx_item *txh, *txt;
  uint64_t unacked; /* our pushes the peer has not pulled yet */
  bool peer_closed, peer_gone;
  uint64_t posted; /* copies posted since the last completed flush */
  ipc_map *maps;
  ipc_export *exports;
} ipc_fabric;

static ipc_fabric *C(kvbm_fabric *f) { return (ipc_fabric *)f; }

#ifdef KVBM_HAVE_CUDA
static int cuda_fail(kvbm_error *err, int code, const char *what, cudaError_t e) {
  (void)cudaGetLastError(); /* clear a sticky error so the next call is judged on its own */
  return kvbm_error_set(err, code, "fabric: cudaipc: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Makes u->device current; *prev is the caller's, put back by dev_leave. */
static int dev_enter(const ipc_fabric *u, int *prev, kvbm_error *err) {
  cudaError_t e = cudaGetDevice(prev);
  if (e != cudaSuccess) return cuda_fail(err, KVBM_EDEVICE, "cudaGetDevice", e);
  if (*prev != u->device && (e = cudaSetDevice(u->device)) != cudaSuccess)
    return cuda_fail(err, KVBM_EDEVICE, "cudaSetDevice", e);
  return KVBM_OK;
}
static void dev_leave(const ipc_fabric *u, int prev) {
  if (prev != u->device) cudaSetDevice(prev);
}

static int device_check(int device, kvbm_error *err) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return cuda_fail(err, KVBM_EDEVICE, "no CUDA device: cudaGetDeviceCount", e);
  if (device >= n)
    return kvbm_error_set(err, KVBM_EDEVICE, "fabric: cudaipc: device %d asked for, this node has %d", device, n);
  return KVBM_OK;
}

/* The stream, the driver's cuMemGetAddressRange and the device UUID. */
static int cuda_setup(ipc_fabric *u, uint8_t uuid[16], kvbm_error *err) {
  int prev, rc = dev_enter(u, &prev, err);
  if (rc) return rc;
  cudaStream_t s;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    rc = cuda_fail(err, KVBM_EIO, "cudaStreamCreateWithFlags", e);
  } else {
    u->stream = s;
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    e = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn)
      rc = e != cudaSuccess ? cuda_fail(err, KVBM_EIO, "cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)", e)
                            : kvbm_error_set(err, KVBM_EIO, "fabric: cudaipc: the driver has no cuMemGetAddressRange");
    else
      u->get_range = (range_fn)fn;
    fn = NULL;
    if (!rc && cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &fn, 12000, cudaEnableDefault, &q) ==
                   cudaSuccess && q == cudaDriverEntryPointSuccess)
      u->get_attr = (attr_fn)fn;
    (void)cudaGetLastError();
  }
  if (!rc) {
    struct cudaDeviceProp p;
    e = cudaGetDeviceProperties(&p, u->device);
    if (e != cudaSuccess)
      rc = cuda_fail(err, KVBM_EIO, "cudaGetDeviceProperties", e);
    else
      memcpy(uuid, p.uuid.bytes, 16);
  }
  dev_leave(u, prev);
  return rc;
}

/* The allocation holding ptr (its base and size): cuMemGetAddressRange,
 * or the pointer's range attributes where that cannot answer. The CUresult
 * of the first call when neither can. */
static CUresult alloc_range(const ipc_fabric *u, const void *ptr, CUdeviceptr *base, size_t *size) {
  CUresult cr = u->get_range(base, size, (CUdeviceptr)(uintptr_t)ptr);
  if (cr == CUDA_SUCCESS || !u->get_attr) return cr;
  CUdeviceptr b = 0;
  size_t n = 0;
  if (u->get_attr(&b, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS ||
      u->get_attr(&n, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS || n == 0)
    return cr;
  *base = b;
  *size = n;
  return CUDA_SUCCESS;
}

static void cuda_teardown(ipc_fabric *u) {
  if (!u->stream) return;
  int prev;
  if (dev_enter(u, &prev, NULL)) return;
  cudaStreamSynchronize((cudaStream_t)u->stream);
  for (ipc_map *m = u->maps, *n; m; m = n) { /* sets not released: a caller's bug */
    n = m->next;
    cudaIpcCloseMemHandle(m->ptr);
    free(m);
  }
  u->maps = NULL;
  cudaStreamDestroy((cudaStream_t)u->stream);
  u->stream = NULL;
  (void)cudaGetLastError();
  dev_leave(u, prev);
}
#endif

static int no_device(const ipc_fabric *u, const char *what, kvbm_error *err) {
  (void)u;
#ifdef KVBM_HAVE_CUDA
  return kvbm_error_set(err, KVBM_EDEVICE, "fabric: cudaipc: %s needs a CUDA device (this end has none)", what);
#else
  return kvbm_error_set(err, KVBM_EUNSUPPORTED, "fabric: cudaipc: %s: this build has no CUDA runtime", what);
#endif
}

/* ---- The framed socket ---- */

static void tx_queue(ipc_fabric *u, tx_item *t) {
  if (u->txt)
    u->txt->next = t;
  else
    u->txh = t;
  u->txt = t;
}

/* A recv that returned n <= 0: nothing yet (EAGAIN), or the peer is gone
 * (EOF, a reset). */
static void rx_end(ipc_fabric *u, ssize_t n) {
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  u->peer_gone = u->peer_closed = true;
}

/* Reads whatever the socket holds, frame by frame, without waiting. */
static void rx_pump(ipc_fabric *u) {
  while (!u->base.fatal && !u->peer_gone) {
    ssize_t n;
    if (u->rx_cur) { /* a payload's bytes */
      size_t want = u->rx_cur->len - u->rx_got;
      if (want) {
        n = recv(u->sock, u->rx_cur->data + u->rx_got, want, MSG_DONTWAIT);
        if (n <= 0) {
          rx_end(u, n);
          return;
        }
        u->rx_got += (size_t)n;
      }
      if (u->rx_got == u->rx_cur->len) {
        rx_msg *m = u->rx_cur;
        u->rx_cur = NULL;
        if (u->tail)
          u->tail->next = m;
        else
          u->head = m;
        u->tail = m;
      }
      continue;
    }
    size_t need = u->rx_hdr_got == 0 ? 1 : u->rx_hdr_need;
    n = recv(u->sock, u->rx_hdr + u->rx_hdr_got, need - u->rx_hdr_got, MSG_DONTWAIT);
    if (n <= 0) {
          rx_end(u, n);
          return;
        }
    u->rx_hdr_got += (size_t)n;
    if (u->rx_hdr_got == 1) {
      switch (u->rx_hdr[0]) {
        case FR_PUSH: u->rx_hdr_need = 17; break;
        case FR_ACK: u->rx_hdr_need = 9; break;
        case FR_BYE: u->rx_hdr_need = 1; break;
        default:
          kvbm__fabric_set_fatal(&u->base, NULL, KVBM_EPROTO, "fabric: cudaipc: peer sent frame type 0x%02x",
                                 u->rx_hdr[0]);
          return;
      }
    }
    if (u->rx_hdr_got < u->rx_hdr_need) continue;
    u->rx_hdr_got = 0;
    uint8_t type = u->rx_hdr[0];
    if (type == FR_BYE) {
      u->peer_closed = true;
      continue;
    }
    uint64_t id = kvbm__get_le64(u->rx_hdr + 1);
    if (type == FR_ACK) {
      if (u->unacked == 0 || id == 0 || id >= u->base.next_push_id) {
        kvbm__fabric_set_fatal(&u->base, NULL, KVBM_EPROTO, "fabric: cudaipc: peer acknowledged payload %llu, "
                               "which is not waiting", (unsigned long long)id);
        return;
      }
      u->unacked--;
      continue;
    }
    uint64_t len = kvbm__get_le64(u->rx_hdr + 9);
    if (u->peer_closed) {
      kvbm__fabric_set_fatal(&u->base, NULL, KVBM_EPROTO, "fabric: cudaipc: peer pushed after its bye");
      return;
    }
    if (len > u->max_payload) {
      kvbm__fabric_set_fatal(&u->base, NULL, KVBM_EPROTO, "fabric: cudaipc: peer pushed %llu bytes (limit %llu)",
                             (unsigned long long)len, (unsigned long long)u->max_payload);
      return;
    }
    if (u->pending >= u->max_pending) {
      kvbm__fabric_set_fatal(&u->base, NULL, KVBM_EPROTO, "fabric: cudaipc: more than %llu payloads waiting",
                             (unsigned long long)u->max_pending);
      return;
    }
    if (id <= u->max_received) {
      kvbm__fabric_set_fatal(&u->base, NULL, KVBM_EPROTO, "fabric: cudaipc: payload id %llu after %llu",
                             (unsigned long long)id, (unsigned long long)u->max_received);
      return;
    }
    rx_msg *m = calloc(1, sizeof *m);
    if (m && len) m->data = malloc((size_t)len);
    if (!m || (len && !m->data)) {
      free(m);
      kvbm__fabric_set_fatal(&u->base, NULL, KVBM_ENOMEM, "fabric: cudaipc: out of memory for a %llu-byte payload",
                             (unsigned long long)len);
      return;
    }
    m->id = id;
    m->len = (size_t)len;
    u->pending++;
    u->max_received = id;
    u->rx_cur = m;
    u->rx_got = 0;
  }
}

/* Sends what the queue holds, without waiting. */
static void tx_pump(ipc_fabric *u) {
  while (u->txh && !u->peer_gone) {
    tx_item *t = u->txh;
    size_t total = t->hdr_len + t->len;
    while (t->sent < total) {
      const uint8_t *p;
      size_t n;
      if (t->sent < t->hdr_len) {
        p = t->hdr + t->sent;
        n = t->hdr_len - t->sent;
      } else {
        p = t->data + (t->sent - t->hdr_len);
        n = total - t->sent;
      }
      ssize_t w = send(u->sock, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        u->peer_gone = u->peer_closed = true;
        return;
      }
      t->sent += (size_t)w;
    }
    u->txh = t->next;
    if (!u->txh) u->txt = NULL;
    free(t);
  }
}

/* One turn: waits up to wait_ms for the socket (readable, or writable
 * while something is queued), then moves what it can both ways. */
static void pump(ipc_fabric *u, int wait_ms) {
  if (u->peer_gone) return;
  struct pollfd p = {.fd = u->sock, .events = POLLIN | (u->txh ? POLLOUT : 0)};
  int n = poll(&p, 1, wait_ms);
  if (n > 0) {
    if (p.revents & POLLOUT) tx_pump(u);
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) rx_pump(u);
  }
  if (u->txh) tx_pump(u);
}

/* How long the next pump may wait: what is left of the deadline, at most
 * 100 ms (so a fatal error or a deadline is seen soon). */
static int wait_slice(int64_t deadline) {
  if (deadline == INT64_MAX) return 100;
  int64_t left = deadline - kvbm__sc_now_ms();
  if (left <= 0) return 0;
  return left > 100 ? 100 : (int)left;
}

/* ---- vtable ---- */

static int ci_push(kvbm_fabric *f, const void *data, size_t len, uint64_t id, kvbm_error *err) {
  ipc_fabric *u = C(f);
  pump(u, 0);
  if (u->peer_closed) return kvbm_error_set(err, KVBM_ECLOSED, "fabric: push: peer '%s' is closed", f->peer_name);
  if (len > u->max_payload)
    return kvbm_error_set(err, KVBM_ETOOLONG, "fabric: push: %zu bytes above the limit of %llu", len,
                          (unsigned long long)u->max_payload);
  tx_item *t = calloc(1, sizeof *t);
  if (!t) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: push: out of memory");
  t->hdr[0] = FR_PUSH;
  kvbm__put_le64(t->hdr + 1, id);
  kvbm__put_le64(t->hdr + 9, len);
  t->hdr_len = 17;
  t->data = data;
  t->len = len;
  tx_queue(u, t);
  u->unacked++;
  tx_pump(u);
  return KVBM_OK;
}

static int ci_next(kvbm_fabric *f, int timeout_ms, kvbm_fabric_handle *h, size_t *len, kvbm_error *err) {
  ipc_fabric *u = C(f);
  int64_t deadline = kvbm__sc_deadline(timeout_ms);
  for (bool last = false;; ) {
    for (rx_msg *m = u->head; m; m = m->next)
      if (!m->announced) {
        m->announced = true;
        h->id = m->id;
        if (len) *len = m->len;
        return KVBM_OK;
      }
    int rc = kvbm__fabric_check(f, err);
    if (rc) return rc;
    if (u->peer_closed && !u->rx_cur)
      return kvbm_error_set(err, KVBM_ECLOSED, "fabric: next: peer '%s' closed, nothing left", f->peer_name);
    if (last) return kvbm_error_set(err, KVBM_ETIMEDOUT, "fabric: next: no payload within %d ms", timeout_ms);
    int w = timeout_ms == 0 ? 0 : wait_slice(deadline);
    if (w == 0) last = true;
    pump(u, w);
  }
}

static int ci_pull(kvbm_fabric *f, kvbm_fabric_handle h, void *buf, size_t cap, size_t *len, int timeout_ms,
                   kvbm_error *err) {
  ipc_fabric *u = C(f);
  int64_t deadline = kvbm__sc_deadline(timeout_ms);
  for (bool last = false;; ) {
    rx_msg **pp = &u->head, *prev = NULL;
    while (*pp && (*pp)->id != h.id) {
      prev = *pp;
      pp = &(*pp)->next;
    }
    rx_msg *m = *pp;
    if (m) {
      if (m->len > cap)
        return kvbm_error_set(err, KVBM_ETOOLONG, "fabric: pull: payload %llu is %zu bytes, buffer %zu",
                              (unsigned long long)h.id, m->len, cap);
      tx_item *t = calloc(1, sizeof *t);
      if (!t) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: pull: out of memory");
      *pp = m->next;
      if (u->tail == m) u->tail = prev;
      u->pending--;
      if (m->len) memcpy(buf, m->data, m->len);
      if (len) *len = m->len;
      free(m->data);
      free(m);
      t->hdr[0] = FR_ACK;
      kvbm__put_le64(t->hdr + 1, h.id);
      t->hdr_len = 9;
      tx_queue(u, t);
      tx_pump(u);
      return KVBM_OK;
    }
    bool arriving = u->rx_cur && u->rx_cur->id == h.id;
    if (h.id <= u->max_received && !arriving)
      return kvbm_error_set(err, KVBM_ENOTFOUND, "fabric: pull: payload %llu was already pulled",
                            (unsigned long long)h.id);
    int rc = kvbm__fabric_check(f, err);
    if (rc) return rc;
    if (u->peer_closed && !arriving)
      return kvbm_error_set(err, KVBM_ECLOSED, "fabric: pull: peer '%s' closed before sending payload %llu",
                            f->peer_name, (unsigned long long)h.id);
    if (last)
      return kvbm_error_set(err, KVBM_ETIMEDOUT, "fabric: pull: payload %llu not there within %d ms",
                            (unsigned long long)h.id, timeout_ms);
    int w = timeout_ms == 0 ? 0 : wait_slice(deadline);
    if (w == 0) last = true;
    pump(u, w);
  }
}

/* Whether this end's copies are done: KVBM_OK, KVBM_EAGAIN (still
 * running), or the sticky KVBM_EIO of a copy that failed. */
static int copies_done(ipc_fabric *u, kvbm_error *err) {
  if (u->posted == 0) return KVBM_OK;
#ifdef KVBM_HAVE_CUDA
  int prev, rc = dev_enter(u, &prev, err);
  if (rc) return rc;
  cudaError_t e = cudaStreamQuery((cudaStream_t)u->stream);
  dev_leave(u, prev);
  if (e == cudaErrorNotReady) return KVBM_EAGAIN;
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return kvbm__fabric_set_fatal(&u->base, err, KVBM_EIO, "fabric: cudaipc: a block copy failed: %s (%s)",
                                  cudaGetErrorString(e), cudaGetErrorName(e));
  }
  u->posted = 0;
  return KVBM_OK;
#else
  return no_device(u, "flush", err);
#endif
}

static int ci_flush(kvbm_fabric *f, int timeout_ms, kvbm_error *err) {
  ipc_fabric *u = C(f);
  int64_t deadline = kvbm__sc_deadline(timeout_ms);
  unsigned spins = 0;
  for (;;) {
    int rc = kvbm__fabric_check(f, err);
    if (rc) return rc;
    rc = copies_done(u, err);
    if (rc && rc != KVBM_EAGAIN) return rc;
    bool copies = rc == KVBM_EAGAIN;
    if (!copies && !u->txh && u->unacked == 0) return KVBM_OK;
    if (!copies && u->peer_gone)
      return kvbm_error_set(err, KVBM_ECLOSED, "fabric: flush: peer '%s' is gone with %llu payloads not pulled",
                            f->peer_name, (unsigned long long)u->unacked);
    if (timeout_ms == 0 || (deadline != INT64_MAX && kvbm__sc_now_ms() >= deadline))
      return kvbm_error_set(err, KVBM_ETIMEDOUT, "fabric: flush: not complete after %d ms (%s)", timeout_ms,
                            copies ? "copies still running" : "payloads not pulled yet");
    if (copies && !u->txh && u->unacked == 0) {
      /* Only the GPU to wait for: spin a little (a copy of a few MiB takes
       * microseconds), then sleep in short steps. */
      if (++spins < 2000)
        sched_yield();
      else
        nanosleep(&(struct timespec){0, 20000}, NULL);
      pump(u, 0);
    } else {
      pump(u, copies ? 0 : wait_slice(deadline));
      if (copies) sched_yield();
    }
  }
}

/* A registration ends: its allocation's entry goes with the last region
 * in it (an IPC handle itself needs no release at the exporter). */
static void ci_mem_deregister(kvbm_fabric *f, void *reg) {
  ipc_fabric *u = C(f);
  ipc_export *x = reg;
  if (!x || --x->refs > 0) return;
  ipc_export **pp = &u->exports;
  while (*pp && *pp != x) pp = &(*pp)->next;
  if (*pp) *pp = x->next;
  free(x);
}

static int ci_mem_register(kvbm_fabric *f, void *base, uint64_t len, void **reg, uint8_t **key, size_t *key_len,
                           kvbm_error *err) {
  ipc_fabric *u = C(f);
  *reg = NULL;
  if (!u->has_device) return no_device(u, "register", err);
#ifdef KVBM_HAVE_CUDA
  int prev, rc = dev_enter(u, &prev, err);
  if (rc) return rc;
  kvbm__cipc_key k;
  memset(&k, 0, sizeof k);
  struct cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, base);
  CUdeviceptr abase = 0;
  size_t asize = 0;
  if (e != cudaSuccess) {
    rc = cuda_fail(err, KVBM_EUNSUPPORTED, "register: cudaPointerGetAttributes", e);
  } else if (a.type != cudaMemoryTypeDevice) {
    rc = kvbm_error_set(err, KVBM_EUNSUPPORTED,
                        "fabric: cudaipc: register: region at %p is not device memory (CUDA says %s): CUDA IPC "
                        "exports cudaMalloc memory only",
                        base, a.type == cudaMemoryTypeHost ? "pinned host" : a.type == cudaMemoryTypeManaged
                                                                                  ? "managed" : "unregistered host");
  } else {
    CUresult cr = alloc_range(u, base, &abase, &asize);
    if (cr != CUDA_SUCCESS)
      rc = kvbm_error_set(err, KVBM_EUNSUPPORTED, "fabric: cudaipc: register: cuMemGetAddressRange(%p) failed (%d)",
                          base, (int)cr);
    else if ((uint64_t)(uintptr_t)base - abase > asize || len > asize - ((uint64_t)(uintptr_t)base - abase))
      rc = kvbm_error_set(err, KVBM_EINVAL,
                          "fabric: cudaipc: register: region [%p, +%llu) reaches past its allocation of %zu bytes",
                          base, (unsigned long long)len, asize);
  }
  ipc_export *x = NULL;
  if (!rc) {
    for (x = u->exports; x && !(x->base == abase && x->size == asize); x = x->next) {
    }
    if (!x) {
      cudaIpcMemHandle_t h;
      e = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)abase);
      if (e != cudaSuccess)
        rc = cuda_fail(err, KVBM_EUNSUPPORTED, "register: cudaIpcGetMemHandle (memory from cudaMallocAsync pools or "
                       "cuMemCreate has no legacy IPC handle)", e);
      else if (!(x = calloc(1, sizeof *x)))
        rc = kvbm_error_set(err, KVBM_ENOMEM, "fabric: cudaipc: register: out of memory");
      else {
        x->base = abase;
        x->size = asize;
        memcpy(x->handle, &h, KVBM__CIPC_HANDLE);
        x->next = u->exports;
        u->exports = x;
      }
    }
  }
  dev_leave(u, prev);
  if (rc) return rc;
  *key = malloc(KVBM__CIPC_KEY_LEN);
  if (!*key) {
    x->refs++;
    ci_mem_deregister(f, x); /* drops the entry unless another region uses it */
    return kvbm_error_set(err, KVBM_ENOMEM, "fabric: cudaipc: register: out of memory");
  }
  memcpy(k.handle, x->handle, KVBM__CIPC_HANDLE);
  k.offset = (uint64_t)(uintptr_t)base - abase;
  k.alloc_size = asize;
  kvbm__cipc_key_encode(&k, *key);
  *key_len = KVBM__CIPC_KEY_LEN;
  x->refs++;
  *reg = x;
  return KVBM_OK;
#else
  (void)base, (void)len, (void)key, (void)key_len;
  return no_device(u, "register", err);
#endif
}


static int ci_mem_alloc(kvbm_fabric *f, uint64_t len, void **addr, void **alloc, kvbm_error *err) {
  (void)f, (void)len, (void)addr, (void)alloc;
  return kvbm_error_set(err, KVBM_EUNSUPPORTED,
                        "fabric: cudaipc: storage_create: the CUDA IPC fabric moves device memory; use "
                        "kvbm_storage_create(KVBM_MEMORY_DEVICE, ...) and register it");
}

static void ci_mem_free(kvbm_fabric *f, void *alloc) { (void)f, (void)alloc; }

static int ci_key_attach(kvbm_fabric *f, uint64_t base, uint64_t len, const uint8_t *key, size_t key_len,
                         void **rkey, kvbm_error *err) {
  ipc_fabric *u = C(f);
  kvbm__cipc_key k;
  int rc = kvbm__cipc_key_decode(key, key_len, len, &k, err);
  if (rc) return rc;
  if (!u->has_device) return no_device(u, "import", err);
#ifdef KVBM_HAVE_CUDA
  ipc_rkey *rk = calloc(1, sizeof *rk);
  if (!rk) return kvbm_error_set(err, KVBM_ENOMEM, "fabric: cudaipc: import: out of memory");
  ipc_map *m = u->maps;
  while (m && memcmp(m->handle, k.handle, KVBM__CIPC_HANDLE) != 0) m = m->next;
  if (!m) {
    int prev;
    rc = dev_enter(u, &prev, err);
    if (rc) {
      free(rk);
      return rc;
    }
    m = calloc(1, sizeof *m);
    cudaIpcMemHandle_t h;
    memcpy(&h, k.handle, KVBM__CIPC_HANDLE);
    cudaError_t e = m ? cudaIpcOpenMemHandle(&m->ptr, h, cudaIpcMemLazyEnablePeerAccess) : cudaSuccess;
    if (!m) {
      rc = kvbm_error_set(err, KVBM_ENOMEM, "fabric: cudaipc: import: out of memory");
    } else if (e != cudaSuccess) {
      rc = cuda_fail(err, KVBM_EPROTO, "import: cudaIpcOpenMemHandle refused the peer's handle", e);
      free(m);
      m = NULL;
    } else {
      CUdeviceptr mb = 0;
      size_t ms = 0;
      CUresult cr = alloc_range(u, m->ptr, &mb, &ms);
      CUdeviceptr p = (CUdeviceptr)(uintptr_t)m->ptr;
      if (cr != CUDA_SUCCESS || p < mb || p - mb >= ms)
        rc = kvbm_error_set(err, KVBM_EIO,
                            "fabric: cudaipc: import: the driver cannot say how large the mapping at %p is "
                            "(cuMemGetAddressRange: %d)", m->ptr, (int)cr);
      if (rc) {
        cudaIpcCloseMemHandle(m->ptr);
        free(m);
        m = NULL;
      } else {
        memcpy(m->handle, k.handle, KVBM__CIPC_HANDLE);
        m->size = ms - (size_t)(p - mb); /* usable from the pointer CUDA gave */
        m->next = u->maps;
        u->maps = m;
      }
    }
    dev_leave(u, prev);
    if (rc) {
      free(rk);
      return rc;
    }
  }
  /* The mapping's real size rules, whatever the peer claimed. */
  if (k.offset > m->size || len > m->size - k.offset) {
    rc = kvbm_error_set(err, KVBM_ERANGE,
                        "fabric: cudaipc: import: region [%llu, +%llu) outside the peer's allocation as mapped "
                        "(%zu bytes; the peer claimed %llu)",
                        (unsigned long long)k.offset, (unsigned long long)len, m->size,
                        (unsigned long long)k.alloc_size);
    if (m->refs == 0) {
      ipc_map **pp = &u->maps;
      while (*pp != m) pp = &(*pp)->next;
      *pp = m->next;
      int prev;
      if (!dev_enter(u, &prev, NULL)) {
        cudaIpcCloseMemHandle(m->ptr);
        dev_leave(u, prev);
      }
      free(m);
    }
    free(rk);
    return rc;
  }
  m->refs++;
  rk->map = m;
  rk->peer_base = base;
  rk->len = len;
  rk->local = (uint8_t *)m->ptr + k.offset;
  *rkey = rk;
  return KVBM_OK;
#else
  (void)base, (void)rkey;
  return no_device(u, "import", err);
#endif
}

static void ci_key_detach(kvbm_fabric *f, void *rkey) {
  ipc_fabric *u = C(f);
  ipc_rkey *rk = rkey;
  if (!rk) return;
#ifdef KVBM_HAVE_CUDA
  ipc_map *m = rk->map;
  int prev;
  bool on = dev_enter(u, &prev, NULL) == KVBM_OK;
  /* Our copies may still read or write the mapping: let them finish. */
  if (on && u->stream) cudaStreamSynchronize((cudaStream_t)u->stream);
  if (m && --m->refs == 0) {
    ipc_map **pp = &u->maps;
    while (*pp && *pp != m) pp = &(*pp)->next;
    if (*pp) *pp = m->next;
    if (on) cudaIpcCloseMemHandle(m->ptr);
    free(m);
  }
  (void)cudaGetLastError();
  if (on) dev_leave(u, prev);
#else
  (void)u;
#endif
  free(rk);
}

static int ci_rma(kvbm_fabric *f, bool write, void *rkey, uint64_t raddr, void *local, size_t len, void *lreg,
                  kvbm_error *err) {
  (void)lreg;
  ipc_fabric *u = C(f);
  ipc_rkey *rk = rkey;
  /* The generic layer checked the range; check it again against what is
   * mapped here, since a wrong pointer here is a write into our own GPU. */
  if (!rk || raddr < rk->peer_base || raddr - rk->peer_base > rk->len || len > rk->len - (raddr - rk->peer_base))
    return kvbm_error_set(err, KVBM_ERANGE, "fabric: cudaipc: [0x%llx, +%zu) outside the imported extent",
                          (unsigned long long)raddr, len);
  if (!u->has_device) return no_device(u, "read/write", err);
#ifdef KVBM_HAVE_CUDA
  uint8_t *remote = rk->local + (raddr - rk->peer_base);
  int prev, rc = dev_enter(u, &prev, err);
  if (rc) return rc;
  cudaError_t e = write ? cudaMemcpyAsync(remote, local, len, cudaMemcpyDefault, (cudaStream_t)u->stream)
                        : cudaMemcpyAsync(local, remote, len, cudaMemcpyDefault, (cudaStream_t)u->stream);
  dev_leave(u, prev);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return kvbm__fabric_set_fatal(&u->base, err, KVBM_EIO, "fabric: cudaipc: cudaMemcpyAsync (%s, %zu bytes): %s",
                                  write ? "write" : "read", len, cudaGetErrorString(e));
  }
  u->posted++;
  return KVBM_OK;
#else
  (void)write, (void)local;
  return no_device(u, "read/write", err);
#endif
}

static void rx_clear(ipc_fabric *u) {
  for (rx_msg *m = u->head, *n; m; m = n) {
    n = m->next;
    free(m->data);
    free(m);
  }
  if (u->rx_cur) {
    free(u->rx_cur->data);
    free(u->rx_cur);
  }
  u->rx_cur = NULL;
  u->head = u->tail = NULL;
  for (tx_item *t = u->txh, *n; t; t = n) {
    n = t->next;
    free(t);
  }
  u->txh = u->txt = NULL;
}

/* Bye both ways (see "Close" above), then CUDA, then the socket. */
static void ci_destroy(kvbm_fabric *f) {
  ipc_fabric *u = C(f);
  if (u->sock >= 0) {
    int64_t deadline = kvbm__sc_deadline(u->timeout_ms);
    tx_item *t = calloc(1, sizeof *t);
    if (t) {
      t->hdr[0] = FR_BYE;
      t->hdr_len = 1;
      tx_queue(u, t);
    }
    /* A peer that broke the protocol is not waited for (nor read). */
    while (!u->peer_gone && !u->base.fatal && (u->txh || !u->peer_closed) && kvbm__sc_now_ms() < deadline)
      pump(u, wait_slice(deadline));
  }
#ifdef KVBM_HAVE_CUDA
  cuda_teardown(u);
#endif
  rx_clear(u);
  for (ipc_export *x = u->exports, *n; x; x = n) { /* sets not released: a caller's bug */
    n = x->next;
    free(x);
  }
  if (u->sock >= 0) close(u->sock);
  free(u);
}

static const kvbm_fabric_vtable ci_vtable = {
    .kind = "cudaipc",
    .label = "cuda-ipc",
    .device_memory = true,
    .push = ci_push,
    .next = ci_next,
    .pull = ci_pull,
    .flush = ci_flush,
    .mem_register = ci_mem_register,
    .mem_deregister = ci_mem_deregister,
    .mem_alloc = ci_mem_alloc,
    .mem_free = ci_mem_free,
    .key_attach = ci_key_attach,
    .key_detach = ci_key_detach,
    .rma = ci_rma,
    .destroy = ci_destroy,
};

/* ---- Setting up a connection ---- */

struct kvbm_fabric_cudaipc_listener {
  int fd;
  uint16_t port;
  kvbm__gate *gate;
  kvbm_fabric_cudaipc_config cfg; /* key cleared: the gate holds the derived one */
  char name[KVBM_FABRIC_NAME_MAX + 1];
};

kvbm_fabric_cudaipc_config kvbm_fabric_cudaipc_config_default(void) {
  return (kvbm_fabric_cudaipc_config){
      .name = NULL, .device = 0, .timeout_ms = 10000, .max_payload = 1ull << 30, .max_pending = 65536};
}

static int check_cfg(const kvbm_fabric_cudaipc_config *cfg, uint8_t key[KVBM__HELLO_KEY], kvbm_error *err) {
  if (!cfg) return kvbm_error_set(err, KVBM_EINVAL, "fabric: cudaipc: NULL config");
  if (cfg->timeout_ms <= 0) return kvbm_error_set(err, KVBM_EINVAL, "fabric: cudaipc: timeout_ms must be positive");
  if (cfg->max_pending == 0) return kvbm_error_set(err, KVBM_EINVAL, "fabric: cudaipc: max_pending must be positive");
  if (cfg->device < 0)
    return kvbm_error_set(err, KVBM_EINVAL, "fabric: cudaipc: device %d is not a CUDA ordinal", cfg->device);
  if (!cfg->key)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "fabric: cudaipc: a shared key is required (kvbm_fabric_cudaipc_config.key): peers prove "
                          "it before they exchange anything");
  int rc = kvbm__hello_derive(cfg->key, cfg->key_len, key, err);
  if (rc) return rc;
  return kvbm__fabric_name_check(cfg->name, err);
}

/* Hello both ways (name and who we are, MAC'd), then ready both ways. */
static int handshake(ipc_fabric *u, const kvbm__hs *hs, const kvbm__cipc_addr *self, kvbm_error *err) {
  int64_t deadline = kvbm__sc_deadline(u->timeout_ms);
  uint8_t addr[KVBM__CIPC_ADDR_LEN];
  kvbm__cipc_addr_encode(self, addr);
  size_t n = kvbm__hello_size(strlen(u->base.name), sizeof addr);
  uint8_t *b = n ? malloc(n) : NULL;
  int rc = b ? kvbm__hs_hello_encode(hs, u->base.name, addr, sizeof addr, b, n, &n, err)
             : kvbm_error_set(err, KVBM_ENOMEM, "fabric: cudaipc: out of memory");
  if (!rc) rc = kvbm__sc_send_record(u->sock, b, n, deadline, err);
  free(b);
  if (rc) return rc;
  void *rec;
  rc = kvbm__sc_recv_record(u->sock, KVBM__HELLO_MAX, &rec, &n, deadline, err);
  if (rc) return rc;
  kvbm__hello h;
  rc = kvbm__hs_hello_decode(hs, rec, n, &h, err);
  if (rc && rc != KVBM_EAUTH) {
    if (err) err->code = KVBM_EPROTO;
    rc = KVBM_EPROTO;
  }
  kvbm__cipc_addr peer;
  if (!rc) rc = kvbm__cipc_addr_decode(h.addr, h.addr_len, self, &peer, err);
  if (!rc) memcpy(u->base.peer_name, h.name, sizeof h.name);
  free(rec);
  if (rc) return rc;
  unsigned char r = SC_READY;
  rc = kvbm__sc_send_all(u->sock, &r, 1, deadline, err);
  if (!rc) rc = kvbm__sc_recv_all(u->sock, &r, 1, deadline, err);
  if (!rc && r != SC_READY)
    rc = kvbm_error_set(err, KVBM_EPROTO, "fabric: cudaipc: expected ready, got 0x%02x", r);
  return rc;
}

/* A fabric on a socket whose peer proved the key. *ours tells a failure
 * on this side (CUDA, memory) from the peer's. */
static int new_fabric(const kvbm_fabric_cudaipc_config *cfg, const char *name, int sock, const kvbm__hs *hs,
                      bool need_device, kvbm_fabric **out, bool *ours, kvbm_error *err) {
  *ours = true;
  ipc_fabric *u = calloc(1, sizeof *u);
  if (!u) {
    close(sock);
    return kvbm_error_set(err, KVBM_ENOMEM, "fabric: cudaipc: out of memory");
  }
  kvbm__fabric_base_init(&u->base, &ci_vtable, name ? name : "cudaipc");
  u->sock = sock;
  u->timeout_ms = cfg->timeout_ms;
  u->device = cfg->device;
  u->max_payload = cfg->max_payload;
  u->max_pending = cfg->max_pending;
  u->has_device = need_device;
  kvbm__cipc_addr self;
  kvbm__cipc_addr_self(&self);
  int rc = KVBM_OK;
#ifdef KVBM_HAVE_CUDA
  if (need_device) rc = cuda_setup(u, self.uuid, err);
#endif
  if (!rc) {
    *ours = false;
    rc = handshake(u, hs, &self, err);
    if (rc == KVBM_ENOMEM) *ours = true;
  }
  if (rc) {
#ifdef KVBM_HAVE_CUDA
    cuda_teardown(u);
#endif
    close(sock);
    free(u);
    return rc;
  }
  int fl = fcntl(sock, F_GETFL, 0);
  if (fl >= 0) fcntl(sock, F_SETFL, fl | O_NONBLOCK);
  *out = &u->base;
  return KVBM_OK;
}

int kvbm_fabric_cudaipc_listen(const kvbm_fabric_cudaipc_config *cfg, const char *host, uint16_t port,
                               kvbm_fabric_cudaipc_listener **out, kvbm_error *err) {
  uint8_t key[KVBM__HELLO_KEY];
  int rc = check_cfg(cfg, key, err);
  if (!rc && !out) rc = kvbm_error_set(err, KVBM_EINVAL, "fabric: cudaipc: NULL out");
  kvbm_fabric_cudaipc_listener *l = rc ? NULL : calloc(1, sizeof *l);
  if (!rc && !l) rc = kvbm_error_set(err, KVBM_ENOMEM, "fabric: cudaipc: out of memory");
  if (rc) {
    explicit_bzero(key, sizeof key);
    return rc;
  }
  l->fd = -1;
  l->cfg = *cfg;
  l->cfg.key = NULL;
  l->cfg.key_len = 0;
  snprintf(l->name, sizeof l->name, "%s", cfg->name ? cfg->name : "cudaipc");
  l->cfg.name = l->name;
  rc = kvbm__sc_listen(host, port, &l->fd, &l->port, err);
  if (!rc) rc = kvbm__gate_create(l->fd, key, cfg->timeout_ms, cfg->on_refused, cfg->on_refused_user, &l->gate, err);
  explicit_bzero(key, sizeof key);
  if (rc) {
    kvbm_fabric_cudaipc_listener_destroy(l);
    return rc;
  }
  *out = l;
  return KVBM_OK;
}

uint16_t kvbm_fabric_cudaipc_listener_port(const kvbm_fabric_cudaipc_listener *l) { return l ? l->port : 0; }

uint64_t kvbm_fabric_cudaipc_listener_refused(const kvbm_fabric_cudaipc_listener *l) {
  return l ? kvbm__gate_refused_count(l->gate) : 0;
}

void kvbm_fabric_cudaipc_listener_destroy(kvbm_fabric_cudaipc_listener *l) {
  if (!l) return;
  kvbm__gate_destroy(l->gate);
  if (l->fd >= 0) close(l->fd);
  free(l);
}

static int need_cuda(int device, bool need_device, kvbm_error *err) {
  if (!need_device) return KVBM_OK;
#ifdef KVBM_HAVE_CUDA
  return device_check(device, err);
#else
  (void)device;
  return kvbm_error_set(err, KVBM_EUNSUPPORTED, "fabric: cudaipc: this build has no CUDA runtime");
#endif
}

static int do_accept(kvbm_fabric_cudaipc_listener *l, bool need_device, kvbm_fabric **out, kvbm_error *err) {
  if (!l || !out) return kvbm_error_set(err, KVBM_EINVAL, "fabric: cudaipc: accept: NULL argument");
  int rc = need_cuda(l->cfg.device, need_device, err);
  if (rc) return rc;
  int64_t deadline = kvbm__sc_deadline(l->cfg.timeout_ms);
  for (;;) {
    int sock;
    kvbm__hs hs;
    char peer[KVBM__PEER_NAME];
    rc = kvbm__gate_accept(l->gate, deadline, &sock, &hs, peer, err);
    if (rc) return rc;
    kvbm_error e = {0};
    bool ours;
    rc = new_fabric(&l->cfg, l->name, sock, &hs, need_device, out, &ours, &e);
    kvbm__hs_wipe(&hs);
    if (rc == KVBM_OK) return KVBM_OK;
    if (ours) return kvbm_error_set(err, rc, "%s", e.msg);
    kvbm__gate_refused(l->gate, peer, rc, e.msg);
  }
}

static int do_connect(const kvbm_fabric_cudaipc_config *cfg, const char *host, uint16_t port, bool need_device,
                      kvbm_fabric **out, kvbm_error *err) {
  uint8_t key[KVBM__HELLO_KEY];
  int rc = check_cfg(cfg, key, err);
  if (!rc && !out) rc = kvbm_error_set(err, KVBM_EINVAL, "fabric: cudaipc: NULL out");
  if (!rc && port == 0) rc = kvbm_error_set(err, KVBM_EINVAL, "fabric: cudaipc: connect needs a port");
  if (!rc) rc = need_cuda(cfg->device, need_device, err);
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
  rc = new_fabric(cfg, cfg->name, sock, &hs, need_device, out, &ours, err);
  kvbm__hs_wipe(&hs);
  return rc;
}

int kvbm_fabric_cudaipc_accept(kvbm_fabric_cudaipc_listener *l, kvbm_fabric **out, kvbm_error *err) {
  return do_accept(l, true, out, err);
}

int kvbm_fabric_cudaipc_connect(const kvbm_fabric_cudaipc_config *cfg, const char *host, uint16_t port,
                                kvbm_fabric **out, kvbm_error *err) {
  return do_connect(cfg, host, port, true, out, err);
}

int kvbm__fabric_cudaipc_accept_nodev(kvbm_fabric_cudaipc_listener *l, kvbm_fabric **out, kvbm_error *err) {
  return do_accept(l, false, out, err);
}

int kvbm__fabric_cudaipc_connect_nodev(const kvbm_fabric_cudaipc_config *cfg, const char *host, uint16_t port,
                                       kvbm_fabric **out, kvbm_error *err) {
  return do_connect(cfg, host, port, false, out, err);
}
