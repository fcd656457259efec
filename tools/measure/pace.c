// Where a driver draws its pace for small non-blocking writes: per process, per context or per
// queue. For each of C contexts (all kept alive) and Q queues in each, R batches of 50
// non-blocking 4 KiB writes to offset 0, each batch then clFinish: the median us per write of
// every queue, in the order made. Run it several times (fresh processes) directly and caged.
// Arguments: C Q R (default 4 3 200).
#include "probe.h"
#include <string.h>
int main(int argc, char **argv) {
  int nc = argc > 1 ? atoi(argv[1]) : 4, nq = argc > 2 ? atoi(argv[2]) : 3, reps = argc > 3 ? atoi(argv[3]) : 200;
  const size_t sz = 4096; const int n = 50;
  cl_platform_id p; cl_device_id d; cl_int e;
  clGetPlatformIDs(1, &p, 0); clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, 0);
  char *h = malloc(sz); memset(h, 1, sz);
  double *t = malloc(sizeof(double) * reps);
  for (int ci = 0; ci < nc; ci++) {
    cl_context c = clCreateContext(0, 1, &d, 0, 0, &e);
    cl_mem b = clCreateBuffer(c, CL_MEM_READ_WRITE, sz, 0, &e);
    printf("context %d:", ci);
    for (int qi = 0; qi < nq; qi++) {
      cl_command_queue q = clCreateCommandQueueWithProperties(c, d, 0, &e);
      for (int r = 0; r < reps; r++) {
        double x = now();
        for (int i = 0; i < n; i++) clEnqueueWriteBuffer(q, b, CL_FALSE, 0, sz, h, 0, 0, 0);
        clFinish(q);
        t[r] = (now() - x) / n / 1e3;
      }
      qsort(t, reps, sizeof(double), cmp);
      printf(" %.2f", t[reps / 2]);
      fflush(stdout);
    }
    printf("\n");
  }
  return 0;
}
