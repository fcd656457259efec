/* Handle cells used again (shim/src/handle/cells.rs): a released handle's cell leaves the
 * quarantine after 65 536 later releases and is handed out again, for any kind of object. One
 * thread creates and releases buffers and kernels, 140 000 in all, so that cells go round the
 * quarantine twice over; meanwhile the main thread runs a kernel, each time with a new buffer
 * and a new value set through clSetKernelArg's loop case (which reads the cells), and checks
 * what the kernel wrote. It also hands the kernel, between runs,
 * a buffer it released: refused, however many times its cell was used since.
 *
 * Prints "runs N ok, churned M" and "PASS", or FAIL with the place. Usage: cell_reuse [RUNS]
 * (at least RUNS runs, and until the churn is done). */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>

static const char *src = "__kernel void put(__global int *out, int v) { out[get_global_id(0)] = v; }\n";

static cl_context ctx;
static cl_program prog;
static atomic_int done;

/* How many objects the churn creates and releases: the quarantine (65 536 handles) twice over,
 * so every cell it used is handed out again, some more than once. */
#define CHURN 140000

/* Creates and releases buffers and kernels, one after the other. */
static void *churn(void *arg) {
  (void)arg;
  cl_int err;
  long n = 0;
  while (n < CHURN) {
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
    CHECK(err);
    CHECK(clReleaseMemObject(b));
    if (n % 8 == 0) {
      cl_kernel k = clCreateKernel(prog, "put", &err);
      CHECK(err);
      CHECK(clReleaseKernel(k));
    }
    n++;
  }
  atomic_store(&done, 1);
  return NULL;
}

int main(int argc, char **argv) {
  int runs = argc > 1 ? atoi(argv[1]) : 2000;
  cl_device_id dev;
  cl_int err;
  ctx = first_device_context(&dev);
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
  CHECK(err);
  prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
  CHECK(err);
  CHECK(clBuildProgram(prog, 1, &dev, "", NULL, NULL));
  cl_kernel k = clCreateKernel(prog, "put", &err);
  CHECK(err);
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, churn, NULL) == 0, "no thread");
  const size_t n = 4;
  int r = 0;
  for (; r < runs || !atomic_load(&done); r++) {
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n * sizeof(cl_int), NULL, &err);
    CHECK(err);
    cl_int v = 7 * r + 1;
    CHECK(clSetKernelArg(k, 0, sizeof out, &out));
    CHECK(clSetKernelArg(k, 1, sizeof v, &v));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL));
    cl_int got[4] = {0, 0, 0, 0};
    CHECK(clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
    for (size_t i = 0; i < n; i++) EXPECT(got[i] == v, "run %d: word %zu is %d, not %d", r, i, got[i], v);
    CHECK(clReleaseMemObject(out));
    if (r % 100 == 99) {
      /* The buffer just released, given again where the argument has a buffer's shape. */
      cl_int rc = clSetKernelArg(k, 0, sizeof out, &out);
      EXPECT(rc == CL_INVALID_MEM_OBJECT, "run %d: a released buffer was taken (%d)", r, rc);
    }
  }
  pthread_join(t, NULL);
  printf("runs %d ok, churned %d\n", r, CHURN);
  CHECK(clReleaseKernel(k));
  CHECK(clReleaseProgram(prog));
  CHECK(clReleaseCommandQueue(q));
  CHECK(clReleaseContext(ctx));
  printf("PASS\n");
  return 0;
}
