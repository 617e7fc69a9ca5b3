/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool_link.c: a block pool's listener feeding a publisher.
 *
 * The pool calls its listener synchronously, in order, on the thread that
 * drives it; the link turns each call into one publish (one block per
 * BlockStored, as the pool registers blocks one at a time), so the
 * publisher's ids and batches follow the pool's order exactly. The link
 * never calls back into the pool. A refused publish (queue full under the
 * DROP policy, publisher closing) cannot be reported to the pool, which
 * has no error path for its listener, so the link counts it and keeps the
 * last status for the owner to check.
 *
 * The pool's salt hash is not sent: vLLM's lora_id is an adapter id, not a
 * hash, and the salt is already folded into every sequence hash.
 */
#include "kvbm/events.h"

void kvbm_pool_link_listener(void *user, const kvbm_pool_event *ev) {
  kvbm_pool_link *l = user;
  int rc;
  switch (ev->kind) {
    case KVBM_POOL_STORED:
      rc = kvbm_publisher_publish_stored(l->pub, &ev->seq_hash, 1,
                                         ev->has_parent ? &ev->parent_hash : NULL, ev->tokens,
                                         ev->tokens ? ev->num_tokens : 0, l->block_size, NULL,
                                         l->medium, NULL, NULL);
      break;
    case KVBM_POOL_REMOVED:
      rc = kvbm_publisher_publish_removed(l->pub, &ev->seq_hash, 1, l->medium, NULL, NULL);
      break;
    case KVBM_POOL_CLEARED:
      rc = kvbm_publisher_publish_cleared(l->pub, NULL, NULL);
      break;
    default:
      rc = KVBM_EINVAL;
      break;
  }
  if (rc) {
    l->failed++;
    l->last_status = rc;
  } else {
    l->forwarded++;
  }
}

int kvbm_pool_link_attach(kvbm_pool_link *link, kvbm_pool *pool, kvbm_publisher *pub,
                          kvbm_medium medium, kvbm_error *err) {
  if (!link || !pool || !pub)
    return kvbm_error_set(err, KVBM_EINVAL, "events: pool link: NULL argument");
  if (medium < KVBM_MEDIUM_NONE || medium >= KVBM_MEDIUM_OTHER)
    return kvbm_error_set(err, KVBM_EINVAL,
                          "events: pool link: medium %d is not NONE, GPU, CPU, DISK or REMOTE",
                          (int)medium);
  *link = (kvbm_pool_link){.pub = pub, .medium = medium,
                           .block_size = kvbm_pool_block_size(pool)};
  kvbm_pool_set_listener(pool, kvbm_pool_link_listener, link);
  return KVBM_OK;
}
