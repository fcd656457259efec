/* Pointer-sized kernel argument values that are none of the application's live objects: a
 * buffer it released, the address of its own zeroed memory, a made-up address, each given to a
 * `__global` argument, and a non-zero value given to a `__local` one. Directly, pocl 3.1 takes
 * the first three (it dereferences the value as its object's address: a crash where nothing is
 * mapped there); caged, the driver would dereference them in the worker, so the cage refuses
 * them as the spec says (`CL_INVALID_MEM_OBJECT`, `CL_INVALID_ARG_VALUE`). After each, the
 * kernel runs with a good buffer, a NULL buffer and a 64-bit value, and its results are
 * checked: the driver never died on the way.
 *
 * Prints "ARG <what>: <code>" per refused value, then "run <n>: ok" or "run <n>: WRONG ..."
 * per run, then "ARG buffer released since: <code>" (a buffer released after it was the
 * argument, given again), "ARG released sampler: <code>" (a sampler argument), and "done". */
#include "check.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static const char *src =
    "__kernel void k(__global ulong *out, __global const ulong *maybe, __local ulong *scratch, ulong v) {\n"
    "  size_t i = get_global_id(0);\n"
    "  scratch[get_local_id(0)] = v + i;\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  out[i] = scratch[get_local_id(0)] + (maybe ? maybe[i] : 7ul);\n"
    "}\n";

#define N 16

int main(void) {
    cl_device_id d;
    cl_int err;
    cl_context ctx = first_device_context(&d);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    if (clBuildProgram(prog, 1, &d, "", NULL, NULL) != CL_SUCCESS) {
        printf("build failed\n");
        return 1;
    }
    cl_kernel k = clCreateKernel(prog, "k", &err);
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(cl_ulong), NULL, &err);
    cl_ulong ones[N];
    for (int i = 0; i < N; i++) ones[i] = 1000 + i;
    cl_mem maybe = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof ones, ones, &err);
    cl_mem gone = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
    clReleaseMemObject(gone);
    static uint64_t zeroed[64];
    void *own = zeroed;
    void *made_up = (void *)(uintptr_t)0x10000;
    cl_ulong nonzero = 0x1234;
    clSetKernelArg(k, 0, sizeof out, &out);
    clSetKernelArg(k, 2, 4 * sizeof(cl_ulong), NULL);
    int run = 0;
    struct { const char *what; cl_uint index; const void *value; } bad[] = {
        {"released buffer", 1, &gone},
        {"own memory's address", 1, &own},
        {"made-up address", 1, &made_up},
        {"value for __local", 2, &nonzero},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        cl_int rc = clSetKernelArg(k, bad[b].index, sizeof(void *), bad[b].value);
        printf("ARG %s: %d\n", bad[b].what, rc);
        /* The argument keeps what it had, or gets a good value now: a buffer, NULL, a size. */
        cl_mem none = NULL;
        clSetKernelArg(k, 1, sizeof(cl_mem), b % 2 ? (const void *)&none : (const void *)&maybe);
        clSetKernelArg(k, 2, 4 * sizeof(cl_ulong), NULL);
        cl_ulong v = ((cl_ulong)0xdeadbeef << 20) + b;
        clSetKernelArg(k, 3, sizeof v, &v);
        size_t g = N, l = 4;
        cl_int e1 = clEnqueueNDRangeKernel(q, k, 1, NULL, &g, &l, 0, NULL, NULL);
        cl_ulong r[N];
        cl_int e2 = clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof r, r, 0, NULL, NULL);
        int wrong = -1;
        for (int i = 0; i < N && wrong < 0; i++)
            if (r[i] != v + i + (b % 2 ? 7 : ones[i])) wrong = i;
        if (e1 || e2 || wrong >= 0)
            printf("run %d: WRONG (enqueue %d, read %d, first wrong word %d)\n", run, e1, e2, wrong);
        else
            printf("run %d: ok\n", run);
        run++;
    }
    /* A buffer released after it was an argument, given again where the argument has a
     * buffer's shape already (the loop case, which reads the handles' cells). */
    cl_mem late = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
    clSetKernelArg(k, 1, sizeof late, &late);
    clReleaseMemObject(late);
    printf("ARG buffer released since: %d\n", clSetKernelArg(k, 1, sizeof late, &late));
    /* A sampler the application released, given to a sampler argument. */
    const char *sampling = "__kernel void s(__read_only image2d_t img, sampler_t smp, __global float4 *out) {\n"
                           "  out[0] = read_imagef(img, smp, (int2)(0, 0));\n"
                           "}\n";
    cl_program sprog = clCreateProgramWithSource(ctx, 1, &sampling, NULL, &err);
    if (clBuildProgram(sprog, 1, &d, "", NULL, NULL) == CL_SUCCESS) {
        cl_kernel sk = clCreateKernel(sprog, "s", &err);
        cl_sampler_properties props[] = {CL_SAMPLER_NORMALIZED_COORDS, CL_FALSE, 0};
        cl_sampler smp = clCreateSamplerWithProperties(ctx, props, &err);
        clReleaseSampler(smp);
        printf("ARG released sampler: %d\n", clSetKernelArg(sk, 1, sizeof smp, &smp));
        clReleaseKernel(sk);
    }
    printf("done\n");
    return 0;
}
