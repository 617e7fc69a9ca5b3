/* SPDX-License-Identifier: Apache-2.0 */
/*
 * myvendor.h: an example storage backend for kvbm (see myvendor.c): an
 * in-memory store of at most `capacity` values, served to kvbm volumes
 * under the URL scheme "myvendor://".
 */
#ifndef MYVENDOR_H
#define MYVENDOR_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <kvbm/volume.h>

typedef struct myvendor_store myvendor_store;

/* A store; pass it as kvbm_volume_config.backend_user. Thread-safe. */
myvendor_store *myvendor_store_create(size_t capacity);
void myvendor_store_destroy(myvendor_store *s); /* after every volume on it is unregistered */

/* The backend (static): kvbm_volume_config.backend. */
const kvbm_volume_backend *myvendor_backend(void);

/* For the demo: flips a byte of a stored value (1 if found); how many
 * backend states were opened on the store. */
int myvendor_store_damage(myvendor_store *s, uint64_t key);
uint64_t myvendor_store_opens(myvendor_store *s);

#endif
