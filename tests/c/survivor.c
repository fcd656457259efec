/* A client that must outlive its driver: it runs a small workload and reports the first
 * failing call. Under cloister a driver fault must surface as CL_DEVICE_NOT_AVAILABLE (-2),
 * after which the application keeps running (and exits normally). */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#define STEP(name, expr)                                                              \
    do {                                                                              \
        cl_int e_ = (expr);                                                           \
        if (e_ != CL_SUCCESS) {                                                       \
            printf("ERROR step=%s code=%d\n", name, e_);                              \
            printf("still running after the driver fault\n");                         \
            return e_ == CL_DEVICE_NOT_AVAILABLE || e_ == -1001 /* CL_PLATFORM_NOT_FOUND_KHR */ ? 0 : 1; \
        }                                                                             \
    } while (0)

int main(void) {
    cl_platform_id p;
    cl_device_id d;
    cl_int err;
    cl_uint n = 0;
    STEP("platforms", clGetPlatformIDs(1, &p, &n));
    STEP("devices", clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    STEP("context", err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    STEP("queue", err);
    const char *src = "__kernel void k(__global int *o) { o[get_global_id(0)] = 2 * get_global_id(0); }";
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    STEP("program", err);
    STEP("build", clBuildProgram(prog, 0, NULL, NULL, NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "k", &err);
    STEP("kernel", err);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 1024 * sizeof(int), NULL, &err);
    STEP("buffer", err);
    STEP("arg", clSetKernelArg(k, 0, sizeof m, &m));
    size_t g = 1024;
    for (int round = 0; round < 5; round++) {
        STEP("enqueue", clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
        STEP("finish", clFinish(q));
        usleep(100 * 1000); /* long enough for an asynchronous driver crash to land */
    }
    /* Read in two halves: the worker pins a staging region the second time it is used
     * (CLOISTER_STAGING=pinned), which takes its non-blocking lane path, and the second half
     * differs from what the first left in the lane. */
    int out[1024];
    memset(out, 0xff, sizeof out);
    for (int half = 0; half < 2; half++)
        STEP("read", clEnqueueReadBuffer(q, m, CL_TRUE, half * sizeof out / 2, sizeof out / 2,
                                         out + half * 512, 0, NULL, NULL));
    for (int i = 0; i < 1024; i++)
        if (out[i] != 2 * i) { printf("WRONG RESULT at %d\n", i); return 1; }
    printf("completed without fault\n");
    return 0;
}
