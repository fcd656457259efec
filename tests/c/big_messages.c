/* Messages of any size cross the cage (issue 16, item 1): a 100 MB source is built and read
 * back (CL_PROGRAM_SOURCE), and a pocl binary over 4 MiB is read back with
 * clGetProgramInfo(CL_PROGRAM_BINARIES), created again with clCreateProgramWithBinary, built and
 * run. Prints one line per finding; exits non-zero on the first failure.
 * Usage: big_messages [SOURCE_MB] [TABLE_WORDS] */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(what, rc)                                                  \
    do {                                                                 \
        cl_int rc_ = (rc);                                               \
        if (rc_ != CL_SUCCESS) {                                         \
            printf("FAIL %s: %d\n", what, rc_);                          \
            return 1;                                                    \
        }                                                                \
    } while (0)

static cl_context ctx;
static cl_device_id dev;
static cl_command_queue q;

/* Runs kernel `name` of `prog` on 64 ints and checks it wrote `want` everywhere. */
static int run_kernel(cl_program prog, const char *name, int want) {
    cl_int rc;
    cl_kernel k = clCreateKernel(prog, name, &rc);
    CHECK("clCreateKernel", rc);
    int host[64] = {0};
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof host, NULL, &rc);
    CHECK("clCreateBuffer", rc);
    CHECK("clSetKernelArg", clSetKernelArg(k, 0, sizeof buf, &buf));
    size_t global = 64;
    CHECK("clEnqueueNDRangeKernel", clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
    CHECK("clEnqueueReadBuffer", clEnqueueReadBuffer(q, buf, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
    for (int i = 0; i < 64; i++)
        if (host[i] != want) {
            printf("FAIL kernel %s wrote %d at %d, want %d\n", name, host[i], i, want);
            return 1;
        }
    clReleaseMemObject(buf);
    clReleaseKernel(k);
    return 0;
}

static int huge_source(size_t mb) {
    const char *tail = "\nkernel void padded(global int *a) { a[get_global_id(0)] = 7; }\n";
    size_t pad = mb << 20;
    size_t len = 2 + pad + 2 + strlen(tail);
    char *src = malloc(len + 1);
    memcpy(src, "/*", 2);
    for (size_t i = 0; i < pad; i++) src[2 + i] = "cloister "[i % 9];
    memcpy(src + 2 + pad, "*/", 2);
    strcpy(src + 4 + pad, tail);
    cl_int rc;
    const char *srcs[] = {src};
    cl_program prog = clCreateProgramWithSource(ctx, 1, srcs, &len, &rc);
    CHECK("clCreateProgramWithSource (huge)", rc);
    CHECK("clBuildProgram (huge source)", clBuildProgram(prog, 1, &dev, "", NULL, NULL));
    size_t back_len = 0;
    CHECK("CL_PROGRAM_SOURCE size", clGetProgramInfo(prog, CL_PROGRAM_SOURCE, 0, NULL, &back_len));
    char *back = malloc(back_len);
    CHECK("CL_PROGRAM_SOURCE", clGetProgramInfo(prog, CL_PROGRAM_SOURCE, back_len, back, NULL));
    if (back_len != len + 1 || memcmp(back, src, len) != 0) {
        printf("FAIL source read back: %zu bytes, want %zu\n", back_len, len + 1);
        return 1;
    }
    if (run_kernel(prog, "padded", 7)) return 1;
    printf("source of %zu bytes built, read back and ran\n", len);
    free(back);
    free(src);
    clReleaseProgram(prog);
    return 0;
}

static int huge_binary(int words) {
    /* A constant table of `words` ints makes a pocl binary of 4 bytes a word and more. */
    size_t cap = (size_t)words * 12 + 512;
    char *src = malloc(cap), *p = src;
    p += sprintf(p, "constant int table[%d] = {", words);
    for (int i = 0; i < words; i++) p += sprintf(p, "%d,", i % 100003);
    p += sprintf(p, "};\nkernel void look(global int *a) { int i = get_global_id(0);\n"
                    "  int x = (i * 7919) %% %d; a[i] = table[x] - x %% 100003; }\n"
                    "kernel void k0(global int *a) { a[get_global_id(0)] = 0; }\n", words);
    cl_int rc;
    const char *srcs[] = {src};
    cl_program prog = clCreateProgramWithSource(ctx, 1, srcs, NULL, &rc);
    CHECK("clCreateProgramWithSource (kernels)", rc);
    CHECK("clBuildProgram (kernels)", clBuildProgram(prog, 1, &dev, "", NULL, NULL));
    size_t size = 0;
    CHECK("CL_PROGRAM_BINARY_SIZES", clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL));
    unsigned char *bin = malloc(size);
    unsigned char *bins[] = {bin};
    CHECK("CL_PROGRAM_BINARIES", clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL));
    printf("binary of %s 4 MiB\n", size > (4u << 20) ? "more than" : "at most");
    cl_int status = 1;
    const unsigned char *cbins[] = {bin};
    cl_program again = clCreateProgramWithBinary(ctx, 1, &dev, &size, cbins, &status, &rc);
    CHECK("clCreateProgramWithBinary", rc);
    CHECK("binary_status", status);
    CHECK("clBuildProgram (binary)", clBuildProgram(again, 1, &dev, "", NULL, NULL));
    if (run_kernel(again, "look", 0) || run_kernel(again, "k0", 0)) return 1;
    printf("binary read back, created again, built and ran\n");
    clReleaseProgram(again);
    clReleaseProgram(prog);
    free(bin);
    free(src);
    return 0;
}

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? strtoul(argv[1], NULL, 10) : 100;
    int words = argc > 2 ? atoi(argv[2]) : 1500000;
    cl_platform_id plat;
    CHECK("clGetPlatformIDs", clGetPlatformIDs(1, &plat, NULL));
    CHECK("clGetDeviceIDs", clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    cl_int rc;
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &rc);
    CHECK("clCreateContext", rc);
    q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &rc);
    CHECK("clCreateCommandQueue", rc);
    if (huge_source(mb) || huge_binary(words)) return 1;
    printf("PASS\n");
    return 0;
}
