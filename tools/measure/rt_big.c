// Round trip of a one-work-item kernel whose argument is a large buffer (64 MiB by default), then
// clFinish: in replay mode the buffer's copy-out spaces the shim's free checkpoints, so the
// journal grows long between them (what a clFinish must not walk whole each time).
// usage: rt_big [ITERATIONS] [MIB]; prints the median and the mean round trip.
#include "probe.h"
int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 64;
  cl_device_id d; cl_int e;
  cl_context c = first_context(&d);
  cl_command_queue q = clCreateCommandQueueWithProperties(c, d, 0, &e);
  const char *s = "__kernel void touch(__global int *a, int b) { a[b] += 1; }";
  cl_program pr = built_program(c, d, s);
  cl_kernel k = clCreateKernel(pr, "touch", &e);
  cl_mem b = clCreateBuffer(c, CL_MEM_READ_WRITE, mib << 20, 0, &e);
  int zero = 0; clEnqueueFillBuffer(q, b, &zero, sizeof zero, 0, mib << 20, 0, 0, 0); clFinish(q);
  int v = 0; clSetKernelArg(k, 0, sizeof b, &b); clSetKernelArg(k, 1, 4, &v);
  size_t one = 1; double *t = malloc(n * sizeof(double)), total = 0;
  for (int i = 0; i < n; i++) {
    double a = now();
    clEnqueueNDRangeKernel(q, k, 1, 0, &one, 0, 0, 0, 0); clFinish(q);
    t[i] = now() - a; total += t[i];
  }
  qsort(t, n, sizeof(double), cmp);
  printf("round trip with a %zu MiB argument: median %.2f mean %.2f us\n", mib, t[n / 2] / 1e3, total / n / 1e3);
  return 0;
}
