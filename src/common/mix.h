/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mix.h: the splitmix64 finalizer, kvbm__mix64 (private).
 *
 * What. x + 0x9E3779B97F4A7C15, then two xor-shift-multiply rounds and a
 * last xor-shift (Steele, Lea & Flood's SplitMix64 output function): a
 * bijection on 64-bit integers in which every input bit flips about half
 * of the output bits. It is the output step of the splitmix64 generator
 * applied to one value, so kvbm__mix64(s) is the draw of a splitmix64
 * generator whose state was s before its increment.
 *
 * Why. kvbm needs cheap, well-spread 64-bit values derived from hashes
 * and counters: block byte patterns that depend on hash, layer and
 * position (workload/w2.c), a random odd multiplier from a seed of any
 * value, even 0 (peer/hindex.c). Being a bijection it never merges two
 * inputs. It is NOT a cryptographic hash: anyone can invert it, so it
 * must never stand where an adversary chooses inputs and a collision or
 * a prediction matters (keyed MACs live in the G4 code, with libsodium).
 *
 * Never change it. Its outputs are data, not just hash-table order: W2
 * fills blocks with patterns built from it and checks them when they
 * come back from G2/G3/G4 (a G3 file or a G4 store may hold what another
 * process wrote); kvbm worker (src/worker/worker.c) builds the same kind
 * of pattern and another worker process checks it after a transfer, so both ends must agree; several tests
 * compute expected values with their own copies. A changed mix would
 * make stored or in-flight patterns fail their checks. A need for a
 * different mix gets a new function with a new name.
 *
 * Not here on purpose: Fibonacci hashing (h * 0x9E3779B97F4A7C15 >> s,
 * a slot function), the group key of tier/internal.h (h ^ g * golden,
 * with its own inverse), and psim's murmur-style mix64 (other shifts).
 */
#ifndef KVBM_COMMON_MIX_H
#define KVBM_COMMON_MIX_H

#include <stdint.h>

static inline uint64_t kvbm__mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

#endif
