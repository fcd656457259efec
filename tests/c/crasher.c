/* A deterministic crasher: one kernel writes far outside its buffer, which kills the driver's
 * process every time it runs. Under CLOISTER_RECOVERY=replay the shim reruns it a bounded number
 * of times, then drops it: the application gets a clear error (its event fails, the buffer it
 * wrote answers CL_DEVICE_NOT_AVAILABLE, pfn_notify names the command) and carries on with the
 * rest of its objects. Prints "good N" results, "crash event status S", "read after crash: C",
 * "after: ok" when other work still runs, then "done". */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>

#define N 1024

static void CL_CALLBACK notified(const char *errinfo, const void *p, size_t cb, void *user) {
    (void)p;
    (void)cb;
    (void)user;
    printf("context notified: %s\n", errinfo);
    fflush(stdout);
}

static const char *src =
    "__kernel void good(__global int *o, int k) { o[get_global_id(0)] = (int)get_global_id(0) * k; }\n"
    "__kernel void crash(__global int *o) {\n"
    "  __global volatile int *far = o + ((size_t)1 << 42);\n"
    "  far[get_global_id(0)] = 1;\n"
    "}\n";

static int check(cl_command_queue q, cl_kernel good, cl_mem m, int k) {
    size_t g = N;
    static int out[N];
    if (clSetKernelArg(good, 0, sizeof m, &m) || clSetKernelArg(good, 1, sizeof k, &k)) return -1;
    cl_int e = clEnqueueNDRangeKernel(q, good, 1, NULL, &g, NULL, 0, NULL, NULL);
    if (e) return e;
    e = clEnqueueReadBuffer(q, m, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL);
    if (e) return e;
    for (int i = 0; i < N; i++)
        if (out[i] != i * k) return -9999;
    return 0;
}

int main(void) {
    cl_platform_id p;
    cl_device_id d;
    cl_int err;
    if (clGetPlatformIDs(1, &p, NULL) || clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL)) return 2;
    cl_context ctx = clCreateContext(NULL, 1, &d, notified, NULL, &err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    if (clBuildProgram(prog, 0, NULL, NULL, NULL, NULL)) return 3;
    cl_kernel good = clCreateKernel(prog, "good", &err);
    cl_kernel crash = clCreateKernel(prog, "crash", &err);
    cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(int), NULL, &err);
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(int), NULL, &err);
    printf("good 1: %d\n", check(q, good, a, 3));
    fflush(stdout);
    cl_event ev;
    size_t g = N;
    clSetKernelArg(crash, 0, sizeof b, &b);
    cl_int e = clEnqueueNDRangeKernel(q, crash, 1, NULL, &g, NULL, 0, NULL, &ev);
    printf("crash enqueue: %d\n", e);
    printf("finish: %d\n", clFinish(q));
    cl_int status = 1;
    if (e == CL_SUCCESS) clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    printf("crash event status %d\n", status);
    static int out[N];
    printf("read after crash: %d\n", clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
    int after = check(q, good, a, 5);
    printf("after: %s (%d)\n", after == 0 ? "ok" : "failed", after);
    printf("done\n");
    return 0;
}
