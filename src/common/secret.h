/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secret.h: reading a shared secret from a file (private; common/secret.c).
 *
 * kvbm takes secrets (the fabric's shared key, G4's cluster key) from files
 * or the environment, never from the command line, where every user of the
 * host can read them. A file holding one is trusted only when nobody else
 * could have written or read it: a regular file (not a symbolic link,
 * opened with O_NOFOLLOW so that a link swapped in between check and use is
 * refused too), owned by this user, with no group or other permission bits.
 * These checks were written twice (the fabric CLI, G4's key); here once.
 */
#ifndef KVBM_COMMON_SECRET_H
#define KVBM_COMMON_SECRET_H

#include <stddef.h>
#include <stdint.h>

#include "kvbm/status.h"

/* Reads the file at `path` into buf[0..cap) after the checks above; *len is
 * its length without one trailing "\n" (or "\r\n"). A file longer than cap
 * bytes is refused, as is every failed check: KVBM_EINVAL with a message
 * "key file PATH: what is wrong" in err. The length bounds of the secret
 * itself are the caller's. The caller zeroes buf (explicit_bzero) when done;
 * nothing else keeps a copy. */
int kvbm__secret_file_read(const char *path, uint8_t *buf, size_t cap, size_t *len,
                           kvbm_error *err);

#endif
