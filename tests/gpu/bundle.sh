#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bundle.sh: pack dtengine, dtctl, npytool and hfgen with the shared libraries a bare GPU
# node lacks (Open MPI, PMIx, OpenBLAS, jansson, libcrypto, ...: whatever
# ldd resolves here outside glibc, the C++ runtime and the CUDA/NCCL
# libraries, which the node has), so that tests/gpu/device.sh can run
# `dtengine attn --device cuda` there end to end. Run it where dt was built.
#
# usage: sh tests/gpu/bundle.sh [BUILDDIR] OUT.tar.xz
#   the archive holds gpu-bundle/{dtengine,dtctl,npytool,hfgen,lib/*}; device.sh looks
#   for BUILDDIR/gpu-bundle (extract it there: tar xJf OUT.tar.xz).
set -eu

case $# in
1) builddir=. out=$1 ;;
2) builddir=$1 out=$2 ;;
*)
    echo "usage: sh tests/gpu/bundle.sh [BUILDDIR] OUT.tar.xz" >&2
    exit 2
    ;;
esac
for b in engine/dtengine cli/dtctl tests/tools/npytool tests/tools/hfgen; do
    [ -x "$builddir/$b" ] || {
        echo "bundle.sh: $builddir/$b is missing: make $b first" >&2
        exit 1
    }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dt-bundle.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/gpu-bundle/lib"
cp "$builddir/engine/dtengine" "$builddir/cli/dtctl" "$builddir/tests/tools/npytool" "$builddir/tests/tools/hfgen" \
    "$tmp/gpu-bundle/"
for b in engine/dtengine cli/dtctl tests/tools/npytool tests/tools/hfgen; do
    ldd "$builddir/$b" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
    case $name in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | \
        libgcc_s.so.* | libstdc++.so.* | libnccl.so.* | libcublas* | libcudart.so.* | \
        libcuda.so.*) continue ;;
    esac
    cp -L "$path" "$tmp/gpu-bundle/lib/$name"
done
tar -C "$tmp" -cJf "$out" gpu-bundle
echo "bundle.sh: $out ($(du -k "$out" | cut -f1) KiB):" $(ls "$tmp/gpu-bundle/lib")
