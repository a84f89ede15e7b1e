/* SPDX-License-Identifier: MIT
 *
 * The few macros every module may use: the element count of an array and
 * the attribute that makes the compiler refuse a dropped result. Nothing
 * here has a run-time cost or a .c file.
 */
#ifndef DT_MACROS_H
#define DT_MACROS_H

/* Elements of an array (not a pointer: a pointer gives a wrong answer, so
 * use it only on arrays declared in scope). */
#define DT_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* On a function whose result must be looked at: a state change that can
 * fail (db), a collective (comm), a decoder (msg). Ignoring it is a
 * warning, and -Werror (CI) makes it an error; a call site that really has
 * nothing to do says why and casts to (void) after a check, never silently. */
#if defined(__GNUC__) || defined(__clang__)
#define DT_MUST_CHECK __attribute__((warn_unused_result))
#else
#define DT_MUST_CHECK
#endif

#endif /* DT_MACROS_H */
