/* Kernel printf follows the application's stdout: after dup2 of a file over fd 1, the
 * kernel's output lands in the file (the Khronos CTS test_printf works this way). The file is
 * argv[1]; the client reads it back itself once clFinish has returned and prints what it found
 * on stderr. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define CHECK(name, expr)                                          \
    do {                                                           \
        cl_int e_ = (expr);                                        \
        if (e_ != CL_SUCCESS) {                                    \
            fprintf(stderr, "ERROR step=%s code=%d\n", name, e_);  \
            return 1;                                              \
        }                                                          \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    cl_platform_id p;
    cl_device_id d;
    cl_int err;
    CHECK("platforms", clGetPlatformIDs(1, &p, NULL));
    CHECK("devices", clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    CHECK("context", err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    CHECK("queue", err);
    const char *src = "__kernel void k(void) { printf(\"kernel says %d\\n\", 42); }";
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK("program", err);
    CHECK("build", clBuildProgram(prog, 0, NULL, NULL, NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "k", &err);
    CHECK("kernel", err);
    fflush(stdout);
    int saved = dup(1);
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, 1) < 0) return 3;
    size_t g = 1;
    CHECK("enqueue", clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
    CHECK("finish", clFinish(q));
    fflush(stdout);
    dup2(saved, 1);
    char buf[256] = {0};
    int rd = open(argv[1], O_RDONLY);
    ssize_t n = read(rd, buf, sizeof buf - 1);
    fprintf(stderr, "file after finish: [%s]\n", n > 0 ? buf : "");
    fprintf(stderr, "%s\n", strstr(buf, "kernel says 42") ? "PRINTF IN FILE" : "PRINTF MISSING");
    return 0;
}
