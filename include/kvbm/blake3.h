/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/blake3.h: the BLAKE3 hash function (hash, keyed hash, derive key,
 * extended output of any length).
 *
 * Our own implementation, written from the BLAKE3 specification. Large
 * inputs are hashed many chunks at a time with SSE4.1, AVX2 or AVX-512 when
 * the CPU has them (chosen when a hasher is initialised, or forced with
 * kvbm_blake3_hasher_set_impl for tests and benchmarks); the result never
 * depends on the path taken.
 *
 * Memory: a hasher is a plain struct the caller owns (about 1.9 KiB; stack
 * or heap), holds no pointers and allocates nothing; copying it forks the
 * hash state. Its fields are private. Nothing here keeps global state, so
 * distinct hashers may be used from distinct threads freely; one hasher
 * must not be used by two threads at once.
 */
#ifndef KVBM_BLAKE3_H
#define KVBM_BLAKE3_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVBM_BLAKE3_OUT_LEN 32   /* default output length, bytes */
#define KVBM_BLAKE3_KEY_LEN 32   /* key length for keyed hash */
#define KVBM_BLAKE3_BLOCK_LEN 64
#define KVBM_BLAKE3_CHUNK_LEN 1024
/* One more than the deepest tree (2^64 bytes = 2^54 chunks), for the
 * subtree that is kept unmerged until the end of input is known. */
#define KVBM_BLAKE3_MAX_DEPTH 56

/* Compression paths. AUTO picks the widest one the CPU supports. */
typedef enum kvbm_blake3_impl {
  KVBM_BLAKE3_IMPL_AUTO = 0,
  KVBM_BLAKE3_IMPL_PORTABLE = 1, /* plain C, one block at a time */
  KVBM_BLAKE3_IMPL_SSE41 = 2,    /* 4 chunks (or parents) at a time */
  KVBM_BLAKE3_IMPL_AVX2 = 3,     /* 8 at a time */
  KVBM_BLAKE3_IMPL_AVX512 = 4,   /* 16 at a time (AVX-512F) */
} kvbm_blake3_impl;

/* The hash state. Treat every field as private. */
typedef struct kvbm_blake3_hasher {
  uint32_t key[8];          /* key words (IV for plain hashing) */
  uint32_t chunk_cv[8];     /* chaining value of the current chunk */
  uint64_t chunk_counter;   /* index of the current chunk */
  uint8_t buf[KVBM_BLAKE3_BLOCK_LEN]; /* unprocessed bytes of the chunk */
  uint8_t buf_len;
  uint8_t blocks_done;      /* blocks of the current chunk compressed */
  uint8_t flags;            /* mode flags (keyed, derive key) */
  uint8_t impl;             /* a kvbm_blake3_impl other than AUTO */
  uint8_t stack_len;
  uint8_t stack[KVBM_BLAKE3_MAX_DEPTH][32]; /* subtree chaining values */
} kvbm_blake3_hasher;

/* Whether this CPU (and build) can run `impl` (AUTO is always available). */
KVBM_EXTERN int kvbm_blake3_impl_available(kvbm_blake3_impl impl);

/* The widest available path: what AUTO resolves to on this machine. */
KVBM_EXTERN kvbm_blake3_impl kvbm_blake3_impl_best(void);

/* "portable", "sse4.1", "avx2", "avx512", "auto"; "?" for other values. */
KVBM_EXTERN const char *kvbm_blake3_impl_name(kvbm_blake3_impl impl);

/* Starts a plain hash. Returns KVBM_EINVAL if `h` is NULL. */
KVBM_EXTERN int kvbm_blake3_hasher_init(kvbm_blake3_hasher *h);

/* Starts a keyed hash (a MAC) with a 32-byte key; the key is copied. */
KVBM_EXTERN int kvbm_blake3_hasher_init_keyed(kvbm_blake3_hasher *h,
                                  const uint8_t key[KVBM_BLAKE3_KEY_LEN]);

/* Starts key derivation with a context string (NUL-terminated; should be
 * a hard-coded, globally unique, application-specific string). The key
 * material is then fed with update. */
KVBM_EXTERN int kvbm_blake3_hasher_init_derive_key(kvbm_blake3_hasher *h,
                                       const char *context);

/* Same with a context of explicit length (may contain NUL bytes). */
KVBM_EXTERN int kvbm_blake3_hasher_init_derive_key_raw(kvbm_blake3_hasher *h,
                                           const void *context,
                                           size_t context_len);

/* Forces a compression path. KVBM_EUNSUPPORTED (message in `err`) if this
 * CPU lacks it, KVBM_EINVAL for an unknown value. May be called at any
 * time: the state does not depend on the path. */
KVBM_EXTERN int kvbm_blake3_hasher_set_impl(kvbm_blake3_hasher *h, kvbm_blake3_impl impl,
                                kvbm_error *err);

/* Feeds `len` bytes (any split of the input gives the same hash).
 * KVBM_EINVAL if `h` is NULL or `in` is NULL with len > 0. Feeding more
 * than 2^64 bytes in total is outside BLAKE3 and not detected. */
KVBM_EXTERN int kvbm_blake3_hasher_update(kvbm_blake3_hasher *h, const void *in,
                              size_t len);

/* Writes the first `out_len` bytes of the output (32 is the default
 * length; any length works, a shorter output is a prefix of a longer
 * one). Does not change the state: more input may follow, and finalize
 * may be called again. KVBM_EINVAL for NULL arguments. */
KVBM_EXTERN int kvbm_blake3_hasher_finalize(const kvbm_blake3_hasher *h, uint8_t *out,
                                size_t out_len);

/* Writes output bytes [seek, seek + out_len) of the extended output.
 * KVBM_EOVERFLOW if that range goes past 2^64 bytes. */
KVBM_EXTERN int kvbm_blake3_hasher_finalize_seek(const kvbm_blake3_hasher *h,
                                     uint64_t seek, uint8_t *out,
                                     size_t out_len);

/* Forgets all input, keeping the mode, key and compression path. */
KVBM_EXTERN int kvbm_blake3_hasher_reset(kvbm_blake3_hasher *h);

/* One-shot helpers: hash `in` and write `out_len` bytes of output. */
KVBM_EXTERN int kvbm_blake3_hash(const void *in, size_t len, uint8_t *out,
                     size_t out_len);
KVBM_EXTERN int kvbm_blake3_keyed_hash(const uint8_t key[KVBM_BLAKE3_KEY_LEN],
                           const void *in, size_t len, uint8_t *out,
                           size_t out_len);
KVBM_EXTERN int kvbm_blake3_derive_key(const char *context, const void *material,
                           size_t len, uint8_t *out, size_t out_len);

/* ---- Hashing on several threads: a pool ----
 *
 * BLAKE3's tree lets one input be hashed in pieces on several threads: an
 * input cut into pieces of `piece_len` bytes (a power of two) gets one
 * chaining value per piece, computed anywhere, and the tree above them is
 * rebuilt from those values; the result is the plain hash
 * (kvbm_blake3_hash) of the input, bit for bit. A pool runs the pieces of
 * submitted jobs on its worker threads; the thread that waits for a
 * submission helps with the pieces still queued instead of sleeping, so a
 * pool of 0 workers hashes everything in kvbm_blake3_pool_wait (on the
 * caller's thread) and a caller can overlap hashing with other work by
 * submitting first and waiting later.
 *
 * Threads: submit and wait may be called from several threads at once;
 * each ticket is waited for once, by anyone. Plain hash mode only. */
typedef struct kvbm_blake3_pool kvbm_blake3_pool;

/* One input to hash: `len` bytes at `in` (left untouched, and readable
 * until the wait returns); `out_len` (1..64) bytes of its hash go to `out`
 * by the time its submission's wait returns. */
typedef struct kvbm_blake3_job {
  const void *in;
  size_t len;
  uint8_t *out;
  size_t out_len;
} kvbm_blake3_job;

/* Pieces of 256 KiB: small enough that a 2 MiB block spreads over 8
 * threads, large enough that a piece is many kernel calls. */
#define KVBM_BLAKE3_POOL_PIECE_DEFAULT (256u << 10)
#define KVBM_BLAKE3_POOL_MAX_THREADS 256u

/* Starts `threads` worker threads (0..256; 0: every piece runs in the
 * waiting thread) that hash pieces of `piece_len` bytes (0: the default;
 * else a power of two, 1 KiB .. 1 GiB). *out is owned by the caller:
 * kvbm_blake3_pool_destroy(). KVBM_EINVAL, KVBM_ENOMEM, KVBM_EIO (a thread
 * would not start). */
KVBM_EXTERN int kvbm_blake3_pool_create(unsigned threads, size_t piece_len,
                                        kvbm_blake3_pool **out,
                                        kvbm_error *err);

/* Queues `n` jobs (n >= 1; copied, the inputs are not) and returns at once
 * with *ticket naming them. Memory: one allocation of about 64 bytes per
 * job plus 32 per piece, freed by the wait. KVBM_EINVAL (NULL, n == 0, an
 * out_len outside 1..64), KVBM_ENOMEM. */
KVBM_EXTERN int kvbm_blake3_pool_submit(kvbm_blake3_pool *p,
                                        const kvbm_blake3_job *jobs, size_t n,
                                        uint64_t *ticket, kvbm_error *err);

/* Copy and hash in one pass: as kvbm_blake3_pool_submit, and job i's
 * input is also moved to copy_to[i] (jobs[i].len writable bytes that do
 * not overlap the input). Each piece is copied to its offset in copy_to[i]
 * and hashed there at once, by the same thread, while the bytes are still
 * in that core's cache (a 256 KiB piece fits a 1 MiB L2): out is the hash
 * of what landed, and the bytes are read from memory once where a copy
 * followed by a hash reads them twice; the copy spreads over the threads
 * as the hash does. This is how a block arriving from a peer is moved and
 * verified (kvbm_fabric_read_blocks_hashed). The destinations must stay
 * valid until the wait returns. KVBM_EINVAL also for a NULL copy_to or a
 * destination that overlaps its input. */
KVBM_EXTERN int kvbm_blake3_pool_submit_copy(kvbm_blake3_pool *p,
                                             const kvbm_blake3_job *jobs,
                                             void *const *copy_to, size_t n,
                                             uint64_t *ticket, kvbm_error *err);

/* Waits until every job of `ticket` has its hash in its `out`, running
 * queued pieces (of any submission) on this thread meanwhile; then forgets
 * the ticket. KVBM_ENOTFOUND for a ticket not outstanding (already waited
 * for, or never issued). */
KVBM_EXTERN int kvbm_blake3_pool_wait(kvbm_blake3_pool *p, uint64_t ticket,
                                      kvbm_error *err);

/* Submit and wait for one input: its `out_len` bytes of hash in `out`. */
KVBM_EXTERN int kvbm_blake3_pool_hash(kvbm_blake3_pool *p, const void *in,
                                      size_t len, uint8_t *out, size_t out_len,
                                      kvbm_error *err);

/* Worker threads and piece size, as created. */
KVBM_EXTERN unsigned kvbm_blake3_pool_threads(const kvbm_blake3_pool *p);
KVBM_EXTERN size_t kvbm_blake3_pool_piece_len(const kvbm_blake3_pool *p);

/* Waits for the workers to finish the pieces they are running, stops and
 * joins them, and frees the pool with every submission not yet waited for
 * (their outputs are then undefined). No call may be in progress on it.
 * NULL: no-op. */
KVBM_EXTERN void kvbm_blake3_pool_destroy(kvbm_blake3_pool *p);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_BLAKE3_H */
