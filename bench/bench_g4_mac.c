/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench_g4_mac.c: what authenticating a G4 value costs (issue 23), on
 * W4's blocks (../shared/WORKLOADS.md: 32 layers x 16 tokens x 2048 x 2
 * bytes = 2 MiB a block).
 *
 * A G4 value is a frame around a 64-byte body header and the block
 * (tier/store.c); what authentication changes is the frame's sum, at seal
 * (put) and at open (get). Each mode seals and then opens every block of
 * a set, the way a put and a get of the same block would, in memory:
 *   plain   the frame today: plain BLAKE3-128 (kvbm_frame_encode /
 *           kvbm_frame_decode), the baseline of every ratio;
 *   keyed   the keyed frame (kvbm_frame_encode_keyed / _decode_keyed with
 *           the cluster key): BLAKE3 in keyed mode;
 *   xchacha XChaCha20-Poly1305 (libsodium) in place over the body, tag in
 *           the frame's sum, random 24-byte nonce: encryption at rest;
 *   aesgcm  AES-256-GCM (libsodium; only where the CPU has AES-NI and
 *           PCLMUL) in place, random 12-byte nonce;
 *   memcpy  one copy of each block there and back: the bound of a
 *           host-side step that touches every byte twice.
 * The AEAD modes are measured here with libsodium directly: the library
 * ships the keyed MAC, not encryption (docs/areas/tiers.md says why).
 *
 * Rounds are interleaved (every mode once per round, in turn) so that the
 * machine's load falls on all alike; each round's ratio is mode / plain in
 * that round. Reported per mode: GB/s of sealed-and-opened block bytes,
 * and the ratio of its time to plain's, both as wall clock and as the
 * thread's CPU time (less disturbed by other processes on a shared
 * machine), median [min..max] over the rounds.
 *
 * Usage: bench_g4_mac [--blocks N] [--rounds R] [--block-bytes B] [--json]
 */
#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kvbm/blake3.h"
#include "kvbm/frame.h"

#define HDR KVBM_FRAME_HEADER_LEN
#define BODY_HDR 64
#define NONCE_MAX 24

enum { M_PLAIN, M_KEYED, M_XCHACHA, M_AESGCM, M_MEMCPY, M_COUNT };
static const char *const kName[M_COUNT] = {"plain", "keyed", "xchacha", "aesgcm", "memcpy"};

typedef struct set {
  size_t n, body;     /* blocks, body bytes (64 + block) */
  uint8_t **val;      /* n values: header, nonce room, body */
  uint8_t *scratch;   /* memcpy's target */
  uint8_t mac_key[32], aead_key[32];
} set;

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what) { kvbm_bench_die("bench_g4_mac", "%s", what); }

/* Seals then opens block i in mode m; dies on any failure (a bench that
 * measures a failing path measures nothing). */
static void one(set *s, int m, size_t i) {
  uint8_t *v = s->val[i], *body = v + HDR + NONCE_MAX;
  size_t len;
  kvbm_frame_header h;
  const uint8_t *b;
  switch (m) {
  case M_PLAIN:
  case M_KEYED: {
    const uint8_t *key = m == M_KEYED ? s->mac_key : NULL;
    uint8_t *f = body - HDR; /* the body right after the header */
    if (kvbm_frame_encode_keyed(key, KVBM_PHASE_THINK_ACTIVE, body, s->body, f, HDR + s->body, &len,
                                NULL))
      die("seal");
    if (kvbm_frame_decode_keyed(key, f, len, (uint32_t)s->body, &h, &b, NULL)) die("open");
    break;
  }
  case M_XCHACHA: {
    uint8_t *nonce = v + HDR, tag[16];
    randombytes_buf(nonce, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES);
    crypto_aead_xchacha20poly1305_ietf_encrypt_detached(body, tag, NULL, body, s->body, v, 16, NULL,
                                                        nonce, s->aead_key);
    memcpy(v + 16, tag, 16);
    if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(body, NULL, body, s->body, v + 16, v,
                                                            16, nonce, s->aead_key))
      die("xchacha open");
    break;
  }
  case M_AESGCM: {
    uint8_t *nonce = v + HDR, tag[16];
    randombytes_buf(nonce, crypto_aead_aes256gcm_NPUBBYTES);
    crypto_aead_aes256gcm_encrypt_detached(body, tag, NULL, body, s->body, v, 16, NULL, nonce,
                                           s->aead_key);
    memcpy(v + 16, tag, 16);
    if (crypto_aead_aes256gcm_decrypt_detached(body, NULL, body, s->body, v + 16, v, 16, nonce,
                                               s->aead_key))
      die("aesgcm open");
    break;
  }
  case M_MEMCPY:
    memcpy(s->scratch, body, s->body);
    memcpy(body, s->scratch, s->body);
    break;
  }
}

int main(int argc, char **argv) {
  size_t nblocks = 64, block = 2u << 20;
  int rounds = 7;
  bool json = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--blocks") && i + 1 < argc) nblocks = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--block-bytes") && i + 1 < argc) block = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--json")) json = true;
    else {
      fprintf(stderr, "usage: %s [--blocks N] [--rounds R] [--block-bytes B] [--json]\n", argv[0]);
      return 2;
    }
  }
  if (!nblocks || rounds < 1 || !block || block > (1u << 30)) die("bad arguments");
  if (sodium_init() < 0) die("sodium_init");
  bool have_aes = crypto_aead_aes256gcm_is_available() != 0;
  set s = {.n = nblocks, .body = BODY_HDR + block};
  s.val = calloc(nblocks, sizeof *s.val);
  s.scratch = aligned_alloc(4096, (s.body + 4095) / 4096 * 4096);
  if (!s.val || !s.scratch) die("out of memory");
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < nblocks; i++) {
    s.val[i] = aligned_alloc(4096, (HDR + NONCE_MAX + s.body + 4095) / 4096 * 4096);
    if (!s.val[i]) die("out of memory");
    uint64_t *w = (uint64_t *)(void *)(s.val[i] + HDR + NONCE_MAX);
    for (size_t k = 0; k < s.body / 8; k++) w[k] = kvbm_bench_xorshift(&x);
  }
  randombytes_buf(s.mac_key, sizeof s.mac_key);
  randombytes_buf(s.aead_key, sizeof s.aead_key);
  for (int m = 0; m < M_COUNT; m++) /* warm: page in, pick SIMD paths */
    if (m != M_AESGCM || have_aes) one(&s, m, 0);
  double *wall[M_COUNT], *cpu[M_COUNT], *gbs[M_COUNT];
  for (int m = 0; m < M_COUNT; m++) {
    wall[m] = calloc((size_t)rounds, sizeof(double));
    cpu[m] = calloc((size_t)rounds, sizeof(double));
    gbs[m] = calloc((size_t)rounds, sizeof(double));
  }
  for (int r = 0; r < rounds; r++)
    for (int m = 0; m < M_COUNT; m++) {
      if (m == M_AESGCM && !have_aes) continue;
      double t0 = kvbm_bench_now(), c0 = cpu_now();
      for (size_t i = 0; i < nblocks; i++) one(&s, m, i);
      wall[m][r] = kvbm_bench_now() - t0;
      cpu[m][r] = cpu_now() - c0;
      gbs[m][r] = (double)nblocks * (double)block / wall[m][r] / 1e9;
    }
  if (!json)
    printf("W4 G4 value seal+open: %zu blocks of %zu bytes, %d interleaved rounds, BLAKE3 %s\n"
           "%-8s %-24s %-26s %-26s\n",
           nblocks, block, rounds, kvbm_blake3_impl_name(kvbm_blake3_impl_best()), "mode",
           "GB/s", "time / plain (wall)", "time / plain (CPU)");
  else
    printf("{\"workload\":\"W4\",\"blocks\":%zu,\"block_bytes\":%zu,\"rounds\":%d", nblocks, block,
           rounds);
  for (int m = 0; m < M_COUNT; m++) {
    if (m == M_AESGCM && !have_aes) {
      if (!json) printf("%-8s (no AES-NI/PCLMUL: not available)\n", kName[m]);
      continue;
    }
    double rw[rounds], rc[rounds];
    for (int r = 0; r < rounds; r++) {
      rw[r] = wall[m][r] / wall[M_PLAIN][r];
      rc[r] = cpu[m][r] / cpu[M_PLAIN][r];
    }
    kvbm_bench_spread g = kvbm_bench_spread_of(gbs[m], rounds);
    kvbm_bench_spread w = kvbm_bench_spread_of(rw, rounds);
    kvbm_bench_spread c = kvbm_bench_spread_of(rc, rounds);
    if (!json)
      printf("%-8s %5.2f [%5.2f-%5.2f]      %5.3f [%5.3f-%5.3f]      %5.3f [%5.3f-%5.3f]\n", kName[m],
             g.median, g.min, g.max, w.median, w.min, w.max, c.median, c.min, c.max);
    else
      printf(",\"%s\":{\"gbs\":%.3f,\"gbs_min\":%.3f,\"gbs_max\":%.3f,\"wall_ratio\":%.4f,"
             "\"wall_ratio_min\":%.4f,\"wall_ratio_max\":%.4f,\"cpu_ratio\":%.4f,"
             "\"cpu_ratio_min\":%.4f,\"cpu_ratio_max\":%.4f}",
             kName[m], g.median, g.min, g.max, w.median, w.min, w.max, c.median, c.min, c.max);
  }
  if (json) printf("}\n");
  for (int m = 0; m < M_COUNT; m++) {
    free(wall[m]);
    free(cpu[m]);
    free(gbs[m]);
  }
  for (size_t i = 0; i < nblocks; i++) free(s.val[i]);
  free(s.val);
  free(s.scratch);
  return 0;
}
