/* A client for cloister's intercept features (tests/tests/intercept.rs): builds one small kernel,
   runs it and prints its first results; makes exactly one failing call (a zero-size buffer);
   LEAK=1 leaves two buffers and a kernel unreleased; COMPILE=1 compiles and links instead of building; THREADS=N runs the work in N threads; its queues are made without profiling, and it
   prints what their queries say. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#define CHECK(x) do { cl_int e_ = (x); if (e_ != CL_SUCCESS) { printf("FAIL %s:%d %s = %d\n", __FILE__, __LINE__, #x, e_); exit(1);} } while (0)

static const char *src =
  "#ifdef BROKEN\n#error BROKEN is defined: the source was compiled\n#endif\n"
  "#ifndef FOO\n#define FOO 1\n#endif\n"
  "__kernel void fill(__global int *out) { int i = get_global_id(0); out[i] = i * FOO; }\n";

static cl_context ctx; static cl_device_id dev; static cl_program prog;

static void *work(void *arg) {
  cl_int err; int rounds = arg ? 20 : 1;
  cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err); CHECK(err);
  cl_kernel k = clCreateKernel(prog, "fill", &err); CHECK(err);
  cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64 * sizeof(int), NULL, &err); CHECK(err);
  int host[64];
  for (int r = 0; r < rounds; r++) {
    size_t n = 64;
    CHECK(clSetKernelArg(k, 0, sizeof out, &out));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
  }
  if (!arg) {
    printf("out %d %d %d %d\n", host[0], host[1], host[2], host[3]);
    /* The queue was made without profiling: that is what its queries must say. */
    size_t n = 64; cl_event ev; cl_ulong t = 0; cl_command_queue_properties props = 99;
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, &ev)); CHECK(clWaitForEvents(1, &ev));
    cl_int prc = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof t, &t, NULL);
    CHECK(clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL));
    printf("profiling rc %d, queue properties %llu\n", prc, (unsigned long long)props);
    CHECK(clReleaseEvent(ev));
  }
  CHECK(clReleaseMemObject(out)); CHECK(clReleaseKernel(k)); CHECK(clReleaseCommandQueue(q));
  return NULL;
}

int main(void) {
  cl_platform_id p; cl_int err;
  CHECK(clGetPlatformIDs(1, &p, NULL));
  CHECK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
  ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); CHECK(err);
  prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err); CHECK(err);
  if (getenv("COMPILE")) {
    /* Compiled, then linked, instead of built (COMPILE=1): build options appended by cloister
       must reach the compile. */
    err = clCompileProgram(prog, 1, &dev, "-cl-std=CL1.2", 0, NULL, NULL, NULL, NULL);
    if (err == CL_SUCCESS) {
      cl_program linked = clLinkProgram(ctx, 1, &dev, NULL, 1, &prog, NULL, NULL, &err);
      if (err == CL_SUCCESS) { CHECK(clReleaseProgram(prog)); prog = linked; }
    }
  } else {
    err = clBuildProgram(prog, 1, &dev, "-cl-std=CL1.2", NULL, NULL);
  }
  char log[8192] = {0}; size_t ls = 0;
  clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, &ls);
  if (err != CL_SUCCESS) { printf("build failed %d: %s\n", err, log); return 2; }
  /* The one failing call. */
  cl_mem none = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 0, NULL, &err);
  if (none || err != CL_INVALID_BUFFER_SIZE) { printf("FAIL zero-size buffer %d\n", err); return 1; }
  int threads = getenv("THREADS") ? atoi(getenv("THREADS")) : 0;
  if (threads > 0) {
    pthread_t t[16];
    for (int i = 0; i < threads && i < 16; i++) pthread_create(&t[i], NULL, work, (void *)1);
    for (int i = 0; i < threads && i < 16; i++) pthread_join(t[i], NULL);
  }
  work(NULL);
  if (getenv("LEAK")) {
    cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_ONLY, 256, NULL, &err); CHECK(err);
    cl_mem b = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, 512, NULL, &err); CHECK(err);
    cl_kernel k = clCreateKernel(prog, "fill", &err); CHECK(err);
    (void)a; (void)b; (void)k;
  }
  CHECK(clReleaseProgram(prog)); CHECK(clReleaseContext(ctx));
  printf("PASS\n");
  return 0;
}
