/* SPDX-License-Identifier: MIT
 *
 * Checkpoints of a training job on disk. A checkpoint of step S with R ranks
 * is one directory
 *
 *     <root>/step-<S %08d>/
 *         shard-<rank %05d>-of-<R %05d>.safetensors   one per rank
 *         manifest.json                               written by rank 0
 *         COMMITTED                                   (later: by the coordinator)
 *
 * built under the temporary name <root>/.step-<S %08d>.tmp and renamed into
 * place by dt_ckpt_commit only when the manifest and every shard of the right
 * size are there, so a crash at any point leaves either a complete step
 * directory or a temp directory that readers skip. The manifest records
 *
 *     {"format": "dt-checkpoint", "version": 1, "step": S, "ranks": R,
 *      "model": {...}, "plan": {...}, "rng": {...}, "data_cursor": N,
 *      "shards": [{"rank": r, "file": "...", "bytes": n, "sha256": "..."}, ...]}
 *
 * where model is the model's shape and settings (dt_ckpt_model_json, read
 * back by dt_ckpt_model_parse), plan (the layout) and rng free JSON objects
 * of the caller.
 * Modes: root (when created here) and step directories 0700, every file
 * 0600, whatever the umask: a checkpoint holds a model's weights, and a
 * shared ckpt_dir must not show them to other users.
 * Resume takes the newest step directory that verifies (manifest parses,
 * every shard present with its recorded size and SHA-256).
 *
 * Sequence for one step (no coordinator yet; the caller's barriers order it):
 * rank 0 dt_ckpt_begin; barrier; every rank dt_ckpt_write_shard and sends its
 * dt_ckpt_shard_t to rank 0; rank 0 dt_ckpt_write_manifest, dt_ckpt_commit,
 * then optionally dt_ckpt_prune.
 *
 * Training shards (dt-train-1, dtengine train's parameters and moments)
 * are built and read back here (the end of this file); other commands'
 * shards are their own (use safetensors.h on the shard paths).
 *
 * Not here: the COMMITTED protocol with the coordinator (only its file hook),
 * resharding to another rank count, locking between two jobs sharing a root.
 */
#ifndef DT_CKPT_H
#define DT_CKPT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "io/safetensors.h"
#include "spec/model.h"

#define DT_CKPT_FORMAT "dt-checkpoint"
#define DT_CKPT_VERSION 1
#define DT_CKPT_MAX_RANKS (1 << 20)
#define DT_CKPT_MANIFEST "manifest.json"
#define DT_CKPT_COMMITTED "COMMITTED"
#define DT_CKPT_MANIFEST_MAX (16 << 20) /* bytes; a manifest is a few KiB */

/* One shard as the manifest records it. */
typedef struct dt_ckpt_shard {
    int rank;
    char file[64]; /* name inside the step directory */
    int64_t bytes;
    char sha256[65]; /* lowercase hex */
} dt_ckpt_shard_t;

/* A manifest. For dt_ckpt_write_manifest the json objects are borrowed (NULL
 * plan or rng is written as {}; model is required) and shards holds `ranks`
 * records in rank order. From dt_ckpt_manifest_read everything is owned by
 * the struct and released by dt_ckpt_manifest_close. */
typedef struct dt_ckpt_manifest {
    int64_t step;
    int ranks;
    json_t *model;
    json_t *plan;
    json_t *rng;
    int64_t data_cursor;
    dt_ckpt_shard_t *shards;
} dt_ckpt_manifest_t;

/* The manifest's "model" object for cfg (new reference): dim, layers,
 * heads, kv_heads, ffn, vocab, rope_theta, norm_eps, tied; "head_dim" only
 * when it differs from dim / heads and "rope_scaling" ({"rope_type":
 * "llama3", "factor", "low_freq_factor", "high_freq_factor",
 * "original_max_pos"}) only with a scaling, so the manifests of checkpoints
 * written before those settings existed still compare equal. A resume into
 * another shape or other settings is refused by comparing these
 * (json_equal), so the object must not change for a given cfg. */
json_t *dt_ckpt_model_json(const dt_model_cfg_t *cfg);

/* The inverse: a manifest's "model" object into *cfg (name "custom"),
 * strictly. Every key above is required but head_dim and rope_scaling,
 * with its JSON type (sizes integers that fit an int, rope_theta and
 * norm_eps numbers, tied a boolean, rope_scaling an object of exactly
 * those five keys with rope_type "llama3"); an unknown key (a newer dt's
 * setting this one would ignore) is refused too. Then
 * dt_model_cfg_check. Returns 0; DT_EFORMAT naming the key that is
 * missing, of the wrong type or unknown ("model: ..."; the caller adds the
 * file), or dt_model_cfg_check's DT_EINVAL. *cfg is undefined on
 * failure. */
int dt_ckpt_model_parse(const json_t *model, dt_model_cfg_t *cfg, dt_emsg_t *em);

/* "<root>/step-%08d" and "<root>/.step-%08d.tmp"; the caller frees. */
char *dt_ckpt_step_dir(const char *root, int64_t step);
char *dt_ckpt_tmp_dir(const char *root, int64_t step);
/* "shard-%05d-of-%05d.safetensors". */
void dt_ckpt_shard_name(int rank, int ranks, char out[64]);

/* Start step STEP: create root if missing (one level), remove a leftover
 * temp directory of this step (a crashed attempt) and create it empty. Call
 * on one rank, before any rank writes. DT_EEXIST if step-STEP already exists
 * (a committed step is never overwritten). */
int dt_ckpt_begin(const char *root, int64_t step, dt_emsg_t *em);

/* Write this rank's shard from w (see dt_st_write) into the temp directory
 * of STEP and fill *out with its record. Any rank, concurrently. */
int dt_ckpt_write_shard(const char *root, int64_t step, int rank, int ranks, dt_st_writer_t *w,
                        dt_ckpt_shard_t *out, dt_emsg_t *em);

/* Rank 0: check the records (one per rank, in order, names as
 * dt_ckpt_shard_name, each file present in the temp directory with its
 * recorded size) and write manifest.json there atomically. DT_EINVAL for bad
 * records, DT_ENOENT/DT_EFORMAT for a missing or wrong-sized shard. */
int dt_ckpt_write_manifest(const char *root, const dt_ckpt_manifest_t *m, dt_emsg_t *em);

/* Rank 0: check the temp directory (manifest and shard sizes; hashes were
 * computed by the writers), fsync it, rename it to step-STEP and fsync root.
 * On success *out_dir (may be NULL) is the new directory's path (the caller
 * frees). DT_EEXIST if step-STEP exists; on failure the temp directory is
 * left as it was. */
int dt_ckpt_commit(const char *root, int64_t step, char **out_dir, dt_emsg_t *em);

/* Hook for the coordinator's commit protocol: write DIR/COMMITTED atomically
 * (the file holds the manifest's SHA-256). Safe in a directory that another
 * user controls: DIR itself must not be a symbolic link, the manifest is
 * hashed only as a regular file reached without a link, the marker's temp
 * file is created with O_EXCL | O_NOFOLLOW (mode 0600) and renamed over
 * whatever is at DIR/COMMITTED, so no planted link is ever written through.
 * dt_ckpt_is_committed says whether the marker is there (a regular file,
 * not a link). */
int dt_ckpt_mark_committed(const char *dir, dt_emsg_t *em);
bool dt_ckpt_is_committed(const char *dir);

/* Parse and validate DIR/manifest.json into m (m is zeroed first and is
 * empty on failure). The manifest must be a regular file (not a symbolic
 * link) of at most DT_CKPT_MANIFEST_MAX bytes. DT_ENOENT, DT_EFORMAT (with
 * the field named). */
int dt_ckpt_manifest_read(const char *dir, dt_ckpt_manifest_t *m, dt_emsg_t *em);
/* The same over len bytes of text in memory (name is used in messages): a
 * pure function, for the fuzzer (tests/fuzz/fuzz_manifest.c). */
int dt_ckpt_manifest_parse(const char *name, const char *text, size_t len, dt_ckpt_manifest_t *m,
                           dt_emsg_t *em);
void dt_ckpt_manifest_close(dt_ckpt_manifest_t *m);

/* Full check of a step directory: manifest valid, its step agrees with the
 * directory name, every shard present as a regular file (not a symbolic
 * link) with the recorded size and SHA-256 and a sane safetensors header
 * (a truncated shard whose manifest was rewritten to match is refused).
 * The message names the shard and what is wrong. Reads every byte of the
 * checkpoint. */
int dt_ckpt_verify(const char *dir, dt_emsg_t *em);

/* Called by dt_ckpt_latest for each checkpoint directory it passes over
 * (newest first): dir is its path, err the DT_* code and why the message. */
typedef void (*dt_ckpt_skip_fn)(const char *dir, int err, const char *why, void *ud);

/* Only directories with a COMMITTED marker count (for when the coordinator
 * writes the marker). */
#define DT_CKPT_REQUIRE_COMMITTED 1u

/* The newest step directory under ROOT that verifies. Directories newer
 * than it that do not (temp directories, missing or corrupt shards, bad
 * manifests, no marker under DT_CKPT_REQUIRE_COMMITTED) are reported to skip
 * (may be NULL), newest first. Returns 0 with *out_dir (the caller frees)
 * and *out_step (may be NULL) set, or 0 with *out_dir NULL when there is no
 * usable checkpoint (also when ROOT does not exist). Fails (negative, skip
 * never called) only when ROOT cannot be listed. */
int dt_ckpt_latest(const char *root, unsigned flags, dt_ckpt_skip_fn skip, void *ud, char **out_dir,
                   int64_t *out_step, dt_emsg_t *em);

/* Keep the newest KEEP (>= 1) step directories that pass the quick check
 * (manifest and shard sizes, no hashing) and delete every step directory
 * older than the oldest of them, and temp directories older than it. Newer
 * directories that fail the check are left for inspection. Each deletion
 * renames the directory out of the step-* namespace first, so a crash
 * mid-deletion leaves no half step directory. Returns the number of
 * directories deleted, or a negative DT_* code. */
int dt_ckpt_prune(const char *root, int keep, dt_emsg_t *em);

/* Move the step directory STEP of ROOT out of the step-* namespace, to
 * ROOT/step-NNNNNNNN.TAG, or .TAG.2, .TAG.3, ... when that name is taken:
 * nothing existing is ever replaced, so a step set aside again on a later
 * retry gets the next name. Resume and prune ignore such directories; they
 * are kept for inspection. On success *out (may be NULL) is the new path
 * (the caller frees). For a resume that passed over a step that does not
 * verify and will write that step again. */
int dt_ckpt_set_aside(const char *root, int64_t step, const char *tag, char **out, dt_emsg_t *em);

/* What dt_ckpt_supersede found. */
enum dt_ckpt_prior {
    DT_CKPT_NONE = 0,  /* no step directory: write it */
    DT_CKPT_KEEP,      /* committed: as good as the one about to be written; skip */
    DT_CKPT_REDONE,    /* uncommitted: moved out of step-* and removed; write it */
};

/* Before step STEP of ROOT is written under external commits (the
 * coordinator commits): a step directory already there is from an earlier
 * generation that went past the checkpoint the coordinator resumed from.
 * With its COMMITTED marker it is as good as the one about to be written
 * (same step, same state). Without, the coordinator gave up on it: it is
 * renamed out of the step-* namespace (ROOT/.step-NNNNNNNN.superseded.PID),
 * so no reader can take it, and removed. Returns a dt_ckpt_prior, or a
 * negative code when it cannot be moved aside; a renamed directory that
 * cannot be removed is no error, and *warn says why (warn may be NULL). */
int dt_ckpt_supersede(const char *root, int64_t step, dt_emsg_t *warn, dt_emsg_t *em);

/* Training checkpoints (format "dt-train-1", of dtengine train):
 * the flat float32 parameter array of n values and the two AdamW moments
 * are cut into R contiguous slices; shard r holds slice r as the 1-D F32
 * tensors "params", "adam_m" and "adam_v", with metadata "format" =
 * "dt-train-1", "offset" (the slice's first index) and "nparams" (n), in
 * decimal. */
#define DT_CKPT_TRAIN_FORMAT "dt-train-1"
/* One rank's shard, for dt_ckpt_write_shard: the slice [off, off + len) of
 * n parameters and of both moments, P, M and V each pointing at the
 * slice's first element. The writer holds the pointers, not copies: they
 * must stay valid until it is written; free it with dt_st_writer_free.
 * Never NULL (its names are fixed: a failure to add them is a bug, and
 * aborts). */
dt_st_writer_t *dt_ckpt_train_writer_new(int64_t n, int64_t off, int64_t len, const float *P,
                                         const float *M, const float *V);
/* Reading them back: dt_ckpt_read_train reads every shard of the
 * checkpoint DIR (manifest man) into P, M and V (n floats each), calling
 * tick (may be NULL) after each shard. M and V may both be NULL: the parameters alone
 * are read (an export needs no moments), the moments' headers are still
 * checked. DT_EFORMAT with the shard named when a shard is not a slice of
 * n parameters. */
typedef void (*dt_ckpt_tick_fn)(void *ud);
/* One shard's slice as dt_ckpt_read_train checks it, from its header alone
 * (r from dt_st_open or dt_st_parse; path names it in messages): "offset"
 * and "nparams" decimal, nparams == n, "params", "adam_m" and "adam_v" 1-D
 * F32 of one length, and [off, off + len) inside [0, n), all without
 * overflow. 0 with *off and *len set, or DT_EFORMAT. */
int dt_ckpt_train_slice(const char *path, const dt_st_reader_t *r, int64_t n, int64_t *off,
                        int64_t *len, dt_emsg_t *em);
int dt_ckpt_read_train(const char *dir, const dt_ckpt_manifest_t *man, int64_t n, float *P,
                       float *M, float *V, dt_ckpt_tick_fn tick, void *ud, dt_emsg_t *em);
/* The same, keeping parts only (sharded training state): the parameters
 * [plo, plo + pn) into P (pn floats) and the moments [mlo, mlo + mn) into
 * M and V, each read straight from the shards that hold them. The shards
 * may list their slices in any order; they must tile [0, n). A range
 * outside [0, n): DT_EINVAL. */
int dt_ckpt_read_train_range(const char *dir, const dt_ckpt_manifest_t *man, int64_t n,
                             float *P, int64_t plo, int64_t pn, float *M, float *V, int64_t mlo,
                             int64_t mn, dt_ckpt_tick_fn tick, void *ud, dt_emsg_t *em);

#endif /* DT_CKPT_H */
