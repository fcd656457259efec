/* Many small buffers, each rewritten by a kernel every iteration and read only at the end (a
 * test runs it with zero-copy buffers off, as on a discrete GPU): replay's checkpoints read
 * them back, many in one call (`ReadBack`), and a crash mid-run replays from those read-backs.
 * Each iteration runs the kernel once on every buffer and finishes the queue; at the end every
 * buffer is read and folded into a checksum, which a run whose driver crashed must match.
 *
 * usage: replay_many ITERATIONS [SLEEP_MS]
 * Prints "iteration N", "context notified (replay): ..." for each pfn_notify, then
 * "checksum X" and "done", or "ERROR step=... code=..." and exits 1. */
#include "replay_common.h"

#define BUFFERS 200
#define INTS 256 /* 1 KiB each: far below what a read-back keeps in its own segment */

static const char *src =
    "__kernel void bump(__global uint *b, uint k) {\n"
    "  size_t i = get_global_id(0);\n"
    "  b[i] = b[i] * 3u + k + (uint)i;\n"
    "}\n";

int main(int argc, char **argv) {
    REPLAY_START(argc, argv, p, d, ctx, q, err);
    REPLAY_PROGRAM(prog, ctx, src, err);
    REPLAY_KERNEL(bump, prog, "bump", err);
    static cl_mem b[BUFFERS];
    static cl_uint init[INTS], out[INTS];
    for (int j = 0; j < BUFFERS; j++) {
        for (int i = 0; i < INTS; i++) init[i] = (cl_uint)(j * 1000 + i);
        b[j] = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof init, init, &err);
        STEP("buffer", err);
    }
    size_t g = INTS;
    for (int it = 0; it < iterations; it++) {
        for (int j = 0; j < BUFFERS; j++) {
            cl_uint k = (cl_uint)(it * 7 + j);
            STEP("arg0", clSetKernelArg(bump, 0, sizeof b[j], &b[j]));
            STEP("arg1", clSetKernelArg(bump, 1, sizeof k, &k));
            STEP("enqueue", clEnqueueNDRangeKernel(q, bump, 1, NULL, &g, NULL, 0, NULL, NULL));
        }
        STEP("finish", clFinish(q));
        iteration_done(it, sleep_ms);
    }
    uint64_t sum = FOLD_START;
    for (int j = 0; j < BUFFERS; j++) {
        STEP("read", clEnqueueReadBuffer(q, b[j], CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
        sum = fold(sum, out, INTS);
    }
    STEP("finish", clFinish(q));
    print_result(sum);
    return 0;
}
