/* SPDX-License-Identifier: MIT
 *
 * SHA-256 over libcrypto's EVP interface, as lowercase hex: streaming
 * (new, update..., final), of a buffer, of an open file and of a regular
 * file by name. libcrypto failing to initialise or update a digest
 * (allocation failure, a broken library) aborts with a message: no caller
 * could do anything useful with a half-computed hash. In libdtcrypto (with
 * base64.h), apart from libdtcommon, which links no libcrypto.
 */
#ifndef DT_SHA256_H
#define DT_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* 64 hex digits and a NUL. */
#define DT_SHA256_HEX 65

typedef struct dt_sha256 dt_sha256_t;

dt_sha256_t *dt_sha256_new(void);
void dt_sha256_update(dt_sha256_t *s, const void *p, size_t n);
/* The digest into hex; frees s. */
void dt_sha256_final(dt_sha256_t *s, char hex[DT_SHA256_HEX]);
/* Frees s without a digest (NULL is fine). */
void dt_sha256_free(dt_sha256_t *s);

/* Of n bytes at p. */
void dt_sha256_hex(const void *p, size_t n, char hex[DT_SHA256_HEX]);
/* Of what fd holds from offset 0 to its end (read with pread, in 1 MiB
 * chunks): the number of bytes hashed, or a negative code from a failed
 * read (hex is then unset). */
int64_t dt_sha256_fd(int fd, char hex[DT_SHA256_HEX]);
/* Of the regular file at PATH; a symbolic link, a directory, a FIFO or a
 * device is refused (DT_EINVAL). Returns 0 or the errno-derived code with
 * a message naming the file. */
int dt_sha256_file(const char *path, char hex[DT_SHA256_HEX], dt_emsg_t *em);

#endif /* DT_SHA256_H */
