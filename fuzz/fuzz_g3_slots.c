/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_g3_slots.c: libFuzzer target for the G3 slot file's readers
 * (src/volume/disk.c), which treat the file as hostile input: the slot
 * header check (records v1 and v2, the tag) and the superblock at open
 * (geometry, the label area).
 * fuzz-modules: common blake3 volume/disk.c
 * fuzz-libs: uring xxhash
 *
 * The first byte picks what the rest is:
 *   bit 0 clear  a slot: the rest is a slot (data then header) checked by
 *                kvbm__disk_check; bit 1 re-seals the header's XXH3 sum
 *                first (anyone who can write the file can), so that the
 *                field rules behind the sum are what gets explored; bit 2
 *                checks the data too, bit 3 expects a hash.
 *   bit 0 set    a superblock: the rest is written as the first 4096
 *                bytes of a persistent file, opened under the label "L".
 * Properties: never a crash, leak or read outside the buffers; a slot
 * accepted obeys the record rules (v1: flags 0 or 1 and tag 0; v2: a tag
 * 1..255, no other flag bit); an open either succeeds or refuses with
 * KVBM_EFORMAT and a message (a valid label other than "L").
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "volume/disk.h"

#define DATA 200u /* data_bytes: one slot of 4096, header at 200 */
#define FP 0x1234567890abcdefull

static kvbm_disk *disk;
static uint8_t *slot;
static char dir[64];

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/fuzz-g3-XXXXXX");
  if (!mkdtemp(dir)) abort();
  kvbm__disk_config c = {.dir = dir, .num_slots = 1, .data_bytes = DATA, .fingerprint = FP,
                         .queue_depth = 1};
  if (kvbm__disk_open(&c, &disk, NULL)) abort();
  slot = kvbm__disk_buffer(disk);
  if (!slot) abort();
}

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

static void check_slot(uint8_t mode, const uint8_t *in, size_t n) {
  size_t sz = (size_t)kvbm__disk_slot_size(disk);
  memset(slot, 0, sz);
  memcpy(slot, in, n < sz ? n : sz);
  uint8_t *h = slot + DATA;
  if (mode & 2) {
    uint64_t s = XXH3_64bits(h, 56);
    for (int i = 0; i < 8; i++) h[56 + i] = (uint8_t)(s >> (8 * i));
  }
  uint64_t want = 0;
  memcpy(&want, h + 8, 8);
  kvbm_slot_header out;
  int rc = kvbm__disk_check(disk, slot, NULL, mode & 4, (mode & 8) ? &want : NULL, &out);
  if (rc != KVBM_OK) return;
  uint32_t flags = le32(h + 24);
  bool v2 = !memcmp(h, "KVBMSLT2", 8);
  if (v2 ? (out.tag == 0 || (flags & ~0xFF01u) || out.tag != ((flags >> 8) & 0xFF))
         : (out.tag != 0 || (flags & ~1u) || memcmp(h, "KVBMSLT1", 8)))
    abort();
  if (out.has_parent != (flags & 1)) abort();
}

static void check_super(const uint8_t *in, size_t n) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, KVBM_DISK_FILE_NAME);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) abort();
  uint8_t sb[4096] = {0};
  memcpy(sb, in, n < sizeof sb ? n : sizeof sb);
  if (write(fd, sb, sizeof sb) != (ssize_t)sizeof sb) abort();
  close(fd);
  kvbm__disk_config c = {.dir = dir, .num_slots = 1, .data_bytes = DATA, .fingerprint = FP,
                         .queue_depth = 1, .persist = true, .label = "L"};
  kvbm_disk *d = NULL;
  kvbm_error e = {0};
  int rc = kvbm__disk_open(&c, &d, &e);
  if (rc == KVBM_OK) {
    kvbm__disk_close(d);
  } else if (rc != KVBM_EFORMAT || !e.msg[0]) {
    abort();
  }
  unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!disk) setup();
  if (size < 1) return 0;
  if (data[0] & 1) check_super(data + 1, size - 1);
  else check_slot(data[0], data + 1, size - 1);
  return 0;
}
