#!/bin/sh
# SPDX-License-Identifier: MIT
# Install the Debian 12 packages dt builds, tests and runs with. Needs root
# (or sudo). Idempotent. The last lines are for the tests only: the
# sqlite3 CLI (a newer-schema database is made with it), clang with
# libFuzzer (the protocol decoder is fuzzed in `make check`), setpriv/unshare
# and groupadd (the multi-user tests); xmllint, rsvg-convert and libpng (the
# picture of `dtctl plot` is checked to parse, render and have drawn pixels:
# tests/tools/pngcount); curl and promtool scrape and lint the coordinator's
# metrics endpoint (tests/integration/metrics.sh).
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
    sqlite3 clang-14 libclang-rt-14-dev util-linux passwd curl \
    libxml2-utils librsvg2-bin libpng-dev

# promtool comes only in Debian's prometheus package (22 MB to fetch with its
# web assets, 96 MB installed, the server with it). Its maintainer scripts would
# enable and start a Prometheus server on :9090: installed here, they are
# told not to (invoke-rc.d asks policy-rc.d, which says no for the
# install), and the unit is disabled where systemd runs. Only promtool is
# used; nothing of it is left running.
if ! dpkg -s prometheus >/dev/null 2>&1; then
    own_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        own_policy=1
    fi
    rc=0
    apt-get install -y -q --no-install-recommends prometheus || rc=$?
    [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
    [ "$rc" -eq 0 ] || exit "$rc"
    if [ -d /run/systemd/system ]; then
        systemctl disable --now prometheus.service >/dev/null 2>&1 || :
    fi
fi
