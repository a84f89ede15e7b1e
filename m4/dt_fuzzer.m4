# SPDX-License-Identifier: MIT
# DT_FUZZER: find a clang that links libFuzzer (-fsanitize=fuzzer,address);
# `make fuzz` builds and runs the fuzz targets with it for a bounded time.
# Absent: warn; the targets are still built as plain replay programs.

AC_DEFUN([DT_FUZZER], [
  AC_ARG_VAR([FUZZ_CC], [clang with libFuzzer for the fuzz targets])
  AS_IF([test -z "$FUZZ_CC"], [AC_PATH_PROGS([FUZZ_CC], [clang-14 clang], [])])
  have_fuzzer=no
  AS_IF([test -n "$FUZZ_CC"], [
    AC_MSG_CHECKING([whether $FUZZ_CC links libFuzzer])
    echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' > conftest_fuzz.c
    AS_IF([$FUZZ_CC -fsanitize=fuzzer,address conftest_fuzz.c -o conftest_fuzz >/dev/null 2>&1],
      [have_fuzzer=yes])
    rm -f conftest_fuzz.c conftest_fuzz
    AC_MSG_RESULT([$have_fuzzer])
  ])
  AS_IF([test "x$have_fuzzer" = xno],
    [AC_MSG_WARN([no clang with libFuzzer: 'make fuzz' will replay the corpus only])])
  AM_CONDITIONAL([HAVE_FUZZER], [test "x$have_fuzzer" = xyes])
])
