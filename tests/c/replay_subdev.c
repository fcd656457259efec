/* Replay of sub-devices: the device is split (CL_DEVICE_PARTITION_EQUALLY, one compute unit
 * each), the context and its queue use the first sub-device, and a kernel loop runs with a
 * blocking read each iteration, asking the second sub-device's compute units too. The first
 * sub-device is released only after the context: pocl 3.1 frees a sub-device on its last
 * clReleaseDevice although a context and queue still use it (valgrind shows the reads of freed
 * memory without cloister), so releasing it earlier tests pocl's use-after-free, not the replay. One context, never recreated; every result folded into a
 * checksum, which a run whose driver crashed mid-run must match.
 *
 * usage: replay_subdev ITERATIONS [SLEEP_MS]
 * Prints "iteration N", "context notified (replay): ..." for each pfn_notify, then
 * "checksum X" and "done", or "ERROR step=... code=..." and exits 1. */
#include "replay_common.h"

#define N 4096

static const char *src =
    "__kernel void spin(__global uint *acc, uint k) {\n"
    "  size_t i = get_global_id(0);\n"
    "  acc[i] = (acc[i] ^ (k * 2654435761u)) * 16777619u + (uint)i;\n"
    "}\n";

int main(int argc, char **argv) {
    int iterations, sleep_ms;
    replay_args(argc, argv, &iterations, &sleep_ms);
    cl_platform_id p;
    cl_device_id d;
    cl_int err;
    STEP("platforms", clGetPlatformIDs(1, &p, NULL));
    STEP("devices", clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));
    cl_device_partition_property props[] = {CL_DEVICE_PARTITION_EQUALLY, 1, 0};
    cl_device_id subs[64];
    cl_uint n_subs = 0;
    STEP("sub-devices", clCreateSubDevices(d, props, 64, subs, &n_subs));
    if (n_subs < 2) {
        printf("ERROR step=sub-device-count code=%u\n", n_subs);
        return 1;
    }
    cl_uint units = 0;
    STEP("sub-device info", clGetDeviceInfo(subs[1], CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL));
    printf("%u sub-devices, the first with %u compute units\n", n_subs, units);
    cl_context ctx = clCreateContext(NULL, 1, &subs[0], notified, "replay", &err);
    STEP("context", err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, subs[0], NULL, &err);
    STEP("queue", err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    STEP("program", err);
    STEP("build", clBuildProgram(prog, 1, &subs[0], "", NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "spin", &err);
    STEP("kernel", err);
    static cl_uint host[N];
    for (int i = 0; i < N; i++) host[i] = (cl_uint)i * 3u;
    cl_mem acc = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host, &err);
    STEP("acc", err);
    STEP("arg", clSetKernelArg(k, 0, sizeof acc, &acc));
    uint64_t sum = 1469598103934665603ull;
    size_t global = N;
    for (int it = 0; it < iterations; it++) {
        cl_uint kk = (cl_uint)it + 1;
        STEP("arg", clSetKernelArg(k, 1, sizeof kk, &kk));
        STEP("spin", clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
        STEP("spin", clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
        STEP("read", clEnqueueReadBuffer(q, acc, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
        for (int i = 0; i < N; i++) sum = (sum ^ host[i]) * 1099511628211ull;
        cl_uint now = 0;
        STEP("sub-device info", clGetDeviceInfo(subs[1], CL_DEVICE_MAX_COMPUTE_UNITS, sizeof now, &now, NULL));
        if (now != units) {
            printf("ERROR step=sub-device-units code=%u\n", now);
            return 1;
        }
        iteration_done(it, sleep_ms);
    }
    STEP("finish", clFinish(q));
    print_result(sum);
    clReleaseKernel(k);
    clReleaseMemObject(acc);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    for (cl_uint i = 0; i < n_subs; i++) clReleaseDevice(subs[i]);
    return 0;
}
