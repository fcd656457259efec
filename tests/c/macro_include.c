/* A header named by a macro built from a `-D` folder, as hashcat includes its headers
 * (`-D INCLUDE_PATH=/usr/share/hashcat/OpenCL`, `#include M2S(INCLUDE_PATH/inc_vendor.h)`):
 * builds with `-D INCLUDE_PATH=DIR` and prints what the kernel computed, or the build log.
 * Usage: macro_include DIR */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>

static const char *SRC = "#define M2S_(x) #x\n#define M2S(x) M2S_(x)\n#include M2S(INCLUDE_PATH/inc_val.h)\n"
                         "kernel void k(global int *o) { o[get_global_id(0)] = VAL + MORE; }\n";

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    cl_platform_id plat;
    cl_device_id d;
    cl_int err;
    if (clGetPlatformIDs(1, &plat, NULL) || clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &d, NULL)) return 2;
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    cl_program p = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    char options[4096];
    snprintf(options, sizeof options, "-D INCLUDE_PATH=%s", argv[1]);
    err = clBuildProgram(p, 1, &d, options, NULL, NULL);
    if (err) {
        static char log[1 << 16];
        clGetProgramBuildInfo(p, d, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
        printf("build failed: %d\n%s\n", err, log);
        return 1;
    }
    cl_kernel k = clCreateKernel(p, "k", &err);
    int out = 0;
    cl_mem m = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, sizeof out, NULL, &err);
    clSetKernelArg(k, 0, sizeof m, &m);
    size_t g = 1;
    clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL);
    clEnqueueReadBuffer(q, m, CL_TRUE, 0, sizeof out, &out, 0, NULL, NULL);
    printf("kernel computed %d\n", out);
    return 0;
}
