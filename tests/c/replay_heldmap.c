/* Mappings held across a worker's death (replay mode): each iteration maps one buffer for
 * writing and another for reading, then runs a kernel on a third buffer (where a test crashes
 * the driver) and waits, and only then reads through the one mapping and writes through the
 * other, unmaps both, and runs a kernel that uses what was written. Every result is folded into
 * a checksum, which a run whose driver crashed while the mappings were held must match.
 *
 * usage: replay_heldmap ITERATIONS [SLEEP_MS]
 * Prints "iteration N", "context notified (replay): ..." for each pfn_notify, then
 * "checksum X" and "done", or "ERROR step=... code=..." and exits 1. */
#include "replay_common.h"

#define N 8192
#define BIG (256 * 1024) /* ints: a zero-copy buffer on host-unified devices */

static const char *src =
    "__kernel void busy(__global int *x) {\n"
    "  size_t i = get_global_id(0);\n"
    "  x[i] = x[i] * 3 + 1;\n"
    "}\n"
    "__kernel void take(__global const int *in, __global int *acc) {\n"
    "  size_t i = get_global_id(0);\n"
    "  acc[i] = acc[i] * 29 + in[i % 8192];\n"
    "}\n";


int main(int argc, char **argv) {
    REPLAY_START(argc, argv, p, d, ctx, q, err);
    REPLAY_PROGRAM(prog, ctx, src, err);
    REPLAY_KERNEL(busy, prog, "busy", err);
    REPLAY_KERNEL(take, prog, "take", err);
    static int zeros[BIG];
    cl_mem in = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, N * sizeof(int), zeros, &err);
    STEP("in", err);
    cl_mem acc = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, BIG * sizeof(int), zeros, &err);
    STEP("acc", err);
    cl_mem other = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, N * sizeof(int), zeros, &err);
    STEP("other", err);
    STEP("arg", clSetKernelArg(busy, 0, sizeof other, &other));
    STEP("arg", clSetKernelArg(take, 0, sizeof in, &in));
    STEP("arg", clSetKernelArg(take, 1, sizeof acc, &acc));
    uint64_t sum = FOLD_START;
    size_t n = N, big = BIG;
    for (int it = 0; it < iterations; it++) {
        int *w = clEnqueueMapBuffer(q, in, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0, N * sizeof(int), 0, NULL, NULL,
                                    &err);
        STEP("map in", err);
        int *r = clEnqueueMapBuffer(q, acc, CL_TRUE, CL_MAP_READ, 0, BIG * sizeof(int), 0, NULL, NULL, &err);
        STEP("map acc", err);
        /* The driver may die here, with both mappings held. */
        STEP("busy", clEnqueueNDRangeKernel(q, busy, 1, NULL, &n, NULL, 0, NULL, NULL));
        STEP("finish", clFinish(q));
        sum = fold(sum, r, BIG);
        for (int i = 0; i < N; i++) w[i] = i * 7 + it * 13;
        STEP("unmap acc", clEnqueueUnmapMemObject(q, acc, r, 0, NULL, NULL));
        STEP("unmap in", clEnqueueUnmapMemObject(q, in, w, 0, NULL, NULL));
        STEP("take", clEnqueueNDRangeKernel(q, take, 1, NULL, &big, NULL, 0, NULL, NULL));
        static int host[N];
        STEP("read", clEnqueueReadBuffer(q, other, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
        sum = fold(sum, host, N);
        iteration_done(it, sleep_ms);
    }
    static int last[BIG];
    STEP("read acc", clEnqueueReadBuffer(q, acc, CL_TRUE, 0, sizeof last, last, 0, NULL, NULL));
    sum = fold(sum, last, BIG);
    print_result(sum);
    clReleaseKernel(busy);
    clReleaseKernel(take);
    clReleaseMemObject(in);
    clReleaseMemObject(acc);
    clReleaseMemObject(other);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
