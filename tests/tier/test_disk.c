/* SPDX-License-Identifier: Apache-2.0 */
/* G3 faults and persistence: a flipped byte, a full disk (RLIMIT_FSIZE),
 * an unusable directory, warm restart across processes, the slot codec on
 * its own; and the persistent file against other users: planted links and
 * files, modes of files and directories, the private default directory,
 * forged slots with and without a checksum key. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <cmocka.h>
#include <xxhash.h>

#include "volume/disk.h"
#include "tier_testutil.h"

/* Flips byte `at` (from the slot's start: data, then the header at
 * data_bytes) of the slot holding hash h in dir's persistent file; returns
 * whether it found the slot. */
static int flip_slot(const char *dir, uint64_t h, uint64_t slot_size, uint64_t data_bytes,
                     size_t at) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, KVBM_DISK_FILE_NAME);
  int fd = open(path, O_RDWR);
  if (fd < 0) return 0;
  struct stat sb;
  fstat(fd, &sb);
  int found = 0;
  for (off_t off = KVBM_DISK_ALIGN; off + (off_t)slot_size <= sb.st_size && !found;
       off += (off_t)slot_size) {
    uint8_t hdr[16];
    if (pread(fd, hdr, 16, off + (off_t)data_bytes) != 16) break;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | hdr[8 + i];
    if (memcmp(hdr, "KVBMSLT1", 8) || v != h) continue;
    uint8_t c;
    if (pread(fd, &c, 1, off + (off_t)at) != 1) break;
    c ^= 0x40;
    found = pwrite(fd, &c, 1, off + (off_t)at) == 1;
  }
  fsync(fd);
  close(fd);
  return found;
}

static uint64_t slot_size_for(kvbm_manager *m) {
  return (kvbm_manager_block_bytes(m) + KVBM_DISK_HEADER + KVBM_DISK_ALIGN - 1) &
         ~(uint64_t)(KVBM_DISK_ALIGN - 1);
}

/* A flipped byte in block 2's slot: the onboard fails its checksum, the
 * match stops at block 2, nothing wrong reaches G1; once recomputed and
 * committed, the slot is rewritten. */
static void flipped_byte(bool pages) {
  char *dir = tu_tmpdir("flip");
  kvbm_manager_config c = tu_config(dir, 8, 0, 64);
  c.g3_persist = true;
  if (pages) /* zero-copy slots: the bad bytes land in G1 and must be refused there */
    c.layout = (kvbm_layout_config){.num_blocks = 1, .num_layers = 2, .outer_dim = 2,
                                    .page_size = 4, .inner_dim = 256, .dtype_size = 2,
                                    .alignment = 4096};
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  print_message("G3 mode: %s\n", kvbm_manager_g3_mode(m));
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq *r;
  kvbm_mreq_info info;
  tu_run(m, a, 17, NULL, &r);
  uint64_t h2;
  kvbm_mreq_block_hash(r, 2, &h2);
  kvbm_mreq_destroy(r);
  tu_run(m, b, 29, NULL, NULL); /* A leaves G1 */
  assert_true(flip_slot(dir, h2, slot_size_for(m), kvbm_manager_block_bytes(m), 100));

  size_t opt;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, a, 17, &r, &opt, NULL), KVBM_OK);
  assert_int_equal(opt, 16); /* the walk found all four on disk */
  assert_int_equal(kvbm_mreq_wait(r, -1, &info), KVBM_OK);
  assert_int_equal(info.matched_tokens, 8);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G3], 2);
  assert_int_equal(tu_verify(m, r, 2), 2);
  kvbm_tier_stats s3;
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  assert_int_equal(s3.checksum_failures, 1);
  assert_int_equal(s3.onboard_failures, 1);
  assert_int_equal(s3.onboarded_blocks, 3); /* blocks 0, 1 and 3 */
  uint64_t written = s3.offloaded_blocks;
  tu_compute(m, r, 2);
  kvbm_mreq_commit(r);
  kvbm_manager_flush(m);
  kvbm_mreq_destroy(r);
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  assert_int_equal(s3.offloaded_blocks, written + 1); /* block 2 rewritten */
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

static void test_flipped_byte_is_a_miss(void **st) {
  (void)st;
  flipped_byte(false);
  flipped_byte(true);
}

/* A bad header (not data) is also a counted miss. */
static void test_flipped_header_is_a_miss(void **st) {
  (void)st;
  char *dir = tu_tmpdir("fliphdr");
  kvbm_manager_config c = tu_config(dir, 8, 0, 64);
  c.g3_persist = true;
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq *r;
  kvbm_mreq_info info;
  tu_run(m, a, 17, NULL, &r);
  uint64_t h0;
  kvbm_mreq_block_hash(r, 0, &h0);
  kvbm_mreq_destroy(r);
  tu_run(m, b, 29, NULL, NULL);
  assert_true(flip_slot(dir, h0, slot_size_for(m), kvbm_manager_block_bytes(m),
                        kvbm_manager_block_bytes(m) + 44)); /* the write sequence */
  assert_int_equal(tu_run(m, a, 17, &info, NULL), 0);
  kvbm_tier_stats s3;
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  assert_int_equal(s3.checksum_failures, 1);
  kvbm_manager_destroy(m);
  free(a);
  free(b);
  tu_rmdir(dir);
}

/* In a child limited to a file of a few slots: preallocation fails, some
 * writes fail with EFBIG; they are skipped and counted, what was written
 * still serves, G2 keeps serving. Exit code = first failed check. */
static int full_disk_child(const char *dir) {
  signal(SIGXFSZ, SIG_IGN);
  kvbm_manager_config c = tu_config(dir, 16, 16, 64);
  kvbm_manager *m;
  if (kvbm_manager_create(&c, &m, NULL)) return 10;
  uint64_t slot = slot_size_for(m);
  kvbm_manager_destroy(m);
  struct rlimit rl = {KVBM_DISK_ALIGN + 3 * slot, KVBM_DISK_ALIGN + 3 * slot};
  if (setrlimit(RLIMIT_FSIZE, &rl)) return 11;
  if (kvbm_manager_create(&c, &m, NULL)) return 12;
  if (strcmp(kvbm_manager_g3_error(m), "")) return 13;
  uint32_t *a = tu_prompt(1000, 33); /* 8 full blocks */
  kvbm_mreq_info info;
  if (tu_run(m, a, 33, NULL, NULL) != 0) return 14;
  kvbm_tier_stats s3, s2;
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  if (s3.skipped_io == 0 || s3.offloaded_blocks + s3.skipped_io != 8) return 15;
  if (s3.offloaded_blocks == 0) return 16;
  /* Still serving: the same prompt again (all in G1), and a new one. */
  if (tu_run(m, a, 33, &info, NULL) != 32) return 17;
  uint32_t *b = tu_prompt(9000, 61);
  if (tu_run(m, b, 61, NULL, NULL) == SIZE_MAX) return 18;
  kvbm_manager_stats_get(m, KVBM_TIER_G2, &s2);
  if (s2.offloaded_blocks != 8 + 15) return 19;
  /* What was written before the disk filled is intact: push A out of G1
   * and G2, then its first blocks (the slots below the limit) come back
   * from G3, verified; the match stops at the first slot that failed. */
  uint32_t *f = tu_prompt(20000, 61);
  if (tu_run(m, f, 61, NULL, NULL) == SIZE_MAX) return 20;
  kvbm_mreq *r;
  if (tu_run(m, a, 33, &info, &r) != 4 * 3) return 21; /* slots 0..2 fit under the limit */
  if (info.hit_blocks[KVBM_TIER_G3] != 3 || tu_verify(m, r, 3) != 3) return 22;
  kvbm_mreq_destroy(r);
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  if (s3.checksum_failures || s3.read_errors) return 23;
  kvbm_manager_destroy(m);
  free(a);
  free(b);
  free(f);
  return 0;
}

static void test_disk_full(void **st) {
  (void)st;
  char *dir = tu_tmpdir("full");
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(full_disk_child(dir));
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  tu_rmdir(dir);
}

/* A G3 directory that cannot hold a file: create succeeds, G3 is
 * unavailable (and says why), offloads there are skipped and counted, G2
 * still serves hits. */
static void test_unusable_dir(void **st) {
  (void)st;
  char *dir = tu_tmpdir("nodir");
  char file[600], bad[700];
  snprintf(file, sizeof file, "%s/plainfile", dir);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  snprintf(bad, sizeof bad, "%s/sub", file); /* ENOTDIR, even for root */
  kvbm_manager_config c = tu_config(bad, 8, 16, 16);
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  assert_non_null(strstr(kvbm_manager_g3_error(m), "sub"));
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  kvbm_mreq_info info;
  tu_run(m, a, 17, NULL, NULL);
  tu_run(m, b, 29, NULL, NULL);
  kvbm_tier_stats s3;
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  assert_false(s3.present);
  assert_int_equal(s3.skipped_unavailable, 4 + 7);
  assert_int_equal(s3.offloaded_blocks, 0);
  assert_int_equal(tu_run(m, a, 17, &info, NULL), 16);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G2], 4);
  kvbm_manager_destroy(m);
  free(a);
  free(b);
  tu_rmdir(dir);
}

/* Warm restart: a child process writes A and B to a persistent G3 and
 * exits; one of A's slot headers is then corrupted; a new manager in this
 * process rebuilds the index from the headers (that slot skipped) and
 * serves A's blocks before it. (A slot whose data is damaged is found when
 * it is read: test_flipped_byte_is_a_miss; a restart reads headers only.) */
static void test_warm_restart(void **st) {
  (void)st;
  char *dir = tu_tmpdir("warm");
  kvbm_manager_config c = tu_config(dir, 8, 0, 64);
  c.g3_persist = true;
  uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    kvbm_manager *m;
    if (kvbm_manager_create(&c, &m, NULL)) _exit(1);
    tu_run(m, a, 17, NULL, NULL);
    tu_run(m, b, 29, NULL, NULL);
    kvbm_tier_stats s3;
    kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
    kvbm_manager_destroy(m);
    _exit(s3.offloaded_blocks == 11 ? 0 : 2);
  }
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);

  /* The hash of A's block 2, from a throwaway G1-only manager. */
  kvbm_manager_config c1 = tu_config(dir, 8, 0, 0);
  kvbm_manager *m;
  kvbm_mreq *r;
  assert_int_equal(kvbm_manager_create(&c1, &m, NULL), KVBM_OK);
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, a, 17, &r, NULL, NULL), KVBM_OK);
  uint64_t h2;
  kvbm_mreq_block_hash(r, 2, &h2);
  uint64_t slot = slot_size_for(m), bytes = kvbm_manager_block_bytes(m);
  kvbm_mreq_destroy(r);
  kvbm_manager_destroy(m);
  assert_true(flip_slot(dir, h2, slot, bytes, bytes + 44)); /* its write sequence */

  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  kvbm_tier_stats s3;
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  assert_int_equal(s3.restored_blocks, 10);
  assert_int_equal(s3.restore_skipped, 1);
  kvbm_mreq_info info;
  size_t opt;
  assert_int_equal(kvbm_manager_prefill(m, 0, 0, a, 17, &r, &opt, NULL), KVBM_OK);
  assert_int_equal(opt, 8);
  assert_int_equal(kvbm_mreq_wait(r, 5000, &info), KVBM_OK);
  assert_int_equal(info.matched_tokens, 8);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G3], 2);
  assert_int_equal(tu_verify(m, r, 2), 2);
  kvbm_mreq_destroy(r);
  /* B is whole. */
  assert_int_equal(tu_run(m, b, 29, &info, &r), 28);
  assert_int_equal(info.hit_blocks[KVBM_TIER_G3], 7);
  assert_int_equal(tu_verify(m, r, 7), 7);
  kvbm_mreq_destroy(r);

  /* A second manager on the same directory while this one holds it. */
  kvbm_manager *m2;
  assert_int_equal(kvbm_manager_create(&c, &m2, NULL), KVBM_OK);
  assert_non_null(strstr(kvbm_manager_g3_error(m2), "in use"));
  kvbm_manager_destroy(m2);
  kvbm_manager_destroy(m);

  /* Another geometry on the same file starts cold. */
  kvbm_manager_config c2 = c;
  c2.layout.inner_dim = 16;
  assert_int_equal(kvbm_manager_create(&c2, &m, NULL), KVBM_OK);
  kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
  assert_int_equal(s3.restored_blocks, 0);
  kvbm_manager_destroy(m);
  free(a);
  free(b);
  tu_rmdir(dir);
}

/* The slot codec: seal then check; every corruption class is caught. */
static void test_slot_codec(void **st) {
  (void)st;
  char *dir = tu_tmpdir("codec");
  kvbm__disk_config dc = {.dir = dir, .num_slots = 4, .data_bytes = 1000, .fingerprint = 77,
                         .direct = true, .uring = true, .queue_depth = 4};
  kvbm_disk *d;
  kvbm_error e = {0};
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_OK);
  assert_int_equal(kvbm__disk_slot_size(d), 4096);
  uint8_t *buf = kvbm__disk_buffer(d);
  for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)(i * 7);
  kvbm_slot_header h = {.seq_hash = 42, .parent_hash = 41, .has_parent = true}, got;
  kvbm__disk_seal(d, buf, NULL, &h);
  uint64_t want = 42, other = 43;
  assert_int_equal(kvbm__disk_check(d, buf, NULL, true, &want, &got), KVBM_OK);
  assert_int_equal(got.parent_hash, 41);
  assert_true(got.has_parent);
  assert_int_equal(kvbm__disk_check(d, buf, NULL, true, &other, NULL), KVBM_ENOTFOUND);
  kvbm__disk_io io = {.slot = 3, .buf = buf, .write = true};
  assert_int_equal(kvbm__disk_begin(d, &io), KVBM_OK);
  assert_ptr_equal(kvbm__disk_reap(d), &io);
  assert_null(kvbm__disk_reap(d));
  assert_int_equal(io.result, 0);
  memset(buf, 0, 4096);
  io.write = false;
  assert_int_equal(kvbm__disk_begin(d, &io), KVBM_OK);
  kvbm__disk_finish(d);
  assert_int_equal(io.result, 0);
  assert_int_equal(kvbm__disk_check(d, buf, NULL, true, &want, NULL), KVBM_OK);
  buf[999] ^= 1;
  assert_int_equal(kvbm__disk_check(d, buf, NULL, true, &want, NULL), KVBM_ECHECKSUM);
  assert_int_equal(kvbm__disk_check(d, buf, NULL, false, &want, NULL), KVBM_OK);
  buf[999] ^= 1;
  buf[1000 + 9] ^= 1;
  assert_int_equal(kvbm__disk_check(d, buf, NULL, true, &want, NULL), KVBM_ECHECKSUM);
  buf[1000 + 9] ^= 1;
  buf[1000] = 'X';
  assert_int_equal(kvbm__disk_check(d, buf, NULL, true, &want, NULL), KVBM_EMAGIC);
  /* 1000-byte blocks cannot be zero-copy: the header would share a page. */
  assert_false(kvbm__disk_direct_ok(d, buf, 4096));
  io.slot = 4;
  assert_int_equal(kvbm__disk_begin(d, &io), KVBM_EINVAL);
  free(buf);
  kvbm__disk_close(d);
  /* Another fingerprint: the header is from another layout. */
  dc.fingerprint = 78;
  dc.uring = false;
  dc.direct = false;
  assert_int_equal(kvbm__disk_open(&dc, &d, NULL), KVBM_OK);
  assert_false(kvbm__disk_is_uring(d));
  buf = kvbm__disk_buffer(d);
  kvbm__disk_config dc77 = dc;
  dc77.fingerprint = 77;
  kvbm_disk *d77;
  assert_int_equal(kvbm__disk_open(&dc77, &d77, NULL), KVBM_OK);
  kvbm__disk_seal(d77, buf, NULL, &h);
  assert_int_equal(kvbm__disk_check(d, buf, NULL, true, &want, NULL), KVBM_EFORMAT);
  kvbm__disk_close(d77);
  kvbm__disk_close(d);
  free(buf);
  dc.queue_depth = 0;
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_EINVAL);
  dc.queue_depth = 4;
  dc.num_slots = 0;
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_EINVAL);
  tu_rmdir(dir);
}

/* Zero-copy slots: data in three caller pieces, header page in the
 * buffer; a read lands in other pieces and checks there. */
static void test_slot_zero_copy(void **st) {
  (void)st;
  char *dir = tu_tmpdir("zc");
  for (int uring = 0; uring < 2; uring++) {
    kvbm__disk_config dc = {.dir = dir, .num_slots = 2, .data_bytes = 3 * 4096, .fingerprint = 5,
                           .direct = true, .uring = uring, .queue_depth = 2};
    kvbm_disk *d;
    assert_int_equal(kvbm__disk_open(&dc, &d, NULL), KVBM_OK);
    assert_int_equal(kvbm__disk_slot_size(d), 4 * 4096);
    uint8_t *mem = NULL, *back = NULL;
    assert_int_equal(posix_memalign((void **)&mem, 4096, 3 * 4096), 0);
    assert_int_equal(posix_memalign((void **)&back, 4096, 3 * 4096), 0);
    for (int i = 0; i < 3 * 4096; i++) mem[i] = (uint8_t)(i * 13 + 1);
    memset(back, 0, 3 * 4096);
    struct iovec w[3] = {{mem + 8192, 4096}, {mem, 4096}, {mem + 4096, 4096}};
    struct iovec r[3] = {{back, 4096}, {back + 4096, 4096}, {back + 8192, 4096}};
    uint8_t *buf = kvbm__disk_buffer(d);
    kvbm__disk_io io = {.slot = 1, .buf = buf, .write = true, .data = {w, 3}};
    kvbm_slot_header h = {.seq_hash = 9};
    kvbm__disk_seal(d, buf, &io.data, &h);
    assert_int_equal(kvbm__disk_begin(d, &io), KVBM_OK);
    kvbm__disk_finish(d);
    assert_int_equal(io.result, 0);
    memset(buf, 0, 4096);
    io = (kvbm__disk_io){.slot = 1, .buf = buf, .write = false, .data = {r, 3}};
    assert_int_equal(kvbm__disk_begin(d, &io), KVBM_OK);
    assert_ptr_equal(kvbm__disk_reap(d), &io);
    assert_int_equal(io.result, 0);
    uint64_t want = 9;
    assert_int_equal(kvbm__disk_check(d, buf, &io.data, true, &want, NULL), KVBM_OK);
    assert_memory_equal(back, mem + 8192, 4096);
    assert_memory_equal(back + 4096, mem, 8192);
    back[5000] ^= 1;
    assert_int_equal(kvbm__disk_check(d, buf, &io.data, true, &want, NULL), KVBM_ECHECKSUM);
    /* Misaligned or short pieces are refused. */
    struct iovec bad[2] = {{mem + 1, 4096}, {mem + 4096, 8192}};
    io = (kvbm__disk_io){.slot = 0, .buf = buf, .write = true, .data = {bad, 2}};
    assert_int_equal(kvbm__disk_begin(d, &io), KVBM_EINVAL);
    struct iovec shortv[1] = {{mem, 4096}};
    io.data = (kvbm__disk_data){shortv, 1};
    assert_int_equal(kvbm__disk_begin(d, &io), KVBM_EINVAL);
    free(mem);
    free(back);
    free(buf);
    kvbm__disk_close(d);
  }
  tu_rmdir(dir);
}


/* ---- the persistent file against other users ---- */

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static int file_is(const char *path, const char *text) {
  char buf[256] = {0};
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  return n == strlen(text) && memcmp(buf, text, n) == 0;
}

static kvbm__disk_config persist_cfg(const char *dir) {
  return (kvbm__disk_config){.dir = dir, .num_slots = 4, .data_bytes = 1000, .fingerprint = 7,
                            .persist = true, .uring = false, .queue_depth = 2};
}

/* A link planted at the file's name: before, open followed it and
 * ftruncate/fallocate overwrote the target (a copy of /etc/passwd in the
 * report), or created it through a dangling link. Now: refused, the
 * target untouched, nothing created. */
static void test_planted_link(void **st) {
  (void)st;
  char *dir = tu_tmpdir("link");
  char victim[600], name[600], ghost[600];
  snprintf(victim, sizeof victim, "%s/victim", dir);
  snprintf(name, sizeof name, "%s/%s", dir, KVBM_DISK_FILE_NAME);
  snprintf(ghost, sizeof ghost, "%s/ghost", dir);
  write_file(victim, "root:x:0:0:root:/root:/bin/bash\n");
  assert_int_equal(symlink(victim, name), 0);
  kvbm__disk_config dc = persist_cfg(dir);
  kvbm_disk *d = NULL;
  kvbm_error e = {0};
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_EIO);
  assert_non_null(strstr(e.msg, "symbolic link"));
  assert_true(file_is(victim, "root:x:0:0:root:/root:/bin/bash\n"));
  /* the manager: G3 unavailable, says why, the target still intact */
  kvbm_manager_config c = tu_config(dir, 8, 0, 16);
  c.g3_persist = true;
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
  assert_non_null(strstr(kvbm_manager_g3_error(m), "symbolic link"));
  kvbm_manager_destroy(m);
  assert_true(file_is(victim, "root:x:0:0:root:/root:/bin/bash\n"));
  /* a dangling link: nothing is created at its target */
  unlink(name);
  assert_int_equal(symlink(ghost, name), 0);
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_EIO);
  assert_int_equal(access(ghost, F_OK), -1);
  /* a FIFO, a directory, a file with a second name: not ours to use */
  unlink(name);
  assert_int_equal(mkfifo(name, 0600), 0);
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_EIO);
  assert_non_null(strstr(e.msg, "regular file"));
  unlink(name);
  assert_int_equal(mkdir(name, 0700), 0);
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_EIO);
  rmdir(name);
  write_file(victim, "x");
  assert_int_equal(link(victim, name), 0);
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_EIO);
  assert_non_null(strstr(e.msg, "hard links"));
  assert_true(file_is(victim, "x"));
  tu_rmdir(dir);
}

static unsigned mode_of(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) != 0) return 0xffff;
  return (unsigned)(sb.st_mode & 07777);
}

/* Counts the entries of dir (besides . and ..). */
static int entries(const char *dir) {
  char cmd[700];
  snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", dir);
  return system(cmd) == 0 ? 1 : 0;
}

/* Files are created 0600 (before: 0644, world-readable KV of others'
 * prompts), exclusively and renamed into place (no leftovers); an old
 * 0644 file is tightened and kept; a persistent file needs a directory
 * nobody else can write; the default directory is a private one, never
 * /tmp itself, refused if it is a link. */
static void test_private_files(void **st) {
  (void)st;
  mode_t old_mask = umask(022);
  char *dir = tu_tmpdir("mode");
  char name[600];
  snprintf(name, sizeof name, "%s/%s", dir, KVBM_DISK_FILE_NAME);
  kvbm__disk_config dc = persist_cfg(dir);
  kvbm_disk *d;
  kvbm_error e = {0};
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_OK);
  assert_string_equal(kvbm__disk_path(d), name);
  assert_int_equal(mode_of(name), 0600);
  assert_true(entries(dir)); /* the file alone: the temporary name is gone */
  uint8_t *buf = kvbm__disk_buffer(d);
  memset(buf, 3, 1000);
  kvbm_slot_header h = {.seq_hash = 11};
  kvbm__disk_seal(d, buf, NULL, &h);
  kvbm__disk_io io = {.slot = 1, .buf = buf, .write = true};
  assert_int_equal(kvbm__disk_begin(d, &io), KVBM_OK);
  kvbm__disk_finish(d);
  assert_int_equal(io.result, 0);
  kvbm__disk_close(d);
  /* a file left 0644 by an older kvbm: tightened, its slots kept */
  assert_int_equal(chmod(name, 0644), 0);
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_OK);
  assert_true(kvbm__disk_reused(d));
  assert_int_equal(mode_of(name), 0600);
  kvbm__disk_close(d);
  /* a directory others can write: no persistent file there */
  assert_int_equal(chmod(dir, 0777), 0);
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_EIO);
  assert_non_null(strstr(e.msg, "writable by other users"));
  dc.persist = false; /* an unlinked temporary is fine anywhere */
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_OK);
  assert_string_equal(kvbm__disk_path(d), "");
  kvbm__disk_close(d);
  assert_int_equal(chmod(dir, 0700), 0);

  /* the default directory: <parent>/kvbm-<uid>, made 0700 */
  char parent[600], def[700], defname[800];
  snprintf(parent, sizeof parent, "%s/parent", dir);
  assert_int_equal(mkdir(parent, 0777), 0);
  assert_int_equal(chmod(parent, 01777), 0); /* like /tmp */
  snprintf(def, sizeof def, "%s/kvbm-%u", parent, (unsigned)geteuid());
  snprintf(defname, sizeof defname, "%s/%s", def, KVBM_DISK_FILE_NAME);
  dc = persist_cfg(NULL);
  dc.test_default_parent = parent;
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_OK);
  assert_string_equal(kvbm__disk_path(d), defname);
  assert_int_equal(mode_of(def), 0700);
  assert_int_equal(mode_of(defname), 0600);
  kvbm__disk_close(d);
  /* ours but opened up: made private again */
  assert_int_equal(chmod(def, 0755), 0);
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_OK);
  assert_int_equal(mode_of(def), 0700);
  kvbm__disk_close(d);
  /* a link planted at the default directory's name: refused */
  char elsewhere[700];
  snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere", dir);
  assert_int_equal(mkdir(elsewhere, 0700), 0);
  char cmd[800];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", def);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(symlink(elsewhere, def), 0);
  dc.persist = false;
  assert_int_equal(kvbm__disk_open(&dc, &d, &e), KVBM_EIO);
  assert_non_null(strstr(e.msg, "symbolic link"));
  free(buf);
  tu_rmdir(dir);
  umask(old_mask);
}

/* Rewrites the slot holding hash h as a forger who can write the file but
 * has no key would: new data, then both sums recomputed with XXH3. */
static int forge_slot(const char *dir, uint64_t h, uint64_t slot_size, uint64_t data_bytes) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, KVBM_DISK_FILE_NAME);
  int fd = open(path, O_RDWR);
  if (fd < 0) return 0;
  struct stat sb;
  fstat(fd, &sb);
  int done = 0;
  uint8_t *slot = malloc(slot_size);
  for (off_t off = KVBM_DISK_ALIGN; !done && off + (off_t)slot_size <= sb.st_size; off += (off_t)slot_size) {
    if (pread(fd, slot, slot_size, off) != (ssize_t)slot_size) break;
    uint8_t *p = slot + data_bytes;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[8 + i];
    if (memcmp(p, "KVBMSLT1", 8) || v != h) continue;
    for (uint64_t i = 0; i < data_bytes; i++) slot[i] ^= 0x5a;
    uint64_t ds = XXH3_64bits(slot, data_bytes), hs;
    for (int i = 0; i < 8; i++) p[48 + i] = (uint8_t)(ds >> (8 * i));
    hs = XXH3_64bits(p, 56);
    for (int i = 0; i < 8; i++) p[56 + i] = (uint8_t)(hs >> (8 * i));
    done = pwrite(fd, slot, slot_size, off) == (ssize_t)slot_size;
  }
  free(slot);
  fsync(fd);
  close(fd);
  return done;
}

/* The slot codec against a forger: XXH3 sums (the default) accept a slot
 * whose sums were recomputed; keyed-BLAKE3 sums do not, nor slots sealed
 * under another key; a file written under another key starts cold. */
static void test_keyed_slots(void **st) {
  (void)st;
  char *dir = tu_tmpdir("keyed");
  uint8_t k1[KVBM_DISK_KEY_LEN], k2[KVBM_DISK_KEY_LEN];
  memset(k1, 1, sizeof k1);
  memset(k2, 2, sizeof k2);
  kvbm__disk_config dc = {.dir = dir, .num_slots = 4, .data_bytes = 1000, .fingerprint = 7, .queue_depth = 2};
  for (int keyed = 0; keyed < 2; keyed++) {
    dc.checksum_key = keyed ? k1 : NULL;
    kvbm_disk *d;
    assert_int_equal(kvbm__disk_open(&dc, &d, NULL), KVBM_OK);
    uint8_t *buf = kvbm__disk_buffer(d);
    for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)i;
    kvbm_slot_header h = {.seq_hash = 99};
    kvbm__disk_seal(d, buf, NULL, &h);
    uint64_t want = 99;
    assert_int_equal(kvbm__disk_check(d, buf, NULL, true, &want, NULL), KVBM_OK);
    /* forged: other data, XXH3 sums recomputed */
    buf[10] ^= 0xff;
    uint8_t *p = buf + 1000;
    uint64_t ds = XXH3_64bits(buf, 1000), hs;
    for (int i = 0; i < 8; i++) p[48 + i] = (uint8_t)(ds >> (8 * i));
    hs = XXH3_64bits(p, 56);
    for (int i = 0; i < 8; i++) p[56 + i] = (uint8_t)(hs >> (8 * i));
    int rc = kvbm__disk_check(d, buf, NULL, true, &want, NULL);
    assert_int_equal(rc, keyed ? KVBM_ECHECKSUM : KVBM_OK);
    /* a header claiming another hash, its header sum recomputed */
    kvbm__disk_seal(d, buf, NULL, &h);
    p[8] ^= 1;
    hs = XXH3_64bits(p, 56);
    for (int i = 0; i < 8; i++) p[56 + i] = (uint8_t)(hs >> (8 * i));
    want = 98;
    assert_int_equal(kvbm__disk_check(d, buf, NULL, false, &want, NULL), keyed ? KVBM_ECHECKSUM : KVBM_OK);
    want = 99;
    if (keyed) {
      /* sealed under another key */
      kvbm__disk_config d2c = dc;
      d2c.checksum_key = k2;
      kvbm_disk *d2;
      assert_int_equal(kvbm__disk_open(&d2c, &d2, NULL), KVBM_OK);
      kvbm__disk_seal(d2, buf, NULL, &h);
      assert_int_equal(kvbm__disk_check(d2, buf, NULL, true, &want, NULL), KVBM_OK);
      assert_int_equal(kvbm__disk_check(d, buf, NULL, true, &want, NULL), KVBM_ECHECKSUM);
      kvbm__disk_close(d2);
    }
    free(buf);
    kvbm__disk_close(d);
  }
  /* persistent: the same key reuses the file, another key or none starts it anew */
  dc.persist = true;
  dc.checksum_key = k1;
  kvbm_disk *d;
  assert_int_equal(kvbm__disk_open(&dc, &d, NULL), KVBM_OK);
  kvbm__disk_close(d);
  assert_int_equal(kvbm__disk_open(&dc, &d, NULL), KVBM_OK);
  assert_true(kvbm__disk_reused(d));
  kvbm__disk_close(d);
  dc.checksum_key = k2;
  assert_int_equal(kvbm__disk_open(&dc, &d, NULL), KVBM_OK);
  assert_false(kvbm__disk_reused(d));
  kvbm__disk_close(d);
  dc.checksum_key = NULL;
  assert_int_equal(kvbm__disk_open(&dc, &d, NULL), KVBM_OK);
  assert_false(kvbm__disk_reused(d));
  kvbm__disk_close(d);
  tu_rmdir(dir);
}

/* End to end: a slot forged in the persistent file between two runs. With
 * XXH3 sums the restart would serve the forger's bytes as a hit; with a
 * G3 key the slot is skipped at restore and the block recomputed. */
static void test_forged_slot_restart(void **st) {
  (void)st;
  static const char secret[] = "the operator's G3 secret, 16+ bytes";
  for (int keyed = 0; keyed < 2; keyed++) {
    char *dir = tu_tmpdir("forge");
    kvbm_manager_config c = tu_config(dir, 8, 0, 64);
    c.g3_persist = true;
    if (keyed) {
      c.g3_key = secret;
      c.g3_key_len = sizeof secret - 1;
    }
    uint32_t *a = tu_prompt(1000, 17), *b = tu_prompt(5000, 29);
    kvbm_manager *m;
    kvbm_mreq *r;
    assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
    assert_string_equal(kvbm_manager_g3_error(m), "");
    tu_run(m, a, 17, NULL, &r);
    uint64_t h1;
    kvbm_mreq_block_hash(r, 1, &h1);
    kvbm_mreq_destroy(r);
    tu_run(m, b, 29, NULL, NULL);
    uint64_t slot = slot_size_for(m), bytes = kvbm_manager_block_bytes(m);
    kvbm_manager_destroy(m);
    assert_true(forge_slot(dir, h1, slot, bytes));
    assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_OK);
    kvbm_tier_stats s3;
    kvbm_manager_stats_get(m, KVBM_TIER_G3, &s3);
    kvbm_mreq_info info;
    size_t got = tu_run(m, a, 17, &info, &r);
    if (keyed) {
      assert_int_equal(s3.restored_blocks, 10);
      assert_int_equal(s3.restore_skipped, 1);
      assert_int_equal(got, 4); /* block 0 from G3; block 1 is recomputed */
      assert_int_equal(tu_verify(m, r, 1), 1);
    } else {
      /* the weakness a key closes: the forged slot restores and serves */
      assert_int_equal(s3.restored_blocks, 11);
      assert_int_equal(got, 16);
      assert_int_equal(tu_verify(m, r, 4), 3);
    }
    kvbm_mreq_destroy(r);
    kvbm_manager_destroy(m);
    free(a);
    free(b);
    tu_rmdir(dir);
  }
  /* a key of a bad length is a config error */
  kvbm_manager_config c = tu_config("/nonexistent", 8, 0, 64);
  c.g3_key = "short";
  c.g3_key_len = 5;
  kvbm_manager *m;
  assert_int_equal(kvbm_manager_create(&c, &m, NULL), KVBM_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flipped_byte_is_a_miss), cmocka_unit_test(test_flipped_header_is_a_miss),
      cmocka_unit_test(test_disk_full),           cmocka_unit_test(test_unusable_dir),
      cmocka_unit_test(test_warm_restart),        cmocka_unit_test(test_slot_codec),
      cmocka_unit_test(test_slot_zero_copy),
      cmocka_unit_test(test_planted_link),        cmocka_unit_test(test_private_files),
      cmocka_unit_test(test_keyed_slots),         cmocka_unit_test(test_forged_slot_restart),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
