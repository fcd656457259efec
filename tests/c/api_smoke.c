#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define CHECK(x) do { cl_int e_ = (x); if (e_ != CL_SUCCESS) { printf("FAIL %s:%d %s = %d\n", __FILE__, __LINE__, #x, e_); exit(1);} } while (0)
static int cb_count = 0;
static void CL_CALLBACK cb(cl_event e, cl_int st, void *ud) { cb_count += (ud == (void*)0x42); }
int main(void) {
  cl_platform_id p; cl_device_id d; cl_int err;
  CHECK(clGetPlatformIDs(1, &p, NULL));
  CHECK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));
  cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err); CHECK(err);
  cl_command_queue q = clCreateCommandQueue(ctx, d, CL_QUEUE_PROFILING_ENABLE, &err); CHECK(err);
  const char *src = "__kernel void add(__global const float*a, __global const float*b, __global float*c, float k){int i=get_global_id(0); c[i]=a[i]+b[i]*k;}\n"
                    "__kernel void red(__global const int*a, __global int*out, __local int*tmp){int l=get_local_id(0); tmp[l]=a[get_global_id(0)]; barrier(CLK_LOCAL_MEM_FENCE); if(l==0){int s=0; for(int i=0;i<get_local_size(0);i++) s+=tmp[i]; atomic_add(out, s);}}";
  cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err); CHECK(err);
  CHECK(clBuildProgram(prog, 1, &d, "-DFOO=1", NULL, NULL));
  cl_kernel k = clCreateKernel(prog, "add", &err); CHECK(err);
  size_t n = 1 << 20; float *a = malloc(n*4), *b = malloc(n*4), *c = malloc(n*4);
  for (size_t i = 0; i < n; i++) { a[i] = i; b[i] = 2*i; }
  cl_mem A = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, n*4, a, &err); CHECK(err);
  cl_mem B = clCreateBuffer(ctx, CL_MEM_USE_HOST_PTR, n*4, b, &err); CHECK(err);
  cl_mem C = clCreateBuffer(ctx, CL_MEM_ALLOC_HOST_PTR, n*4, NULL, &err); CHECK(err);
  float kk = 0.5f;
  CHECK(clSetKernelArg(k, 0, sizeof(cl_mem), &A)); CHECK(clSetKernelArg(k, 1, sizeof(cl_mem), &B));
  CHECK(clSetKernelArg(k, 2, sizeof(cl_mem), &C)); CHECK(clSetKernelArg(k, 3, sizeof(float), &kk));
  cl_event ev;
  CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, &ev));
  CHECK(clSetEventCallback(ev, CL_COMPLETE, cb, (void*)0x42));
  CHECK(clEnqueueReadBuffer(q, C, CL_TRUE, 0, n*4, c, 1, &ev, NULL));
  for (size_t i = 0; i < n; i++) if (c[i] != a[i] + b[i]*0.5f) { printf("FAIL mismatch at %zu: %f\n", i, c[i]); return 1; }
  cl_ulong t0, t1; CHECK(clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, 8, &t0, NULL)); CHECK(clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, 8, &t1, NULL));
  printf("kernel %llu ns\n", (unsigned long long)(t1 - t0));
  float *m = clEnqueueMapBuffer(q, C, CL_TRUE, CL_MAP_READ|CL_MAP_WRITE, 0, n*4, 0, NULL, NULL, &err); CHECK(err);
  if (m[5] != c[5]) { printf("FAIL map\n"); return 1; }
  m[5] = 12345.0f; CHECK(clEnqueueUnmapMemObject(q, C, m, 0, NULL, NULL));
  float v; CHECK(clEnqueueReadBuffer(q, C, CL_TRUE, 20, 4, &v, 0, NULL, NULL));
  if (v != 12345.0f) { printf("FAIL unmap writeback %f\n", v); return 1; }
  float *mb = clEnqueueMapBuffer(q, B, CL_TRUE, CL_MAP_READ, 0, n*4, 0, NULL, NULL, &err); CHECK(err);
  if (mb != b) { printf("FAIL use_host_ptr map returned %p not %p\n", mb, b); return 1; }
  CHECK(clEnqueueUnmapMemObject(q, B, mb, 0, NULL, NULL));
  /* reduction with local memory */
  cl_kernel r = clCreateKernel(prog, "red", &err); CHECK(err);
  int *ia = malloc(n*4); long want = 0; for (size_t i=0;i<n;i++){ia[i]=i%7; want+=ia[i];}
  cl_mem IA = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, n*4, ia, &err); CHECK(err);
  int zero = 0; cl_mem OUT = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, 4, &zero, &err); CHECK(err);
  CHECK(clSetKernelArg(r, 0, sizeof(cl_mem), &IA)); CHECK(clSetKernelArg(r, 1, sizeof(cl_mem), &OUT)); CHECK(clSetKernelArg(r, 2, 64*4, NULL));
  size_t lws = 64; CHECK(clEnqueueNDRangeKernel(q, r, 1, NULL, &n, &lws, 0, NULL, NULL));
  int got; CHECK(clEnqueueReadBuffer(q, OUT, CL_TRUE, 0, 4, &got, 0, NULL, NULL));
  if (got != want) { printf("FAIL reduction %d != %ld\n", got, want); return 1; }
  /* errors */
  if (clCreateKernel(prog, "nope", &err) || err != CL_INVALID_KERNEL_NAME) { printf("FAIL bad name %d\n", err); return 1; }
  if ((err = clSetKernelArg(k, 9, 4, &kk)) != CL_INVALID_ARG_INDEX) { printf("FAIL arg idx %d\n", err); return 1; }
  if ((err = clEnqueueReadBuffer(q, OUT, CL_TRUE, 0, 8, &got, 0, NULL, NULL)) != CL_INVALID_VALUE) { printf("FAIL oob read %d\n", err); return 1; }
  if (getenv("GARBAGE") && (err = clFinish((cl_command_queue)0x1234)) != CL_INVALID_COMMAND_QUEUE) { printf("FAIL garbage queue %d\n", err); return 1; }
  const char *bad = "__kernel void x( { }";
  cl_program bp = clCreateProgramWithSource(ctx, 1, &bad, NULL, &err); CHECK(err);
  err = clBuildProgram(bp, 1, &d, NULL, NULL, NULL);
  char log[4096]; size_t ls; CHECK(clGetProgramBuildInfo(bp, d, CL_PROGRAM_BUILD_LOG, sizeof log, log, &ls));
  printf("build err %d, log %zu bytes: %.80s\n", err, ls, log);
  cl_event ue = clCreateUserEvent(ctx, &err); CHECK(err);
  cl_event mk; CHECK(clEnqueueMarkerWithWaitList(q, 1, &ue, &mk));
  cl_int st; CHECK(clGetEventInfo(mk, CL_EVENT_COMMAND_EXECUTION_STATUS, 4, &st, NULL)); printf("marker status before %d\n", st);
  CHECK(clSetUserEventStatus(ue, CL_COMPLETE)); CHECK(clWaitForEvents(1, &mk));
  CHECK(clFinish(q));
  { cl_event ue2 = clCreateUserEvent(ctx, &err); CHECK(err); float nb[4] = {0}; cl_event rev;
    float w[4] = {7, 8, 9, 10};
    CHECK(clEnqueueWriteBuffer(q, C, CL_FALSE, 0, 16, w, 1, &ue2, NULL));
    CHECK(clEnqueueReadBuffer(q, C, CL_FALSE, 0, 16, nb, 1, &ue2, &rev));
    CHECK(clSetUserEventStatus(ue2, CL_COMPLETE)); CHECK(clWaitForEvents(1, &rev));
    if (nb[0] != 7 || nb[3] != 10) { printf("FAIL nonblocking %f %f\n", nb[0], nb[3]); return 1; }
    float nb2[4] = {0}; CHECK(clEnqueueReadBuffer(q, B, CL_FALSE, 4, 16, nb2, 0, NULL, NULL)); CHECK(clFinish(q));
    if (nb2[0] != b[1]) { printf("FAIL nonblocking2\n"); return 1; }
    printf("nonblocking ok\n"); }
  { /* The OpenCL 1.1 marker, barrier and wait, and the 2.1 timers. */
    cl_event m11; CHECK(clEnqueueMarker(q, &m11)); CHECK(clEnqueueBarrier(q));
    /* pocl's own clEnqueueWaitForEvents exits the process ("unimplemented"): only caged, where
       cloister runs it as a barrier with a wait list, is it safe to call. */
    if (getenv("CLOISTER_SOCKET")) CHECK(clEnqueueWaitForEvents(q, 1, &m11));
    CHECK(clFinish(q));
    cl_int st11; CHECK(clGetEventInfo(m11, CL_EVENT_COMMAND_EXECUTION_STATUS, 4, &st11, NULL));
    if (st11 != CL_COMPLETE) { printf("FAIL 1.1 marker status %d\n", st11); return 1; }
    CHECK(clReleaseEvent(m11));
    cl_ulong dts = 0, hts = 0, hts2 = 0;
    cl_int trc = clGetDeviceAndHostTimer(d, &dts, &hts);
    cl_int hrc = clGetHostTimer(d, &hts2);
    if (trc == CL_SUCCESS && (hts == 0 || dts == 0)) { printf("FAIL timers returned zero\n"); return 1; }
    if (hrc == CL_SUCCESS && trc == CL_SUCCESS && hts2 < hts) { printf("FAIL host timer went backwards\n"); return 1; }
    printf("1.1 sync ok; timers rc %d %d\n", trc, hrc);
  }
  { /* An empty property list: size 0, success (this query once crashed the worker). */
    size_t psz = 99; CHECK(clGetContextInfo(ctx, CL_CONTEXT_PROPERTIES, 0, NULL, &psz));
    if (psz != 0) { printf("FAIL context properties size %zu\n", psz); return 1; } }
  cl_uint rc; CHECK(clGetContextInfo(ctx, CL_CONTEXT_REFERENCE_COUNT, 4, &rc, NULL)); 
  cl_device_id dd; CHECK(clGetContextInfo(ctx, CL_CONTEXT_DEVICES, sizeof dd, &dd, NULL)); if (dd != d) { printf("FAIL ctx devices\n"); return 1;}
  CHECK(clReleaseEvent(ev)); CHECK(clReleaseMemObject(A)); CHECK(clReleaseKernel(k)); CHECK(clReleaseProgram(prog)); CHECK(clReleaseCommandQueue(q)); CHECK(clReleaseContext(ctx));
  if (getenv("GARBAGE") && clReleaseContext(ctx) != CL_INVALID_CONTEXT) { printf("FAIL double release\n"); return 1; }
  printf("callbacks %d\nPASS\n", cb_count);
  return 0;
}
