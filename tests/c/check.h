/* CHECK(cond, format, ...) for the C ABI's test programs: when cond fails, prints
 * "<CHECK_PREFIX> FAIL line N: <message> (last error: ...)" to stderr and returns 1 from the
 * function (main). Define CHECK_PREFIX before including this. */
#ifndef FASTPAR_TESTS_CHECK_H
#define FASTPAR_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

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

/* The model options of the suite's run: its GPU run offloads layers (FASTPAR_TEST_N_GPU_LAYERS,
 * tests/conftest.py), so a program computes on the device of the Python call it is compared with. */
static fastpar_model_params test_model_params(void) {
    fastpar_model_params mp = fastpar_model_default_params();
    const char * gpu_layers = getenv("FASTPAR_TEST_N_GPU_LAYERS");
    if (gpu_layers != NULL && *gpu_layers != '\0') mp.n_gpu_layers = atoi(gpu_layers);
    return mp;
}

#endif
