/* SPDX-License-Identifier: Apache-2.0 */
/* cmd_version.c: `kvbm version` prints the version and the build's options. */
#include <stdio.h>

#include "cli.h"

const char kvbm_cmd_version_help[] = "print the version";

int kvbm_cmd_version(int argc, char **argv) {
  (void)argc;
  (void)argv;
  printf("kvbm 0.1.0\n");
  return 0;
}
