#!/bin/sh
# SPDX-License-Identifier: MIT
# Install the Debian 12 packages dt builds, tests and runs with. Needs root
# (or sudo). Idempotent; about 15 s on a fresh machine.
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
    libopenblas-dev libjansson-dev
