# SPDX-License-Identifier: MIT
# DT_ENABLE_SANITIZERS: --enable-sanitizers builds every C program with
# AddressSanitizer (and LeakSanitizer) and UndefinedBehaviorSanitizer, made
# fatal: DT_SAN_FLAGS is added to CFLAGS and LDFLAGS (nvcc objects do not
# see CFLAGS: build such a tree --without-cuda). `make check` then runs
# each test through tests/sanrun.sh, which collects the sanitizers' reports
# and fails a test that produced one. A compiler that cannot link the
# runtimes is an error when the option was asked for.

AC_DEFUN([DT_ENABLE_SANITIZERS], [
  AC_ARG_ENABLE([sanitizers],
    [AS_HELP_STRING([--enable-sanitizers],
      [build with -fsanitize=address,undefined (tests fail on any report)])],
    [], [enable_sanitizers=no])
  DT_SAN_FLAGS=
  AS_IF([test "x$enable_sanitizers" = xyes], [
    DT_SAN_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
    dt_save_CFLAGS="$CFLAGS"; dt_save_LDFLAGS="$LDFLAGS"
    CFLAGS="$CFLAGS $DT_SAN_FLAGS"; LDFLAGS="$LDFLAGS $DT_SAN_FLAGS"
    AC_MSG_CHECKING([whether $CC links with $DT_SAN_FLAGS])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([], [])], [AC_MSG_RESULT([yes])], [
      AC_MSG_RESULT([no])
      AC_MSG_ERROR([--enable-sanitizers: $CC cannot link $DT_SAN_FLAGS (libasan and libubsan installed?)])])
    CFLAGS="$dt_save_CFLAGS $DT_SAN_FLAGS"; LDFLAGS="$dt_save_LDFLAGS $DT_SAN_FLAGS"
  ], [enable_sanitizers=no])
  AC_SUBST([DT_SAN_FLAGS])
  AM_CONDITIONAL([DT_SANITIZERS], [test "x$enable_sanitizers" = xyes])
])
