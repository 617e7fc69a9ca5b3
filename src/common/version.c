/* SPDX-License-Identifier: Apache-2.0 */
/*
 * version.c: the version of the library that is loaded (kvbm/version.h).
 *
 * Compiled into the library, so a program can tell the headers it was built
 * with (KVBM_VERSION_HEX) from the libkvbm.so it runs against.
 */
#include "kvbm/version.h"

#define KVBM__STR2(x) #x
#define KVBM__STR(x) KVBM__STR2(x)

unsigned kvbm_version(void) { return KVBM_VERSION_HEX; }

const char *kvbm_version_string(void) {
  return KVBM__STR(KVBM_VERSION_MAJOR) "." KVBM__STR(KVBM_VERSION_MINOR) "." KVBM__STR(
      KVBM_VERSION_PATCH);
}
