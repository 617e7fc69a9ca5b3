/* SPDX-License-Identifier: Apache-2.0 */
/*
 * group.c: KV cache group specs, their parser, and the prefix hit rule of a
 * hybrid model (see kvbm/group.h).
 *
 * Why a module of its own: the rule of which prefix a hybrid model can
 * reuse is needed by the pool's users (the W1-hybrid replay today, the
 * manager and the router's per-group indexes next), and it has to be the
 * same rule everywhere, so it is written once, as a pure function over a
 * "is block b cached in group g" callback. It knows nothing of pools or
 * hashes: a caller answers the callback from whatever index it keeps.
 *
 * The rule is vLLM's (vllm/v1/core/kv_cache_coordinator.py and
 * single_type_kv_cache_manager.py, read for their behaviour):
 *   - groups with equal specs are one attention type, whose block is
 *     cached only when it is cached in each of them;
 *   - full attention scans left to right to the first miss; a sliding
 *     window scans right to left for ceil((W - 1) / B) contiguous cached
 *     blocks, or takes the run that starts at block 0; chunked local
 *     attention treats every block before the current chunk as computed
 *     and scans the chunk's blocks left to right; Mamba takes the last
 *     cached block (its state at that boundary);
 *   - the candidate starts at max_tokens; each type in turn may only
 *     shorten it, full attention first; a pass that shortened it is run
 *     again until no type shortens it (with exactly one full and one other
 *     type, one pass suffices, as vLLM's "simple hybrid").
 * Only one block size is supported (every group uses the pool's), so
 * vLLM's alignment to the LCM of block sizes is the block size itself.
 */
#include "kvbm/group.h"

#include <stdio.h>
#include <string.h>

const char *kvbm_group_kind_name(kvbm_group_kind kind) {
  switch (kind) {
    case KVBM_GROUP_FULL: return "full_attention";
    case KVBM_GROUP_SLIDING_WINDOW: return "sliding_window";
    case KVBM_GROUP_CHUNKED_LOCAL: return "chunked_local_attention";
    case KVBM_GROUP_MAMBA:
    case KVBM_GROUP_MAMBA_ALIGN: return "mamba";
  }
  return "unknown";
}

/* ---- parsing --------------------------------------------------------------- */

/* The kind named by text[0..len): the CLI's short name or vLLM's. */
static bool kind_of(const char *s, size_t len, kvbm_group_kind *k) {
  static const struct { const char *name; kvbm_group_kind kind; } names[] = {
      {"full", KVBM_GROUP_FULL},           {"full_attention", KVBM_GROUP_FULL},
      {"sw", KVBM_GROUP_SLIDING_WINDOW},   {"sliding_window", KVBM_GROUP_SLIDING_WINDOW},
      {"chunk", KVBM_GROUP_CHUNKED_LOCAL}, {"chunked_local_attention", KVBM_GROUP_CHUNKED_LOCAL},
      {"mamba", KVBM_GROUP_MAMBA},         {"mamba-align", KVBM_GROUP_MAMBA_ALIGN},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strlen(names[i].name) == len && !memcmp(names[i].name, s, len)) {
      *k = names[i].kind;
      return true;
    }
  return false;
}

/* A decimal 1..KVBM_GROUP_MAX_TOKENS filling text[0..len) exactly. */
static bool tokens_of(const char *s, size_t len, uint32_t *out) {
  if (len == 0 || len > 10) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  if (v == 0 || v > KVBM_GROUP_MAX_TOKENS) return false;
  *out = (uint32_t)v;
  return true;
}

/* One item text[0..len) ("sw:128"), the idx-th of the list. */
static int parse_item(const char *s, size_t len, size_t idx, kvbm_group_spec *g, kvbm_error *err) {
  const char *colon = memchr(s, ':', len);
  size_t klen = colon ? (size_t)(colon - s) : len;
  if (len == 0) return kvbm_error_set(err, KVBM_EINVAL, "groups: item %zu is empty", idx);
  if (!kind_of(s, klen, &g->kind))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "groups: item %zu '%.*s': unknown kind (full, sw:W, chunk:C, mamba, mamba-align)", idx,
                          (int)(len > 64 ? 64 : len), s);
  const bool wants = g->kind == KVBM_GROUP_SLIDING_WINDOW || g->kind == KVBM_GROUP_CHUNKED_LOCAL;
  g->tokens = 0;
  if (!wants) {
    if (colon)
      return kvbm_error_set(err, KVBM_EINVAL, "groups: item %zu '%.*s': %s takes no parameter", idx,
                            (int)(len > 64 ? 64 : len), s, kvbm_group_kind_name(g->kind));
    return KVBM_OK;
  }
  const char *what = g->kind == KVBM_GROUP_SLIDING_WINDOW ? "window" : "chunk";
  if (!colon)
    return kvbm_error_set(err, KVBM_EINVAL, "groups: item %zu '%.*s': the %s is missing (e.g. %.*s:128)",
                          idx, (int)(len > 64 ? 64 : len), s, what, (int)klen, s);
  if (!tokens_of(colon + 1, len - klen - 1, &g->tokens))
    return kvbm_error_set(err, KVBM_EINVAL,
                          "groups: item %zu '%.*s': the %s must be a whole number of tokens in [1, 2^30]",
                          idx, (int)(len > 64 ? 64 : len), s, what);
  return KVBM_OK;
}

int kvbm_groups_parse(const char *text, kvbm_group_spec *out, size_t max, size_t *n, kvbm_error *err) {
  if (!text || !out || !n) return kvbm_error_set(err, KVBM_EINVAL, "groups: NULL argument");
  if (!*text) return kvbm_error_set(err, KVBM_EINVAL, "groups: the list is empty");
  if (max > KVBM_GROUPS_MAX) max = KVBM_GROUPS_MAX;
  size_t count = 0;
  for (const char *p = text;;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (count == max)
      return kvbm_error_set(err, KVBM_EINVAL, "groups: more than %zu groups", max);
    int rc = parse_item(p, len, count, &out[count], err);
    if (rc) return rc;
    count++;
    if (!end) break;
    p = end + 1;
  }
  *n = count;
  return KVBM_OK;
}

size_t kvbm_groups_format(const kvbm_group_spec *groups, size_t n, char *buf, size_t cap) {
  size_t len = 0;
  if (cap) buf[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    char item[32];
    switch (groups[i].kind) {
      case KVBM_GROUP_SLIDING_WINDOW: snprintf(item, sizeof item, "sw:%u", groups[i].tokens); break;
      case KVBM_GROUP_CHUNKED_LOCAL: snprintf(item, sizeof item, "chunk:%u", groups[i].tokens); break;
      case KVBM_GROUP_MAMBA: snprintf(item, sizeof item, "mamba"); break;
      case KVBM_GROUP_MAMBA_ALIGN: snprintf(item, sizeof item, "mamba-align"); break;
      default: snprintf(item, sizeof item, "full"); break;
    }
    int w = snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, "%s%s", i ? "," : "", item);
    len += (size_t)w;
  }
  return len;
}

uint64_t kvbm_group_skipped_tokens(const kvbm_group_spec *g, uint64_t computed) {
  switch (g->kind) {
    case KVBM_GROUP_SLIDING_WINDOW: return computed + 1 > g->tokens ? computed + 1 - g->tokens : 0;
    case KVBM_GROUP_CHUNKED_LOCAL: return computed / g->tokens * g->tokens;
    case KVBM_GROUP_MAMBA:
    case KVBM_GROUP_MAMBA_ALIGN: return computed ? computed - 1 : 0;
    default: return 0;
  }
}

size_t kvbm_group_kept_ranges(const kvbm_group_spec *g, uint32_t block_size, uint64_t prompt_tokens,
                              uint64_t junction, size_t lo[2], size_t hi[2]) {
  if (g->kind == KVBM_GROUP_FULL || g->kind == KVBM_GROUP_CHUNKED_LOCAL) {
    lo[0] = 0, hi[0] = SIZE_MAX;
    return 1;
  }
  if (!prompt_tokens || !block_size) return 0;
  const uint64_t B = block_size;
  const uint64_t need = g->kind == KVBM_GROUP_SLIDING_WINDOW ? (g->tokens - 1 + B - 1) / B : 1;
  const uint64_t bounds[2] = {prompt_tokens - 1, junction};
  size_t n = 0;
  for (int k = 0; k < 2; k++) {
    if (k == 1 && !junction) break;
    const size_t end = (size_t)(bounds[k] / B); /* blocks before the boundary */
    if (end == 0) continue;
    const size_t l = end > need ? end - (size_t)need : 0;
    if (n && l <= hi[0] && end >= lo[0]) { /* overlapping or adjacent: one range */
      if (l < lo[0]) lo[0] = l;
      if (end > hi[0]) hi[0] = end;
    } else {
      lo[n] = l, hi[n] = end;
      n++;
    }
  }
  if (n == 2 && lo[1] < lo[0]) { /* in position order */
    size_t t = lo[0];
    lo[0] = lo[1], lo[1] = t;
    t = hi[0], hi[0] = hi[1], hi[1] = t;
  }
  return n;
}

/* ---- the hit rule ------------------------------------------------------------ */

/* One attention type: a spec and the groups that have it. */
typedef struct atype {
  kvbm_group_spec spec;
  uint32_t ids[KVBM_GROUPS_MAX];
  size_t nids;
} atype;

typedef struct ctx {
  uint32_t bs;
  kvbm_group_lookup lookup;
  void *user;
} ctx;

static bool cached(const ctx *c, const atype *t, size_t block) {
  for (size_t i = 0; i < t->nids; i++)
    if (!c->lookup(c->user, t->ids[i], block)) return false;
  return true;
}

/* Each type's longest hit no longer than max (vLLM's find_longest_cache_hit
 * of its manager), in tokens. */
static uint64_t find_full(const ctx *c, const atype *t, uint64_t max) {
  size_t nb = (size_t)(max / c->bs), k = 0;
  while (k < nb && cached(c, t, k)) k++;
  return (uint64_t)k * c->bs;
}

static uint64_t find_window(const ctx *c, const atype *t, uint64_t max) {
  size_t nb = (size_t)(max / c->bs);
  size_t need = (size_t)((t->spec.tokens - 1 + (uint64_t)c->bs - 1) / c->bs), run = 0;
  for (size_t i = nb; i-- > 0;) {
    if (!cached(c, t, i)) {
      run = 0;
      continue;
    }
    if (++run >= need) return (uint64_t)(i + run) * c->bs;
  }
  return (uint64_t)run * c->bs; /* the run that starts at block 0, if any */
}

static uint64_t find_chunk(const ctx *c, const atype *t, uint64_t max) {
  size_t nb = (size_t)(max / c->bs);
  size_t k = (size_t)(max / t->spec.tokens * t->spec.tokens / c->bs); /* the chunk's first block */
  while (k < nb && cached(c, t, k)) k++;
  return (uint64_t)k * c->bs;
}

static uint64_t find_mamba(const ctx *c, const atype *t, uint64_t max) {
  for (size_t i = (size_t)(max / c->bs); i-- > 0;)
    if (cached(c, t, i)) return (uint64_t)(i + 1) * c->bs;
  return 0;
}

static uint64_t find(const ctx *c, const atype *t, uint64_t max) {
  switch (t->spec.kind) {
    case KVBM_GROUP_SLIDING_WINDOW: return find_window(c, t, max);
    case KVBM_GROUP_CHUNKED_LOCAL: return find_chunk(c, t, max);
    case KVBM_GROUP_MAMBA:
    case KVBM_GROUP_MAMBA_ALIGN: return find_mamba(c, t, max);
    default: return find_full(c, t, max);
  }
}

static bool same_spec(const kvbm_group_spec *a, const kvbm_group_spec *b) {
  return a->kind == b->kind && a->tokens == b->tokens;
}

/* Groups of equal specs merged into types, full attention first (the
 * others in order of first appearance). Returns the number of types. */
static size_t make_types(const kvbm_group_spec *groups, size_t n, atype *types) {
  size_t nt = 0;
  for (int pass = 0; pass < 2; pass++)
    for (size_t g = 0; g < n; g++) {
      if ((groups[g].kind == KVBM_GROUP_FULL) != (pass == 0)) continue;
      size_t t = 0;
      while (t < nt && !same_spec(&types[t].spec, &groups[g])) t++;
      if (t == nt) {
        types[nt].spec = groups[g];
        types[nt].nids = 0;
        nt++;
      }
      types[t].ids[types[t].nids++] = (uint32_t)g;
    }
  return nt;
}

static uint64_t hit_of(const kvbm_group_spec *groups, size_t n, uint32_t block_size, uint64_t max_tokens,
                       kvbm_group_lookup lookup, void *user, uint64_t *first_pass);

uint64_t kvbm_groups_hit(const kvbm_group_spec *groups, size_t n, uint32_t block_size,
                         uint64_t max_tokens, kvbm_group_lookup lookup, void *user) {
  return kvbm_groups_hit_junction(groups, n, block_size, max_tokens, lookup, user, NULL);
}

uint64_t kvbm_groups_hit_junction(const kvbm_group_spec *groups, size_t n, uint32_t block_size,
                                  uint64_t max_tokens, kvbm_group_lookup lookup, void *user,
                                  uint64_t *junction) {
  uint64_t first_pass = 0, hit = hit_of(groups, n, block_size, max_tokens, lookup, user, &first_pass);
  if (junction) *junction = first_pass > hit ? first_pass : 0;
  return hit;
}

/* kvbm_groups_hit_junction's work: the hit, and the first type's first
 * pass in *first_pass. */
static uint64_t hit_of(const kvbm_group_spec *groups, size_t n, uint32_t block_size, uint64_t max_tokens,
                       kvbm_group_lookup lookup, void *user, uint64_t *first_pass) {
  if (!groups || !lookup || n == 0 || block_size == 0) return 0;
  if (n > KVBM_GROUPS_MAX) n = KVBM_GROUPS_MAX;
  atype types[KVBM_GROUPS_MAX];
  const size_t nt = make_types(groups, n, types);
  const ctx c = {block_size, lookup, user};
  if (nt == 1) return *first_pass = find(&c, &types[0], max_tokens);
  const bool first_full = types[0].spec.kind == KVBM_GROUP_FULL;
  const bool simple = nt == 2 && first_full;
  uint64_t hit = max_tokens;
  bool full_done = false, seen_first = false;
  for (;;) {
    uint64_t cur = hit;
    for (size_t t = 0; t < nt; t++) {
      if (t == 0 && first_full && full_done) {
        /* Full attention is downward closed: its first pass answered for
         * every shorter candidate. */
        cur = cur / block_size * block_size;
        continue;
      }
      cur = find(&c, &types[t], cur);
      if (t == 0 && !seen_first) *first_pass = cur, seen_first = true;
      if (t == 0 && first_full) full_done = true;
    }
    if (cur >= hit) break;
    hit = cur;
    if (simple) break;
  }
  return hit;
}
