/* What the replay clients share (tests/tests/recovery_replay.rs runs them): a step that fails
 * the run with "ERROR step=NAME code=N" and exit status 1, the context's pfn_notify (it prints
 * "context notified (USER): ERRINFO"), and the arguments ITERATIONS [SLEEP_MS]. */
#ifndef REPLAY_COMMON_H
#define REPLAY_COMMON_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define STEP(name, expr)                                                  \
    do {                                                                  \
        cl_int e_ = (expr);                                               \
        if (e_ != CL_SUCCESS) {                                           \
            printf("ERROR step=%s code=%d\n", name, e_);                  \
            fflush(stdout);                                               \
            return 1;                                                     \
        }                                                                 \
    } while (0)

static void CL_CALLBACK notified(const char *errinfo, const void *p, size_t cb, void *user) {
    (void)p;
    (void)cb;
    printf("context notified (%s): %s\n", (const char *)user, errinfo);
    fflush(stdout);
}

/* Declares and opens what every replay client starts with: platform `p`, device `d`, context
 * `ctx` (its pfn_notify `notified`), in-order queue `q`, and `err` for later calls; a failing
 * step ends main as STEP does. */
#define REPLAY_OPEN(p, d, ctx, q, err)                                              \
    cl_platform_id p;                                                              \
    cl_device_id d;                                                                \
    cl_int err;                                                                    \
    STEP("platforms", clGetPlatformIDs(1, &p, NULL));                              \
    STEP("devices", clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));           \
    cl_context ctx = clCreateContext(NULL, 1, &d, notified, "replay", &err);       \
    STEP("context", err);                                                          \
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);   \
    STEP("queue", err)

/* The start of a replay client's main: declares `iterations` and `sleep_ms` (ITERATIONS and
 * SLEEP_MS from the command line, `replay_args`), then `REPLAY_OPEN`. */
#define REPLAY_START(argc, argv, p, d, ctx, q, err)    \
    int iterations, sleep_ms;                          \
    replay_args(argc, argv, &iterations, &sleep_ms);   \
    REPLAY_OPEN(p, d, ctx, q, err)

/* Declares program `prog` made from `src` in `ctx`, built; a failing step ends main as STEP does. */
#define REPLAY_PROGRAM(prog, ctx, src, err)                                     \
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);      \
    STEP("program", err);                                                      \
    STEP("build", clBuildProgram(prog, 0, NULL, "", NULL, NULL))

/* Declares kernel `k`, `name` in `prog`. */
#define REPLAY_KERNEL(k, prog, name, err)               \
    cl_kernel k = clCreateKernel(prog, name, &err);     \
    STEP("kernel", err)

/* The checksum every client folds its results into (FNV-1a over 32-bit words): its start, and
 * `n` words at `v` folded in. */
#define FOLD_START 1469598103934665603ull
static inline uint64_t fold(uint64_t sum, const void *v, size_t n) {
    const uint32_t *w = (const uint32_t *)v;
    for (size_t i = 0; i < n; i++) sum = (sum ^ w[i]) * 1099511628211ull;
    return sum;
}

/* ITERATIONS (20 without) and SLEEP_MS (0 without) from the command line. */
static inline void replay_args(int argc, char **argv, int *iterations, int *sleep_ms) {
    *iterations = argc > 1 ? atoi(argv[1]) : 20;
    *sleep_ms = argc > 2 ? atoi(argv[2]) : 0;
}

/* Says iteration `it` is done (a test kills the worker after some) and waits SLEEP_MS. */
static inline void iteration_done(int it, int sleep_ms) {
    printf("iteration %d\n", it);
    fflush(stdout);
    if (sleep_ms) usleep(sleep_ms * 1000);
}

/* The run's result, which a disturbed run must match, and its end. */
static inline void print_result(uint64_t checksum) {
    printf("checksum %016llx\n", (unsigned long long)checksum);
    printf("done\n");
}

#endif
