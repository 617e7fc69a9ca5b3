/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blake3.c: the BLAKE3 hasher: chunking, the tree, modes, extended output,
 * and the choice of compression path.
 *
 * Design. Input is cut into 1 KiB chunks; chunk chaining values are the
 * leaves of a binary tree whose left subtrees are always complete powers
 * of two. The hasher keeps:
 *   - the current, incomplete chunk (compressed one block at a time, by
 *     compress(); its last block is held back because only the end of
 *     input tells whether it is the root);
 *   - a stack of chaining values of complete subtrees, largest first.
 * Long inputs skip the chunk state: all their whole chunks are compressed
 * side by side by a SIMD kernel ("batch"), then the tree above them is
 * reduced level by level with the same kernel, since a row of sibling
 * chaining values is exactly a row of parent blocks. Only nodes that
 * straddle the batch edge go to the stack.
 *
 * Lazy merging: a stack entry is merged with its left neighbour only when
 * more input arrives (the stack is brought down to popcount(chunks) entries
 * before each push). So the hasher can take whole chunks in a batch even
 * when they end the input: at finalize the top two entries become the root
 * parent. For the same reason a batch never merges the pair that would
 * cover the whole input so far. This costs at most one stack slot.
 *
 * Path choice: each hasher records its path (AUTO resolves to the widest
 * the CPU has, via __builtin_cpu_supports, a cheap read of data the
 * runtime fills at load time); nothing is cached in globals. The widest
 * kernel takes full batches, one padded call of a narrower one the rest
 * (see many()).
 *
 * Trade-offs: a batch keeps its chaining values on the stack (up to about
 * 40 KiB per update call) rather than in the hasher, which stays small and
 * copyable; inputs shorter than two chunks never reach the SIMD kernels
 * (they are latency-bound single compressions either way).
 */
#include "kvbm/blake3.h"

#include <string.h>

#include "blake3/blake3_impl.h"

/* Chunks per batch: bounds the two chaining value rows on the stack
 * (2 x 8 KiB) while keeping kernel calls long. */
#define B3_MAX_BATCH 256

/* ---- compression paths ---- */

static int cpu_has(kvbm_blake3_impl impl) {
  switch (impl) {
    case KVBM_BLAKE3_IMPL_AUTO:
    case KVBM_BLAKE3_IMPL_PORTABLE:
      return 1;
#if defined(B3_X86) && (defined(__GNUC__) || defined(__clang__))
    case KVBM_BLAKE3_IMPL_SSE41:
      return __builtin_cpu_supports("sse4.1");
    case KVBM_BLAKE3_IMPL_AVX2:
      return __builtin_cpu_supports("avx2");
    case KVBM_BLAKE3_IMPL_AVX512:
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return 0;
  }
}

int kvbm_blake3_impl_available(kvbm_blake3_impl impl) { return cpu_has(impl); }

kvbm_blake3_impl kvbm_blake3_impl_best(void) {
  static const kvbm_blake3_impl order[] = {
      KVBM_BLAKE3_IMPL_AVX512, KVBM_BLAKE3_IMPL_AVX2, KVBM_BLAKE3_IMPL_SSE41};
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
    if (cpu_has(order[i])) return order[i];
  return KVBM_BLAKE3_IMPL_PORTABLE;
}

const char *kvbm_blake3_impl_name(kvbm_blake3_impl impl) {
  switch (impl) {
    case KVBM_BLAKE3_IMPL_AUTO: return "auto";
    case KVBM_BLAKE3_IMPL_PORTABLE: return "portable";
    case KVBM_BLAKE3_IMPL_SSE41: return "sse4.1";
    case KVBM_BLAKE3_IMPL_AVX2: return "avx2";
    case KVBM_BLAKE3_IMPL_AVX512: return "avx512";
  }
  return "?";
}

/* Runs `n` inputs through the SIMD kernels allowed by `impl`: full
 * batches on the widest, then whatever is left in ONE call of the
 * narrowest kernel that holds it, the inputs copied to a zero-padded
 * scratch area. A kernel call costs about the same at any width, so one
 * padded call beats a cascade of narrower ones or a portable loop. */
static void many(kvbm_blake3_impl impl, b3_many_args a, size_t n,
                 uint8_t *out) {
#ifdef B3_X86
  static const struct {
    kvbm_blake3_impl impl;
    size_t width;
    b3_many_fn fn;
  } kernels[] = {
      {KVBM_BLAKE3_IMPL_AVX512, 16, kvbm__b3_many_avx512},
      {KVBM_BLAKE3_IMPL_AVX2, 8, kvbm__b3_many_avx2},
      {KVBM_BLAKE3_IMPL_SSE41, 4, kvbm__b3_many_sse41},
  };
  const size_t nk = sizeof kernels / sizeof kernels[0];
  size_t widest = 0;
  while (widest < nk && impl < kernels[widest].impl) widest++;
  if (widest == nk) {
    kvbm__b3_many_portable(&a, n, out);
    return;
  }
  const size_t w = kernels[widest].width;
  while (n >= w) {
    kernels[widest].fn(&a, out);
    a.in += w * a.stride;
    a.counter += (uint64_t)a.counter_step * w;
    out += 32 * w;
    n -= w;
  }
  if (n == 0) return;
  size_t k = nk - 1;
  while (kernels[k].width < n) k--;
  const size_t len = a.nblocks * B3_BLOCK_LEN;
  uint8_t scratch[16 * B3_CHUNK_LEN], cvs[16 * 32];
  if (len * kernels[k].width > sizeof scratch) {
    kvbm__b3_many_portable(&a, n, out);
    return;
  }
  for (size_t i = 0; i < n; i++)
    memcpy(scratch + i * len, a.in + i * a.stride, len);
  memset(scratch + n * len, 0, (kernels[k].width - n) * len);
  a.in = scratch;
  a.stride = len;
  kernels[k].fn(&a, cvs);
  memcpy(out, cvs, 32 * n);
#else
  (void)impl;
  kvbm__b3_many_portable(&a, n, out);
#endif
}

/* One compression (not batchable): row-wise SSE4.1 on any SIMD path. */
static void compress(kvbm_blake3_impl impl, const uint32_t cv[8],
                     const uint8_t block[64], uint8_t block_len,
                     uint64_t counter, uint8_t flags, uint32_t out[16]) {
#ifdef B3_X86
  if (impl >= KVBM_BLAKE3_IMPL_SSE41) {
    kvbm__b3_compress_sse41(cv, block, block_len, counter, flags, out);
    return;
  }
#else
  (void)impl;
#endif
  kvbm__b3_compress_portable(cv, block, block_len, counter, flags, out);
}

/* ---- root output ---- */

/* What the root (or any node) needs to produce output: enough to run its
 * last compression again with other counters and the ROOT flag. */
typedef struct node {
  uint32_t cv[8];
  uint8_t block[64];
  uint8_t block_len;
  uint64_t counter;
  uint8_t flags;
  kvbm_blake3_impl impl; /* the hasher's path, for compress() */
} node;

static void node_cv(const node *n, uint8_t out[32]) {
  uint32_t st[16];
  compress(n->impl, n->cv, n->block, n->block_len, n->counter, n->flags, st);
  b3_store_cv(out, st);
}

static node parent_node(const kvbm_blake3_hasher *h, const uint8_t left[32],
                        const uint8_t right[32]) {
  node n;
  memcpy(n.cv, h->key, sizeof n.cv);
  memcpy(n.block, left, 32);
  memcpy(n.block + 32, right, 32);
  n.block_len = B3_BLOCK_LEN;
  n.counter = 0;
  n.flags = (uint8_t)(h->flags | B3_PARENT);
  n.impl = (kvbm_blake3_impl)h->impl;
  return n;
}

/* Output bytes [seek, seek+len): output block i is the root compression
 * with counter i. */
static void root_output(const node *n, uint64_t seek, uint8_t *out,
                        size_t len) {
  uint64_t counter = seek / 64;
  size_t skip = (size_t)(seek % 64);
  while (len > 0) {
    uint32_t st[16];
    uint8_t bytes[64];
    compress(n->impl, n->cv, n->block, n->block_len, counter,
                         (uint8_t)(n->flags | B3_ROOT), st);
    for (int i = 0; i < 16; i++) b3_store32(bytes + 4 * i, st[i]);
    size_t take = 64 - skip;
    if (take > len) take = len;
    memcpy(out, bytes + skip, take);
    out += take;
    len -= take;
    skip = 0;
    counter++;
  }
}

/* ---- chunk state ---- */

static size_t chunk_len(const kvbm_blake3_hasher *h) {
  return (size_t)h->blocks_done * B3_BLOCK_LEN + h->buf_len;
}

static uint8_t chunk_start_flag(const kvbm_blake3_hasher *h) {
  return h->blocks_done == 0 ? B3_CHUNK_START : 0;
}

static void chunk_reset(kvbm_blake3_hasher *h, uint64_t counter) {
  memcpy(h->chunk_cv, h->key, sizeof h->chunk_cv);
  h->chunk_counter = counter;
  h->buf_len = 0;
  h->blocks_done = 0;
}

/* Adds bytes to the current chunk; the caller keeps them within the
 * chunk. A full buffer is compressed only once more bytes come. */
static void chunk_update(kvbm_blake3_hasher *h, const uint8_t *in,
                         size_t len) {
  while (len > 0) {
    if (h->buf_len == B3_BLOCK_LEN) {
      uint32_t st[16];
      compress((kvbm_blake3_impl)h->impl, h->chunk_cv, h->buf, B3_BLOCK_LEN,
               h->chunk_counter, (uint8_t)(h->flags | chunk_start_flag(h)),
               st);
      memcpy(h->chunk_cv, st, sizeof h->chunk_cv);
      h->blocks_done++;
      h->buf_len = 0;
    }
    size_t take = B3_BLOCK_LEN - h->buf_len;
    if (take > len) take = len;
    memcpy(h->buf + h->buf_len, in, take);
    h->buf_len = (uint8_t)(h->buf_len + take);
    in += take;
    len -= take;
  }
}

static node chunk_node(const kvbm_blake3_hasher *h) {
  node n;
  memcpy(n.cv, h->chunk_cv, sizeof n.cv);
  memset(n.block, 0, sizeof n.block);
  memcpy(n.block, h->buf, h->buf_len);
  n.block_len = h->buf_len;
  n.counter = h->chunk_counter;
  n.flags = (uint8_t)(h->flags | chunk_start_flag(h) | B3_CHUNK_END);
  n.impl = (kvbm_blake3_impl)h->impl;
  return n;
}

/* ---- the subtree stack ---- */

static unsigned popcount64(uint64_t x) {
  unsigned c = 0;
  for (; x; x &= x - 1) c++;
  return c;
}

/* Pushes the chaining value of a complete subtree that starts after
 * `chunks_before` chunks, first merging what the lazy rule left over. */
/* Merges the entries left unmerged, down to one per set bit of `chunks`,
 * the count of chunks the stack covers: done when more input shows that
 * none of them is the root. */
static void stack_merge(kvbm_blake3_hasher *h, uint64_t chunks) {
  while (h->stack_len > popcount64(chunks)) {
    node p = parent_node(h, h->stack[h->stack_len - 2],
                         h->stack[h->stack_len - 1]);
    node_cv(&p, h->stack[h->stack_len - 2]);
    h->stack_len--;
  }
}

static void stack_push(kvbm_blake3_hasher *h, const uint8_t cv[32],
                       uint64_t chunks_before) {
  stack_merge(h, chunks_before);
  memcpy(h->stack[h->stack_len++], cv, 32);
}

/* A subtree left at the edge of a batch, waiting for the stack. */
typedef struct edge {
  uint8_t cv[32];
  unsigned level;
} edge;

/* Hashes `n` whole chunks (chunk state empty) and pushes the subtrees
 * they complete. */
static void batch(kvbm_blake3_hasher *h, const uint8_t *in, size_t n) {
  uint8_t rows[2][B3_MAX_BATCH * 32];
  edge front[66], back[66];
  size_t nfront = 0, nback = 0;
  const uint64_t first = h->chunk_counter;
  const kvbm_blake3_impl impl = (kvbm_blake3_impl)h->impl;

  b3_many_args a = {in, B3_CHUNK_LEN, B3_CHUNK_BLOCKS, h->key, first, 1,
                    h->flags, B3_CHUNK_START, B3_CHUNK_END};
  many(impl, a, n, rows[0]);

  /* Level by level: a first node at an odd position is a right child whose
   * sibling is on the stack; a last node at an even position waits for a
   * sibling from later input; the pairs in between are parents' blocks.
   * Edge nodes are copied out at once: the next level's output overwrites
   * the row they sit in. */
  uint64_t pos = first;
  size_t m = n;
  int cur = 0;
  for (unsigned level = 0; m > 0; level++) {
    const uint8_t *row = rows[cur];
    if (pos & 1) {
      memcpy(front[nfront].cv, row, 32);
      front[nfront++].level = level;
      row += 32;
      pos++;
      m--;
    }
    if (first == 0 && nback == 0 && m == 2) {
      /* This pair would be the whole input so far: it may be the root. */
      for (int i = 0; i < 2; i++) {
        memcpy(front[nfront].cv, row + 32 * i, 32);
        front[nfront++].level = level;
      }
      break;
    }
    size_t pairs = m / 2;
    if (m & 1) {
      memcpy(back[nback].cv, row + 64 * pairs, 32);
      back[nback++].level = level;
    }
    b3_many_args p = {row, 64, 1, h->key, 0, 0,
                      (uint8_t)(h->flags | B3_PARENT), 0, 0};
    many(impl, p, pairs, rows[cur ^ 1]);
    cur ^= 1;
    m = pairs;
    pos /= 2;
  }

  /* In input order: front edges grow in size, back edges shrink. */
  uint64_t chunks = first;
  for (size_t i = 0; i < nfront; i++) {
    stack_push(h, front[i].cv, chunks);
    chunks += (uint64_t)1 << front[i].level;
  }
  for (size_t i = nback; i-- > 0;) {
    stack_push(h, back[i].cv, chunks);
    chunks += (uint64_t)1 << back[i].level;
  }
  chunk_reset(h, first + n);
}

/* ---- subtrees, for hashing one input on several threads ----
 *
 * BLAKE3's tree makes the chaining value of a subtree a function of its
 * bytes and its position (the counter of its first chunk) alone. An input
 * cut into pieces of P bytes (P a power of two, >= one chunk) has a tree
 * whose every split above P bytes falls on a piece boundary: the left
 * subtree of n bytes is the largest power-of-two number of chunks below n
 * bytes, a multiple of P once n > P. So the pieces' chaining values can be
 * computed apart (kvbm__b3_piece_cv, on any thread) and the tree above them
 * rebuilt from those values alone (kvbm__b3_root_from_pieces), giving the
 * same hash as one hasher would. Plain hash mode only (what frames use). */

/* The chaining value of the complete subtree of `nchunks` whole chunks (a
 * power of two) at chunk `offset` (a multiple of nchunks): the chunks by
 * the widest kernel, then the levels above by the same kernel. Never the
 * root. */
static void complete_cv(kvbm_blake3_impl impl, const uint8_t *in,
                        uint64_t nchunks, uint64_t offset, uint8_t cv[32]) {
  if (nchunks > B3_MAX_BATCH) {
    uint8_t pair[64];
    uint64_t half = nchunks / 2;
    complete_cv(impl, in, half, offset, pair);
    complete_cv(impl, in + half * B3_CHUNK_LEN, half, offset + half,
                pair + 32);
    uint32_t st[16];
    compress(impl, b3_iv, pair, B3_BLOCK_LEN, 0, B3_PARENT, st);
    b3_store_cv(cv, st);
    return;
  }
  uint8_t rows[2][B3_MAX_BATCH * 32];
  b3_many_args a = {in, B3_CHUNK_LEN, B3_CHUNK_BLOCKS, b3_iv, offset, 1,
                    0, B3_CHUNK_START, B3_CHUNK_END};
  many(impl, a, (size_t)nchunks, rows[0]);
  size_t m = (size_t)nchunks;
  int cur = 0;
  while (m > 1) {
    b3_many_args p = {rows[cur], 64, 1, b3_iv, 0, 0, B3_PARENT, 0, 0};
    many(impl, p, m / 2, rows[cur ^ 1]);
    cur ^= 1;
    m /= 2;
  }
  memcpy(cv, rows[cur], 32);
}

/* Chunks in the left subtree of a `len`-byte subtree (len > one chunk):
 * the largest power of two that leaves at least one byte on the right. */
static uint64_t left_chunks(uint64_t len) {
  uint64_t n = (len - 1) / B3_CHUNK_LEN, p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

/* The chaining value of any subtree that is not the root: `len` (>= 1)
 * bytes at chunk `offset`, either complete and aligned or the input's
 * rightmost subtree of its level. */
static void subtree_cv(kvbm_blake3_impl impl, const uint8_t *in, uint64_t len,
                       uint64_t offset, uint8_t cv[32]) {
  uint64_t chunks = len / B3_CHUNK_LEN;
  if (len % B3_CHUNK_LEN == 0 && chunks > 0 && (chunks & (chunks - 1)) == 0) {
    complete_cv(impl, in, chunks, offset, cv);
    return;
  }
  if (len <= B3_CHUNK_LEN) {
    kvbm_blake3_hasher h;
    kvbm_blake3_hasher_init(&h);
    h.impl = (uint8_t)impl;
    chunk_reset(&h, offset);
    chunk_update(&h, in, (size_t)len);
    node c = chunk_node(&h);
    node_cv(&c, cv);
    return;
  }
  uint64_t left = left_chunks(len);
  uint8_t pair[64];
  complete_cv(impl, in, left, offset, pair);
  subtree_cv(impl, in + left * B3_CHUNK_LEN, len - left * B3_CHUNK_LEN,
             offset + left, pair + 32);
  uint32_t st[16];
  compress(impl, b3_iv, pair, B3_BLOCK_LEN, 0, B3_PARENT, st);
  b3_store_cv(cv, st);
}

int kvbm__b3_piece_cv(const void *input, size_t len, size_t piece,
                      size_t index, uint8_t cv[32]) {
  if (!input || !cv || piece < B3_CHUNK_LEN || (piece & (piece - 1)) ||
      len <= piece || index >= (len + piece - 1) / piece)
    return KVBM_EINVAL;
  size_t start = index * piece;
  size_t n = len - start < piece ? len - start : piece;
  subtree_cv(kvbm_blake3_impl_best(), (const uint8_t *)input + start, n,
             start / B3_CHUNK_LEN, cv);
  return KVBM_OK;
}

/* The chaining value of pieces [lo, hi), which cover `len` bytes. */
static void pieces_cv(const uint8_t (*cvs)[32], size_t lo, size_t hi,
                      uint64_t len, size_t piece, uint8_t cv[32]) {
  if (hi - lo == 1) {
    memcpy(cv, cvs[lo], 32);
    return;
  }
  size_t lp = (size_t)(left_chunks(len) * B3_CHUNK_LEN / piece);
  uint8_t pair[64];
  pieces_cv(cvs, lo, lo + lp, (uint64_t)lp * piece, piece, pair);
  pieces_cv(cvs, lo + lp, hi, len - (uint64_t)lp * piece, piece, pair + 32);
  uint32_t st[16];
  compress(kvbm_blake3_impl_best(), b3_iv, pair, B3_BLOCK_LEN, 0, B3_PARENT,
           st);
  b3_store_cv(cv, st);
}

int kvbm__b3_root_from_pieces(const uint8_t (*cvs)[32], size_t len,
                              size_t piece, uint8_t *out, size_t out_len) {
  if (!cvs || (!out && out_len > 0) || piece < B3_CHUNK_LEN ||
      (piece & (piece - 1)) || len <= piece)
    return KVBM_EINVAL;
  size_t n = (len + piece - 1) / piece;
  size_t lp = (size_t)(left_chunks(len) * B3_CHUNK_LEN / piece);
  uint8_t pair[64];
  pieces_cv(cvs, 0, lp, (uint64_t)lp * piece, piece, pair);
  pieces_cv(cvs, lp, n, len - (uint64_t)lp * piece, piece, pair + 32);
  node root;
  memcpy(root.cv, b3_iv, sizeof root.cv);
  memcpy(root.block, pair, 64);
  root.block_len = B3_BLOCK_LEN;
  root.counter = 0;
  root.flags = B3_PARENT;
  root.impl = kvbm_blake3_impl_best();
  root_output(&root, 0, out, out_len);
  return KVBM_OK;
}

/* ---- public API ---- */

static void init_common(kvbm_blake3_hasher *h, const uint32_t key[8],
                        uint8_t flags) {
  memcpy(h->key, key, sizeof h->key);
  h->flags = flags;
  h->impl = (uint8_t)kvbm_blake3_impl_best();
  h->stack_len = 0;
  chunk_reset(h, 0);
}

int kvbm_blake3_hasher_init(kvbm_blake3_hasher *h) {
  if (!h) return KVBM_EINVAL;
  init_common(h, b3_iv, 0);
  return KVBM_OK;
}

int kvbm_blake3_hasher_init_keyed(kvbm_blake3_hasher *h,
                                  const uint8_t key[KVBM_BLAKE3_KEY_LEN]) {
  if (!h || !key) return KVBM_EINVAL;
  uint32_t words[8];
  for (int i = 0; i < 8; i++) words[i] = b3_load32(key + 4 * i);
  init_common(h, words, B3_KEYED_HASH);
  return KVBM_OK;
}

int kvbm_blake3_hasher_init_derive_key_raw(kvbm_blake3_hasher *h,
                                           const void *context,
                                           size_t context_len) {
  if (!h || (!context && context_len > 0)) return KVBM_EINVAL;
  /* First hash the context in its own mode; its output keys the
   * material hash. */
  init_common(h, b3_iv, B3_DERIVE_KEY_CONTEXT);
  kvbm_blake3_hasher_update(h, context, context_len);
  uint8_t ck[32];
  kvbm_blake3_hasher_finalize(h, ck, sizeof ck);
  uint32_t words[8];
  for (int i = 0; i < 8; i++) words[i] = b3_load32(ck + 4 * i);
  init_common(h, words, B3_DERIVE_KEY_MATERIAL);
  return KVBM_OK;
}

int kvbm_blake3_hasher_init_derive_key(kvbm_blake3_hasher *h,
                                       const char *context) {
  if (!context) return KVBM_EINVAL;
  return kvbm_blake3_hasher_init_derive_key_raw(h, context, strlen(context));
}

int kvbm_blake3_hasher_set_impl(kvbm_blake3_hasher *h, kvbm_blake3_impl impl,
                                kvbm_error *err) {
  if (!h) return kvbm_error_set(err, KVBM_EINVAL, "blake3: hasher is NULL");
  if (impl < KVBM_BLAKE3_IMPL_AUTO || impl > KVBM_BLAKE3_IMPL_AVX512)
    return kvbm_error_set(err, KVBM_EINVAL, "blake3: unknown path %d",
                          (int)impl);
  if (!cpu_has(impl))
    return kvbm_error_set(err, KVBM_EUNSUPPORTED,
                          "blake3: this CPU cannot run the %s path",
                          kvbm_blake3_impl_name(impl));
  h->impl = (uint8_t)(impl == KVBM_BLAKE3_IMPL_AUTO ? kvbm_blake3_impl_best()
                                                    : impl);
  return KVBM_OK;
}

int kvbm_blake3_hasher_reset(kvbm_blake3_hasher *h) {
  if (!h) return KVBM_EINVAL;
  h->stack_len = 0;
  chunk_reset(h, 0);
  return KVBM_OK;
}

int kvbm_blake3_hasher_update(kvbm_blake3_hasher *h, const void *in,
                              size_t len) {
  if (!h || (!in && len > 0)) return KVBM_EINVAL;
  const uint8_t *p = in;
  while (len > 0) {
    if (chunk_len(h) == B3_CHUNK_LEN) {
      /* A full chunk with more input after it is not the root. */
      node c = chunk_node(h);
      uint8_t cv[32];
      node_cv(&c, cv);
      stack_push(h, cv, h->chunk_counter);
      chunk_reset(h, h->chunk_counter + 1);
    }
    size_t whole = len / B3_CHUNK_LEN;
    /* A lone first chunk stays in the chunk state: if it is the whole
     * input it is the root, which a chaining value cannot give. */
    if (chunk_len(h) == 0 && whole > 0 && (h->chunk_counter > 0 || whole > 1)) {
      if (whole > B3_MAX_BATCH) whole = B3_MAX_BATCH;
      batch(h, p, whole);
      p += whole * B3_CHUNK_LEN;
      len -= whole * B3_CHUNK_LEN;
      continue;
    }
    /* The stack must be canonical under a chunk that finalize may make
     * the root's rightmost leaf. */
    if (chunk_len(h) == 0) stack_merge(h, h->chunk_counter);
    size_t take = B3_CHUNK_LEN - chunk_len(h);
    if (take > len) take = len;
    chunk_update(h, p, take);
    p += take;
    len -= take;
  }
  return KVBM_OK;
}

int kvbm_blake3_hasher_finalize_seek(const kvbm_blake3_hasher *h,
                                     uint64_t seek, uint8_t *out,
                                     size_t out_len) {
  if (!h || (!out && out_len > 0)) return KVBM_EINVAL;
  if (out_len > 0 && (uint64_t)(out_len - 1) > UINT64_MAX - seek)
    return KVBM_EOVERFLOW;
  node n;
  size_t i = h->stack_len;
  if (chunk_len(h) > 0 || h->stack_len == 0) {
    n = chunk_node(h);
  } else {
    /* Input ended on a batch boundary: the top two entries are the root's
     * children (see the lazy merging rule above). */
    n = parent_node(h, h->stack[i - 2], h->stack[i - 1]);
    i -= 2;
  }
  while (i > 0) {
    uint8_t cv[32];
    node_cv(&n, cv);
    i--;
    n = parent_node(h, h->stack[i], cv);
  }
  root_output(&n, seek, out, out_len);
  return KVBM_OK;
}

int kvbm_blake3_hasher_finalize(const kvbm_blake3_hasher *h, uint8_t *out,
                                size_t out_len) {
  return kvbm_blake3_hasher_finalize_seek(h, 0, out, out_len);
}

int kvbm_blake3_hash(const void *in, size_t len, uint8_t *out,
                     size_t out_len) {
  kvbm_blake3_hasher h;
  kvbm_blake3_hasher_init(&h);
  int rc = kvbm_blake3_hasher_update(&h, in, len);
  return rc ? rc : kvbm_blake3_hasher_finalize(&h, out, out_len);
}

int kvbm_blake3_keyed_hash(const uint8_t key[KVBM_BLAKE3_KEY_LEN],
                           const void *in, size_t len, uint8_t *out,
                           size_t out_len) {
  kvbm_blake3_hasher h;
  int rc = kvbm_blake3_hasher_init_keyed(&h, key);
  if (!rc) rc = kvbm_blake3_hasher_update(&h, in, len);
  return rc ? rc : kvbm_blake3_hasher_finalize(&h, out, out_len);
}

int kvbm_blake3_derive_key(const char *context, const void *material,
                           size_t len, uint8_t *out, size_t out_len) {
  kvbm_blake3_hasher h;
  int rc = kvbm_blake3_hasher_init_derive_key(&h, context);
  if (!rc) rc = kvbm_blake3_hasher_update(&h, material, len);
  return rc ? rc : kvbm_blake3_hasher_finalize(&h, out, out_len);
}
