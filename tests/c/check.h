/* What the self-checking C clients share: CHECK and EXPECT, which print FAIL with the place and
 * exit 1, and a context on the first platform's first device (the driver the ICD loader finds,
 * or the cage's). */
#ifndef CLOISTER_TEST_CHECK_H
#define CLOISTER_TEST_CHECK_H
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x) do { cl_int e_ = (x); if (e_ != CL_SUCCESS) { printf("FAIL %s:%d %s = %d\n", __FILE__, __LINE__, #x, e_); exit(1); } } while (0)
#define EXPECT(c, ...) do { if (!(c)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); exit(1); } } while (0)

/* A context on the first platform's first device, which goes into `dev`. */
static inline cl_context first_device_context(cl_device_id *dev) {
  cl_platform_id plat;
  cl_int err;
  CHECK(clGetPlatformIDs(1, &plat, NULL));
  CHECK(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, dev, NULL));
  cl_context ctx = clCreateContext(NULL, 1, dev, NULL, NULL, &err);
  CHECK(err);
  return ctx;
}
#endif
