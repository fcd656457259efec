/* Kernel printf between host lines, from a kernel that includes a header of the application's
 * ("inc.h", found through OPTS="-I DIR" or in the working folder; or the header named by
 * INCLUDE, an absolute path, with the program's source read back as written), and the build's
 * options read back; a build that fails prints its log and exits 1. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
  cl_platform_id p; cl_device_id d; cl_int err;
  clGetPlatformIDs(1, &p, NULL); clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL);
  cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
  const char *inc = getenv("INCLUDE");
  char text[4096];
  snprintf(text, sizeof text, "#include \"%s\"\n__kernel void k(int base) { printf(\"kernel line %%d\\n\", base + VAL); }", inc ? inc : "inc.h");
  const char *src = text;
  cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
  if (inc) {
    char back[4096]; size_t n = 0;
    err = clGetProgramInfo(prog, CL_PROGRAM_SOURCE, sizeof back, back, &n);
    printf("source read back %s (%zu bytes)\n", err == CL_SUCCESS && strcmp(back, text) == 0 ? "as written" : "changed", n);
  }
  err = clBuildProgram(prog, 1, &d, getenv("OPTS"), NULL, NULL);
  if (err) { char log[4096]; clGetProgramBuildInfo(prog, d, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL); printf("build failed %d: %s\n", err, log); return 1; }
  char opts[4096] = "";
  cl_int opts_err = clGetProgramBuildInfo(prog, d, CL_PROGRAM_BUILD_OPTIONS, sizeof opts, opts, NULL);
  printf("build options read back (%d): '%s'\n", opts_err, opts);
  cl_kernel k = clCreateKernel(prog, "k", &err);
  for (int i = 0; i < 3; i++) {
    printf("host before %d\n", i); fflush(stdout);
    int b = i * 10; clSetKernelArg(k, 0, sizeof b, &b);
    size_t one = 1; clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL);
    clFinish(q);
    printf("host after %d\n", i); fflush(stdout);
  }
  return 0;
}
