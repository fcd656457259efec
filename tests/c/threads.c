#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
static cl_context ctx; static cl_device_id d; static cl_program prog; static int fails = 0;
static void *work(void *arg) {
  long t = (long)arg; cl_int err;
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
  cl_kernel k = clCreateKernel(prog, "fill", &err);
  int n = 4096; cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n*4, NULL, &err);
  int *out = malloc(n*4);
  for (int it = 0; it < 200; it++) {
    int v = t*1000 + it;
    clSetKernelArg(k, 0, sizeof m, &m); clSetKernelArg(k, 1, 4, &v);
    size_t g = n; err = clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL);
    if (err) { __sync_fetch_and_add(&fails, 1); break; }
    err = clEnqueueReadBuffer(q, m, CL_TRUE, 0, n*4, out, 0, NULL, NULL);
    for (int i = 0; i < n; i++) if (out[i] != v + i) { __sync_fetch_and_add(&fails, 1); break; }
  }
  clReleaseMemObject(m); clReleaseKernel(k); clReleaseCommandQueue(q); free(out);
  return NULL;
}
int main(void) {
  cl_platform_id p; cl_int err;
  clGetPlatformIDs(1, &p, NULL); clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL);
  ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
  const char *src = "__kernel void fill(__global int*o, int v){int i=get_global_id(0); o[i]=v+i;}";
  prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err); clBuildProgram(prog, 0, NULL, NULL, NULL, NULL);
  pthread_t th[8]; for (long t = 0; t < 8; t++) pthread_create(&th[t], NULL, work, (void*)t);
  for (int t = 0; t < 8; t++) pthread_join(th[t], NULL);
  printf(fails ? "FAIL %d\n" : "PASS\n", fails); return fails != 0;
}
