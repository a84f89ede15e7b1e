# SPDX-License-Identifier: MIT
# DT_WITH_CUDA: --with-cuda[=PREFIX]. Default "check": use CUDA when nvcc,
# the runtime, cuBLASLt and NCCL are found (cuDNN's graph header as well
# builds the cuDNN attention backend, opened at run time; without it
# attention runs on dt's own kernels), warn and go on without the GPU
# backend otherwise. An explicit --with-cuda that cannot be satisfied is an
# error.
#
# The runtime is linked statically (libcudart_static) so GPU binaries need
# only the driver, libcublasLt.so.13 and libnccl.so.2 on a GPU node, and
# libcudnn.so.9 where it is to be used (all ship in NVIDIA's pip wheels;
# cuDNN is opened at run time, never linked; the rpath to PREFIX/lib64 serves builds run
# where they were built, LD_LIBRARY_PATH the others); NVCC_GENCODE picks the
# architectures (sm_80 and sm_90a by default: A100, H100/H200).

AC_DEFUN([DT_WITH_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=PREFIX@:>@],
      [build the CUDA backend (default: check /usr/local/cuda)])],
    [], [with_cuda=check])
  AC_ARG_VAR([NVCC_GENCODE], [nvcc -gencode flags (default: sm_80 and sm_90a)])
  have_cuda=no
  cuda_missing=
  AS_IF([test "x$with_cuda" != xno], [
    cuda_prefix=/usr/local/cuda
    AS_IF([test "x$with_cuda" != xyes && test "x$with_cuda" != xcheck],
      [cuda_prefix="$with_cuda"])
    AC_PATH_PROG([NVCC], [nvcc], [], [$cuda_prefix/bin$PATH_SEPARATOR$PATH])
    AS_IF([test -z "$NVCC"], [cuda_missing="nvcc"])
    for f in cuda_runtime.h cublasLt.h nccl.h; do
      AS_IF([test -f "$cuda_prefix/include/$f"], [],
        [cuda_missing="$cuda_missing $f"])
    done
    for f in libcudart_static.a libcublasLt.so libnccl.so; do
      AS_IF([test -f "$cuda_prefix/lib64/$f"], [],
        [cuda_missing="$cuda_missing $f"])
    done
    AS_IF([test -z "$cuda_missing"], [
      CUDA_CFLAGS="-I$cuda_prefix/include"
      CUDA_LIBS="-L$cuda_prefix/lib64 -Wl,-rpath,$cuda_prefix/lib64 -lcublasLt -lnccl -lcudart_static -ldl -lrt -lpthread -lstdc++"
      have_cuda=yes
    ], [
      AS_IF([test "x$with_cuda" = xcheck],
        [AC_MSG_WARN([CUDA not usable under $cuda_prefix (missing:$cuda_missing): building without the GPU backend])],
        [AC_MSG_ERROR([--with-cuda given but missing under $cuda_prefix:$cuda_missing])])
    ])
  ])
  AS_IF([test "x$have_cuda" = xyes], [
    AC_DEFINE([HAVE_CUDA], [1], [Define to 1 to build the CUDA backend])
    AC_DEFINE_UNQUOTED([CUDA_PREFIX], ["$cuda_prefix"], [The CUDA tree built against])
    AS_IF([test -f "$cuda_prefix/include/cudnn_graph.h"],
      [AC_DEFINE([HAVE_CUDNN_GRAPH_H], [1], [Define to 1 when cuDNN's graph API header is there])],
      [AC_MSG_WARN([no cudnn_graph.h under $cuda_prefix/include: GPU attention on dt's own kernels only])])
    AS_IF([test -z "$NVCC_GENCODE"],
      [NVCC_GENCODE="-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a"])
    with_cuda=yes
  ], [with_cuda=no])
  AC_SUBST([CUDA_CFLAGS])
  AC_SUBST([CUDA_LIBS])
  AC_SUBST([NVCC_GENCODE])
  AM_CONDITIONAL([HAVE_CUDA], [test "x$have_cuda" = xyes])
])
