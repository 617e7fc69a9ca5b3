/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blake3_hd.h (private): BLAKE3 written once for the host and the device.
 *
 * What: the BLAKE3 compression function, the chunk chaining value, the
 * parent node and one step of the level-by-level tree reduction, as
 * portable C that compiles both as C11 (the host; tests/cuda/
 * test_blake3_hd.c runs it against the official vectors and kvbm_blake3)
 * and as CUDA device code (src/cuda/checksum_kernels.cu). KVBM_HD is
 * `__host__ __device__` under nvcc and empty otherwise.
 *
 * Why one copy: the device check is only worth having if it computes
 * exactly the digest kvbm already keeps for a block (BLAKE3 of the block's
 * bytes; the fabric and the frames keep its first 16 bytes). CI has no
 * nvcc and no GPU, so the logic the kernels run must be testable on a
 * plain C compiler: the kernel adds only the thread mapping (which thread
 * computes which chunk or node) and the memory moves around these
 * functions.
 *
 * The tree: BLAKE3 cuts the input into 1 KiB chunks; its tree is the
 * left-complete binary tree over them (a left subtree holds the largest
 * power of two of chunks that leaves at least one on the right). Pairing
 * the nodes of a level left to right, and carrying an odd last node up
 * unchanged, builds exactly that tree, so a level can be reduced with one
 * independent job per output node (kvbm_hd_level_node) -- the shape a GPU
 * wants. Any aligned run of 2^k whole chunks is a subtree of the tree, and
 * so is the run of chunks after the last such aligned run; the kernel uses
 * this to reduce groups of KVBM_HD_GROUP_CHUNKS chunks in shared memory
 * and then the groups' values.
 *
 * Trade-offs: the state lives in sixteen named locals and the message in
 * an array that the device compiler keeps in registers once the rounds are
 * unrolled (every index is a constant); the host build of the same code is
 * the plain portable speed (tests only: the library's own kvbm_blake3 has
 * the SIMD paths). Only the plain hash mode (key = IV) with a 32-byte
 * output is here: that is the digest kvbm stores.
 */
#ifndef KVBM_CUDA_BLAKE3_HD_H
#define KVBM_CUDA_BLAKE3_HD_H

#include <stdint.h>

#ifdef __CUDACC__
#define KVBM_HD __host__ __device__
#define KVBM_HD_INLINE __forceinline__
#else
#define KVBM_HD
#define KVBM_HD_INLINE inline
#endif
#define KVBM_HD_FN static KVBM_HD_INLINE KVBM_HD

#ifdef __cplusplus
extern "C" {
#endif

#define KVBM_HD_CHUNK_LEN 1024u
#define KVBM_HD_BLOCK_LEN 64u
#define KVBM_HD_CHUNK_START 1u
#define KVBM_HD_CHUNK_END 2u
#define KVBM_HD_PARENT 4u
#define KVBM_HD_ROOT 8u

/* Chunks reduced by one CUDA thread block (a power of two: a full group
 * is a subtree), and the most groups one input may have (the second
 * reduction holds them all in shared memory): 256 KiB x 1024 = 256 MiB,
 * the largest block kvbm_cuda_digest_blocks takes. */
#define KVBM_HD_GROUP_CHUNKS 256u
#define KVBM_HD_MAX_GROUPS 1024u

#define KVBM_HD_IV0 0x6A09E667u
#define KVBM_HD_IV1 0xBB67AE85u
#define KVBM_HD_IV2 0x3C6EF372u
#define KVBM_HD_IV3 0xA54FF53Au
#define KVBM_HD_IV4 0x510E527Fu
#define KVBM_HD_IV5 0x9B05688Cu
#define KVBM_HD_IV6 0x1F83D9ABu
#define KVBM_HD_IV7 0x5BE0CD19u

KVBM_HD_FN void kvbm_hd_iv(uint32_t cv[8]) {
  cv[0] = KVBM_HD_IV0, cv[1] = KVBM_HD_IV1, cv[2] = KVBM_HD_IV2, cv[3] = KVBM_HD_IV3;
  cv[4] = KVBM_HD_IV4, cv[5] = KVBM_HD_IV5, cv[6] = KVBM_HD_IV6, cv[7] = KVBM_HD_IV7;
}

KVBM_HD_FN uint32_t kvbm_hd_rotr(uint32_t w, uint32_t c) { return (w >> c) | (w << (32u - c)); }

#define KVBM_HD_G(a, b, c, d, x, y)     \
  do {                                  \
    a = a + b + (x);                    \
    d = kvbm_hd_rotr(d ^ a, 16);        \
    c = c + d;                          \
    b = kvbm_hd_rotr(b ^ c, 12);        \
    a = a + b + (y);                    \
    d = kvbm_hd_rotr(d ^ a, 8);         \
    c = c + d;                          \
    b = kvbm_hd_rotr(b ^ c, 7);         \
  } while (0)

/* The compression function, truncated to the 8 words of a chaining value
 * (all kvbm needs: 32-byte digests). m[] is the 64-byte message block as
 * little-endian words, consumed (permuted in place round by round, as the
 * specification's reference does, so that every round reads m[0..15] in
 * order: constant indices once unrolled). cv and out may alias. */
KVBM_HD_FN void kvbm_hd_compress(const uint32_t cv[8], uint32_t m[16], uint32_t block_len,
                                 uint64_t counter, uint32_t flags, uint32_t out[8]) {
  uint32_t v0 = cv[0], v1 = cv[1], v2 = cv[2], v3 = cv[3];
  uint32_t v4 = cv[4], v5 = cv[5], v6 = cv[6], v7 = cv[7];
  uint32_t v8 = KVBM_HD_IV0, v9 = KVBM_HD_IV1, v10 = KVBM_HD_IV2, v11 = KVBM_HD_IV3;
  uint32_t v12 = (uint32_t)counter, v13 = (uint32_t)(counter >> 32), v14 = block_len, v15 = flags;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int r = 0; r < 7; r++) {
    KVBM_HD_G(v0, v4, v8, v12, m[0], m[1]);
    KVBM_HD_G(v1, v5, v9, v13, m[2], m[3]);
    KVBM_HD_G(v2, v6, v10, v14, m[4], m[5]);
    KVBM_HD_G(v3, v7, v11, v15, m[6], m[7]);
    KVBM_HD_G(v0, v5, v10, v15, m[8], m[9]);
    KVBM_HD_G(v1, v6, v11, v12, m[10], m[11]);
    KVBM_HD_G(v2, v7, v8, v13, m[12], m[13]);
    KVBM_HD_G(v3, v4, v9, v14, m[14], m[15]);
    if (r < 6) { /* the message permutation {2,6,3,10,7,0,4,13,1,11,12,5,9,14,15,8} */
      uint32_t t0 = m[2], t1 = m[6], t2 = m[3], t3 = m[10], t4 = m[7], t5 = m[0], t6 = m[4],
               t7 = m[13], t8 = m[1], t9 = m[11], t10 = m[12], t11 = m[5], t12 = m[9],
               t13 = m[14], t14 = m[15], t15 = m[8];
      m[0] = t0, m[1] = t1, m[2] = t2, m[3] = t3, m[4] = t4, m[5] = t5, m[6] = t6, m[7] = t7;
      m[8] = t8, m[9] = t9, m[10] = t10, m[11] = t11, m[12] = t12, m[13] = t13, m[14] = t14,
      m[15] = t15;
    }
  }
  out[0] = v0 ^ v8, out[1] = v1 ^ v9, out[2] = v2 ^ v10, out[3] = v3 ^ v11;
  out[4] = v4 ^ v12, out[5] = v5 ^ v13, out[6] = v6 ^ v14, out[7] = v7 ^ v15;
}

/* Loads `len` (0..64) bytes at p as a message block, zero padded. On the
 * device a whole block at a 16-byte aligned address is four 16-byte
 * read-only loads (CUDA and x86 are both little-endian, so the words are
 * the bytes as they lie); anything else goes byte by byte. */
KVBM_HD_FN void kvbm_hd_load_block(const uint8_t *p, uint32_t len, uint32_t m[16]) {
#ifdef __CUDA_ARCH__
  if (len == KVBM_HD_BLOCK_LEN && ((uintptr_t)p & 15u) == 0) {
    const uint4 *q = (const uint4 *)p;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      uint4 x = __ldg(q + i);
      m[4 * i] = x.x, m[4 * i + 1] = x.y, m[4 * i + 2] = x.z, m[4 * i + 3] = x.w;
    }
    return;
  }
#endif
  for (uint32_t i = 0; i < 16; i++) {
    uint32_t w = 0;
    for (uint32_t b = 0; b < 4; b++) {
      uint32_t k = 4 * i + b;
      if (k < len) w |= (uint32_t)p[k] << (8 * b);
    }
    m[i] = w;
  }
}

/* The chaining value of one chunk: `len` bytes (0..1024; 0 only for the
 * empty input) at p, chunk number `counter`. `root` adds the ROOT flag to
 * the last block: the input is this one chunk, and cv is its digest. */
KVBM_HD_FN void kvbm_hd_chunk_cv(const uint8_t *p, uint32_t len, uint64_t counter, int root,
                                 uint32_t cv[8]) {
  uint32_t nblocks = len == 0 ? 1u : (len + KVBM_HD_BLOCK_LEN - 1) / KVBM_HD_BLOCK_LEN;
  uint32_t m[16];
  kvbm_hd_iv(cv);
  for (uint32_t b = 0; b < nblocks; b++) {
    uint32_t off = b * KVBM_HD_BLOCK_LEN;
    uint32_t blen = len - off < KVBM_HD_BLOCK_LEN ? len - off : KVBM_HD_BLOCK_LEN;
    uint32_t flags = 0;
    if (b == 0) flags |= KVBM_HD_CHUNK_START;
    if (b + 1 == nblocks) flags |= KVBM_HD_CHUNK_END | (root ? KVBM_HD_ROOT : 0u);
    kvbm_hd_load_block(p + off, blen, m);
    kvbm_hd_compress(cv, m, blen, counter, flags, cv);
  }
}

/* A parent node over two children's chaining values; `root` when it is
 * the top of the whole tree (out is then the digest). out may alias. */
KVBM_HD_FN void kvbm_hd_parent_cv(const uint32_t l[8], const uint32_t r[8], int root,
                                  uint32_t out[8]) {
  uint32_t m[16], iv[8];
  for (int i = 0; i < 8; i++) m[i] = l[i], m[8 + i] = r[i];
  kvbm_hd_iv(iv);
  kvbm_hd_compress(iv, m, KVBM_HD_BLOCK_LEN, 0, KVBM_HD_PARENT | (root ? KVBM_HD_ROOT : 0u), out);
}

/* Node i of the level above a level of n >= 2 nodes (cvs: n x 8 words):
 * the parent of nodes 2i and 2i+1, or node 2i itself carried up when it is
 * the odd last one. The level above has (n + 1) / 2 nodes. `top` says that
 * this level is the whole input's last (n == 2 there): the parent is the
 * root. */
KVBM_HD_FN void kvbm_hd_level_node(const uint32_t (*cvs)[8], uint32_t n, uint32_t i, int top,
                                   uint32_t out[8]) {
  if (2 * i + 1 < n) {
    kvbm_hd_parent_cv(cvs[2 * i], cvs[2 * i + 1], top && n == 2, out);
  } else {
    for (int k = 0; k < 8; k++) out[k] = cvs[2 * i][k];
  }
}

/* Chunks of an input of len bytes (the empty input is one empty chunk). */
KVBM_HD_FN uint64_t kvbm_hd_chunks(uint64_t len) {
  return len == 0 ? 1u : (len + KVBM_HD_CHUNK_LEN - 1) / KVBM_HD_CHUNK_LEN;
}

/* Groups of KVBM_HD_GROUP_CHUNKS chunks of an input of len bytes. */
KVBM_HD_FN uint64_t kvbm_hd_groups(uint64_t len) {
  return (kvbm_hd_chunks(len) + KVBM_HD_GROUP_CHUNKS - 1) / KVBM_HD_GROUP_CHUNKS;
}

/* A chaining value as its 32 little-endian bytes. */
KVBM_HD_FN void kvbm_hd_store_cv(const uint32_t cv[8], uint8_t out[32]) {
  for (int i = 0; i < 8; i++)
    for (int b = 0; b < 4; b++) out[4 * i + b] = (uint8_t)(cv[i] >> (8 * b));
}

/* ---- what checksum.c and checksum_kernels.cu share ---- */

/* One input of a launch: its spans (sp[span0 .. span0 + nspans), each
 * but the last a whole number of chunks), total length, and where its
 * group chaining values go in the scratch array (index of its first
 * group). */
typedef struct kvbm__dblock {
  uint64_t len;
  uint64_t group0;
  uint64_t groups;
  uint32_t span0;
  uint32_t nspans;
} kvbm__dblock;

/* One span: device address, length, offset in its input. */
typedef struct kvbm__dspan {
  uint64_t ptr;
  uint64_t len;
  uint64_t off;
  uint64_t pad;
} kvbm__dspan;

/* Where byte `off` of an input made of spans sp[0..n) lies (n >= 1; the
 * last span whose offset is at most off, so empty spans are passed over):
 * the whole chunk starting there is in that span when every span but the
 * last is a whole number of chunks. A binary search: log2(n) reads of a
 * table the cache holds. */
KVBM_HD_FN const uint8_t *kvbm_hd_span_ptr(const kvbm__dspan *sp, uint32_t n, uint64_t off) {
  uint32_t lo = 0, hi = n - 1;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo + 1) / 2;
    if (sp[mid].off <= off) lo = mid;
    else hi = mid - 1;
  }
  return (const uint8_t *)(uintptr_t)(sp[lo].ptr + (off - sp[lo].off));
}

/* Queues the digest of d[0..n) (a device array; spans in sp) on `stream` (a
 * cudaStream_t): 32 bytes per input to out (device, n x 32), using scratch
 * (device, 32 bytes per group of all inputs). owner (device, `groups`
 * entries: the sum of d[].groups) names the input of each group, so that
 * the first kernel's grid is exactly one thread block per group whatever
 * the mix of sizes. max_groups is the largest d[].groups. Returns the
 * cudaError_t of the launches (0 = cudaSuccess). Defined only when the
 * kernels are built. */
int kvbm__digest_launch(const kvbm__dblock *d, const kvbm__dspan *sp, const uint32_t *owner, uint32_t n,
                        uint64_t groups, uint32_t max_groups, uint8_t *scratch, uint8_t *out, void *stream);

/* kvbm_cuda_digest_blocks, plus `reps` more launches of the kernels alone
 * timed with CUDA events: their mean in *kernel_ms (for
 * bench_gpu_checksum; checksum.c). Same errors; KVBM_EINVAL for reps < 1. */
struct kvbm_error;
int kvbm__cuda_digest_timed(int32_t device, void *stream, const void *const *ptrs, const uint64_t *lens,
                            uint32_t n, uint8_t (*out)[32], int reps, float *kernel_ms, struct kvbm_error *err);

#ifdef __cplusplus
}
#endif

#endif
