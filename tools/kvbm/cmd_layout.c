/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_layout.c: `kvbm layout`, a layout's strides and sizes, and the
 * serialized form a node sends its peers (encode to a file, decode a file).
 *
 *   kvbm layout --blocks N --layers L --page-size P --inner I [options]
 *   kvbm layout --decode FILE           (FILE "-" = standard input)
 *
 * Operators use it to size a pool before allocating it and to read a
 * serialized layout received from a peer when an import is refused: the
 * decoder's message says exactly which field is wrong.
 *
 * Output is "key: value" lines, or one JSON object with --json. Exit 0 ok,
 * 1 I/O failure, 2 bad options or an invalid config / serialized layout.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvbm/layout.h"

const char kvbm_cmd_layout_help[] =
    "strides and sizes of a block layout; encode or decode a serialized layout";

static const char kUsage[] =
    "usage: kvbm layout --blocks N --layers L --page-size P --inner I [options]\n"
    "       kvbm layout --decode FILE [--json]\n"
    "  --kind K           fully-contiguous (default) or layer-separate\n"
    "  --outer N          2 for K and V (default), 1 for MLA\n"
    "  --dtype-size N     bytes per element (default 2)\n"
    "  --alignment N      block alignment, a power of two (default 256)\n"
    "  --memory M         system (default), pinned, device, disk, remote\n"
    "  --device N         device id (default -1; 0 for --memory device)\n"
    "  --block-set ID     block set id (default 0)\n"
    "  --encode FILE      write the serialized layout (region bases 0)\n"
    "  --decode FILE      read a serialized layout and print it\n"
    "  --json             one JSON object\n";

static int parse_name(const char *text, const char *(*name)(int), int lo, int hi) {
  for (int v = lo; v <= hi; v++)
    if (strcmp(text, name(v)) == 0) return v;
  return 0;
}

static void print_desc(const kvbm_layout_desc *d, bool decoded, bool json) {
  const kvbm_layout *l = &d->layout;
  const kvbm_layout_config *c = &l->config;
  const struct {
    const char *key;
    uint64_t v;
  } f[] = {
      {"num_blocks", c->num_blocks},     {"num_layers", c->num_layers},
      {"outer_dim", c->outer_dim},       {"page_size", c->page_size},
      {"inner_dim", c->inner_dim},       {"dtype_size", c->dtype_size},
      {"alignment", c->alignment},       {"outer_stride", l->outer_stride},
      {"layer_stride", l->layer_stride}, {"block_stride", l->block_stride},
      {"num_regions", l->num_regions},   {"region_size", l->region_size},
      {"total_size", kvbm_layout_total_size(l)},
  };
  uint64_t fp = kvbm_layout_fingerprint(l);
  if (json) {
    printf("{\"kind\": \"%s\"", kvbm_layout_kind_name(l->kind));
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
      printf(", \"%s\": %" PRIu64, f[i].key, f[i].v);
    printf(", \"fingerprint\": \"%016" PRIx64 "\"", fp);
    if (decoded) {
      printf(", \"memory\": \"%s\", \"device_id\": %d, \"block_set_id\": %" PRIu64
             ", \"region_base\": [",
             kvbm_memory_type_name(d->memory), (int)d->device_id, d->block_set_id);
      for (uint64_t r = 0; r < d->num_regions; r++)
        printf("%s%" PRIu64, r ? ", " : "", d->region_base[r]);
      printf("]");
    }
    printf("}\n");
    return;
  }
  printf("kind: %s\n", kvbm_layout_kind_name(l->kind));
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) printf("%s: %" PRIu64 "\n", f[i].key, f[i].v);
  printf("fingerprint: %016" PRIx64 "\n", fp);
  if (decoded) {
    printf("memory: %s\ndevice_id: %d\nblock_set_id: %" PRIu64 "\n",
           kvbm_memory_type_name(d->memory), (int)d->device_id, d->block_set_id);
    for (uint64_t r = 0; r < d->num_regions; r++)
      printf("region %" PRIu64 " base: 0x%" PRIx64 "\n", r, d->region_base[r]);
  }
}

/* Reads at most `cap` bytes; a longer input is reported, not truncated
 * silently (the decoder would then call it truncated, which misleads). */
static int read_all(const char *path, uint8_t *buf, size_t cap, size_t *len) {
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "kvbm layout: %s: %s\n", path, strerror(errno));
    return 1;
  }
  *len = fread(buf, 1, cap, f);
  int bad = ferror(f);
  int more = !bad && *len == cap && fgetc(f) != EOF;
  if (f != stdin) fclose(f);
  if (bad) {
    fprintf(stderr, "kvbm layout: %s: read error\n", path);
    return 1;
  }
  if (more) {
    fprintf(stderr, "kvbm layout: %s: longer than any serialized layout (%zu bytes)\n", path,
            cap);
    return 2;
  }
  return 0;
}

static int decode_file(const char *path, bool json) {
  size_t cap = KVBM_LAYOUT_WIRE_HEADER + 8 * (size_t)KVBM_LAYOUT_MAX_LAYERS, len = 0;
  uint8_t *buf = malloc(cap);
  if (!buf) {
    fprintf(stderr, "kvbm layout: out of memory\n");
    return 1;
  }
  int rc = read_all(path, buf, cap, &len);
  if (rc) {
    free(buf);
    return rc;
  }
  kvbm_layout_desc d;
  kvbm_error e;
  int st = kvbm_layout_desc_decode(buf, len, &d, &e);
  free(buf);
  if (st != KVBM_OK) {
    fprintf(stderr, "kvbm layout: %s: %s (%s)\n", path, e.msg, kvbm_status_name(st));
    return 2;
  }
  print_desc(&d, true, json);
  kvbm_layout_desc_release(&d);
  return 0;
}

int kvbm_cmd_layout(int argc, char **argv) {
  kvbm_layout_config c = {0, 0, 2, 0, 0, 2, 256};
  int kind = KVBM_LAYOUT_FULLY_CONTIGUOUS, memory = KVBM_MEMORY_SYSTEM;
  uint64_t device = UINT64_MAX, set = 0;
  const char *encode = NULL, *decode = NULL;
  bool json = false;
  unsigned given = 0; /* bit k: required option k was given */
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int r;
    if (strcmp(argv[i], "--json") == 0) {
      json = true;
      continue;
    }
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      fputs(kUsage, stdout);
      return 0;
    }
#define NUM(opt, dst, hi, bit)                                              \
  if ((r = cli_opt_value("layout", argc, argv, &i, opt, &v)) != 0) {        \
    if (r < 0 || !cli_parse_u64("layout", opt, v, 0, hi, dst)) return 2;    \
    given |= (bit);                                                         \
    continue;                                                               \
  }
    /* Zero is let through to the validator, whose message names the field. */
    NUM("--blocks", &c.num_blocks, UINT64_MAX, 1u)
    NUM("--layers", &c.num_layers, UINT64_MAX, 2u)
    NUM("--page-size", &c.page_size, UINT64_MAX, 4u)
    NUM("--inner", &c.inner_dim, UINT64_MAX, 8u)
    NUM("--outer", &c.outer_dim, UINT64_MAX, 0u)
    NUM("--dtype-size", &c.dtype_size, UINT64_MAX, 0u)
    NUM("--alignment", &c.alignment, UINT64_MAX, 0u)
    NUM("--device", &device, INT32_MAX, 0u)
    NUM("--block-set", &set, UINT64_MAX, 0u)
#undef NUM
    if ((r = cli_opt_value("layout", argc, argv, &i, "--kind", &v)) != 0) {
      if (r < 0) return 2;
      if (!(kind = parse_name(v, kvbm_layout_kind_name, 1, 2))) {
        fprintf(stderr, "kvbm layout: --kind: '%s' is not fully-contiguous or layer-separate\n", v);
        return 2;
      }
      continue;
    }
    if ((r = cli_opt_value("layout", argc, argv, &i, "--memory", &v)) != 0) {
      if (r < 0) return 2;
      if (!(memory = parse_name(v, kvbm_memory_type_name, 1, 5))) {
        fprintf(stderr, "kvbm layout: --memory: '%s' is not system, pinned, device, disk or remote\n", v);
        return 2;
      }
      continue;
    }
    if ((r = cli_opt_value("layout", argc, argv, &i, "--encode", &encode)) != 0) {
      if (r < 0) return 2;
      continue;
    }
    if ((r = cli_opt_value("layout", argc, argv, &i, "--decode", &decode)) != 0) {
      if (r < 0) return 2;
      continue;
    }
    fprintf(stderr, "kvbm layout: unknown argument '%s'\n%s", argv[i], kUsage);
    return 2;
  }
  if (decode) return decode_file(decode, json);
  static const char *const required[] = {"--blocks", "--layers", "--page-size", "--inner"};
  for (int k = 0; k < 4; k++)
    if (!(given & (1u << k))) {
      fprintf(stderr, "kvbm layout: %s is required\n%s", required[k], kUsage);
      return 2;
    }

  kvbm_layout_desc d;
  memset(&d, 0, sizeof d);
  kvbm_error e;
  if (kvbm_layout_init(&d.layout, (kvbm_layout_kind)kind, &c, &e) != KVBM_OK) {
    fprintf(stderr, "kvbm %s\n", e.msg); /* "kvbm layout: alignment 24 is ..." */
    return 2;
  }
  d.memory = (kvbm_memory_type)memory;
  d.device_id = device != UINT64_MAX ? (int32_t)device : memory == KVBM_MEMORY_DEVICE ? 0 : -1;
  d.block_set_id = set;
  d.num_regions = d.layout.num_regions;
  d.region_base = calloc((size_t)d.num_regions, sizeof *d.region_base);
  if (!d.region_base) {
    fprintf(stderr, "kvbm layout: out of memory\n");
    return 1;
  }
  int rc = 0;
  if (encode) {
    size_t n = kvbm_layout_desc_encoded_size(&d);
    uint8_t *buf = malloc(n);
    FILE *f = NULL;
    if (!buf || kvbm_layout_desc_encode(&d, buf, n, NULL, &e) != KVBM_OK) {
      fprintf(stderr, "kvbm layout: %s\n", buf ? e.msg : "out of memory");
      rc = buf ? 2 : 1;
    } else if (!(f = strcmp(encode, "-") == 0 ? stdout : fopen(encode, "wb")) ||
               fwrite(buf, 1, n, f) != n || (f != stdout && fclose(f) != 0)) {
      fprintf(stderr, "kvbm layout: %s: %s\n", encode, strerror(errno));
      rc = 1;
    }
    free(buf);
    if (rc || strcmp(encode, "-") == 0) {
      free(d.region_base);
      return rc;
    }
  }
  print_desc(&d, false, json);
  free(d.region_base);
  return 0;
}
