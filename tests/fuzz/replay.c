/* SPDX-License-Identifier: MIT
 *
 * A stand-in for libFuzzer's driver: runs LLVMFuzzerTestOneInput once on
 * each file named on the command line (each in a heap buffer of exactly its
 * size) and prints "replayed N inputs". It lets the corpus and any crash
 * reproducer run as a regression test in builds without clang's libFuzzer.
 * It does not mutate inputs or search for new ones.
 *
 * Exit status: 0 when every file was read and replayed, 1 when a file could
 * not be read, 2 on usage. A failed check inside the target aborts.
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The whole of path in a new buffer of exactly *size bytes (at least one
 * allocated), or NULL with a message on stderr. */
static uint8_t *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0, got;

    if (f == NULL) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    do {
        if (n == cap) {
            cap = cap > 0 ? 2 * cap : 4096;
            buf = dt_xrealloc(buf, cap);
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    if (ferror(f)) {
        fprintf(stderr, "replay: %s: read error\n", path);
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    *size = n;
    return dt_xrealloc(buf, n > 0 ? n : 1);
}

int main(int argc, char **argv)
{
    int replayed = 0, unreadable = 0;

    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        size_t size;
        uint8_t *data = slurp(argv[i], &size);

        if (data == NULL) {
            unreadable++;
            continue;
        }
        LLVMFuzzerTestOneInput(data, size);
        free(data);
        replayed++;
    }
    printf("replayed %d inputs\n", replayed);
    if (unreadable > 0) {
        fprintf(stderr, "replay: %d of %d files could not be read\n", unreadable, argc - 1);
        return 1;
    }
    return 0;
}
