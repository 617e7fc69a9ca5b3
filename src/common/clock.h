/*
 * common/clock.h: the monotonic clock the library's modules time things
 * with (private to src/). Header-only: every user is a hot or a leaf path.
 */
#ifndef KVBM_COMMON_CLOCK_H
#define KVBM_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC. */
static inline uint64_t kvbm_clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Seconds on CLOCK_MONOTONIC. */
static inline double kvbm_clock_seconds(void) { return (double)kvbm_clock_ns() * 1e-9; }

#endif
