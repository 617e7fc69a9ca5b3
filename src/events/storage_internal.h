/* SPDX-License-Identifier: Apache-2.0 */
/*
 * storage_internal.h: what the storage events' codec shares with their
 * publisher (private to the events module).
 */
#ifndef KVBM_EVENTS_STORAGE_INTERNAL_H
#define KVBM_EVENTS_STORAGE_INTERNAL_H

#include <stddef.h>

#include "kvbm/storage_events.h"

/* The encoder's rules for one event (event number i in messages):
 * KVBM_OK or KVBM_EINVAL naming the field. */
int kvbm__storage_check(const kvbm_storage_event *e, size_t i, kvbm_error *err);

#endif
