/* A non-blocking read queued behind a long kernel, so that a driver crash lands while it is in
 * flight: under CLOISTER_RECOVERY=replay the read is run again in the replacement and its data
 * lands where the application asked before its event completes. Prints "checksum X", "done". */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdint.h>
#include <stdio.h>

#define N 64

#define STEP(name, expr)                                                  \
    do {                                                                  \
        cl_int e_ = (expr);                                               \
        if (e_ != CL_SUCCESS) {                                           \
            printf("ERROR step=%s code=%d\n", name, e_);                  \
            return 1;                                                     \
        }                                                                 \
    } while (0)

static const char *src =
    "__kernel void slow(__global uint *o, uint rounds) {\n"
    "  uint x = (uint)get_global_id(0) + 1u;\n"
    "  for (uint r = 0; r < rounds; r++) x = x * 1664525u + 1013904223u;\n"
    "  o[get_global_id(0)] = x;\n"
    "}\n";

int main(void) {
    cl_platform_id p;
    cl_device_id d;
    cl_int err;
    STEP("platforms", clGetPlatformIDs(1, &p, NULL));
    STEP("devices", clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    STEP("context", err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    STEP("queue", err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    STEP("program", err);
    STEP("build", clBuildProgram(prog, 0, NULL, NULL, NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "slow", &err);
    STEP("kernel", err);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(cl_uint), NULL, &err);
    STEP("buffer", err);
    cl_uint rounds = 30000000u;
    STEP("arg0", clSetKernelArg(k, 0, sizeof m, &m));
    STEP("arg1", clSetKernelArg(k, 1, sizeof rounds, &rounds));
    size_t g = N;
    static cl_uint out[N];
    cl_event ev;
    STEP("enqueue", clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
    STEP("read", clEnqueueReadBuffer(q, m, CL_FALSE, 0, sizeof out, out, 0, NULL, &ev));
    STEP("wait", clWaitForEvents(1, &ev));
    cl_int status;
    STEP("status", clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
    if (status != CL_COMPLETE) {
        printf("ERROR step=status code=%d\n", status);
        return 1;
    }
    uint64_t sum = 1469598103934665603ull;
    for (int i = 0; i < N; i++) sum = (sum ^ out[i]) * 1099511628211ull;
    printf("checksum %016llx\n", (unsigned long long)sum);
    printf("done\n");
    return 0;
}
