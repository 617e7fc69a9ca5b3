/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blake3_impl.h: what the BLAKE3 hasher shares with its compression paths.
 *
 * Every path offers one entry point, a "many" kernel: compress `n` inputs
 * that sit at a fixed `stride` in memory, each `nblocks` 64-byte blocks
 * long, all with the same key and flags, and write their `n` 32-byte
 * chaining values to `out`. Chunks are stride 1024 / 16 blocks; parent
 * nodes are stride 64 / 1 block (a row of child chaining values is already
 * laid out as parent blocks). The SIMD kernels take exactly their width
 * of inputs; the portable one takes any number.
 */
#ifndef KVBM_BLAKE3_IMPL_H
#define KVBM_BLAKE3_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
  B3_CHUNK_START = 1 << 0,
  B3_CHUNK_END = 1 << 1,
  B3_PARENT = 1 << 2,
  B3_ROOT = 1 << 3,
  B3_KEYED_HASH = 1 << 4,
  B3_DERIVE_KEY_CONTEXT = 1 << 5,
  B3_DERIVE_KEY_MATERIAL = 1 << 6,
};

#define B3_BLOCK_LEN 64
#define B3_CHUNK_LEN 1024
#define B3_CHUNK_BLOCKS 16

extern const uint32_t b3_iv[8];

/* Round r uses message word b3_schedule[r][i] where the spec's round 0
 * uses word i: the permutation 2,6,3,10,7,0,4,13,1,11,12,5,9,14,15,8
 * applied r times. Static so that every user sees constants it can fold
 * into unrolled rounds. */
static const uint8_t b3_schedule[7][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8},
    {3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1},
    {10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6},
    {12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4},
    {9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7},
    {11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13},
};


/* Arguments of a many kernel, bundled to keep the signatures short. */
typedef struct b3_many_args {
  const uint8_t *in;
  size_t stride;        /* bytes between the starts of two inputs */
  size_t nblocks;       /* blocks per input (all full) */
  const uint32_t *key;  /* 8 words: the chaining value to start from */
  uint64_t counter;     /* counter of the first input */
  int counter_step;     /* 1 for chunks (counter + i), 0 for parents */
  uint8_t flags;        /* on every block */
  uint8_t flags_first;  /* added on each input's first block */
  uint8_t flags_last;   /* added on each input's last block */
} b3_many_args;

typedef void (*b3_many_fn)(const b3_many_args *a, uint8_t *out);

/* The full 16-word result of one compression (the first 8 words are the
 * new chaining value, all 16 are extended output). */
void kvbm__b3_compress_portable(const uint32_t cv[8], const uint8_t block[64],
                          uint8_t block_len, uint64_t counter, uint8_t flags,
                          uint32_t out[16]);

/* Any number of inputs, one after the other. */
void kvbm__b3_many_portable(const b3_many_args *a, size_t n, uint8_t *out);

#if defined(__x86_64__) || defined(__i386__)
#define B3_X86 1
void kvbm__b3_many_sse41(const b3_many_args *a, uint8_t *out);   /* 4 inputs */
/* Same contract as kvbm__b3_compress_portable, state as row vectors. */
void kvbm__b3_compress_sse41(const uint32_t cv[8], const uint8_t block[64],
                       uint8_t block_len, uint64_t counter, uint8_t flags,
                       uint32_t out[16]);
void kvbm__b3_many_avx2(const b3_many_args *a, uint8_t *out);    /* 8 inputs */
void kvbm__b3_many_avx512(const b3_many_args *a, uint8_t *out);  /* 16 inputs */
#endif

/* Hashing one input in pieces (blake3.c; the pool's building blocks).
 * Plain hash mode. `piece` is a power of two >= 1024 and the input is
 * longer than one piece (else it is one plain hash). kvbm__b3_piece_cv
 * gives piece `index`'s chaining value (bytes [index*piece, ...) of the
 * input), on any thread; kvbm__b3_root_from_pieces rebuilds the tree above
 * the pieces' values (cvs[i] for piece i) and writes out_len bytes of the
 * input's hash. KVBM_EINVAL for arguments outside those rules. */
int kvbm__b3_piece_cv(const void *input, size_t len, size_t piece,
                      size_t index, uint8_t cv[32]);
int kvbm__b3_root_from_pieces(const uint8_t (*cvs)[32], size_t len,
                              size_t piece, uint8_t *out, size_t out_len);

/* Fixed-count loops over lanes and words in the kernels must be fully
 * unrolled so that vectors stay in registers; -O2 alone does not. */
#define B3_UNROLL _Pragma("GCC unroll 16")

/* The kernels read W inputs 1 KiB apart, 64 bytes at a time: too many
 * streams for the hardware prefetcher once data is beyond L2. Asking for
 * the block after next (measured best: +15% from L3) keeps it coming;
 * a prefetch past the end of an input is harmless. */
#define B3_PREFETCH(p) \
  _mm_prefetch((const char *)(p) + 2 * B3_BLOCK_LEN, _MM_HINT_T0)

static inline uint32_t b3_load32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static inline void b3_store32(uint8_t *p, uint32_t w) {
  p[0] = (uint8_t)w;
  p[1] = (uint8_t)(w >> 8);
  p[2] = (uint8_t)(w >> 16);
  p[3] = (uint8_t)(w >> 24);
}

static inline void b3_store_cv(uint8_t out[32], const uint32_t w[8]) {
  for (int i = 0; i < 8; i++) b3_store32(out + 4 * i, w[i]);
}

#endif /* KVBM_BLAKE3_IMPL_H */
