/* Large writes through staging segments, as on a discrete GPU (a test runs it with zero-copy
 * buffers off): replay's journal keeps these writes' data where the shim staged them for the
 * worker instead of copying it, so a segment the pool handed out again too early would change
 * what replay writes. Each iteration writes a 5 MiB buffer whole (blocking), 192 KiB of it again
 * (non-blocking), 256 KiB of it through a writing map, then runs a kernel that folds it into an
 * accumulator (where a test crashes the driver) and reads the accumulator back. Every result
 * is folded into a checksum, which a run whose driver crashed must match.
 *
 * usage: replay_staged ITERATIONS [SLEEP_MS]
 * Prints "iteration N", "context notified (replay): ..." for each pfn_notify, then
 * "checksum X" and "done", or "ERROR step=... code=..." and exits 1. */
#include "replay_common.h"

#define N (1280 * 1024) /* ints: 5 MiB (a blocking write of 4 MiB or more is pipelined, and copied into the journal) */
#define PART (48 * 1024) /* ints: 192 KiB */
#define WINDOW (64 * 1024) /* ints: 256 KiB */

static const char *src =
    "__kernel void fold(__global const int *in, __global int *acc, int k) {\n"
    "  size_t i = get_global_id(0);\n"
    "  acc[i] = acc[i] * 31 + in[i] * k;\n"
    "}\n";

int main(int argc, char **argv) {
    REPLAY_START(argc, argv, p, d, ctx, q, err);
    REPLAY_PROGRAM(prog, ctx, src, err);
    REPLAY_KERNEL(fold_kernel, prog, "fold", err);
    static int zeros[N];
    cl_mem in = clCreateBuffer(ctx, CL_MEM_READ_ONLY, N * sizeof(int), NULL, &err);
    STEP("in", err);
    cl_mem acc = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, N * sizeof(int), zeros, &err);
    STEP("acc", err);
    STEP("arg0", clSetKernelArg(fold_kernel, 0, sizeof in, &in));
    STEP("arg1", clSetKernelArg(fold_kernel, 1, sizeof acc, &acc));

    static int whole[N], part[PART], out[N];
    uint64_t sum = FOLD_START;
    size_t g = N;
    for (int it = 0; it < iterations; it++) {
        for (int i = 0; i < N; i++) whole[i] = (i * 13 + it * 7) % 1009;
        STEP("write whole", clEnqueueWriteBuffer(q, in, CL_TRUE, 0, sizeof whole, whole, 0, NULL, NULL));
        for (int i = 0; i < PART; i++) part[i] = it * 100 + i % 251;
        size_t at = (size_t)(it % 4) * PART * sizeof(int);
        STEP("write part", clEnqueueWriteBuffer(q, in, CL_FALSE, at, sizeof part, part, 0, NULL, NULL));
        size_t off = (size_t)((it * 3) % 4) * WINDOW * sizeof(int);
        int *m = clEnqueueMapBuffer(q, in, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, off, WINDOW * sizeof(int), 0, NULL,
                                    NULL, &err);
        STEP("map", err);
        for (int i = 0; i < WINDOW; i++) m[i] = -(it * 5 + i % 83);
        STEP("unmap", clEnqueueUnmapMemObject(q, in, m, 0, NULL, NULL));
        int k = it % 5 + 1;
        STEP("arg2", clSetKernelArg(fold_kernel, 2, sizeof k, &k));
        STEP("enqueue", clEnqueueNDRangeKernel(q, fold_kernel, 1, NULL, &g, NULL, 0, NULL, NULL));
        STEP("read", clEnqueueReadBuffer(q, acc, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
        for (int i = 0; i < N; i += 7) sum = (sum ^ (uint32_t)out[i]) * 1099511628211ull;
        iteration_done(it, sleep_ms);
    }
    STEP("finish", clFinish(q));
    print_result(sum);
    return 0;
}
