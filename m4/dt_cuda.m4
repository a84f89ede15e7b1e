# SPDX-License-Identifier: MIT
# DT_WITH_CUDA: --with-cuda[=PREFIX]. Default "check": use CUDA when nvcc and
# the runtime are found, warn and go on without it otherwise. An explicit
# --with-cuda that cannot be satisfied is an error.

AC_DEFUN([DT_WITH_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=PREFIX@:>@],
      [build the CUDA backend (default: check /usr/local/cuda)])],
    [], [with_cuda=check])
  have_cuda=no
  AS_IF([test "x$with_cuda" != xno], [
    cuda_prefix=/usr/local/cuda
    AS_IF([test "x$with_cuda" != xyes && test "x$with_cuda" != xcheck],
      [cuda_prefix="$with_cuda"])
    AC_PATH_PROG([NVCC], [nvcc], [], [$cuda_prefix/bin$PATH_SEPARATOR$PATH])
    AS_IF([test -n "$NVCC" && test -f "$cuda_prefix/include/cuda_runtime.h"], [
      CUDA_CFLAGS="-I$cuda_prefix/include"
      CUDA_LIBS="-L$cuda_prefix/lib64 -Wl,-rpath,$cuda_prefix/lib64 -lcudart -lstdc++"
      have_cuda=yes
    ])
    AS_IF([test "x$have_cuda" = xno], [
      AS_IF([test "x$with_cuda" = xcheck],
        [AC_MSG_WARN([CUDA not found under $cuda_prefix: building without the GPU backend])],
        [AC_MSG_ERROR([--with-cuda given but nvcc or cuda_runtime.h not found under $cuda_prefix])])
    ])
  ])
  AS_IF([test "x$have_cuda" = xyes], [
    AC_DEFINE([HAVE_CUDA], [1], [Define to 1 to build the CUDA backend])
    with_cuda=yes
  ], [with_cuda=no])
  AC_SUBST([CUDA_CFLAGS])
  AC_SUBST([CUDA_LIBS])
  AM_CONDITIONAL([HAVE_CUDA], [test "x$have_cuda" = xyes])
])
