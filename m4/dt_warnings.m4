# SPDX-License-Identifier: MIT
# DT_WARNINGS: strict warnings the compiler understands, in DT_WARN_CFLAGS.
# DT_ENABLE_WERROR: --enable-werror adds -Werror (CI builds with it).

AC_DEFUN([DT_WARNINGS], [
  DT_WARN_CFLAGS=""
  for flag in -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
              -Wpointer-arith -Wformat=2 -Wundef -Wno-unused-parameter; do
    AX_SAVE_CFLAGS="$CFLAGS"
    CFLAGS="$CFLAGS -Werror $flag"
    AC_MSG_CHECKING([whether $CC accepts $flag])
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([], [])],
      [AC_MSG_RESULT([yes]); DT_WARN_CFLAGS="$DT_WARN_CFLAGS $flag"],
      [AC_MSG_RESULT([no])])
    CFLAGS="$AX_SAVE_CFLAGS"
  done
  AC_SUBST([DT_WARN_CFLAGS])
])

AC_DEFUN([DT_ENABLE_WERROR], [
  AC_ARG_ENABLE([werror],
    [AS_HELP_STRING([--enable-werror], [treat compiler warnings as errors])],
    [], [enable_werror=no])
  AS_IF([test "x$enable_werror" = xyes],
    [DT_WARN_CFLAGS="$DT_WARN_CFLAGS -Werror"])
])
