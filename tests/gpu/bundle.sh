#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bundle.sh: pack dtengine, dtctl, npytool and hfgen with the shared libraries a bare GPU
# node lacks (Open MPI, PMIx, OpenBLAS, jansson, libcrypto, ...: whatever
# ldd resolves here outside glibc, the C++ runtime and the CUDA/NCCL
# libraries, which the node has), so that tests/gpu/device.sh can run
# `dtengine attn --device cuda` there end to end. Run it where dt was built.
#
# usage: sh tests/gpu/bundle.sh [--tests] [BUILDDIR] OUT.tar.xz
#   the archive holds gpu-bundle/{dtengine,dtctl,npytool,hfgen,lib/*}; device.sh looks
#   for BUILDDIR/gpu-bundle (extract it there: tar xJf OUT.tar.xz). With --tests it
#   also holds the GPU tests and the benchmark (tests/gpu/test_attn_cuda,
#   test_layers_cuda, test_ring_cuda, test_cudnn_plans, bench/bench_attn_cuda) at
#   their places under BUILDDIR, so that one archive extracted in a copy of the
#   tree is all `sh tests/gpu/device.sh --quick` needs on a bare GPU node.
set -eu

tests=
if [ "${1:-}" = --tests ]; then
    tests=1
    shift
fi
case $# in
1) builddir=. out=$1 ;;
2) builddir=$1 out=$2 ;;
*)
    echo "usage: sh tests/gpu/bundle.sh [--tests] [BUILDDIR] OUT.tar.xz" >&2
    exit 2
    ;;
esac
gpu_progs="tests/gpu/test_attn_cuda tests/gpu/test_layers_cuda tests/gpu/test_ring_cuda
tests/gpu/test_cudnn_plans bench/bench_attn_cuda"
if [ -n "$tests" ]; then
    for b in $gpu_progs; do
        [ -x "$builddir/$b" ] || {
            echo "bundle.sh: $builddir/$b is missing: make $b first" >&2
            exit 1
        }
    done
fi
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
if [ -n "$tests" ]; then
    for b in $gpu_progs; do
        mkdir -p "$tmp/$(dirname "$b")"
        cp "$builddir/$b" "$tmp/$b"
    done
    # shellcheck disable=SC2086
    tar -C "$tmp" -cJf "$out" gpu-bundle $gpu_progs
else
    tar -C "$tmp" -cJf "$out" gpu-bundle
fi
echo "bundle.sh: $out ($(du -k "$out" | cut -f1) KiB):" $(ls "$tmp/gpu-bundle/lib") \
    ${tests:+"+ the GPU tests and bench_attn_cuda"}
