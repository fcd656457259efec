/* Non-blocking reads and writes past 64 MiB on an idle in-order queue, clpeak's pattern (a
 * warm-up and a clFinish, then several back to back, then one clFinish). Past 64 MiB the cage
 * makes such a transfer before the call returns, pipelined through two pooled segments, where it
 * waits for nothing else (README, "posted"); posted instead, each would take a shared segment of
 * its own size, created and faulted in for that one call (clpeak on the H200: 0.9-2.0 GB/s
 * against 20 blocking).
 *
 * Prints, per way, whether each read's data was in the application's memory when its call
 * returned ("landed at the call: N of M"), then checks every byte after the clFinish; "PASS" at
 * the end, or FAIL with the place. Directly, a driver may land them later: the line is the
 * cage's (the test compares it caged only). Usage: large_nonblocking [MIB] [ROUNDS]. */
#include "check.h"
#include <string.h>

static void fill(int *p, size_t n, int base) {
  for (size_t i = 0; i < n; i++) p[i] = base + (int)i;
}

static int holds(const int *p, size_t n, int base) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != base + (int)i) return 0;
  return 1;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 70;
  int rounds = argc > 2 ? atoi(argv[2]) : 3;
  size_t bytes = mib << 20, n = bytes / sizeof(int);
  cl_device_id dev;
  cl_int err;
  cl_context ctx = first_device_context(&dev);
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
  CHECK(err);
  cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, bytes, NULL, &err);
  CHECK(err);
  int *host = malloc(bytes), **reads = malloc(rounds * sizeof(int *));
  EXPECT(host && reads, "out of memory");
  /* Writes: a warm-up, then ROUNDS back to back, each of other data; the last one's stays. */
  fill(host, n, 0);
  CHECK(clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, bytes, host, 0, NULL, NULL));
  CHECK(clFinish(q));
  for (int r = 0; r < rounds; r++) {
    fill(host, n, 1000 * (r + 1));
    CHECK(clEnqueueWriteBuffer(q, buf, CL_FALSE, 0, bytes, host, 0, NULL, NULL));
  }
  CHECK(clFinish(q));
  /* Reads: a warm-up, then ROUNDS back to back into memory of their own. */
  memset(host, 0, bytes);
  CHECK(clEnqueueReadBuffer(q, buf, CL_FALSE, 0, bytes, host, 0, NULL, NULL));
  CHECK(clFinish(q));
  EXPECT(holds(host, n, 1000 * rounds), "the writes' last data did not come back");
  int landed = 0;
  for (int r = 0; r < rounds; r++) {
    reads[r] = calloc(n, sizeof(int));
    EXPECT(reads[r], "out of memory");
    CHECK(clEnqueueReadBuffer(q, buf, CL_FALSE, 0, bytes, reads[r], 0, NULL, NULL));
    landed += holds(reads[r], n, 1000 * rounds);
  }
  printf("reads of %zu MiB on an idle queue, landed at the call: %d of %d\n", mib, landed, rounds);
  CHECK(clFinish(q));
  for (int r = 0; r < rounds; r++) {
    EXPECT(holds(reads[r], n, 1000 * rounds), "read %d: wrong data after clFinish", r);
    free(reads[r]);
  }
  free(reads);
  free(host);
  CHECK(clReleaseMemObject(buf));
  CHECK(clReleaseCommandQueue(q));
  CHECK(clReleaseContext(ctx));
  printf("PASS\n");
  return 0;
}
