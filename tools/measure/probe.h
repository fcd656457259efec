// What the probes here share: a clock, a comparison of doubles for qsort, and a context on the
// first platform's first device (the driver the ICD loader finds, or the cage's).
#ifndef CLOISTER_PROBE_H
#define CLOISTER_PROBE_H
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }

static inline int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

static inline cl_context first_context(cl_device_id *d) {
  cl_platform_id p; cl_int e;
  clGetPlatformIDs(1, &p, 0); clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, d, 0);
  return clCreateContext(0, 1, d, 0, 0, &e);
}
/* A program built from `src` on device `d` of context `c`. */
static inline cl_program built_program(cl_context c, cl_device_id d, const char *src) {
  cl_int e;
  cl_program pr = clCreateProgramWithSource(c, 1, &src, 0, &e);
  clBuildProgram(pr, 1, &d, 0, 0, 0);
  return pr;
}
#endif
