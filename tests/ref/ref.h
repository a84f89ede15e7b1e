/* SPDX-License-Identifier: MIT
 *
 * Naive reference attention for tests: dense and dilated (LongNet),
 * causal or not, GQA, forward and backward, computed straight from the
 * definition in engine/attn/attn.h with double-precision accumulation. Written
 * to be obviously right, not fast: O(T^2 * H * D) time, O(T) extra memory
 * (never a T x T matrix). Also the comparison helpers every numeric test
 * uses: |x - ref| <= atol + rtol * |ref|, printing the first mismatches.
 *
 * This is not the engine's single-rank path and shares no code with it
 * (not even the head kernels of kernels/cpu): it is what they are checked
 * against. It knows nothing of ranks or layouts; tensors are whole, in
 * position order.
 *
 * Shapes: q (T, H, D), k and v (T, Hkv, D), o (T, H, D), lse (H, T) natural
 * log; query head h reads kv head h / (H / Hkv). All float32 in memory.
 */
#ifndef DT_TESTS_REF_H
#define DT_TESTS_REF_H

#include <stdbool.h>
#include <stdint.h>

/* How many mismatches ref_print_mismatches shows. */
#define REF_SHOWN 5

/* Forward. nbranch == 0: dense attention over every key (causal: key
 * position j <= query position i). nbranch > 0: dilated with branches
 * (seg[b], dil[b]); the keys of (i, h) are the multiset union over the
 * branches that cover (i, h) (see ref.c), and a key that two branches
 * contribute counts twice. A (position, head) with no key gets o = 0 and
 * lse = -inf. scale multiplies q.k; 0 means 1 / sqrt(D), as in
 * dt_attn_spec_t. o (T, H, D) and lse (H, T) are overwritten; lse may be
 * NULL. Preconditions (asserted): sizes positive, Hkv divides H, seg and
 * dil positive. */
void ref_attn_fwd(int64_t T, int H, int Hkv, int D, const float *q, const float *k, const float *v,
                  int causal, float scale, int nbranch, const int64_t *seg, const int64_t *dil,
                  float *o, float *lse);

/* Backward of the same definition: given dout (T, H, D), overwrite dq
 * (T, H, D), dk and dv (T, Hkv, D) with the exact gradient of
 * sum(dout * o). Probabilities are recomputed per (i, h); nothing from a
 * forward call is reused. */
void ref_attn_bwd(int64_t T, int H, int Hkv, int D, const float *q, const float *k, const float *v,
                  int causal, float scale, int nbranch, const int64_t *seg, const int64_t *dil,
                  const float *dout, float *dq, float *dk, float *dv);

/* A mask over the positions (written from dtengine(1)'s definitions, not
 * spec/mask.c): (i, j) is a pair of head h iff every part given allows it:
 * documents (ndoc consecutive lengths doc_len summing to T; 0: none): the
 * same document; window W > 0: causal i - j < W, else |i - j| < W; block
 * B > 0: blocks[(hh * nb + i / B) * nb + j / B] != 0 with nb = T / B and
 * hh = h when nhead > 1, else 0. Causality stays the causal argument. */
typedef struct ref_mask {
    int64_t ndoc;
    const int64_t *doc_len;
    int64_t window;
    int64_t block;
    int nhead;
    const uint8_t *blocks;
} ref_mask_t;

/* ref_attn_fwd / _bwd with a mask (NULL: none); with dilated branches the
 * mask removes pairs from every branch. */
void ref_attn_fwd_masked(int64_t T, int H, int Hkv, int D, const float *q, const float *k,
                         const float *v, int causal, float scale, int nbranch,
                         const int64_t *seg, const int64_t *dil, const ref_mask_t *mask,
                         float *o, float *lse);
void ref_attn_bwd_masked(int64_t T, int H, int Hkv, int D, const float *q, const float *k,
                         const float *v, int causal, float scale, int nbranch,
                         const int64_t *seg, const int64_t *dil, const ref_mask_t *mask,
                         const float *dout, float *dq, float *dk, float *dv);

/* dst[i] = dt_gen_normal(seed, stream) at flat index i, for i in [0, n):
 * the same values `npytool gen` and `dtengine --generate` produce. */
void ref_fill(uint64_t seed, uint64_t stream, int64_t n, float *dst);

/* Compare a (under test) with b (the reference), element by element:
 * element i is good iff |a - b| <= atol + rtol * |b| (in double), or a and
 * b are the same infinity. NaN in either is always bad. Returns the largest
 * |a - b| over the elements that are not equal: NaN if any element is NaN,
 * +inf if an infinity is unmatched, 0 for n == 0. *nbad (may be NULL) gets
 * the number of bad elements, *first_bad (may be NULL) the index of the
 * first, or -1 when there is none. */
double ref_max_abs_err(const float *a, const float *b, int64_t n, float atol, float rtol,
                       int64_t *nbad, int64_t *first_bad);

/* Largest |a - b| / |b| with the same conventions (equal elements count 0,
 * NaN gives NaN, a difference against b == 0 gives +inf). For reports. */
double ref_max_rel_err(const float *a, const float *b, int64_t n);

/* Print to stderr the first REF_SHOWN bad elements, one line each:
 * "<label>[<index>]: got <a> want <b> (|diff| <d> > tol <t>)", then a line
 * with how many more there are. Returns the number of bad elements. */
int64_t ref_print_mismatches(const char *label, const float *a, const float *b, int64_t n,
                             float atol, float rtol);

/* For tests: true when every element is good. Otherwise print to stderr
 * "<label>: max_abs_err=... bad=<n> of <count>" and the first mismatches,
 * and return false, so that `cr_assert(ref_allclose(...))` explains itself. */
bool ref_allclose(const char *label, const float *a, const float *b, int64_t n, float atol,
                  float rtol);

#endif /* DT_TESTS_REF_H */
