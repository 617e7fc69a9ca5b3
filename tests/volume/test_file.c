/* SPDX-License-Identifier: Apache-2.0 */
/* test_file.c: the file:///DIR backend. Round trips and the on-disk layout
 * (DIR/<namespace>/<hex>, 0600, no temporaries left), namespaces kept
 * apart, two processes sharing one directory, concurrent writers of one key
 * (a reader only ever sees whole values), hostile entries under a key
 * (symlink, FIFO, directory, oversize file), garbage returned as is, a full
 * file system (RLIMIT_FSIZE) and unusable directories. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/resource.h>
#include <cmocka.h>

#include "volume_testutil.h"

static kvbm_volume *open_file_volume(const char *dir, const char *ns, uint64_t max,
                                     uint32_t threads) {
  char url[512];
  snprintf(url, sizeof url, "file://%s", dir);
  kvbm_volume_config c = kvbm_volume_config_default(url);
  c.key_namespace = ns;
  c.threads = threads;
  if (max) c.max_value_bytes = max;
  kvbm_volume *v = NULL;
  kvbm_error e;
  int rc = kvbm_volume_register(&c, &v, &e);
  if (rc) fail_msg("register %s: %s", url, e.msg);
  return v;
}

/* Entries of dir whose name starts with '.' (temporaries). */
static int count_dotfiles(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static void test_round_trip(void **state) {
  (void)state;
  char *dir = vt_tmpdir("file");
  kvbm_volume *v = open_file_volume(dir, "model-a:fp16", 0, 2);
  assert_string_equal(kvbm_volume_url(v), strstr(kvbm_volume_url(v), "file:///"));
  size_t sizes[] = {1, 4096, (2u << 20) + 3};
  uint8_t *val = malloc(sizes[2]), *out = malloc(sizes[2]);
  for (int i = 0; i < 3; i++) {
    uint64_t key = 0xabc0000000000000ull + (uint64_t)i;
    vt_pattern(val, sizes[i], key, 1, 0);
    assert_int_equal(kvbm_volume_put(v, key, val, sizes[i]), KVBM_OK);
    size_t sz = 0;
    memset(out, 0, sizes[i]);
    assert_int_equal(kvbm_volume_get(v, key, out, sizes[2], &sz), KVBM_OK);
    assert_int_equal(sz, sizes[i]);
    assert_true(vt_pattern(out, sizes[i], key, 1, 1));
    assert_int_equal(kvbm_volume_exists(v, key, &sz), KVBM_OK);
    assert_int_equal(sz, sizes[i]);
  }
  /* the layout: DIR/<ns>/<16 hex>, 0600 in a 0700 folder */
  char path[600];
  struct stat st;
  snprintf(path, sizeof path, "%s/model-a:fp16/abc0000000000002", dir);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_size, (off_t)sizes[2]);
  assert_int_equal(st.st_mode & 0777, 0600);
  snprintf(path, sizeof path, "%s/model-a:fp16", dir);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
  assert_int_equal(count_dotfiles(path), 0);
  /* replace, too small a buffer, missing, delete */
  uint64_t key = 0xabc0000000000001ull;
  vt_pattern(val, 5000, key, 2, 0);
  assert_int_equal(kvbm_volume_put(v, key, val, 5000), KVBM_OK);
  size_t sz;
  assert_int_equal(kvbm_volume_get(v, key, out, 4999, &sz), KVBM_ENOSPC);
  assert_int_equal(sz, 5000);
  assert_int_equal(kvbm_volume_get(v, key, out, 5000, &sz), KVBM_OK);
  assert_true(vt_pattern(out, 5000, key, 2, 1));
  assert_int_equal(kvbm_volume_delete(v, key), KVBM_OK);
  assert_int_equal(kvbm_volume_get(v, key, out, 5000, &sz), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_volume_exists(v, key, &sz), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_volume_delete(v, key), KVBM_ENOTFOUND);
  /* a batch of mixed ops */
  kvbm_volume_op ops[4] = {
      {.kind = KVBM_VOLUME_PUT, .key = 1, .src = val, .len = 100},
      {.kind = KVBM_VOLUME_GET, .key = 1, .dst = out, .cap = 100},
      {.kind = KVBM_VOLUME_DELETE, .key = 1},
      {.kind = KVBM_VOLUME_EXISTS, .key = 1},
  };
  assert_int_equal(kvbm_volume_run(v, ops, 4, NULL), KVBM_OK);
  assert_int_equal(ops[0].status, KVBM_OK);
  assert_int_equal(ops[1].status, KVBM_OK);
  assert_int_equal(ops[2].status, KVBM_OK);
  assert_int_equal(ops[3].status, KVBM_ENOTFOUND);
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.hits, 5);
  assert_int_equal(s.misses, 2);
  assert_int_equal(s.io_errors, 0);
  kvbm_volume_unregister(v);
  free(val);
  free(out);
  vt_rmrf(dir);
  free(dir);
}

/* The same key in two namespaces (and the empty one) are three values. */
static void test_namespaces_apart(void **state) {
  (void)state;
  char *dir = vt_tmpdir("ns");
  kvbm_volume *a = open_file_volume(dir, "a", 0, 1);
  kvbm_volume *b = open_file_volume(dir, "b", 0, 1);
  kvbm_volume *z = open_file_volume(dir, "", 0, 1);
  uint8_t va[64], vb[64], out[64];
  vt_pattern(va, 64, 7, 1, 0);
  vt_pattern(vb, 64, 7, 2, 0);
  assert_int_equal(kvbm_volume_put(a, 7, va, 64), KVBM_OK);
  assert_int_equal(kvbm_volume_get(b, 7, out, 64, NULL), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_volume_get(z, 7, out, 64, NULL), KVBM_ENOTFOUND);
  assert_int_equal(kvbm_volume_put(b, 7, vb, 64), KVBM_OK);
  assert_int_equal(kvbm_volume_get(a, 7, out, 64, NULL), KVBM_OK);
  assert_true(vt_pattern(out, 64, 7, 1, 1));
  assert_int_equal(kvbm_volume_get(b, 7, out, 64, NULL), KVBM_OK);
  assert_true(vt_pattern(out, 64, 7, 2, 1));
  assert_int_equal(kvbm_volume_put(z, 7, va, 10), KVBM_OK);
  char path[600];
  snprintf(path, sizeof path, "%s/0000000000000007", dir);
  assert_int_equal(access(path, F_OK), 0);
  kvbm_volume_unregister(a);
  kvbm_volume_unregister(b);
  kvbm_volume_unregister(z);
  vt_rmrf(dir);
  free(dir);
}

/* Two processes, each with its own volume on one directory: what one puts,
 * the other gets, both ways. */
static void test_two_processes(void **state) {
  (void)state;
  char *dir = vt_tmpdir("share");
  pid_t pid = fork();
  if (pid == 0) {
    kvbm_volume_config c;
    char url[512];
    snprintf(url, sizeof url, "file://%s", dir);
    c = kvbm_volume_config_default(url);
    c.key_namespace = "shared";
    kvbm_volume *v;
    if (kvbm_volume_register(&c, &v, NULL)) _exit(2);
    uint8_t val[3000];
    for (uint64_t k = 0; k < 20; k++) {
      vt_pattern(val, sizeof val, k, 100, 0);
      if (kvbm_volume_put(v, k, val, sizeof val)) _exit(3);
    }
    /* then wait for the parent's key 1000 and check it */
    for (int i = 0; i < 3000; i++) {
      size_t sz;
      if (kvbm_volume_get(v, 1000, val, sizeof val, &sz) == KVBM_OK)
        _exit(sz == 777 && vt_pattern(val, 777, 1000, 5, 1) ? 0 : 4);
      usleep(10000);
    }
    _exit(5);
  }
  kvbm_volume *v = open_file_volume(dir, "shared", 0, 1);
  uint8_t out[3000];
  for (uint64_t k = 0; k < 20; k++) {
    int rc;
    for (int i = 0; (rc = kvbm_volume_get(v, k, out, sizeof out, NULL)) == KVBM_ENOTFOUND && i < 3000; i++)
      usleep(10000);
    assert_int_equal(rc, KVBM_OK);
    assert_true(vt_pattern(out, sizeof out, k, 100, 1));
  }
  vt_pattern(out, 777, 1000, 5, 0);
  assert_int_equal(kvbm_volume_put(v, 1000, out, 777), KVBM_OK);
  int st;
  waitpid(pid, &st, 0);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  kvbm_volume_unregister(v);
  vt_rmrf(dir);
  free(dir);
}

/* Three processes write one key over and over, each its own versions,
 * while this one reads: every value read is one writer's whole value. */
static void test_concurrent_writers(void **state) {
  (void)state;
  char *dir = vt_tmpdir("race");
  const size_t len = 256 * 1024;
  const uint64_t key = 42;
  pid_t kids[3];
  for (int w = 0; w < 3; w++) {
    kids[w] = fork();
    if (kids[w] == 0) {
      char url[512];
      snprintf(url, sizeof url, "file://%s", dir);
      kvbm_volume_config c = kvbm_volume_config_default(url);
      c.key_namespace = "race";
      kvbm_volume *v;
      if (kvbm_volume_register(&c, &v, NULL)) _exit(2);
      uint8_t *val = malloc(len);
      for (uint64_t i = 0; i < 60; i++) {
        uint64_t version = (uint64_t)(w + 1) << 32 | i;
        vt_pattern(val, len, key, version, 0);
        if (kvbm_volume_put(v, key, val, len)) _exit(3);
      }
      kvbm_volume_unregister(v);
      free(val);
      _exit(0);
    }
  }
  kvbm_volume *v = open_file_volume(dir, "race", 0, 1);
  uint8_t *out = malloc(len);
  int reads = 0, alive = 3;
  while (alive) {
    size_t sz;
    int rc = kvbm_volume_get(v, key, out, len, &sz);
    if (rc == KVBM_OK) {
      assert_int_equal(sz, len);
      assert_true(vt_pattern(out, len, key, vt_version(out), 1)); /* whole, one writer's */
      reads++;
    } else {
      assert_int_equal(rc, KVBM_ENOTFOUND); /* before the first rename only */
    }
    alive = 0;
    for (int w = 0; w < 3; w++) {
      int st;
      if (kids[w] > 0 && waitpid(kids[w], &st, WNOHANG) == kids[w]) {
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        kids[w] = 0;
      }
      alive += kids[w] > 0;
    }
  }
  assert_int_equal(kvbm_volume_get(v, key, out, len, NULL), KVBM_OK);
  uint64_t last = vt_version(out);
  assert_int_equal(last & 0xffffffffu, 59); /* some writer's final value */
  char path[600];
  snprintf(path, sizeof path, "%s/race", dir);
  assert_int_equal(count_dotfiles(path), 0);
  (void)reads;
  kvbm_volume_unregister(v);
  free(out);
  vt_rmrf(dir);
  free(dir);
}

/* What is found under a key that this backend did not write. */
static void test_hostile_entries(void **state) {
  (void)state;
  char *dir = vt_tmpdir("hostile");
  kvbm_volume *v = open_file_volume(dir, "ns", 1000, 1);
  char path[600], target[600];
  uint8_t out[2000];
  size_t sz;
  /* a symlink to a secret: never followed */
  snprintf(target, sizeof target, "%s/secret", dir);
  FILE *f = fopen(target, "w");
  fputs("secret bytes", f);
  fclose(f);
  snprintf(path, sizeof path, "%s/ns/0000000000000001", dir);
  assert_int_equal(symlink(target, path), 0);
  memset(out, 0, sizeof out);
  assert_int_equal(kvbm_volume_get(v, 1, out, sizeof out, &sz), KVBM_ECHECKSUM);
  assert_null(memmem(out, sizeof out, "secret", 6));
  assert_int_equal(kvbm_volume_exists(v, 1, &sz), KVBM_ENOTFOUND);
  /* a FIFO: the get returns at once instead of waiting for a writer */
  snprintf(path, sizeof path, "%s/ns/0000000000000002", dir);
  assert_int_equal(mkfifo(path, 0600), 0);
  assert_int_equal(kvbm_volume_get(v, 2, out, sizeof out, &sz), KVBM_ECHECKSUM);
  /* a directory */
  snprintf(path, sizeof path, "%s/ns/0000000000000003", dir);
  assert_int_equal(mkdir(path, 0700), 0);
  assert_int_equal(kvbm_volume_get(v, 3, out, sizeof out, &sz), KVBM_ECHECKSUM);
  assert_int_equal(kvbm_volume_delete(v, 3), KVBM_EIO);
  /* a value above max_value_bytes (1000): refused by its size */
  snprintf(path, sizeof path, "%s/ns/0000000000000004", dir);
  f = fopen(path, "w");
  for (int i = 0; i < 1500; i++) fputc('x', f);
  fclose(f);
  assert_int_equal(kvbm_volume_get(v, 4, out, sizeof out, &sz), KVBM_ETOOLONG);
  assert_int_equal(sz, 1500);
  /* garbage of an acceptable size: returned as is (framing is the tier's) */
  snprintf(path, sizeof path, "%s/ns/0000000000000005", dir);
  f = fopen(path, "w");
  fputs("not a frame", f);
  fclose(f);
  assert_int_equal(kvbm_volume_get(v, 5, out, sizeof out, &sz), KVBM_OK);
  assert_int_equal(sz, 11);
  assert_memory_equal(out, "not a frame", 11);
  /* a put over the symlink replaces the link itself, not its target */
  assert_int_equal(kvbm_volume_put(v, 1, "new", 3), KVBM_OK);
  f = fopen(target, "r");
  char buf[32] = {0};
  assert_non_null(fgets(buf, sizeof buf, f));
  fclose(f);
  assert_string_equal(buf, "secret bytes");
  assert_int_equal(kvbm_volume_get(v, 1, out, sizeof out, &sz), KVBM_OK);
  assert_int_equal(sz, 3);
  kvbm_volume_stats s;
  kvbm_volume_stats_get(v, &s);
  assert_int_equal(s.corrupt, 4); /* symlink get + exists, FIFO, directory */
  kvbm_volume_unregister(v);

  /* a namespace folder that is a symlink is refused at register */
  snprintf(path, sizeof path, "%s/linked", dir);
  assert_int_equal(symlink("/tmp", path), 0);
  char url[600];
  snprintf(url, sizeof url, "file://%s", dir);
  kvbm_volume_config c = kvbm_volume_config_default(url);
  c.key_namespace = "linked";
  kvbm_error e;
  assert_int_equal(kvbm_volume_register(&c, &v, &e), KVBM_EIO);
  assert_non_null(strstr(e.msg, "linked/"));
  /* a directory that cannot be made */
  snprintf(url, sizeof url, "file://%s/secret/sub", dir);
  c = kvbm_volume_config_default(url);
  assert_int_equal(kvbm_volume_register(&c, &v, &e), KVBM_EIO);
  assert_non_null(strstr(e.msg, "cannot open the directory"));
  /* a namespace with a slash never reaches the file system */
  snprintf(url, sizeof url, "file://%s", dir);
  c = kvbm_volume_config_default(url);
  c.key_namespace = "../../etc";
  assert_int_equal(kvbm_volume_register(&c, &v, &e), KVBM_EINVAL);
  vt_rmrf(dir);
  free(dir);
}

/* A full file system (here a file size limit): the put is KVBM_ENOSPC and
 * leaves no temporary behind; smaller values still fit. */
static void test_full(void **state) {
  (void)state;
  char *dir = vt_tmpdir("full");
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {64 * 1024, 64 * 1024};
    if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(2);
    char url[512];
    snprintf(url, sizeof url, "file://%s", dir);
    kvbm_volume_config c = kvbm_volume_config_default(url);
    kvbm_volume *v;
    if (kvbm_volume_register(&c, &v, NULL)) _exit(3);
    static uint8_t big[128 * 1024];
    if (kvbm_volume_put(v, 1, big, sizeof big) != KVBM_ENOSPC) _exit(4);
    if (kvbm_volume_put(v, 2, big, 1000) != KVBM_OK) _exit(5);
    kvbm_volume_stats s;
    kvbm_volume_stats_get(v, &s);
    if (s.full != 1) _exit(6);
    kvbm_volume_unregister(v);
    _exit(count_dotfiles(dir) == 0 ? 0 : 7);
  }
  int st;
  waitpid(pid, &st, 0);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  vt_rmrf(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),       cmocka_unit_test(test_namespaces_apart),
      cmocka_unit_test(test_two_processes),    cmocka_unit_test(test_concurrent_writers),
      cmocka_unit_test(test_hostile_entries),  cmocka_unit_test(test_full),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
