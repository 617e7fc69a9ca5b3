/* SPDX-License-Identifier: Apache-2.0 */
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

/* Seconds since the epoch on CLOCK_REALTIME: the wall time a batch carries
 * as its `ts` (events, storage events, hints). Not for intervals: it
 * jumps when the host's clock is set. */
static inline double kvbm_clock_wall_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Deadlines for pthread_cond_timedwait, written once (they were written
 * again in seven files). `clk` is the clock the condition variable waits
 * on: CLOCK_MONOTONIC where it was created with pthread_condattr_setclock,
 * CLOCK_REALTIME (the default) otherwise. */

/* A time on CLOCK_MONOTONIC in nanoseconds (kvbm_clock_ns()'s scale) as
 * a timespec; also a duration in nanoseconds as nanosleep's timespec. */
static inline struct timespec kvbm__timespec_of_ns(uint64_t ns) {
  return (struct timespec){.tv_sec = (time_t)(ns / 1000000000u),
                           .tv_nsec = (long)(ns % 1000000000u)};
}

/* `ns` nanoseconds from now on clock `clk`. */
static inline struct timespec kvbm__deadline_after_ns(clockid_t clk, uint64_t ns) {
  struct timespec ts;
  clock_gettime(clk, &ts);
  uint64_t nsec = (uint64_t)ts.tv_nsec + ns % 1000000000u;
  ts.tv_sec += (time_t)(ns / 1000000000u + nsec / 1000000000u);
  ts.tv_nsec = (long)(nsec % 1000000000u);
  return ts;
}

/* `ms` milliseconds from now on clock `clk` (ms <= 0: now). */
static inline struct timespec kvbm__deadline_after_ms(clockid_t clk, int64_t ms) {
  return kvbm__deadline_after_ns(clk, ms > 0 ? (uint64_t)ms * 1000000u : 0);
}

#endif
