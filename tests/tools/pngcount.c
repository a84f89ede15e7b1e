/* SPDX-License-Identifier: MIT
 *
 * pngcount: how many pixels of a box of a PNG are drawn in colour, for the
 * integration tests of dtctl plot (the picture, rendered by rsvg-convert,
 * must have its data drawn inside each plot area).
 *
 *   pngcount FILE.png VIEW_W VIEW_H X Y W H
 *
 * The box is X, Y, W, H in the units of the picture's viewBox (VIEW_W by
 * VIEW_H), scaled to the PNG's pixels. A pixel counts when it is mostly
 * opaque (alpha >= 128) and coloured: its largest and smallest channel
 * differ by at least 48 (the frame, the grid and the text are grey; the
 * generations' lines and the failures' marks are not). Prints
 * `pixels=N coloured=K`; exits 0, or 2 for bad usage or a file that is no
 * PNG. Not a general image tool: RGBA through libpng's simplified API.
 */
#include "config.h"

#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int num(const char *s, double *out)
{
    char *end;
    *out = strtod(s, &end);
    return end != s && *end == '\0' && *out >= 0;
}

int main(int argc, char **argv)
{
    png_image im;
    double v[6];

    if (argc != 8) {
        fprintf(stderr, "usage: pngcount FILE.png VIEW_W VIEW_H X Y W H\n");
        return 2;
    }
    for (int i = 0; i < 6; i++)
        if (!num(argv[i + 2], &v[i]) || (i < 2 && v[i] <= 0)) {
            fprintf(stderr, "pngcount: '%s' is not a number >= 0 (view sizes > 0)\n", argv[i + 2]);
            return 2;
        }
    memset(&im, 0, sizeof(im));
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&im, argv[1])) {
        fprintf(stderr, "pngcount: %s: %s\n", argv[1], im.message);
        return 2;
    }
    im.format = PNG_FORMAT_RGBA;
    png_bytep px = malloc(PNG_IMAGE_SIZE(im));
    if (px == NULL || !png_image_finish_read(&im, NULL, px, 0, NULL)) {
        fprintf(stderr, "pngcount: %s: %s\n", argv[1], px ? im.message : "out of memory");
        free(px);
        png_image_free(&im);
        return 2;
    }
    double sx = im.width / v[0], sy = im.height / v[1];
    long x0 = (long)(v[2] * sx), y0 = (long)(v[3] * sy);
    long x1 = (long)((v[2] + v[4]) * sx), y1 = (long)((v[3] + v[5]) * sy);
    long pixels = 0, coloured = 0;
    for (long y = y0; y < y1 && y < (long)im.height; y++)
        for (long x = x0; x < x1 && x < (long)im.width; x++) {
            const png_byte *p = px + ((size_t)y * im.width + (size_t)x) * 4;
            int hi = p[0], lo = p[0];
            for (int c = 1; c < 3; c++) {
                hi = p[c] > hi ? p[c] : hi;
                lo = p[c] < lo ? p[c] : lo;
            }
            pixels++;
            coloured += p[3] >= 128 && hi - lo >= 48;
        }
    printf("pixels=%ld coloured=%ld\n", pixels, coloured);
    free(px);
    return 0;
}
