/*
 * testutil.h — small helpers shared by the test programs (header only;
 * include after <cmocka.h>).
 *
 *   contains(hay, needle)   case-insensitive substring test
 *   PROBLEM(fmt, ...)       report a failed check and keep going
 *   end_problems()          fail the current test if any PROBLEM was reported
 *
 * Soft checks let one run list every failing case of a test instead of
 * stopping at the first; the test still fails.
 */
#ifndef MOEX_TESTUTIL_H
#define MOEX_TESTUTIL_H

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* case-insensitive: does hay contain needle? (NULL never contains anything) */
static inline int contains(const char *hay, const char *needle) {
    if (!hay || !needle) return 0;
    size_t n = strlen(needle);
    for (const char *p = hay; *p; p++) {
        size_t i = 0;
        while (i < n && p[i] && tolower((unsigned char)p[i]) == tolower((unsigned char)needle[i])) i++;
        if (i == n) return 1;
    }
    return n == 0;
}

/* need1, need2 (either may be NULL) -> "\"a\"" or "\"a\" or \"b\"" for messages */
static inline const char *needs_text(const char *need1, const char *need2) {
    static char buf[160];
    if (need1 && need2) snprintf(buf, sizeof buf, "\"%s\" or \"%s\"", need1, need2);
    else snprintf(buf, sizeof buf, "\"%s\"", need1 ? need1 : need2 ? need2 : "");
    return buf;
}

/* Problems reported in the running test; printed up to PROBLEM_PRINT_MAX. */
static int g_problems __attribute__((unused));
#define PROBLEM_PRINT_MAX 25

#define PROBLEM(...)                                                         \
    do {                                                                     \
        if (g_problems++ < PROBLEM_PRINT_MAX) {                              \
            print_error("PROBLEM (%s:%d): ", __FILE__, __LINE__);            \
            print_error(__VA_ARGS__);                                        \
            print_error("\n");                                               \
        }                                                                    \
    } while (0)

/* Fail the running test if PROBLEM was called since the last end_problems(). */
#define end_problems()                                                       \
    do {                                                                     \
        int n_ = g_problems;                                                 \
        g_problems = 0;                                                      \
        if (n_) fail_msg("%d problem(s) reported above", n_);                \
    } while (0)

#endif /* MOEX_TESTUTIL_H */
