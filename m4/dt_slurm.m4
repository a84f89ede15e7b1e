# SPDX-License-Identifier: MIT
# DT_WITH_SLURM: --with-slurm[=PREFIX]. Default "check": link libslurm when
# <slurm/slurm.h> and slurm_init are found, warn otherwise. libslurm ships no
# pkg-config file, so this checks the library directly. An explicit
# --with-slurm that cannot be satisfied is an error.

AC_DEFUN([DT_WITH_SLURM], [
  AC_ARG_WITH([slurm],
    [AS_HELP_STRING([--with-slurm@<:@=PREFIX@:>@],
      [submit jobs through libslurm (default: check)])],
    [], [with_slurm=check])
  have_slurm=no
  AS_IF([test "x$with_slurm" != xno], [
    dt_save_CPPFLAGS="$CPPFLAGS"; dt_save_LIBS="$LIBS"; dt_save_LDFLAGS="$LDFLAGS"
    AS_IF([test "x$with_slurm" != xyes && test "x$with_slurm" != xcheck], [
      AS_IF([test -f "$with_slurm/include/slurm/slurm.h"], [],
        [AC_MSG_ERROR([--with-slurm=$with_slurm: no include/slurm/slurm.h under that prefix])])
      SLURM_CFLAGS="-I$with_slurm/include"
      SLURM_LDFLAGS="-L$with_slurm/lib -Wl,-rpath,$with_slurm/lib"
    ])
    CPPFLAGS="$CPPFLAGS $SLURM_CFLAGS"; LDFLAGS="$LDFLAGS $SLURM_LDFLAGS"
    AC_CHECK_HEADER([slurm/slurm.h],
      [AC_CHECK_LIB([slurm], [slurm_init],
        [have_slurm=yes; SLURM_LIBS="$SLURM_LDFLAGS -lslurm"])])
    CPPFLAGS="$dt_save_CPPFLAGS"; LIBS="$dt_save_LIBS"; LDFLAGS="$dt_save_LDFLAGS"
    AS_IF([test "x$have_slurm" = xno], [
      AS_IF([test "x$with_slurm" = xcheck],
        [AC_MSG_WARN([libslurm not found: building without Slurm submission])],
        [AC_MSG_ERROR([--with-slurm given but slurm/slurm.h or libslurm not found])])
    ])
  ])
  AS_IF([test "x$have_slurm" = xyes], [
    AC_DEFINE([HAVE_SLURM], [1], [Define to 1 to submit jobs through libslurm])
    with_slurm=yes
  ], [with_slurm=no])
  AC_SUBST([SLURM_CFLAGS])
  AC_SUBST([SLURM_LIBS])
  AM_CONDITIONAL([HAVE_SLURM], [test "x$have_slurm" = xyes])
])
