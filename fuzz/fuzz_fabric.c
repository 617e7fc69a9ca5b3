/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_fabric.c: libFuzzer target for what the fabric parses from a peer:
 * the export envelope (kvbm_fabric_import) and block messages.
 * fuzz-modules: common service metrics blake3 frame layout fabric
 * fuzz-libs: ucp ucs
 *
 * Input byte 0 picks a mode:
 *   even: the rest is edits applied to a valid export of a real registered
 *         block set (so most inputs get past the magic and the layout
 *         decoder): pairs (u16 offset, u8 xor), then a u16 truncation.
 *         When the edited envelope is imported, the remaining input drives
 *         block and range reads and writes on it. The set lives at fixed
 *         addresses with guard pages around it, and ASan watches: any access
 *         the range checks let through outside the registered memory is a
 *         crash. Properties: import either fails with a negative status and
 *         a message, or every region of what it accepted lies inside the
 *         memory actually registered.
 *   odd:  the rest is a block message, decoded with small limits; an
 *         accepted message's tokens and body lie inside the input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fabric/fabric_impl.h"
#include "kvbm/fabric.h"

#define CHECK(x) \
  do {           \
    if (!(x)) __builtin_trap(); \
  } while (0)

#define NREG 3
#define BASE 0x500000000000ull /* ASan high memory, below its allocator (0x6000...) */
#define SPAN 0x100000ull       /* 1 MiB between regions: guard gaps */

static kvbm_layout g_layout;
static uint8_t *g_region[NREG];

static void setup(void) {
  if (g_region[0]) return;
  kvbm_layout_config c = {.num_blocks = 4, .num_layers = NREG, .outer_dim = 2, .page_size = 4,
                          .inner_dim = 8, .dtype_size = 2, .alignment = 64};
  CHECK(kvbm_layout_init(&g_layout, KVBM_LAYOUT_LAYER_SEPARATE, &c, NULL) == KVBM_OK);
  for (int r = 0; r < NREG; r++) {
    void *p = mmap((void *)(uintptr_t)(BASE + r * SPAN), g_layout.region_size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(p == (void *)(uintptr_t)(BASE + r * SPAN));
    g_region[r] = p;
  }
}

static uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }

static void fuzz_import(const uint8_t *in, size_t n) {
  kvbm_fabric *a, *b;
  CHECK(kvbm_fabric_inproc_pair("a", "b", &a, &b, NULL) == KVBM_OK);
  uint64_t bases[NREG];
  for (int r = 0; r < NREG; r++) bases[r] = (uint64_t)(uintptr_t)g_region[r];
  kvbm_layout_desc d = {.layout = g_layout, .memory = KVBM_MEMORY_SYSTEM, .device_id = -1,
                        .block_set_id = 5, .num_regions = NREG, .region_base = bases};
  kvbm_fabric_local_set *ls;
  CHECK(kvbm_fabric_register(b, &d, &ls, NULL) == KVBM_OK);
  uint8_t *wire;
  size_t wlen;
  CHECK(kvbm_fabric_export(ls, &wire, &wlen, NULL) == KVBM_OK);

  /* edits, then a truncation */
  size_t i = 0;
  size_t edits = n ? in[i++] % 8 : 0;
  for (size_t k = 0; k < edits && i + 3 <= n; k++, i += 3) wire[rd16(in + i) % wlen] ^= in[i + 2];
  size_t len = wlen;
  if (i + 2 <= n) {
    uint32_t t = rd16(in + i);
    i += 2;
    if (t < wlen) len = t;
  }
  kvbm_fabric_remote_set *rs = NULL;
  kvbm_error e = {0};
  int rc = kvbm_fabric_import(a, wire, len, &rs, &e);
  if (rc != KVBM_OK) {
    CHECK(rc < 0 && e.msg[0] != '\0' && rs == NULL);
  } else {
    const kvbm_layout_desc *rd = kvbm_fabric_remote_desc(rs);
    for (uint64_t r = 0; r < rd->num_regions; r++) {
      /* accepted regions lie inside what was registered */
      uint64_t lo = rd->region_base[r], hi = lo + rd->layout.region_size;
      int inside = 0;
      for (int q = 0; q < NREG; q++)
        if (lo >= bases[q] && hi <= bases[q] + g_layout.region_size) inside = 1;
      CHECK(inside);
    }
    /* drive accesses; ASan catches any that escape the checks */
    uint8_t buf[4096];
    memset(buf, 0xA5, sizeof buf);
    uint64_t bb = kvbm_fabric_block_bytes(&rd->layout);
    while (i + 6 <= n) {
      uint8_t op = in[i];
      uint64_t x = rd16(in + i + 1), off = rd16(in + i + 3);
      uint64_t l = in[i + 5] * 16ull;
      i += 6;
      if (op & 1) {
        if (bb <= sizeof buf) {
          rc = (op & 2) ? kvbm_fabric_write_block(a, rs, x % 8, buf, bb, NULL)
                        : kvbm_fabric_read_block(a, rs, x % 8, buf, bb, NULL);
          CHECK(rc == KVBM_OK || rc == KVBM_ERANGE);
        }
      } else {
        rc = (op & 2) ? kvbm_fabric_write(a, rs, x % 4, off, buf, l, NULL)
                      : kvbm_fabric_read(a, rs, x % 4, off, buf, l, NULL);
        CHECK(rc == KVBM_OK || rc == KVBM_ERANGE);
      }
    }
    kvbm_fabric_remote_set_release(rs);
  }
  free(wire);
  kvbm_fabric_local_set_release(ls);
  kvbm_fabric_destroy(a);
  kvbm_fabric_destroy(b);
}

static void fuzz_block_msg(const uint8_t *in, size_t n) {
  uint32_t tokens[16];
  kvbm_block_msg m;
  kvbm_error e = {0};
  int rc = kvbm_block_msg_decode(in, n, 16, 4096, tokens, &m, &e);
  if (rc != KVBM_OK) {
    CHECK(rc < 0 && e.msg[0] != '\0');
    return;
  }
  CHECK(m.num_tokens <= 16 && m.tokens == tokens && m.body_len <= 4096);
  if (m.placed) {
    CHECK(m.body == NULL);
  } else {
    CHECK(m.body >= in && m.body + m.body_len == in + n);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  setup();
  if (size == 0) return 0;
  if (data[0] & 1)
    fuzz_block_msg(data + 1, size - 1);
  else
    fuzz_import(data + 1, size - 1);
  return 0;
}
