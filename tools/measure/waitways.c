// Ways of waiting for a small command, directly on the driver: which costs least between the
// command's end and the caller knowing it. Modes, taken in turns in one process, R rounds of N
// each (medians in us): 4 KiB blocking read into pageable memory (what an application does),
// into pinned memory (a mapped CL_MEM_ALLOC_HOST_PTR buffer, as the worker's staging is), a
// non-blocking read into pinned memory then clFinish, then clWaitForEvents, then a spin on the
// event's status; an empty kernel then clFinish, then a spin on its event's status.
// Usage: waitways [N] [R].
#include "probe.h"
#include <string.h>

enum { MODES = 7 };
static const char *NAMES[MODES] = {"read pageable", "read pinned", "read nb+finish", "read nb+wait",
                                   "read nb+spin", "kernel+finish", "kernel+spin"};

static void spin(cl_event e) {
  cl_int s = 1;
  while (s > 0) clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof s, &s, 0);
  clReleaseEvent(e);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2000, rounds = argc > 2 ? atoi(argv[2]) : 5;
  size_t sz = 4096, one = 1;
  cl_device_id d; cl_int e;
  cl_context c = first_context(&d);
  cl_command_queue q = clCreateCommandQueueWithProperties(c, d, 0, &e);
  cl_mem b = clCreateBuffer(c, CL_MEM_READ_WRITE, sz, 0, &e);
  cl_mem pin = clCreateBuffer(c, CL_MEM_ALLOC_HOST_PTR, sz, 0, &e);
  char *pinned = clEnqueueMapBuffer(q, pin, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, sz, 0, 0, 0, &e);
  char *pageable = malloc(sz);
  memset(pageable, 1, sz);
  cl_program pr = built_program(c, d, "__kernel void empty(__global int*a){}");
  cl_kernel k = clCreateKernel(pr, "empty", &e);
  clSetKernelArg(k, 0, sizeof b, &b);
  double *t = malloc(n * sizeof *t), med[MODES][64];
  for (int r = 0; r < rounds && r < 64; r++) {
    for (int m = 0; m < MODES; m++) {
      for (int i = -100; i < n; i++) {
        cl_event ev;
        double a = now();
        switch (m) {
        case 0: clEnqueueReadBuffer(q, b, CL_TRUE, 0, sz, pageable, 0, 0, 0); break;
        case 1: clEnqueueReadBuffer(q, b, CL_TRUE, 0, sz, pinned, 0, 0, 0); break;
        case 2: clEnqueueReadBuffer(q, b, CL_FALSE, 0, sz, pinned, 0, 0, 0); clFinish(q); break;
        case 3: clEnqueueReadBuffer(q, b, CL_FALSE, 0, sz, pinned, 0, 0, &ev); clWaitForEvents(1, &ev); clReleaseEvent(ev); break;
        case 4: clEnqueueReadBuffer(q, b, CL_FALSE, 0, sz, pinned, 0, 0, &ev); clFlush(q); spin(ev); break;
        case 5: clEnqueueNDRangeKernel(q, k, 1, 0, &one, 0, 0, 0, 0); clFinish(q); break;
        case 6: clEnqueueNDRangeKernel(q, k, 1, 0, &one, 0, 0, 0, &ev); clFlush(q); spin(ev); break;
        }
        if (i >= 0) t[i] = now() - a;
      }
      qsort(t, n, sizeof *t, cmp);
      med[m][r] = t[n / 2] / 1e3;
    }
  }
  for (int m = 0; m < MODES; m++) {
    printf("%-15s", NAMES[m]);
    for (int r = 0; r < rounds && r < 64; r++) printf(" %6.2f", med[m][r]);
    printf("  us (median per round)\n");
  }
  return 0;
}
