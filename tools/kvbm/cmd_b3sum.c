/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_b3sum.c: `kvbm b3sum [options] [FILE]...`, BLAKE3 sums printed the
 * way Debian's b3sum prints them, so operators can compare the two.
 *
 * Output lines are "<hex>  <name>"; no FILE or "-" reads standard input.
 * Names are shown as b3sum shows them: bytes that are not UTF-8 become
 * U+FFFD, and a name holding a backslash or a newline is escaped ("\\",
 * "\n") with a backslash at the start of the line. A file that cannot be
 * read gets "kvbm b3sum: NAME: <reason> (os error N)" on stderr, the other
 * files are still hashed, and the exit status is 1.
 *
 * Regular files of 256 KiB or more are mapped in windows of 64 MiB
 * (prefaulted), so hashing sees long runs of whole chunks without a copy;
 * smaller files and other inputs (pipes, terminals) are read in 256 KiB
 * pieces into one buffer shared by all inputs.
 * Hashing is single-threaded; --num-threads is accepted and ignored.
 * --check reads such lines back (32-byte sums, escaped names included) and
 * prints "name: OK" or "name: FAILED", as b3sum does.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "kvbm/blake3.h"

const char kvbm_cmd_b3sum_help[] =
    "BLAKE3 sums of files, printed like Debian's b3sum";

#define MAP_WINDOW (64u << 20)
#define READ_PIECE (256u << 10)
#define MAP_MIN (256u << 10) /* smaller files: one read beats mmap setup */

static const char kUsage[] =
    "usage: kvbm b3sum [options] [FILE]...\n"
    "  Prints \"<hex>  <name>\" for each FILE (- or none: standard input).\n"
    "  -l, --length N      output bytes before hex encoding (default 32)\n"
    "  --no-names          print the hex only\n"
    "  --raw               write raw output bytes (one input; implies --no-names)\n"
    "  --keyed             keyed mode; the 32-byte key is read from stdin\n"
    "  --derive-key CTX    key derivation mode with context string CTX\n"
    "  --num-threads N     accepted for compatibility; always 1 thread\n"
    "  --no-mmap           read files instead of mapping them\n"
    "  -c, --check         read \"<hex>  <name>\" lines from the FILEs and\n"
    "                      check each named file (prints name: OK/FAILED)\n"
    "  --quiet             with --check, print failures only\n";

typedef struct opts {
  uint64_t length;
  bool no_names, raw, keyed, no_mmap, check, quiet, length_set;
  const char *derive;
  uint8_t key[KVBM_BLAKE3_KEY_LEN];
} opts;

/* Feeds an open descriptor to the hasher; returns 0 or an errno. `buf`
 * is a READ_PIECE-byte buffer shared by all inputs. */
static int hash_fd(int fd, bool no_mmap, uint8_t *buf, kvbm_blake3_hasher *h) {
  struct stat st;
  if (fstat(fd, &st) != 0) return errno;
  if (S_ISDIR(st.st_mode)) return EISDIR;
  if (S_ISREG(st.st_mode) && !no_mmap && st.st_size >= MAP_MIN) {
    for (off_t off = 0; off < st.st_size;) {
      size_t n = (size_t)(st.st_size - off) < MAP_WINDOW
                     ? (size_t)(st.st_size - off)
                     : MAP_WINDOW;
      void *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, off);
      if (p == MAP_FAILED) return errno;
      kvbm_blake3_hasher_update(h, p, n);
      munmap(p, n);
      off += (off_t)n;
    }
    return 0;
  }
  for (;;) {
    ssize_t n = read(fd, buf, READ_PIECE);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return 0;
    kvbm_blake3_hasher_update(h, buf, (size_t)n);
  }
}

/* Length of the valid UTF-8 sequence at s, or 0 if it is not one. */
static size_t utf8_seq_len(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) need = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t i = 1; i < need; i++) {
    if (i >= n) return 0;
    unsigned char lim_lo = i == 1 ? lo : 0x80, lim_hi = i == 1 ? hi : 0xBF;
    if (s[i] < lim_lo || s[i] > lim_hi) return 0;
  }
  return need;
}

/* How many bytes one U+FFFD replaces at s: the maximal prefix of a valid
 * sequence (at least 1). */
static size_t utf8_bad_len(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3
              : c >= 0xC2 && c <= 0xDF ? 2 : 1;
  size_t i = 1;
  for (; i < need && i < n; i++) {
    unsigned char lo = 0x80, hi = 0xBF;
    if (i == 1) {
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    if (s[i] < lo || s[i] > hi) break;
  }
  return i;
}

/* Writes `name` as b3sum shows it: invalid UTF-8 replaced (as Rust's
 * lossy conversion does), then escaped if asked. */
static void print_name(FILE *out, const char *name, bool escape) {
  const unsigned char *s = (const unsigned char *)name;
  size_t n = strlen(name);
  while (n > 0) {
    size_t k = utf8_seq_len(s, n);
    if (k == 0) {
      k = utf8_bad_len(s, n);
      fputs("\xEF\xBF\xBD", out);
    } else if (escape && *s == '\\') {
      fputs("\\\\", out);
    } else if (escape && *s == '\n') {
      fputs("\\n", out);
    } else {
      fwrite(s, 1, k, out);
    }
    s += k;
    n -= k;
  }
}

/* Output bytes [0, length) as hex (or raw), in pieces: any length works. */
static void print_output(FILE *out, const kvbm_blake3_hasher *h,
                         uint64_t length, bool raw) {
  uint8_t buf[4096];
  for (uint64_t off = 0; off < length;) {
    size_t n = length - off < sizeof buf ? (size_t)(length - off) : sizeof buf;
    kvbm_blake3_hasher_finalize_seek(h, off, buf, n);
    if (raw) {
      fwrite(buf, 1, n, out);
    } else {
      for (size_t i = 0; i < n; i++) fprintf(out, "%02x", buf[i]);
    }
    off += n;
  }
}

static int init_hasher(const opts *o, kvbm_blake3_hasher *h) {
  if (o->keyed) return kvbm_blake3_hasher_init_keyed(h, o->key);
  if (o->derive) return kvbm_blake3_hasher_init_derive_key(h, o->derive);
  return kvbm_blake3_hasher_init(h);
}

/* Hashes the named input (- is stdin) into *h; returns 0 or an errno. */
static int hash_named(const opts *o, const char *name, uint8_t *buf,
                      kvbm_blake3_hasher *h) {
  init_hasher(o, h);
  bool is_stdin = strcmp(name, "-") == 0;
  int fd = is_stdin ? STDIN_FILENO : open(name, O_RDONLY | O_CLOEXEC);
  /* stdin is read, never mapped: it may sit mid-file. */
  int e = fd < 0 ? errno : hash_fd(fd, o->no_mmap || is_stdin, buf, h);
  if (fd >= 0 && !is_stdin) close(fd);
  return e;
}

/* Hashes one input and prints its line; returns 0 or 1. */
static int sum_one(const opts *o, const char *name, uint8_t *buf) {
  kvbm_blake3_hasher h;
  int e = hash_named(o, name, buf, &h);
  if (e != 0) {
    fflush(stdout);
    fprintf(stderr, "kvbm b3sum: %s: %s (os error %d)\n", name, strerror(e),
            e);
    return 1;
  }
  bool escape = !o->no_names && (strchr(name, '\\') || strchr(name, '\n'));
  if (escape) fputc('\\', stdout);
  print_output(stdout, &h, o->length, o->raw);
  if (!o->no_names) {
    fputs("  ", stdout);
    print_name(stdout, name, escape);
  }
  if (!o->raw) fputc('\n', stdout);
  return 0;
}

/* A lowercase hex digit's value, or -1: b3sum takes lowercase only. */
static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* Whether s[0..n) is all valid UTF-8. */
static bool utf8_valid(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq_len(u + i, n - i);
    if (k == 0) return false;
    i += k;
  }
  return true;
}

/* Parses one check line (without its newline) as b3sum 1.2 does, in its
 * order: "[\\]<64 lowercase hex>  <name>", the name unescaped (\\n, \\\\)
 * when the line starts with a backslash, and then refused if it holds a
 * NUL (it would cut the name short: another file would be checked) or
 * U+FFFD (several invalid names map to it). Fills want, *name (in place,
 * NUL-terminated) and returns NULL, or returns b3sum's message. */
static const char *parse_check_line(char *line, size_t n, uint8_t want[32], char **name) {
  if (n == 0) return "Empty line";
  bool escaped = line[0] == '\\';
  char *p = line + escaped;
  n -= escaped;
  if (n <= 66) return "Short line";
  for (size_t i = 0; i < 66; i++)
    if ((unsigned char)p[i] >= 0x80) return "Non-ASCII prefix";
  if (p[64] != ' ' || p[65] != ' ') return "Invalid space";
  for (int i = 0; i < 32; i++) {
    int hi = hexval(p[2 * i]), lo = hexval(p[2 * i + 1]);
    if (hi < 0 || lo < 0) return "Invalid hex";
    want[i] = (uint8_t)(hi << 4 | lo);
  }
  char *r = p + 66, *end = p + n, *w = r;
  for (; r < end; r++) {
    if (escaped && *r == '\\') {
      if (r + 1 == end || (r[1] != 'n' && r[1] != '\\')) return "Invalid backslash escape";
      *w++ = r[1] == 'n' ? '\n' : '\\';
      r++;
    } else {
      *w++ = *r;
    }
  }
  size_t len = (size_t)(w - (p + 66));
  *w = '\0';
  *name = p + 66;
  if (memchr(*name, '\0', len)) return "Null character in path";
  if (memmem(*name, len, "\xef\xbf\xbd", 3)) return "Unicode replacement character in path";
  return NULL;
}

/* Checks one line; returns whether it is good. */
static bool check_line(const opts *o, const char *checkfile, size_t lineno, char *line, size_t n, uint8_t *buf) {
  /* How b3sum shows the name: the line's own (escaped) text. */
  char *shown = NULL;
  if (n > 66 + (line[0] == '\\')) shown = strndup(line, n);
  uint8_t want[32], got[32];
  char *name;
  const char *bad = parse_check_line(line, n, want, &name);
  if (bad || !shown) {
    fflush(stdout);
    fprintf(stderr, "kvbm b3sum: %s: line %zu: %s\n", checkfile, lineno, bad ? bad : "out of memory");
    free(shown);
    return false;
  }
  kvbm_blake3_hasher h;
  int e = hash_named(o, name, buf, &h);
  bool ok = false;
  if (e == 0) {
    kvbm_blake3_hasher_finalize(&h, got, sizeof got);
    ok = memcmp(got, want, sizeof got) == 0;
  }
  if (!ok || !o->quiet) {
    /* the line's text after the hash, with its leading backslash */
    const char *text = shown + 66 + (shown[0] == '\\');
    printf("%s%s: ", shown[0] == '\\' ? "\\" : "", text);
    if (e != 0)
      printf("FAILED (%s (os error %d))\n", strerror(e), e);
    else
      printf(ok ? "OK\n" : "FAILED\n");
  }
  free(shown);
  return ok;
}

/* --check: verifies every line of one checkfile, as b3sum 1.2 does: a
 * malformed line is reported and counted as a failure, and the next line
 * is checked. Returns 0 when every line checked, 1 otherwise, and -1 when
 * the checkfile cannot be read or is not UTF-8 (b3sum stops there and
 * checks no further checkfile). */
static int check_one(const opts *o, const char *checkfile, uint8_t *buf) {
  bool is_stdin = strcmp(checkfile, "-") == 0;
  FILE *f = is_stdin ? stdin : fopen(checkfile, "r");
  if (!f) {
    int e = errno;
    fflush(stdout);
    fprintf(stderr, "kvbm b3sum: %s: %s (os error %d)\n", checkfile, strerror(e), e);
    return -1;
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  int rc = 0;
  for (size_t lineno = 1; (n = getline(&line, &cap, f)) >= 0; lineno++) {
    size_t len = (size_t)n;
    if (len > 0 && line[len - 1] == '\n') len--;
    if (!utf8_valid(line, len)) {
      fflush(stdout);
      fprintf(stderr, "kvbm b3sum: %s: line %zu: stream did not contain valid UTF-8\n", checkfile, lineno);
      rc = -1;
      break;
    }
    if (!check_line(o, checkfile, lineno, line, len, buf)) rc = 1;
  }
  if (rc == 0 && ferror(f)) {
    fprintf(stderr, "kvbm b3sum: %s: %s\n", checkfile, strerror(errno));
    rc = -1;
  }
  free(line);
  if (!is_stdin) fclose(f);
  return rc;
}

static int read_key_from_stdin(uint8_t key[KVBM_BLAKE3_KEY_LEN]) {
  uint8_t buf[KVBM_BLAKE3_KEY_LEN + 1];
  size_t got = 0;
  for (;;) {
    ssize_t n = read(STDIN_FILENO, buf + got, sizeof buf - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
    if (got == sizeof buf) break;
  }
  if (got != KVBM_BLAKE3_KEY_LEN) {
    fprintf(stderr,
            "kvbm b3sum: --keyed: the key on standard input must be exactly "
            "32 bytes\n");
    return -1;
  }
  memcpy(key, buf, KVBM_BLAKE3_KEY_LEN);
  return 0;
}

int kvbm_cmd_b3sum(int argc, char **argv) {
  opts o = {.length = KVBM_BLAKE3_OUT_LEN};
  const char **files = calloc((size_t)argc + 1, sizeof *files);
  size_t nfiles = 0;
  uint8_t *buf = NULL;
  bool only_files = false;
  int rc = 2;
  if (!files) return 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = NULL;
    int got;
    if (only_files || a[0] != '-' || strcmp(a, "-") == 0) {
      files[nfiles++] = a;
    } else if (!strcmp(a, "--")) {
      only_files = true;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(kUsage, stdout);
      rc = 0;
      goto out;
    } else if (!strcmp(a, "--no-names")) {
      o.no_names = true;
    } else if (!strcmp(a, "--raw")) {
      o.raw = o.no_names = true;
    } else if (!strcmp(a, "--keyed")) {
      o.keyed = true;
    } else if (!strcmp(a, "-c") || !strcmp(a, "--check")) {
      o.check = true;
    } else if (!strcmp(a, "--quiet")) {
      o.quiet = true;
    } else if (!strcmp(a, "--no-mmap")) {
      o.no_mmap = true;
    } else if ((got = cli_opt_value("b3sum", argc, argv, &i, "--length", &v)) ||
               (got = cli_opt_value("b3sum", argc, argv, &i, "-l", &v))) {
      if (got < 0 || !cli_parse_u64("b3sum", "--length", v, 0, UINT64_MAX,
                                    &o.length))
        goto out;
      o.length_set = true;
    } else if ((got = cli_opt_value("b3sum", argc, argv, &i, "--derive-key",
                                    &v))) {
      if (got < 0) goto out;
      o.derive = v;
    } else if ((got = cli_opt_value("b3sum", argc, argv, &i, "--num-threads",
                                    &v))) {
      uint64_t ignored;
      if (got < 0 || !cli_parse_u64("b3sum", "--num-threads", v, 0,
                                    UINT32_MAX, &ignored))
        goto out;
    } else {
      fprintf(stderr, "kvbm b3sum: unknown option '%s'\n%s", a, kUsage);
      goto out;
    }
  }
  if (nfiles == 0) files[nfiles++] = "-";
  if (o.keyed && o.derive) {
    fprintf(stderr, "kvbm b3sum: --keyed and --derive-key exclude each other\n");
    goto out;
  }
  if (o.check && (o.raw || o.no_names || o.length_set)) {
    fprintf(stderr,
            "kvbm b3sum: --check does not go with --raw, --no-names or "
            "--length\n");
    goto out;
  }
  if (o.quiet && !o.check) {
    fprintf(stderr, "kvbm b3sum: --quiet needs --check\n");
    goto out;
  }
  if (o.raw && nfiles > 1) {
    fprintf(stderr, "kvbm b3sum: --raw takes a single input\n");
    goto out;
  }
  if (o.keyed) {
    for (size_t i = 0; i < nfiles; i++) {
      if (!strcmp(files[i], "-")) {
        fprintf(stderr,
                "kvbm b3sum: --keyed reads the key from standard input, so "
                "'-' cannot be an input\n");
        goto out;
      }
    }
    if (read_key_from_stdin(o.key) != 0) goto out;
  }
  buf = malloc(READ_PIECE);
  if (!buf) {
    fprintf(stderr, "kvbm b3sum: out of memory\n");
    rc = 1;
    goto out;
  }
  rc = 0;
  for (size_t i = 0; i < nfiles; i++) {
    if (!o.check) {
      rc |= sum_one(&o, files[i], buf);
      continue;
    }
    int c = check_one(&o, files[i], buf);
    rc |= c != 0;
    if (c < 0) break; /* b3sum gives up on an unreadable checkfile */
  }
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "kvbm b3sum: writing the output: %s\n", strerror(errno));
    rc = 1;
  }
out:
  free(buf);
  free(files);
  return rc;
}
