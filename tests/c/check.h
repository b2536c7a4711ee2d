/* CHECK(cond, format, ...) for the C ABI's test programs: when cond fails, prints
 * "<CHECK_PREFIX> FAIL line N: <message> (last error: ...)" to stderr and returns 1 from the
 * function (main). Define CHECK_PREFIX before including this. */
#ifndef FASTPAR_TESTS_CHECK_H
#define FASTPAR_TESTS_CHECK_H

#include <stdio.h>

#include "fastpar.h"

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, CHECK_PREFIX " FAIL line %d: ", __LINE__);    \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, " (last error: %s)\n", fastpar_last_error()); \
            return 1;                                                     \
        }                                                                 \
    } while (0)

#endif
