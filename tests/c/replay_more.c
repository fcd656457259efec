/* Replay of what tests/c/replay.c does not use: kernels from clCreateKernelsInProgram and
 * clCloneKernel, and buffers written through maps (a whole-buffer map and a partial one, each
 * iteration). One context, never recreated; every result folded into a checksum, which a run
 * whose worker died mid-run must match.
 *
 * usage: replay_more ITERATIONS [SLEEP_MS]
 * Prints "iteration N", "context notified (replay): ..." for each pfn_notify, then
 * "checksum X" and "done", or "ERROR step=... code=..." and exits 1. */
#include <string.h>
#include "replay_common.h"

#define N 8192

static const char *src =
    "__kernel void fold(__global const int *in, __global int *acc, int k) {\n"
    "  size_t i = get_global_id(0);\n"
    "  acc[i] = acc[i] * 17 + in[i] * k + (int)(i & 255);\n"
    "}\n"
    "__kernel void twist(__global int *acc, int r) {\n"
    "  size_t i = get_global_id(0);\n"
    "  acc[i] = (acc[i] << r) ^ (acc[i] >> (32 - r)) ^ (int)i;\n"
    "}\n";

int main(int argc, char **argv) {
    REPLAY_START(argc, argv, p, d, ctx, q, err);
    REPLAY_PROGRAM(prog, ctx, src, err);
    /* Both kernels from clCreateKernelsInProgram, found by name (the driver's order is its own). */
    cl_kernel ks[2], mix = NULL, twist = NULL;
    cl_uint nk = 0;
    STEP("kernels in program", clCreateKernelsInProgram(prog, 2, ks, &nk));
    if (nk != 2) {
        printf("ERROR step=kernels-in-program code=%u\n", nk);
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        char name[64] = {0};
        STEP("kernel name", clGetKernelInfo(ks[i], CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL));
        if (strcmp(name, "fold") == 0) mix = ks[i];
        if (strcmp(name, "twist") == 0) twist = ks[i];
    }
    if (!mix || !twist) {
        printf("ERROR step=kernel-names code=0\n");
        return 1;
    }
    cl_mem in = clCreateBuffer(ctx, CL_MEM_READ_ONLY, N * sizeof(int), NULL, &err);
    STEP("in", err);
    cl_mem acc = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(int), NULL, &err);
    STEP("acc", err);
    cl_mem acc2 = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(int), NULL, &err);
    STEP("acc2", err);
    int zero = 0;
    STEP("fill", clEnqueueFillBuffer(q, acc, &zero, sizeof zero, 0, N * sizeof(int), 0, NULL, NULL));
    STEP("fill2", clEnqueueFillBuffer(q, acc2, &zero, sizeof zero, 0, N * sizeof(int), 0, NULL, NULL));
    /* A clone of mix with the arguments set so far, then its own. */
    int k = 3;
    STEP("arg", clSetKernelArg(mix, 0, sizeof in, &in));
    STEP("arg", clSetKernelArg(mix, 1, sizeof acc, &acc));
    STEP("arg", clSetKernelArg(mix, 2, sizeof k, &k));
    cl_kernel mix2 = clCloneKernel(mix, &err);
    STEP("clone", err);
    STEP("arg", clSetKernelArg(mix2, 1, sizeof acc2, &acc2));
    STEP("arg", clSetKernelArg(twist, 0, sizeof acc, &acc));

    static int host[N];
    uint64_t sum = FOLD_START;
    size_t global = N;
    for (int it = 0; it < iterations; it++) {
        /* The whole input through a writing map, then a quarter of it through a partial one. */
        int *m = clEnqueueMapBuffer(q, in, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0, N * sizeof(int), 0, NULL,
                                    NULL, &err);
        STEP("map", err);
        for (int i = 0; i < N; i++) m[i] = i * 5 + it * 11;
        STEP("unmap", clEnqueueUnmapMemObject(q, in, m, 0, NULL, NULL));
        size_t off = (size_t)(it % 4) * (N / 4);
        m = clEnqueueMapBuffer(q, in, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, off * sizeof(int), N / 4 * sizeof(int), 0,
                               NULL, NULL, &err);
        STEP("map part", err);
        for (int i = 0; i < N / 4; i++) m[i] = m[i] * 3 - it;
        STEP("unmap part", clEnqueueUnmapMemObject(q, in, m, 0, NULL, NULL));
        int kk = it + 2, r = 1 + it % 7;
        STEP("arg", clSetKernelArg(mix, 2, sizeof kk, &kk));
        STEP("arg", clSetKernelArg(twist, 1, sizeof r, &r));
        STEP("mix", clEnqueueNDRangeKernel(q, mix, 1, NULL, &global, NULL, 0, NULL, NULL));
        STEP("twist", clEnqueueNDRangeKernel(q, twist, 1, NULL, &global, NULL, 0, NULL, NULL));
        STEP("mix2", clEnqueueNDRangeKernel(q, mix2, 1, NULL, &global, NULL, 0, NULL, NULL));
        STEP("read", clEnqueueReadBuffer(q, acc, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
        for (int i = 0; i < N; i++) sum = (sum ^ (uint32_t)host[i]) * 1099511628211ull;
        STEP("read2", clEnqueueReadBuffer(q, acc2, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
        for (int i = 0; i < N; i++) sum = (sum ^ (uint32_t)host[i]) * 1099511628211ull;
        iteration_done(it, sleep_ms);
    }
    STEP("finish", clFinish(q));
    print_result(sum);
    clReleaseKernel(mix2);
    clReleaseKernel(ks[0]);
    clReleaseKernel(ks[1]);
    clReleaseMemObject(in);
    clReleaseMemObject(acc);
    clReleaseMemObject(acc2);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
