/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvbm/status.h: status codes and error reports.
 *
 * Every kvbm call returns a kvbm_status (0 on success, a negative code
 * otherwise); the library never aborts or prints on bad input. Calls that
 * parse or validate input also take an optional kvbm_error* that receives a
 * message naming what was wrong ("layout: alignment 24 is not a power of
 * two"). Passing NULL is always allowed.
 */
#ifndef KVBM_STATUS_H
#define KVBM_STATUS_H

#include <stddef.h>

#include "kvbm/version.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvbm_status {
  KVBM_OK = 0,
  KVBM_EINVAL = -1,       /* an argument is out of range or inconsistent */
  KVBM_ENOMEM = -2,       /* an allocation failed */
  KVBM_EOVERFLOW = -3,    /* a size computation would overflow */
  KVBM_ESTATE = -4,       /* an operation not allowed in the object's state */
  KVBM_ENOSPC = -5,       /* not enough free blocks (or slots, or space) */
  KVBM_ENOTFOUND = -6,    /* no such key, block or handle */
  KVBM_EFORMAT = -7,      /* malformed input: parse error, wrong type */
  KVBM_ETRUNCATED = -8,   /* input shorter than it declares */
  KVBM_ETOOLONG = -9,     /* input longer than it declares or than allowed */
  KVBM_EVERSION = -10,    /* unknown format version */
  KVBM_ECHECKSUM = -11,   /* a checksum does not match the bytes */
  KVBM_EIO = -12,         /* an I/O call failed */
  KVBM_EAGAIN = -13,      /* would block; try again */
  KVBM_EUNSUPPORTED = -14,/* not available in this build or on this machine */
  KVBM_ECLOSED = -15,     /* the object is shut down */
  KVBM_ETIMEDOUT = -16,   /* a wait ran out of time */
  KVBM_EMAGIC = -17,      /* wrong magic number */
  KVBM_EPADDING = -18,    /* reserved bytes are not zero */
  KVBM_ETIER = -19,       /* unknown tier */
  KVBM_EEXIST = -20,      /* already present */
  KVBM_EPROTO = -21,      /* a peer broke the protocol */
  KVBM_ERANGE = -22,      /* an access outside a region */
  KVBM_EDEVICE = -23,     /* no device (e.g. no GPU) */
  KVBM_EAUTH = -24,       /* a peer failed to prove the shared key */
  KVBM_EPHASE = -25,      /* unknown phase label (a frame's byte 12) */
  KVBM_EDISAGG = -26,     /* disaggregation unavailable: no fabric attached */
} kvbm_status;

/* A short static description of a status code (never NULL). */
KVBM_EXTERN const char *kvbm_strerror(int status);

/* The symbolic name of a status code ("KVBM_EINVAL"; never NULL). */
KVBM_EXTERN const char *kvbm_status_name(int status);

#define KVBM_ERROR_MSG_MAX 256

/* Filled in by a failing call that was given one. */
typedef struct kvbm_error {
  int code;                      /* the status that was returned */
  char msg[KVBM_ERROR_MSG_MAX];  /* what was wrong, NUL-terminated */
} kvbm_error;

/* Records `code` and a printf-style message in `err` (may be NULL) and
 * returns `code`, so that callers can write `return kvbm_error_set(...)`. */
KVBM_EXTERN int kvbm_error_set(kvbm_error *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Resets `err` (may be NULL) to KVBM_OK and an empty message. */
KVBM_EXTERN void kvbm_error_clear(kvbm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVBM_STATUS_H */
