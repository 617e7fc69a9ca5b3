/* SPDX-License-Identifier: Apache-2.0 */
/*
 * status.c: status codes to text, and the error report helper.
 *
 * The tables are indexed by the negated code, so adding a code means adding
 * one line to each table in the same order as the enum in status.h.
 */
#include "kvbm/status.h"

#include <stdarg.h>
#include <stdio.h>

static const struct {
  const char *name;
  const char *text;
} kStatus[] = {
    {"KVBM_OK", "success"},
    {"KVBM_EINVAL", "invalid argument"},
    {"KVBM_ENOMEM", "out of memory"},
    {"KVBM_EOVERFLOW", "size overflow"},
    {"KVBM_ESTATE", "operation not allowed in this state"},
    {"KVBM_ENOSPC", "no space left"},
    {"KVBM_ENOTFOUND", "not found"},
    {"KVBM_EFORMAT", "malformed input"},
    {"KVBM_ETRUNCATED", "input truncated"},
    {"KVBM_ETOOLONG", "input too long"},
    {"KVBM_EVERSION", "unknown version"},
    {"KVBM_ECHECKSUM", "checksum mismatch"},
    {"KVBM_EIO", "I/O error"},
    {"KVBM_EAGAIN", "resource temporarily unavailable"},
    {"KVBM_EUNSUPPORTED", "not supported"},
    {"KVBM_ECLOSED", "closed"},
    {"KVBM_ETIMEDOUT", "timed out"},
    {"KVBM_EMAGIC", "wrong magic number"},
    {"KVBM_EPADDING", "nonzero padding"},
    {"KVBM_ETIER", "unknown tier"},
    {"KVBM_EEXIST", "already exists"},
    {"KVBM_EPROTO", "protocol error"},
    {"KVBM_ERANGE", "out of range"},
    {"KVBM_EDEVICE", "no such device"},
    {"KVBM_EAUTH", "authentication failed"},
    {"KVBM_EPHASE", "unknown phase label"},
    {"KVBM_EDISAGG", "disaggregation unavailable"},
};

#define NSTATUS (sizeof kStatus / sizeof kStatus[0])

const char *kvbm_strerror(int status) {
  if (status > 0 || (size_t)-status >= NSTATUS) return "unknown status";
  return kStatus[-status].text;
}

const char *kvbm_status_name(int status) {
  if (status > 0 || (size_t)-status >= NSTATUS) return "KVBM_E?";
  return kStatus[-status].name;
}

int kvbm_error_set(kvbm_error *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

void kvbm_error_clear(kvbm_error *err) {
  if (err) {
    err->code = KVBM_OK;
    err->msg[0] = '\0';
  }
}
