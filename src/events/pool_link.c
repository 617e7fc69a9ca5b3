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
 * Groups: a pool event's group becomes the event's group_idx and the
 * link's spec of that group its kv_cache_spec_kind / _sliding_window,
 * exactly the fields vLLM's BlockPool fills (vllm/distributed/kv_events.py:
 * BlockStored carries all three, BlockRemoved group_idx only). A pool of
 * one group with no specs sends none of them, so a single-group engine's
 * bytes are those kvbm wrote before groups (tests/events/test_pool_link.c
 * checks them against the encoder's output for a group-less event).
 *
 * The pool's salt hash is not sent: vLLM's lora_id is an adapter id, not a
 * hash, and the salt is already folded into every sequence hash.
 */
#include <string.h>

#include "kvbm/events.h"

/* The group fields of pool event `pe` on kv event `ev` (see the header). */
static void put_group(const kvbm_pool_link *l, const kvbm_pool_event *pe, kvbm_event *ev) {
  if (!l->with_groups) return;
  ev->group_idx = pe->group;
  ev->has_group_idx = true;
  if (ev->type != KVBM_EVENT_STORED || pe->group >= l->num_groups) return;
  const kvbm_group_spec *g = &l->groups[pe->group];
  ev->kv_cache_spec_kind = kvbm_group_kind_name(g->kind);
  if (g->kind == KVBM_GROUP_SLIDING_WINDOW) {
    ev->sliding_window = g->tokens;
    ev->has_sliding_window = true;
  }
}

void kvbm_pool_link_listener(void *user, const kvbm_pool_event *pe) {
  kvbm_pool_link *l = user;
  kvbm_event ev = {.medium = l->medium};
  switch (pe->kind) {
    case KVBM_POOL_STORED:
      ev.type = KVBM_EVENT_STORED;
      ev.block_hashes = &pe->seq_hash;
      ev.num_block_hashes = 1;
      ev.parent_hash = pe->parent_hash;
      ev.has_parent = pe->has_parent;
      ev.token_ids = pe->tokens;
      ev.num_tokens = pe->tokens ? pe->num_tokens : 0;
      ev.block_size = l->block_size;
      break;
    case KVBM_POOL_REMOVED:
      ev.type = KVBM_EVENT_REMOVED;
      ev.block_hashes = &pe->seq_hash;
      ev.num_block_hashes = 1;
      break;
    case KVBM_POOL_CLEARED:
      ev.type = KVBM_EVENT_CLEARED;
      ev.medium = KVBM_MEDIUM_NONE;
      break;
    default:
      l->failed++;
      l->last_status = KVBM_EINVAL;
      return;
  }
  put_group(l, pe, &ev);
  int rc = kvbm_publisher_publish(l->pub, &ev, NULL, NULL);
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
                           .block_size = kvbm_pool_block_size(pool),
                           .pool_groups = kvbm_pool_num_groups(pool)};
  link->with_groups = link->pool_groups > 1;
  kvbm_pool_set_listener(pool, kvbm_pool_link_listener, link);
  return KVBM_OK;
}

/* One spec as vLLM could send it; KVBM_EINVAL naming group i otherwise. */
static int check_spec(const kvbm_group_spec *g, size_t i, kvbm_error *err) {
  switch (g->kind) {
    case KVBM_GROUP_FULL:
    case KVBM_GROUP_MAMBA:
    case KVBM_GROUP_MAMBA_ALIGN:
      if (g->tokens)
        return kvbm_error_set(err, KVBM_EINVAL, "events: pool link: group %zu (%s) has tokens %u; "
                              "only sliding windows and chunks have a size", i,
                              kvbm_group_kind_name(g->kind), g->tokens);
      return KVBM_OK;
    case KVBM_GROUP_SLIDING_WINDOW:
    case KVBM_GROUP_CHUNKED_LOCAL:
      if (!g->tokens || g->tokens > KVBM_GROUP_MAX_TOKENS)
        return kvbm_error_set(err, KVBM_EINVAL, "events: pool link: group %zu (%s) has size %u, "
                              "not 1..2^30 tokens", i, kvbm_group_kind_name(g->kind), g->tokens);
      return KVBM_OK;
  }
  return kvbm_error_set(err, KVBM_EINVAL, "events: pool link: group %zu has unknown kind %d", i,
                        (int)g->kind);
}

int kvbm_pool_link_set_groups(kvbm_pool_link *link, const kvbm_group_spec *groups, size_t n,
                              kvbm_error *err) {
  if (!link || (n && !groups))
    return kvbm_error_set(err, KVBM_EINVAL, "events: pool link: NULL argument");
  if (n > KVBM_GROUPS_MAX)
    return kvbm_error_set(err, KVBM_EINVAL, "events: pool link: %zu groups, at most %d", n,
                          KVBM_GROUPS_MAX);
  for (size_t i = 0; i < n; i++) {
    int rc = check_spec(&groups[i], i, err);
    if (rc) return rc;
  }
  if (n) memcpy(link->groups, groups, n * sizeof *groups);
  link->num_groups = (uint32_t)n;
  /* Forgetting the specs keeps group_idx on where the pool has groups. */
  link->with_groups = n > 0 || link->pool_groups > 1;
  return KVBM_OK;
}
