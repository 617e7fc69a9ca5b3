/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/version.h: the library's version, and the mark of its public API.
 *
 * KVBM_EXTERN marks every function of the public API. The library is built
 * with -fvisibility=hidden, so these are the only symbols libkvbm.so
 * exports; functions shared between the library's files but not public are
 * named kvbm__* and stay hidden (libuv's UV_EXTERN and uv__ habit).
 */
#ifndef KVBM_VERSION_H
#define KVBM_VERSION_H

#define KVBM_VERSION_MAJOR 0
#define KVBM_VERSION_MINOR 1
#define KVBM_VERSION_PATCH 0
#define KVBM_VERSION_HEX \
  ((KVBM_VERSION_MAJOR << 16) | (KVBM_VERSION_MINOR << 8) | KVBM_VERSION_PATCH)

#if defined(__GNUC__) || defined(__clang__)
#define KVBM_EXTERN __attribute__((visibility("default")))
#else
#define KVBM_EXTERN
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library actually loaded, as KVBM_VERSION_HEX. Compare
 * with the header's to catch a program run against another libkvbm. */
KVBM_EXTERN unsigned kvbm_version(void);

/* The same as "major.minor.patch" (a static string). */
KVBM_EXTERN const char *kvbm_version_string(void);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_VERSION_H */
