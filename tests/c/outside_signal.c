/* A worker killed from outside while the application holds a context (issue 16, items 7 and
 * 10): the application builds and runs a kernel, prints "ready", and waits for a line on stdin
 * (the test kills the worker meanwhile). Then it reports what the old context's calls answer,
 * with the device handle already rebound to the replacement, and does its work again on a new
 * context of the same device. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>

static const char *SRC = "kernel void k(global int *o) { o[get_global_id(0)] = 5 * get_global_id(0); }";

/* Builds and runs the kernel on `ctx`; returns the first error, 0 if the results are right. */
static cl_int work(cl_context ctx, cl_device_id d, cl_command_queue *keep) {
    cl_int err;
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    if (err) return err;
    cl_program p = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    if (err) return err;
    if ((err = clBuildProgram(p, 1, &d, "", NULL, NULL))) return err;
    cl_kernel k = clCreateKernel(p, "k", &err);
    if (err) return err;
    int out[256];
    cl_mem m = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, sizeof out, NULL, &err);
    if (err) return err;
    clSetKernelArg(k, 0, sizeof m, &m);
    size_t g = 256;
    if ((err = clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL))) return err;
    if ((err = clEnqueueReadBuffer(q, m, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL))) return err;
    for (int i = 0; i < 256; i++)
        if (out[i] != 5 * i) return 1;
    *keep = q;
    return 0;
}

int main(void) {
    cl_platform_id plat;
    cl_device_id d;
    cl_int err;
    if (clGetPlatformIDs(1, &plat, NULL) || clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &d, NULL)) return 2;
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    cl_command_queue q = NULL;
    if (err || work(ctx, d, &q)) return 3;
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 4;
    printf("finish on the old queue: %d\n", clFinish(q));
    /* Give the replacement time to take the device handle. */
    cl_uint n = 0;
    clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 0, NULL, &n);
    clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    printf("old context, queue on the device: %d\n", err);
    clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
    printf("old context, buffer: %d\n", err);
    cl_program p = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    printf("old context, program: %d\n", err);
    if (p) printf("old context, build for the device: %d\n", clBuildProgram(p, 1, &d, "", NULL, NULL));
    cl_context again = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    cl_command_queue q2 = NULL;
    cl_int rc = err ? err : work(again, d, &q2);
    printf("new context: %s (%d)\n", rc == 0 ? "results correct" : "failed", rc);
    return rc == 0 ? 0 : 5;
}
