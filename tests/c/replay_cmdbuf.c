/* Replay of a command buffer (cl_khr_command_buffer): recorded once (a kernel with its
 * arguments, a copy, a fill, sync points), finalized, and run every iteration after a plain
 * kernel, with a blocking read of what it wrote. One context, never recreated; every result
 * folded into a checksum, which a run whose driver crashed mid-run must match.
 *
 * usage: replay_cmdbuf ITERATIONS [SLEEP_MS]
 * Prints "iteration N", "context notified (replay): ..." for each pfn_notify, then
 * "checksum X" and "done", or "ERROR step=... code=..." and exits 1. */
#include "replay_common.h"
#include <CL/cl_ext.h>

#define N 4096

#define GET(name)                                                                             \
    name##_fn name = (name##_fn)clGetExtensionFunctionAddressForPlatform(p, #name);           \
    if (!name) {                                                                              \
        printf("ERROR step=no-" #name " code=0\n");                                          \
        return 1;                                                                             \
    }

static const char *src =
    "__kernel void bump(__global uint *a, uint k) {\n"
    "  size_t i = get_global_id(0);\n"
    "  a[i] = a[i] * 5u + k + (uint)i;\n"
    "}\n"
    "__kernel void stir(__global uint *a, __global uint *b, uint m) {\n"
    "  size_t i = get_global_id(0);\n"
    "  b[i] = (b[i] ^ a[(i * 13) % 4096]) * m + 7u;\n"
    "}\n";

int main(int argc, char **argv) {
    int iterations, sleep_ms;
    replay_args(argc, argv, &iterations, &sleep_ms);
    cl_platform_id p;
    cl_device_id d;
    cl_int err;
    STEP("platforms", clGetPlatformIDs(1, &p, NULL));
    STEP("devices", clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));
    GET(clCreateCommandBufferKHR);
    GET(clFinalizeCommandBufferKHR);
    GET(clEnqueueCommandBufferKHR);
    GET(clCommandNDRangeKernelKHR);
    GET(clCommandCopyBufferKHR);
    GET(clCommandFillBufferKHR);
    GET(clReleaseCommandBufferKHR);
    cl_context ctx = clCreateContext(NULL, 1, &d, notified, "replay", &err);
    STEP("context", err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    STEP("queue", err);
    /* The command buffer before the program, kernels and buffers it records. */
    cl_command_buffer_khr cb = clCreateCommandBufferKHR(1, &q, NULL, &err);
    STEP("command buffer", err);
    REPLAY_PROGRAM(prog, ctx, src, err);
    REPLAY_KERNEL(bump, prog, "bump", err);
    REPLAY_KERNEL(stir, prog, "stir", err);
    static cl_uint host[N];
    for (int i = 0; i < N; i++) host[i] = (cl_uint)i * 11u;
    cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host, &err);
    STEP("a", err);
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host, &err);
    STEP("b", err);
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof host, NULL, &err);
    STEP("out", err);
    cl_uint m = 2654435761u, pattern = 0x5a5a5a5au;
    STEP("arg", clSetKernelArg(stir, 0, sizeof a, &a));
    STEP("arg", clSetKernelArg(stir, 1, sizeof b, &b));
    STEP("arg", clSetKernelArg(stir, 2, sizeof m, &m));
    size_t global = N;
    cl_sync_point_khr s_fill, s_stir;
    STEP("record fill", clCommandFillBufferKHR(cb, NULL, out, &pattern, sizeof pattern, 0, sizeof host, 0, NULL,
                                               &s_fill, NULL));
    STEP("record stir", clCommandNDRangeKernelKHR(cb, NULL, NULL, stir, 1, NULL, &global, NULL, 0, NULL, &s_stir,
                                                  NULL));
    STEP("record copy", clCommandCopyBufferKHR(cb, NULL, b, out, 0, 0, N / 2 * sizeof(cl_uint), 2,
                                               (cl_sync_point_khr[]){s_fill, s_stir}, NULL, NULL));
    STEP("finalize", clFinalizeCommandBufferKHR(cb));
    STEP("arg", clSetKernelArg(bump, 0, sizeof a, &a));
    uint64_t sum = FOLD_START;
    for (int it = 0; it < iterations; it++) {
        cl_uint k = (cl_uint)it * 3u + 1u;
        STEP("arg", clSetKernelArg(bump, 1, sizeof k, &k));
        STEP("bump", clEnqueueNDRangeKernel(q, bump, 1, NULL, &global, NULL, 0, NULL, NULL));
        STEP("run command buffer", clEnqueueCommandBufferKHR(0, NULL, cb, 0, NULL, NULL));
        STEP("read", clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
        for (int i = 0; i < N; i++) sum = (sum ^ host[i]) * 1099511628211ull;
        iteration_done(it, sleep_ms);
    }
    STEP("finish", clFinish(q));
    print_result(sum);
    clReleaseCommandBufferKHR(cb);
    clReleaseKernel(bump);
    clReleaseKernel(stir);
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    clReleaseMemObject(out);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
