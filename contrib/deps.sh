#!/bin/sh
# SPDX-License-Identifier: MIT
# Install the Debian 12 packages dt builds, tests and runs with. Needs root
# (or sudo). Idempotent. The last two lines are for the tests only: the
# sqlite3 CLI (a newer-schema database is made with it), clang with
# libFuzzer (the protocol decoder is fuzzed in `make check`), setpriv/unshare
# and groupadd (the multi-user tests); xmllint, rsvg-convert and libpng (the
# picture of `dtctl plot` is checked to parse, render and have drawn pixels:
# tests/tools/pngcount).
set -e
if [ "$(id -u)" -ne 0 ]; then
    exec sudo "$0" "$@"
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends \
    build-essential autoconf automake libtool pkg-config \
    libuv1-dev libsqlite3-dev libcriterion-dev libpmix-dev libpmix-bin \
    libopenmpi-dev openmpi-bin slurm-wlm libslurm-dev munge libmunge-dev \
    libopenblas-dev libjansson-dev libssl-dev \
    sqlite3 clang-14 libclang-rt-14-dev util-linux passwd \
    libxml2-utils librsvg2-bin libpng-dev
