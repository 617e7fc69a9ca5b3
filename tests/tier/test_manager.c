/* SPDX-License-Identifier: Apache-2.0 */
/* Tiered manager: bytes through G1 -> G2 -> G3 -> G1 for both layouts,
 * policies, queue-full skips, config and environment checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/resource.h>
#include <sys/vfs.h>
#include <sys/wait.h>

#include "volume/disk.h"
#include "tier/testing.h"
#include "kvbm/storage.h"
#include "tier_testutil.h"

/* A: 17 tokens (4 full blocks, 4 matchable); B: 29 tokens (7 full). With
 * G1 = G2 = 8 blocks, B pushes A out of G1 entirely and out of G2 except
 * its last block, while G3 (write-through here) keeps all of A. */
static void roundtrip_cfg(kvbm_layout_kind g1k, kvbm_layout_kind g2k, bool pages,
                          kvbm_memory_type g1mem, kvbm_memory_type g2mem, bool emu) {
  char *dir = tu_tmpdir("rt");
  kvbm_manager_config c = tu_config(dir, 8, 8, 64);
  kvbm__manager_testing tt = {.g1_emulate = emu};
  c.g1_kind = g1k;
  c.g2_kind = g2k;
  c.g1_memory = g1mem;
  c.g2_memory = g2mem;
  if (pages) /* 4096-byte layers, page-aligned: the disk moves them without a bounce copy */
    c.layout = (kvbm_layout_config){.num_blocks = 1, .num_layers = 2, .outer_dim = 2,
                                    .page_size = 4, .inner_dim = 256, .dtype_size = 2,
                                    .alignment = 4096};
  kvbm_manager *m = NULL;
  kvbm_error e = {0};
  int rc = kvbm__manager_create_testing(&c, &tt, &m, &e);
  if (!emu && (g1mem != KVBM_MEMORY_SYSTEM || g2mem != KVBM_MEMORY_SYSTEM)) {
    /* CUDA memory: a build without CUDA refuses it, a CUDA build on a
     * machine without a GPU reports no device; with a GPU the bytes must
     * make the same round trip. */
    int want = kvbm_storage_have_cuda() ? KVBM_EDEVICE : KVBM_EUNSUPPORTED;
    if (rc != KVBM_OK) {
      assert_int_equal(rc, want);
      assert_null(m);
      assert_true(strstr(e.msg, kvbm_storage_have_cuda() ? "device" : "CUDA build") != NULL);
      print_message("%s G1, %s G2: %s (skipped)\n", kvbm_memory_type_name(g1mem),
                    kvbm_memory_type_name(g2mem), e.msg);
      tu_rmdir(dir);
      return;
    }
    assert_true(kvbm_storage_have_cuda());
    assert_int_equal(kvbm_manager_memory(m, KVBM_TIER_G1), g1mem);
  }
  assert_int_equal(rc, KVBM_OK);
  assert_string_equal(kvbm_manager_g3_error(m), "");
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq_info info;
  assert_int_equal(tu_run(m, a, 17, &info, NULL), 0);
  kvbm_tier_stats s2, s3;
  kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  assert_int_equal(s2.offloaded_blocks, 4);
  assert_int_equal(s3.offloaded_blocks, 4);
  assert_int_equal(s2.offloaded_bytes, 4 * kvbm_manager_block_bytes(m));
  assert_int_equal(tu_run(m, b, 29, &info, NULL), 0);

  kvbm_mreq *r;
  assert_int_equal(tu_run(m, a, 17, &info, &r), 16);
  assert_true(info.ready);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G1], 0);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G2], 1);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G3], 3);
  assert_int_equal(tu_verify(m, r, 4), 4);
  kvbm_mreq_destroy(r);
  kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  assert_int_equal(s2.onboarded_blocks, 1);
  assert_int_equal(s3.onboarded_blocks, 3);
  assert_int_equal(s3.checksum_failures, 0);
  assert_int_equal(s2.hit_blocks, 1);
  assert_int_equal(s3.hit_blocks, 3);
  /* A third time: everything is in G1 now. */
  assert_int_equal(tu_run(m, a, 17, &info, NULL), 16);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G1], 4);
  kvbm_manager_destroy(m);
  free(a);
  free(b);
  tu_rmdir(dir);
}

static void roundtrip_mem(kvbm_layout_kind g1k, kvbm_layout_kind g2k, bool pages,
                          kvbm_memory_type g1mem, kvbm_memory_type g2mem) {
  roundtrip_cfg(g1k, g2k, pages, g1mem, g2mem, false);
}

static void roundtrip(kvbm_layout_kind g1k, kvbm_layout_kind g2k, bool pages) {
  roundtrip_mem(g1k, g2k, pages, KVBM_MEMORY_SYSTEM, KVBM_MEMORY_SYSTEM);
}

/* The device path without a GPU (kvbm__manager_testing.g1_emulate; any build): copies go
 * through the stream code (batches with an event per job, deferred to the
 * waits), G3 through the staging buffers; every layout pair, bounce and
 * page-sized blocks; also G3 straight from device G1 (no G2). */
static void test_emulated_device_roundtrip(void **st) {
  (void)st;
  const kvbm_layout_kind K[2] = {KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_LAYER_SEPARATE};
  for (int i = 0; i < 4; i++)
    for (int pages = 0; pages < 2; pages++)
      roundtrip_cfg(K[i / 2], K[i % 2], pages, KVBM_MEMORY_DEVICE, KVBM_MEMORY_SYSTEM, true);
  char *dir = tu_tmpdir("emu3");
  kvbm_manager_config c = tu_config(dir, 8, 0, 16);
  c.g1_memory = KVBM_MEMORY_DEVICE;
  kvbm__manager_testing tt = {.g1_emulate = true};
  kvbm_manager *m;
  assert_int_equal(kvbm__manager_create_testing(&c, &tt, &m, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_memory(m, KVBM_TIER_G1), KVBM_MEMORY_DEVICE);
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq_info info;
  kvbm_mreq *r;
  tu_run(m, a, 17, NULL, NULL);
  tu_run(m, b, 29, NULL, NULL);
  assert_int_equal(tu_run(m, a, 17, &info, &r), 16);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G3], 4);
  assert_int_equal(tu_verify(m, r, 4), 4);
  kvbm_mreq_destroy(r);
  kvbm_manager_destroy(m);
  free(a);
  free(b);
  tu_rmdir(dir);
}

/* A device copy that fails: an onboard's failure shortens the match (the
 * block is recomputed and the next request gets it whole), an offload's
 * leaves its G2 block FAILED (a miss, rewritten by the next use); both are
 * counted in copy_errors. Copies are numbered over the manager's life:
 * FullyContiguous G1 and G2 make one copy per block. */
static void emu_fail_case(uint32_t fail_copy, bool onboard) {
  kvbm_manager_config c = tu_config("/tmp", 8, 16, 0);
  c.g1_memory = KVBM_MEMORY_DEVICE;
  kvbm__manager_testing tt = {.g1_emulate = true, .g1_fail_copy = fail_copy};
  kvbm_manager *m;
  assert_int_equal(kvbm__manager_create_testing(&c, &tt, &m, NULL), KVBM_OK);
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq_info info;
  kvbm_mreq *r;
  kvbm_tier_stats s2;
  tu_run(m, a, 17, NULL, NULL); /* offloads: copies 1..4 */
  tu_run(m, b, 29, NULL, NULL); /* copies 5..11; A leaves G1 */
  kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
  assert_int_equal(s2.copy_errors, onboard ? 0 : 1);
  assert_int_equal(s2.offloaded_blocks, onboard ? 11 : 10);
  /* A again: onboards of blocks 0..3 are copies 12..15 (offload case: the
   * failed block 1 is a miss, so the walk stops there). */
  size_t got = tu_run(m, a, 17, &info, &r);
  if (onboard) {
    assert_int_equal(got, 4); /* copy 13 (block 1) failed */
    assert_int_equal(info.hit_blocks[KVBM_TIER_G2], 1);
  } else {
    assert_int_equal(got, 4); /* block 1's G2 copy is FAILED: a miss */
  }
  assert_int_equal(tu_verify(m, r, 4), 4); /* recomputed where it failed */
  kvbm_mreq_destroy(r);
  kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
  assert_int_equal(s2.copy_errors, 1);
  assert_int_equal(s2.onboard_failures, onboard ? 1 : 0);
  /* Flood G1 again: A now comes whole from G2 (the failed blocks were
   * rewritten by A's commit). */
  tu_run(m, b, 29, NULL, NULL);
  assert_int_equal(tu_run(m, a, 17, &info, &r), 16);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G2] + info.hit_blocks[KVBM_TIER_G1], 4);
  assert_true(info.hit_blocks[KVBM_TIER_G2] >= 1);
  assert_int_equal(tu_verify(m, r, 4), 4);
  kvbm_mreq_destroy(r);
  kvbm_manager_destroy(m);
  free(a);
  free(b);
}

static void test_emulated_device_failures(void **st) {
  (void)st;
  emu_fail_case(13, true);  /* an onboard copy */
  emu_fail_case(2, false);  /* an offload copy */
}

/* CUDA memory tiers: device G1 with pinned G2 (copies on CUDA streams),
 * pinned G1, and device G1 with system G2, both layouts. Here (no GPU) each
 * create must fail cleanly with KVBM_EDEVICE (CUDA build) or
 * KVBM_EUNSUPPORTED (no CUDA) and leave nothing behind (ASan checks). */
static void test_cuda_memory(void **st) {
  (void)st;
  const kvbm_layout_kind FC = KVBM_LAYOUT_FULLY_CONTIGUOUS, LS = KVBM_LAYOUT_LAYER_SEPARATE;
  roundtrip_mem(FC, FC, true, KVBM_MEMORY_DEVICE, KVBM_MEMORY_PINNED);
  roundtrip_mem(LS, FC, false, KVBM_MEMORY_DEVICE, KVBM_MEMORY_PINNED);
  roundtrip_mem(FC, LS, true, KVBM_MEMORY_DEVICE, KVBM_MEMORY_SYSTEM);
  roundtrip_mem(FC, FC, false, KVBM_MEMORY_PINNED, KVBM_MEMORY_PINNED);
  roundtrip_mem(FC, FC, false, KVBM_MEMORY_SYSTEM, KVBM_MEMORY_PINNED);
  /* Memory kinds a tier cannot have. */
  kvbm_manager_config c = tu_config("/tmp", 8, 8, 0);
  kvbm_manager *m = NULL;
  kvbm_error e = {0};
  c.g1_memory = KVBM_MEMORY_DISK;
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "g1_memory"));
  c = tu_config("/tmp", 8, 8, 0);
  c.g2_memory = KVBM_MEMORY_DEVICE;
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "g2_memory"));
  assert_null(m);
  /* Host G1: the engine's block read/write is a plain copy, bounds checked. */
  c = tu_config("/tmp", 8, 0, 0);
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_OK);
  assert_int_equal(kvbm_manager_memory(m, KVBM_TIER_G1), KVBM_MEMORY_SYSTEM);
  assert_int_equal(kvbm_manager_memory(m, KVBM_TIER_G2), 0);
  uint8_t in[128], out[129];
  for (int i = 0; i < 128; i++) in[i] = (uint8_t)(i * 7);
  assert_int_equal(kvbm_manager_block_write(m, KVBM_TIER_G1, 3, 2, in, 128, &e), KVBM_OK);
  assert_int_equal(kvbm_manager_block_read(m, KVBM_TIER_G1, 3, 2, out, 128, &e), KVBM_OK);
  assert_memory_equal(in, out, 128);
  assert_int_equal(kvbm_manager_block_read(m, KVBM_TIER_G1, 3, 2, out, 129, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_manager_block_read(m, KVBM_TIER_G1, 8, 0, out, 1, &e), KVBM_ERANGE);
  assert_int_equal(kvbm_manager_block_read(m, KVBM_TIER_G2, 0, 0, out, 1, &e), KVBM_ETIER);
  kvbm_manager_destroy(m);
}

static void test_roundtrip_fc_fc(void **st) {
  (void)st;
  roundtrip(KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_FULLY_CONTIGUOUS, false);
  roundtrip(KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_FULLY_CONTIGUOUS, true);
}
static void test_roundtrip_ls_ls(void **st) {
  (void)st;
  roundtrip(KVBM_LAYOUT_LAYER_SEPARATE, KVBM_LAYOUT_LAYER_SEPARATE, false);
  roundtrip(KVBM_LAYOUT_LAYER_SEPARATE, KVBM_LAYOUT_LAYER_SEPARATE, true);
}
static void test_roundtrip_fc_ls(void **st) {
  (void)st;
  roundtrip(KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_LAYER_SEPARATE, false);
  roundtrip(KVBM_LAYOUT_FULLY_CONTIGUOUS, KVBM_LAYOUT_LAYER_SEPARATE, true);
}
static void test_roundtrip_ls_fc(void **st) {
  (void)st;
  roundtrip(KVBM_LAYOUT_LAYER_SEPARATE, KVBM_LAYOUT_FULLY_CONTIGUOUS, false);
  roundtrip(KVBM_LAYOUT_LAYER_SEPARATE, KVBM_LAYOUT_FULLY_CONTIGUOUS, true);
}

/* G3 only (no G2): the disk copy comes straight from G1. */
static void test_g3_without_g2(void **st) {
  (void)st;
  char *dir = tu_tmpdir("g3only");
  kvbm_manager_config c = tu_config(dir, 8, 0, 16);
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq_info info;
  kvbm_mreq *r;
  tu_run(m, a, 17, NULL, NULL);
  tu_run(m, b, 29, NULL, NULL);
  assert_int_equal(tu_run(m, a, 17, &info, &r), 16);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G3], 4);
  assert_int_equal(tu_verify(m, r, 4), 4);
  kvbm_mreq_destroy(r);
  kvbm_tier_stats s2;
  kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
  assert_false(s2.present);
  kvbm_manager_destroy(m);
  free(a);
  free(b);
  tu_rmdir(dir);
}

/* The other I/O modes end to end: pread/pwrite with O_DIRECT, buffered
 * io_uring, and a tmpfs directory (when /dev/shm is one; kernels before
 * 6.6 refuse O_DIRECT there and the disk falls back to buffered, newer
 * ones accept it): each serves verified G3 hits and says which mode it
 * used. */
static void g3_mode_refused(const char *dir, bool direct, bool uring, uint32_t refuse,
                            bool pages, const char *want) {
  kvbm_manager_config c = tu_config(dir, 8, 0, 16);
  c.g3_direct = direct;
  c.g3_uring = uring;
  kvbm__manager_testing tt = {.g3_refuse = refuse};
  if (pages) /* page-sized layers: zero-copy slots */
    c.layout = (kvbm_layout_config){.num_blocks = 1, .num_layers = 2, .outer_dim = 2,
                                    .page_size = 4, .inner_dim = 256, .dtype_size = 2,
                                    .alignment = 4096};
  kvbm_manager *m;
  assert_int_equal(kvbm__manager_create_testing(&c, &tt, &m, NULL), KVBM_OK);
  if (want) assert_string_equal(kvbm_manager_g3_mode(m), want);
  else print_message("G3 on %s: %s\n", dir, kvbm_manager_g3_mode(m));
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq_info info;
  kvbm_mreq *r;
  tu_run(m, a, 17, NULL, NULL);
  tu_run(m, b, 29, NULL, NULL);
  assert_int_equal(tu_run(m, a, 17, &info, &r), 16);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G3], 4);
  assert_int_equal(tu_verify(m, r, 4), 4);
  kvbm_mreq_destroy(r);
  kvbm_manager_destroy(m);
  free(a);
  free(b);
}

static void g3_mode_roundtrip(const char *dir, bool direct, bool uring, const char *want) {
  g3_mode_refused(dir, direct, uring, 0, false, want);
}

/* The fallbacks, made to run: open(O_DIRECT) refused with EINVAL (what a
 * filesystem without O_DIRECT answers) gives buffered I/O, io_uring setup
 * refused (ENOSYS, as under seccomp) gives pread/pwrite; each still serves
 * verified G3 hits (bounce-copied and zero-copy slots) and says its mode.
 * The control run without refusals gets O_DIRECT on the same directory. */
static void test_g3_refused_fallbacks(void **st) {
  (void)st;
  char *dir = tu_tmpdir("refused");
  g3_mode_refused(dir, true, false, 0, false, "pread/pwrite+O_DIRECT");
  for (int pages = 0; pages < 2; pages++) {
    g3_mode_refused(dir, true, true, KVBM_DISK_REFUSE_O_DIRECT, pages, "io_uring+buffered");
    g3_mode_refused(dir, true, false, KVBM_DISK_REFUSE_O_DIRECT, pages, "pread/pwrite+buffered");
    g3_mode_refused(dir, true, true, KVBM_DISK_REFUSE_URING, pages, "pread/pwrite+O_DIRECT");
    g3_mode_refused(dir, true, true, KVBM_DISK_REFUSE_O_DIRECT | KVBM_DISK_REFUSE_URING, pages,
                    "pread/pwrite+buffered");
  }
  /* The same at the disk level: a slot written and read back whole. */
  kvbm__disk_config dc = {.dir = dir, .num_slots = 4, .data_bytes = 100, .fingerprint = 7,
                         .direct = true, .uring = true, .queue_depth = 2,
                         .test_refuse = KVBM_DISK_REFUSE_O_DIRECT | KVBM_DISK_REFUSE_URING};
  kvbm_disk *d;
  assert_int_equal(kvbm__disk_open(&dc, &d, NULL), KVBM_OK);
  assert_false(kvbm__disk_is_direct(d));
  assert_false(kvbm__disk_is_uring(d));
  uint8_t *buf = kvbm__disk_buffer(d);
  for (int i = 0; i < 100; i++) buf[i] = (uint8_t)(i * 13 + 1);
  kvbm_slot_header h = {.seq_hash = 42};
  kvbm__disk_seal(d, buf, NULL, &h);
  kvbm__disk_io io = {.slot = 3, .buf = buf, .write = true};
  assert_int_equal(kvbm__disk_begin(d, &io), KVBM_OK);
  assert_ptr_equal(kvbm__disk_reap(d), &io);
  assert_int_equal(io.result, 0);
  memset(buf, 0, kvbm__disk_slot_size(d));
  io.write = false;
  assert_int_equal(kvbm__disk_begin(d, &io), KVBM_OK);
  assert_ptr_equal(kvbm__disk_reap(d), &io);
  assert_int_equal(io.result, 0);
  uint64_t want = 42;
  assert_int_equal(kvbm__disk_check(d, buf, NULL, true, &want, NULL), KVBM_OK);
  assert_int_equal(buf[99], (uint8_t)(99 * 13 + 1));
  free(buf);
  kvbm__disk_close(d);
  tu_rmdir(dir);
}

static void test_g3_io_modes(void **st) {
  (void)st;
  char *dir = tu_tmpdir("modes");
  g3_mode_roundtrip(dir, true, false, "pread/pwrite+O_DIRECT");
  g3_mode_roundtrip(dir, false, true, "io_uring+buffered");
  g3_mode_roundtrip(dir, false, false, "pread/pwrite+buffered");
  tu_rmdir(dir);
  struct statfs sf;
  if (statfs("/dev/shm", &sf) == 0 && sf.f_type == 0x01021994 && access("/dev/shm", W_OK) == 0) {
    char shm[] = "/dev/shm/tier-shm-XXXXXX";
    assert_non_null(mkdtemp(shm));
    g3_mode_roundtrip(shm, true, true, NULL);
    char *d = strdup(shm);
    tu_rmdir(d);
  } else {
    print_message("no tmpfs at /dev/shm: the O_DIRECT refusal case is not run\n");
  }
}

/* The frequency filter: the first use does not earn a disk copy, the
 * second does; a block already on disk is not copied again. */
static void test_frequency_filter(void **st) {
  (void)st;
  char *dir = tu_tmpdir("freq");
  kvbm_manager_config c = tu_config(dir, 16, 16, 16);
  c.g3_policy = KVBM_OFFLOAD_FREQUENCY;
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  uint32_t *a = tu_prompt(1000, 17);
  kvbm_tier_stats s3, s2;
  tu_run(m, a, 17, NULL, NULL);
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  assert_int_equal(s3.offloaded_blocks, 0);
  assert_int_equal(s3.filtered, 4);
  tu_run(m, a, 17, NULL, NULL);
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
  assert_int_equal(s3.offloaded_blocks, 4);
  assert_int_equal(s2.offloaded_blocks, 4); /* G2 already had them */
  tu_run(m, a, 17, NULL, NULL);
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  assert_int_equal(s3.offloaded_blocks, 4);
  kvbm_manager_destroy(m);
  free(a);
  tu_rmdir(dir);
}

/* G2 behind the filter too, and "never". */
static void test_policies_switchable(void **st) {
  (void)st;
  kvbm_manager_config c = tu_config("/tmp", 16, 16, 0);
  c.g2_policy = KVBM_OFFLOAD_FREQUENCY;
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  uint32_t *a = tu_prompt(1000, 17);
  kvbm_tier_stats s2;
  tu_run(m, a, 17, NULL, NULL);
  kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
  assert_int_equal(s2.offloaded_blocks, 0);
  tu_run(m, a, 17, NULL, NULL);
  kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
  assert_int_equal(s2.offloaded_blocks, 4);
  kvbm_manager_destroy(m);
  c.g2_policy = KVBM_OFFLOAD_NEVER;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  tu_run(m, a, 17, NULL, NULL);
  tu_run(m, a, 17, NULL, NULL);
  kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
  assert_int_equal(s2.offloaded_blocks, 0);
  assert_int_equal(s2.filtered, 8);
  kvbm_manager_destroy(m);
  free(a);
  kvbm_offload_policy p;
  assert_true(kvbm_offload_policy_parse("frequency", &p));
  assert_int_equal(p, KVBM_OFFLOAD_FREQUENCY);
  assert_false(kvbm_offload_policy_parse("sometimes", &p));
}

/* A queue of one job: one commit of 7 blocks queues one offload and
 * skips (and counts) the rest, without waiting. */
static void test_queue_full_skips(void **st) {
  (void)st;
  kvbm_manager_config c = tu_config("/tmp", 16, 16, 0);
  c.queue_capacity = 1;
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  uint32_t *b = tu_prompt(5000, 29);
  tu_run(m, b, 29, NULL, NULL);
  kvbm_tier_stats s2;
  kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
  assert_int_equal(s2.offloaded_blocks, 1);
  assert_int_equal(s2.skipped_queue, 6);
  kvbm_manager_destroy(m);
  free(b);
}

/* Destroy with copies queued: cancel and drain both end cleanly. */
static void test_destroy_with_queued_copies(void **st) {
  (void)st;
  for (int drain = 0; drain < 2; drain++) {
    char *dir = tu_tmpdir("shut");
    kvbm_manager_config c = tu_config(dir, 64, 64, 64);
    c.drain_on_destroy = drain;
    kvbm_manager *m;
    assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
    uint32_t *b = tu_prompt(5000, 200);
    kvbm_mreq *r;
    assert_int_equal(kvbm_manager_prefill(m, 0, 0, b, 200, &r, NULL, NULL), KVBM_OK);
    tu_compute(m, r, 0);
    kvbm_mreq_commit(r);
    kvbm_mreq_destroy(r);
    kvbm_manager_destroy(m); /* no flush */
    free(b);
    tu_rmdir(dir);
  }
}

/* One engine thread, two requests on the same prompt: the second does not
 * get (nor wait for) blocks the first has not committed; once committed,
 * they are hits; blocks of a request destroyed uncommitted are recomputed
 * by the next one. */
static void test_uncommitted_blocks(void **st) {
  (void)st;
  kvbm_manager_config c = tu_config("/tmp", 32, 0, 0);
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  uint32_t *a = tu_prompt(1000, 17);
  kvbm_mreq *r1, *r2, *r3;
  kvbm_mreq_info info;
  size_t opt;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, a, 17, &r1, &opt, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, a, 17, &r2, &opt, NULL), KVBM_OK);
  assert_int_equal(opt, 16); /* registered: the walk finds them */
  assert_int_equal(kvbm_mreq_wait(r2, 2000, &info), KVBM_OK);
  assert_int_equal(info.matched_tokens, 0); /* but they hold no KV yet */
  assert_false(kvbm_mreq_must_compute(r2, 0)); /* and are r1's to write */
  assert_true(kvbm_mreq_must_compute(r1, 0));
  tu_compute(m, r1, 0);
  assert_int_equal(kvbm_mreq_commit(r1), KVBM_OK);
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, a, 17, &r3, &opt, NULL), KVBM_OK);
  assert_int_equal(kvbm_mreq_wait(r3, 2000, &info), KVBM_OK);
  assert_int_equal(info.matched_tokens, 16);
  assert_int_equal(tu_verify(m, r3, 4), 4);
  kvbm_mreq_destroy(r3);
  kvbm_mreq_destroy(r2);
  kvbm_mreq_destroy(r1);

  /* Destroyed without commit: the next request must compute them. */
  uint32_t *b = tu_prompt(7000, 17);
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, b, 17, &r1, NULL, NULL), KVBM_OK);
  kvbm_mreq_destroy(r1);
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, b, 17, &r2, &opt, NULL), KVBM_OK);
  assert_int_equal(opt, 16);
  assert_int_equal(kvbm_mreq_wait(r2, 2000, &info), KVBM_OK);
  assert_int_equal(info.matched_tokens, 0);
  assert_true(kvbm_mreq_must_compute(r2, 0));
  tu_compute(m, r2, 0);
  kvbm_mreq_commit(r2);
  kvbm_mreq_destroy(r2);
  assert_int_equal(tu_run(m, b, 17, &info, NULL), 16);
  kvbm_manager_destroy(m);
  free(a);
  free(b);
}

typedef struct g1_log {
  size_t n;
  const void *ctx[64];
  uint64_t hash[64];
} g1_log;

static void on_g1_stored(void *user, const kvbm_pool_event *ev) {
  g1_log *l = user;
  if (ev->kind != KVBM_POOL_STORED || l->n == 64) return;
  l->ctx[l->n] = ev->context;
  l->hash[l->n++] = ev->seq_hash;
}

/* G1's listener learns from each registration which request made it:
 * a prefill's new blocks, an append's full block, and the blocks a prefill
 * onboards from G2 all name their request. */
static void test_listener_names_the_request(void **st) {
  (void)st;
  g1_log log = {0};
  kvbm_manager_config c = tu_config("/tmp", 8, 32, 0);
  c.listener[KVBM_TIER_G1] = on_g1_stored;
  c.listener_user[KVBM_TIER_G1] = &log;
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  uint32_t *a = tu_prompt(100, 9), *b = tu_prompt(5000, 9);
  kvbm_mreq *r1, *r2, *r3;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, a, 9, &r1, NULL, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, b, 9, &r2, NULL, NULL), KVBM_OK);
  uint32_t more[3] = {1, 2, 3};
  assert_int_equal(kvbm_mreq_append(r1, more, 3), KVBM_OK); /* fills block 2 */
  assert_int_equal(log.n, 5);
  for (size_t i = 0; i < 5; i++) assert_ptr_equal(log.ctx[i], i == 2 || i == 3 ? (void *)r2 : (void *)r1);
  tu_compute(m, r1, 0);
  tu_compute(m, r2, 0);
  assert_int_equal(kvbm_mreq_commit(r1), KVBM_OK);
  assert_int_equal(kvbm_mreq_commit(r2), KVBM_OK);
  kvbm_manager_flush(m);
  kvbm_mreq_destroy(r1);
  kvbm_mreq_destroy(r2);
  /* Push a's blocks out of G1 (8 blocks), then onboard them from G2. */
  uint32_t *f = tu_prompt(90000, 29);
  assert_int_equal(tu_run(m, f, 29, NULL, NULL), 0);
  size_t before = log.n;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, a, 9, &r3, NULL, NULL), KVBM_OK);
  kvbm_mreq_info info;
  assert_int_equal(kvbm_mreq_wait(r3, -1, &info), KVBM_OK);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G2], 2);
  assert_true(log.n > before);
  for (size_t i = before; i < log.n; i++) assert_ptr_equal(log.ctx[i], r3);
  kvbm_mreq_destroy(r3);
  kvbm_manager_destroy(m);
  free(a);
  free(b);
  free(f);
}

static void test_config_errors(void **st) {
  (void)st;
  kvbm_manager *m = NULL;
  kvbm_error e = {0};
  kvbm_manager_config c = tu_config("/tmp", 0, 0, 0);
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "g1_blocks"));
  c = tu_config("/tmp", 8, 0, 0);
  c.block_size = 0;
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "block_size"));
  c = tu_config("/tmp", 8, 0, 0);
  c.layout.alignment = 3;
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  c = tu_config("/tmp", 8, 0, 0);
  c.g2_kind = 9;
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  assert_non_null(strstr(e.msg, "g2 layout"));
  c = tu_config("/tmp", 8, 0, 0);
  c.queue_capacity = 0;
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  c = tu_config("/tmp", 8, 0, 0);
  c.g3_queue_depth = 0;
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  c = tu_config("/tmp", 8, 0, 0);
  c.g2_policy = 7;
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_EINVAL);
  assert_null(m);
  assert_int_equal(kvbm_manager_create(NULL, &m, &e), KVBM_EINVAL);

  /* Requests: bad arguments and a prompt that does not fit. */
  c = tu_config("/tmp", 4, 0, 0);
  assert_int_equal(kvbm_manager_create(&c, &m, &e), KVBM_OK);
  uint32_t *t = tu_prompt(1, 40);
  kvbm_mreq *r = NULL;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, t, 0, &r, NULL, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, NULL, 4, &r, NULL, &e), KVBM_EINVAL);
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, t, 40, &r, NULL, &e), KVBM_ENOSPC);
  assert_non_null(strstr(e.msg, "does not fit"));
  assert_null(r);
  void *p;
  assert_int_equal(kvbm_manager_block_layer(m, KVBM_TIER_G3, 0, 0, &p, NULL), KVBM_ETIER);
  assert_int_equal(kvbm_manager_block_layer(m, KVBM_TIER_G2, 0, 0, &p, NULL), KVBM_ETIER);
  assert_int_equal(kvbm_manager_block_layer(m, KVBM_TIER_G1, 4, 0, &p, NULL), KVBM_ERANGE);
  assert_int_equal(kvbm_manager_block_layer(m, KVBM_TIER_G1, 0, 3, &p, NULL), KVBM_ERANGE);
  assert_int_equal(kvbm_mreq_append(NULL, t, 1), KVBM_EINVAL);
  kvbm_manager_destroy(m);
  free(t);
}

static void test_env(void **st) {
  (void)st;
  kvbm_manager_config c = tu_config("/tmp", 8, 0, 0); /* 384-byte blocks */
  const char *env1[] = {"DYN_KVBM_CPU_CACHE_GB=0.5", "DYN_KVBM_DISK_CACHE_GB=1",
                        "DYN_KVBM_DISK_CACHE_DIR=/var/tmp/x", "DYN_KVBM_DISK_DISABLE_O_DIRECT=true",
                        NULL};
  assert_int_equal(kvbm_manager_config_env(&c, env1, NULL), KVBM_OK);
  assert_int_equal(c.g2_blocks, (uint32_t)(536870912ull / 384));
  assert_int_equal(c.g3_blocks, 1073741824ull / 384);
  assert_string_equal(c.g3_dir, "/var/tmp/x");
  assert_false(c.g3_direct);
  const char *env2[] = {"DYN_KVBM_CPU_CACHE_GB=2", "DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS=123",
                        "DYN_KVBM_DISK_CACHE_OVERRIDE_NUM_BLOCKS=77",
                        "DYN_KVBM_DISK_DISABLE_O_DIRECT=0", NULL};
  assert_int_equal(kvbm_manager_config_env(&c, env2, NULL), KVBM_OK);
  assert_int_equal(c.g2_blocks, 123);
  assert_int_equal(c.g3_blocks, 77);
  assert_true(c.g3_direct);
  const char *bad[][2] = {{"DYN_KVBM_CPU_CACHE_GB=lots", NULL},
                          {"DYN_KVBM_CPU_CACHE_GB=-1", NULL},
                          {"DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS=12x", NULL},
                          {"DYN_KVBM_DISK_CACHE_OVERRIDE_NUM_BLOCKS=99999999999", NULL},
                          {"DYN_KVBM_DISK_DISABLE_O_DIRECT=maybe", NULL},
                          {"DYN_KVBM_DISK_CACHE_DIR=", NULL}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kvbm_error e = {0};
    kvbm_manager_config before = c;
    assert_int_equal(kvbm_manager_config_env(&c, bad[i], &e), KVBM_EINVAL);
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(strchr(bad[i][0], '=') - bad[i][0]), bad[i][0]);
    assert_non_null(strstr(e.msg, name));
    assert_memory_equal(&before, &c, sizeof c);
  }
}


/* Virtual memory of this process now (VmSize, bytes), or 0. */
static uint64_t vm_size(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  uint64_t kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmSize: %lu kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb * 1024;
}

/* The G2 and G3 indexes keep no token slots (they only ever name blocks
 * filled whole, and never read tokens back): with 16384-token blocks a
 * manager of 16384 G2 and 16384 G3 blocks fits in 512 MiB of address
 * space, where each index alone used to take 1 GiB of slots (4 bytes x
 * block_size per block; 64 of the 151 heap bytes per G3 block at the
 * default block size). In a child under RLIMIT_AS; not under sanitizers,
 * which reserve terabytes of address space. */
static void test_lower_tiers_keep_no_tokens(void **st) {
  (void)st;
#ifdef KVBM_SANITIZED
  print_message("sanitizer build: the address-space limit is not applied\n");
  skip();
#endif
  char *dir = tu_tmpdir("notok");
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    kvbm_manager_config c = tu_config(dir, 8, 16384, 16384);
    c.block_size = 16384;
    c.layout.page_size = 1; /* small blocks of KV: the slots are what is measured */
    c.g3_direct = false;
    uint64_t vm = vm_size();
    struct rlimit rl = {vm + (512u << 20), vm + (512u << 20)};
    if (!vm || setrlimit(RLIMIT_AS, &rl)) _exit(10);
    kvbm_manager *m;
    kvbm_error e = {0};
    if (kvbm_manager_create(&c, &m, &e)) {
      fprintf(stderr, "child: create: %s\n", e.msg);
      _exit(11);
    }
    if (strcmp(kvbm_manager_g3_error(m), "")) _exit(12);
    kvbm_tier_stats s2, s3;
    kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
    kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
    kvbm_manager_destroy(m);
    _exit(s2.present && s3.present ? 0 : 13);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  tu_rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_fc_fc),   cmocka_unit_test(test_roundtrip_ls_ls),
      cmocka_unit_test(test_roundtrip_fc_ls),   cmocka_unit_test(test_roundtrip_ls_fc),
      cmocka_unit_test(test_g3_without_g2),     cmocka_unit_test(test_g3_io_modes),
      cmocka_unit_test(test_g3_refused_fallbacks),
      cmocka_unit_test(test_emulated_device_roundtrip),
      cmocka_unit_test(test_emulated_device_failures),
      cmocka_unit_test(test_frequency_filter),
      cmocka_unit_test(test_policies_switchable), cmocka_unit_test(test_queue_full_skips),
      cmocka_unit_test(test_destroy_with_queued_copies), cmocka_unit_test(test_uncommitted_blocks),
      cmocka_unit_test(test_config_errors),     cmocka_unit_test(test_cuda_memory),
      cmocka_unit_test(test_env), cmocka_unit_test(test_lower_tiers_keep_no_tokens),
      cmocka_unit_test(test_listener_names_the_request),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
