/* Data integrity of transfers and maps (issue 12): random bytes at odd sizes and offsets, both
 * ways, blocking and not; sub-buffers; overlapping read maps beside a write map; a map's writes
 * seen by a kernel and a kernel's writes seen by a map; COPY_HOST_PTR initial contents;
 * USE_HOST_PTR memory kept in step; the transfers and maps the cage makes without the driver on
 * an idle queue of a CPU device, and what they must still refuse; blocking reads beside another
 * thread's fills on the same queue, never torn; hundreds of small buffers side
 * by side (the cage carves them out of shared slabs), created and released in turns; thousands
 * of large buffers under a low descriptor limit.
 *
 * Every check compares against a reference copy kept in host memory. A failed check prints FAIL
 * and exits 1; the last line is "data integrity ok". Sizes straddle the cage's thresholds: the
 * zero-copy floor (64 KiB), the lane's bulk area (16 MiB) and the largest non-blocking transfer
 * staged through a segment of its own (64 MiB). */
#include "check.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <time.h>


static const char *SRC =
  "__kernel void add1(__global uchar *a) { a[get_global_id(0)] += 1; }\n";

static cl_context ctx;
static cl_device_id dev;
static cl_command_queue q;
static cl_kernel add1;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static void randomize(unsigned char *p, size_t n) { for (size_t i = 0; i < n; i++) p[i] = (unsigned char)next(); }
/* A random [off, off+len) within n, len >= 1. */
static void range(size_t n, size_t *off, size_t *len) {
  *off = next() % n;
  *len = 1 + next() % (n - *off);
}

static void same(const unsigned char *got, const unsigned char *want, size_t n, const char *what, size_t size) {
  if (memcmp(got, want, n) == 0) return;
  size_t i = 0;
  while (got[i] == want[i]) i++;
  printf("FAIL %s (buffer %zu): byte %zu of %zu is %d, expected %d\n", what, size, i, n, got[i], want[i]);
  exit(1);
}

static void run_add1(cl_mem m, size_t n) {
  CHECK(clSetKernelArg(add1, 0, sizeof m, &m));
  CHECK(clEnqueueNDRangeKernel(q, add1, 1, NULL, &n, NULL, 0, NULL, NULL));
}

static void check_all(cl_mem m, const unsigned char *ref, size_t n, const char *what) {
  unsigned char *got = malloc(n);
  CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, got, 0, NULL, NULL));
  same(got, ref, n, what, n);
  free(got);
}

static void transfers(size_t n) {
  unsigned char *ref = malloc(n), *tmp = malloc(n), *nb = malloc(n), *dst = malloc(n);
  cl_int err;
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &err);
  CHECK(err);
  randomize(ref, n);
  CHECK(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, n, ref, 0, NULL, NULL));
  check_all(m, ref, n, "whole blocking write then read");
  for (int round = 0; round < 6; round++) {
    size_t off, len;
    /* Blocking write at an odd range. */
    range(n, &off, &len);
    randomize(tmp, len);
    CHECK(clEnqueueWriteBuffer(q, m, CL_TRUE, off, len, tmp, 0, NULL, NULL));
    memcpy(ref + off, tmp, len);
    /* Non-blocking write from memory left alone until the finish. */
    range(n, &off, &len);
    randomize(nb, len);
    CHECK(clEnqueueWriteBuffer(q, m, CL_FALSE, off, len, nb, 0, NULL, NULL));
    memcpy(ref + off, nb, len);
    /* Non-blocking read of another range, queued after the write. */
    size_t roff, rlen;
    range(n, &roff, &rlen);
    memset(dst, 0xa5, rlen);
    CHECK(clEnqueueReadBuffer(q, m, CL_FALSE, roff, rlen, dst, 0, NULL, NULL));
    CHECK(clFinish(q));
    same(dst, ref + roff, rlen, "non-blocking read after non-blocking write", n);
    /* Blocking read of a random range. */
    range(n, &roff, &rlen);
    CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, roff, rlen, dst, 0, NULL, NULL));
    same(dst, ref + roff, rlen, "blocking read at an odd range", n);
  }
  /* Two overlapping read maps and a disjoint write map, live together. */
  size_t half = n / 2, a_off = next() % (half / 2 + 1), a_len = 1 + next() % (half / 2);
  size_t b_off = a_off + a_len / 2, b_len = a_len;
  if (b_off + b_len > half) b_len = half - b_off;
  if (b_len == 0) b_len = 1, b_off = a_off;
  size_t w_off = half + next() % (n - half), w_len = 1 + next() % (n - w_off);
  unsigned char *ra = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ, a_off, a_len, 0, NULL, NULL, &err);
  CHECK(err);
  unsigned char *rb = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ, b_off, b_len, 0, NULL, NULL, &err);
  CHECK(err);
  unsigned char *w = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_WRITE, w_off, w_len, 0, NULL, NULL, &err);
  CHECK(err);
  same(ra, ref + a_off, a_len, "read map", n);
  same(rb, ref + b_off, b_len, "overlapping read map", n);
  same(w, ref + w_off, w_len, "write map holds the buffer's bytes", n);
  randomize(w, w_len);
  memcpy(ref + w_off, w, w_len);
  CHECK(clEnqueueUnmapMemObject(q, m, rb, 0, NULL, NULL));
  CHECK(clEnqueueUnmapMemObject(q, m, w, 0, NULL, NULL));
  CHECK(clEnqueueUnmapMemObject(q, m, ra, 0, NULL, NULL));
  check_all(m, ref, n, "after overlapping maps");
  /* A map's writes reach a kernel; a kernel's writes reach a map. */
  unsigned char *all = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0, n, 0, NULL, NULL, &err);
  CHECK(err);
  randomize(ref, n);
  memcpy(all, ref, n);
  CHECK(clEnqueueUnmapMemObject(q, m, all, 0, NULL, NULL));
  run_add1(m, n);
  for (size_t i = 0; i < n; i++) ref[i]++;
  check_all(m, ref, n, "kernel after a write map");
  run_add1(m, n);
  for (size_t i = 0; i < n; i++) ref[i]++;
  cl_event mapped;
  all = clEnqueueMapBuffer(q, m, CL_FALSE, CL_MAP_READ, 0, n, 0, NULL, &mapped, &err);
  CHECK(err);
  CHECK(clWaitForEvents(1, &mapped));
  same(all, ref, n, "non-blocking read map after a kernel", n);
  /* Whatever runs a map or an unmap (a read or write by DMA on a discrete GPU, caged), its
     event says what the application enqueued. */
  cl_command_type type = 0;
  CHECK(clGetEventInfo(mapped, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
  EXPECT(type == CL_COMMAND_MAP_BUFFER, "a map's event has command type 0x%x", (unsigned)type);
  cl_event unmapped;
  CHECK(clEnqueueUnmapMemObject(q, m, all, 0, NULL, &unmapped));
  CHECK(clGetEventInfo(unmapped, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
  EXPECT(type == CL_COMMAND_UNMAP_MEM_OBJECT, "an unmap's event has command type 0x%x", (unsigned)type);
  CHECK(clWaitForEvents(1, &unmapped));
  CHECK(clReleaseEvent(unmapped));
  CHECK(clReleaseEvent(mapped));
  /* A kernel then a blocking map, with no finish between. */
  run_add1(m, n);
  for (size_t i = 0; i < n; i++) ref[i]++;
  size_t off, len;
  range(n, &off, &len);
  all = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, off, len, 0, NULL, NULL, &err);
  CHECK(err);
  same(all, ref + off, len, "blocking map right after a kernel", n);
  CHECK(clEnqueueUnmapMemObject(q, m, all, 0, NULL, NULL));
  CHECK(clFinish(q));
  CHECK(clReleaseMemObject(m));
  free(ref); free(tmp); free(nb); free(dst);
  printf("transfers %zu ok\n", n);
}

static void sub_buffers(void) {
  cl_uint align_bits;
  CHECK(clGetDeviceInfo(dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL));
  size_t align = align_bits / 8, n = 2 << 20;
  unsigned char *ref = malloc(n), *tmp = malloc(n);
  cl_int err;
  randomize(ref, n);
  cl_mem parent = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n, ref, &err);
  CHECK(err);
  cl_buffer_region r = { align * (3 + next() % 100), (300 << 10) + 7 };
  cl_mem sub = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r, &err);
  CHECK(err);
  /* Written through the sub-buffer at an odd offset, read through the parent. */
  size_t off = 13, len = r.size - 100;
  randomize(tmp, len);
  CHECK(clEnqueueWriteBuffer(q, sub, CL_TRUE, off, len, tmp, 0, NULL, NULL));
  memcpy(ref + r.origin + off, tmp, len);
  check_all(parent, ref, n, "parent after a sub-buffer write");
  /* Mapped through the sub-buffer: it sees its window of the parent. */
  unsigned char *p = clEnqueueMapBuffer(q, sub, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, r.size, 0, NULL, NULL, &err);
  CHECK(err);
  same(p, ref + r.origin, r.size, "sub-buffer map", n);
  randomize(p + 5, 1000);
  memcpy(ref + r.origin + 5, p + 5, 1000);
  CHECK(clEnqueueUnmapMemObject(q, sub, p, 0, NULL, NULL));
  run_add1(sub, r.size);
  for (size_t i = 0; i < r.size; i++) ref[r.origin + i]++;
  p = clEnqueueMapBuffer(q, parent, CL_TRUE, CL_MAP_READ, 0, n, 0, NULL, NULL, &err);
  CHECK(err);
  same(p, ref, n, "parent map after a kernel on the sub-buffer", n);
  CHECK(clEnqueueUnmapMemObject(q, parent, p, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, sub, CL_TRUE, 0, r.size, tmp, 0, NULL, NULL));
  same(tmp, ref + r.origin, r.size, "sub-buffer read", n);
  CHECK(clReleaseMemObject(sub));
  CHECK(clReleaseMemObject(parent));
  free(ref); free(tmp);
  printf("sub-buffers ok\n");
}

static void host_ptr_flags(size_t n) {
  unsigned char *ref = malloc(n), *got = malloc(n);
  cl_int err;
  /* COPY_HOST_PTR: the initial contents, and the application's memory is not the buffer's. */
  randomize(ref, n);
  memcpy(got, ref, n);
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n, got, &err);
  CHECK(err);
  /* Scribbled after creation: the buffer keeps what it was created with. */
  memset(got, 0x5a, n);
  unsigned char *p = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ, 0, n, 0, NULL, NULL, &err);
  CHECK(err);
  EXPECT(p != got, "a COPY_HOST_PTR map points at the application's memory");
  same(p, ref, n, "COPY_HOST_PTR map", n);
  CHECK(clEnqueueUnmapMemObject(q, m, p, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, got, 0, NULL, NULL));
  same(got, ref, n, "COPY_HOST_PTR read", n);
  CHECK(clReleaseMemObject(m));
  /* ALLOC_HOST_PTR | COPY_HOST_PTR. */
  m = clCreateBuffer(ctx, CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR, n, ref, &err);
  CHECK(err);
  run_add1(m, n);
  for (size_t i = 0; i < n; i++) ref[i]++;
  check_all(m, ref, n, "ALLOC_HOST_PTR after a kernel");
  CHECK(clReleaseMemObject(m));
  /* USE_HOST_PTR: maps return the application's own memory, holding the device's results. */
  unsigned char *host = malloc(n);
  memcpy(host, ref, n);
  m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, n, host, &err);
  CHECK(err);
  run_add1(m, n);
  for (size_t i = 0; i < n; i++) ref[i]++;
  p = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, n, 0, NULL, NULL, &err);
  CHECK(err);
  EXPECT(p == host, "a USE_HOST_PTR map does not return the application's pointer");
  same(p, ref, n, "USE_HOST_PTR map after a kernel", n);
  randomize(p + n / 3, n / 3);
  memcpy(ref + n / 3, p + n / 3, n / 3);
  CHECK(clEnqueueUnmapMemObject(q, m, p, 0, NULL, NULL));
  run_add1(m, n);
  for (size_t i = 0; i < n; i++) ref[i]++;
  CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, got, 0, NULL, NULL));
  same(got, ref, n, "USE_HOST_PTR read after map writes and a kernel", n);
  CHECK(clReleaseMemObject(m));
  free(host); free(ref); free(got);
  printf("host pointer flags %zu ok\n", n);
}

/* Maps the cage makes without the driver (issue 12: a zero-copy buffer mapped on an idle
 * in-order queue of a CPU device is the shim's view of its memory, and its unmap reaches the
 * worker only with a wait list or an event): the same refusals, a map count, unmaps whose
 * events are real unmaps and whose wait lists hold them back, and every byte where it belongs
 * through maps of every kind between kernels and transfers. */
static cl_uint map_count(cl_mem m) {
  cl_uint count = 99;
  CHECK(clGetMemObjectInfo(m, CL_MEM_MAP_COUNT, sizeof count, &count, NULL));
  return count;
}

static void direct_maps(void) {
  enum { N = (256 << 10) + 13 };
  cl_int err;
  unsigned char *ref = malloc(N), *got = malloc(N);
  randomize(ref, N);
  CHECK(clFinish(q));
  cl_mem_flags refused[] = { CL_MEM_HOST_READ_ONLY, CL_MEM_HOST_NO_ACCESS, CL_MEM_HOST_WRITE_ONLY };
  cl_map_flags kinds[] = { CL_MAP_READ, CL_MAP_WRITE, CL_MAP_READ | CL_MAP_WRITE, CL_MAP_WRITE_INVALIDATE_REGION };
  for (int i = 0; i < 3; i++) {
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | refused[i], N, NULL, &err);
    CHECK(err);
    CHECK(clFinish(q));
    for (int k = 0; k < 4; k++) {
      void *p = clEnqueueMapBuffer(q, m, CL_TRUE, kinds[k], 0, N, 0, NULL, NULL, &err);
      printf("host access flags %#llx, map flags %#llx: %d\n", (unsigned long long)refused[i],
             (unsigned long long)kinds[k], err);
      if (err == CL_SUCCESS) CHECK(clEnqueueUnmapMemObject(q, m, p, 0, NULL, NULL));
    }
    CHECK(clReleaseMemObject(m));
  }
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
  CHECK(err);
  CHECK(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, N, ref, 0, NULL, NULL));
  CHECK(clFinish(q));
  /* Refused by the specification; a driver that maps anyway (pocl 3 reads and invalidates)
   * must be unmapped from. */
  void *odd = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE_INVALIDATE_REGION, 0, N, 0, NULL, NULL, &err);
  printf("read and invalidate: %d\n", err);
  if (err == CL_SUCCESS) CHECK(clEnqueueUnmapMemObject(q, m, odd, 0, NULL, NULL));
  odd = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ, N - 3, 4, 0, NULL, NULL, &err);
  printf("map past the end: %d\n", err);
  if (err == CL_SUCCESS) CHECK(clEnqueueUnmapMemObject(q, m, odd, 0, NULL, NULL));
  odd = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ, 0, 0, 0, NULL, NULL, &err);
  printf("empty map: %d\n", err);
  if (err == CL_SUCCESS) CHECK(clEnqueueUnmapMemObject(q, m, odd, 0, NULL, NULL));
  /* What an accepted read-and-invalidate map left is the driver's to say (NVIDIA's leaves
   * zeros): the buffer is written again. */
  CHECK(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, N, ref, 0, NULL, NULL));
  CHECK(clFinish(q));
  printf("unmap of no mapping: %d\n", clEnqueueUnmapMemObject(q, m, got, 0, NULL, NULL));
  /* Two live maps of the idle queue, counted; gone after their unmaps and a finish. */
  unsigned char *a = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ, 0, N, 0, NULL, NULL, &err);
  CHECK(err);
  unsigned char *b = clEnqueueMapBuffer(q, m, CL_FALSE, CL_MAP_READ, 7, 1000, 0, NULL, NULL, &err);
  CHECK(err);
  /* The count is "immediately stale" (the specification): pocl's lags its unmaps and said 3 here
   * once, an earlier unmapped map still counted. With two maps live it is at least 2, not 0 (the
   * count of a driver that never heard of them). */
  cl_uint live = map_count(m);
  EXPECT(live >= 2, "the map count with two maps live is %u", live);
  CHECK(clFinish(q));
  same(a, ref, N, "idle read map", N);
  same(b, ref + 7, 1000, "idle non-blocking read map", N);
  CHECK(clEnqueueUnmapMemObject(q, m, b, 0, NULL, NULL));
  CHECK(clEnqueueUnmapMemObject(q, m, a, 0, NULL, NULL));
  CHECK(clFinish(q));
  /* An idle write map whose unmap wants an event: an unmap's event, complete after the wait. */
  unsigned char *w = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_WRITE, 100, 5000, 0, NULL, NULL, &err);
  CHECK(err);
  same(w, ref + 100, 5000, "idle write map holds the buffer's bytes", N);
  randomize(w, 5000);
  memcpy(ref + 100, w, 5000);
  cl_event unmapped;
  CHECK(clEnqueueUnmapMemObject(q, m, w, 0, NULL, &unmapped));
  cl_command_type type = 0;
  CHECK(clGetEventInfo(unmapped, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
  EXPECT(type == CL_COMMAND_UNMAP_MEM_OBJECT, "an idle map's unmap event has command type 0x%x", (unsigned)type);
  CHECK(clWaitForEvents(1, &unmapped));
  CHECK(clReleaseEvent(unmapped));
  check_all(m, ref, N, "after an idle write map unmapped with an event");
  /* An idle write map whose unmap waits for a user event, a kernel behind the unmap: the kernel
   * sees the map's bytes once the user event lets the unmap go. */
  CHECK(clFinish(q));
  w = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0, N, 0, NULL, NULL, &err);
  CHECK(err);
  randomize(ref, N);
  memcpy(w, ref, N);
  cl_event gate = clCreateUserEvent(ctx, &err);
  CHECK(err);
  CHECK(clEnqueueUnmapMemObject(q, m, w, 1, &gate, NULL));
  run_add1(m, N);
  CHECK(clFlush(q));
  cl_int status = 0;
  CHECK(clGetEventInfo(gate, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
  EXPECT(status == CL_SUBMITTED, "the user event is %d", status);
  CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
  CHECK(clReleaseEvent(gate));
  for (size_t i = 0; i < N; i++) ref[i]++;
  check_all(m, ref, N, "kernel behind an unmap held by a user event");
  /* Maps of every kind at odd ranges, between kernels, transfers and finishes. */
  for (int k = 0; k < 60; k++) {
    size_t off, len;
    range(N, &off, &len);
    cl_map_flags flags = kinds[next() % 4];
    if (k % 3 == 0) CHECK(clFinish(q));
    unsigned char *p = clEnqueueMapBuffer(q, m, k % 2 ? CL_TRUE : CL_FALSE, flags, off, len, 0, NULL, NULL, &err);
    CHECK(err);
    if (k % 2 == 0) CHECK(clFinish(q));
    if (flags != CL_MAP_WRITE_INVALIDATE_REGION) same(p, ref + off, len, "map between kernels", N);
    if (flags != CL_MAP_READ) {
      randomize(p, len);
      memcpy(ref + off, p, len);
    }
    CHECK(clEnqueueUnmapMemObject(q, m, p, 0, NULL, NULL));
    if (k % 4 == 1) {
      run_add1(m, N);
      for (size_t i = 0; i < N; i++) ref[i]++;
    }
    if (k % 5 == 2) {
      range(N, &off, &len);
      CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, off, len, got, 0, NULL, NULL));
      same(got, ref + off, len, "read between maps", N);
    }
  }
  check_all(m, ref, N, "after maps between kernels");
  CHECK(clReleaseMemObject(m));
  free(ref);
  free(got);
  printf("direct map rules ok\n");
}

/* Many large buffers alive at once, under a descriptor limit far below their number. */
/* What a transfer the cage makes without the driver (issue 12: zero-copy buffers on an idle
 * in-order queue of a CPU device) must still refuse, and the order it must keep. Each refusal
 * prints its code, so the caged run must print what the driver printed directly. */
static void direct_rules(void) {
  enum { N = (256 << 10) + 7 };
  cl_int err;
  unsigned char *ref = malloc(N), *got = malloc(N);
  randomize(ref, N);
  CHECK(clFinish(q)); /* idle: the cage may copy by itself from here */
  cl_mem_flags refused[] = { CL_MEM_HOST_READ_ONLY, CL_MEM_HOST_NO_ACCESS, CL_MEM_HOST_WRITE_ONLY };
  for (int i = 0; i < 3; i++) {
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | refused[i], N, NULL, &err);
    CHECK(err);
    cl_int w = clEnqueueWriteBuffer(q, m, CL_TRUE, 0, N, ref, 0, NULL, NULL);
    cl_int r = clEnqueueReadBuffer(q, m, CL_TRUE, 0, N, got, 0, NULL, NULL);
    printf("host access flags %#llx: write %d, read %d\n", (unsigned long long)refused[i], w, r);
    CHECK(clReleaseMemObject(m));
  }
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
  CHECK(err);
  CHECK(clFinish(q));
  printf("past the end: %d, empty: %d\n", clEnqueueWriteBuffer(q, m, CL_TRUE, N - 3, 4, ref, 0, NULL, NULL),
         clEnqueueReadBuffer(q, m, CL_TRUE, 0, 0, got, 0, NULL, NULL));
  cl_context other = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  CHECK(err);
  cl_mem foreign = clCreateBuffer(other, CL_MEM_READ_WRITE, N, NULL, &err);
  CHECK(err);
  printf("buffer of another context: %d\n", clEnqueueWriteBuffer(q, foreign, CL_TRUE, 0, N, ref, 0, NULL, NULL));
  CHECK(clReleaseMemObject(foreign));
  /* A map unmapped on a queue of another context is refused, and stays mapped for the right
   * unmap (the shim's own record of it included). */
  cl_command_queue other_q = clCreateCommandQueue(other, dev, 0, &err);
  CHECK(err);
  CHECK(clFinish(q));
  void *mapped = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ, 0, 64, 0, NULL, NULL, &err);
  CHECK(err);
  printf("unmap on another context's queue: %d\n", clEnqueueUnmapMemObject(other_q, m, mapped, 0, NULL, NULL));
  printf("unmap on its own queue: %d\n", clEnqueueUnmapMemObject(q, m, mapped, 0, NULL, NULL));
  CHECK(clReleaseCommandQueue(other_q));
  CHECK(clReleaseContext(other));
  /* A wait list pointer with no events is refused, by the transfers the cage makes itself too. */
  cl_event none = clCreateUserEvent(ctx, &err);
  CHECK(err);
  CHECK(clFinish(q));
  cl_int read_rc = clEnqueueReadBuffer(q, m, CL_TRUE, 0, 16, got, 0, &none, NULL);
  cl_int write_rc = clEnqueueWriteBuffer(q, m, CL_TRUE, 0, 16, ref, 0, &none, NULL);
  cl_int nb_write_rc = clEnqueueWriteBuffer(q, m, CL_FALSE, 0, 16, ref, 0, &none, NULL);
  printf("a wait list with no events: read %d, write %d, non-blocking write %d\n", read_rc, write_rc, nb_write_rc);
  CHECK(clSetUserEventStatus(none, CL_COMPLETE));
  CHECK(clReleaseEvent(none));
  /* Non-blocking transfers the driver refuses fail at once, not at the next blocking call. */
  cl_mem read_only = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_HOST_READ_ONLY, 64, NULL, &err);
  CHECK(err);
  write_rc = clEnqueueWriteBuffer(q, read_only, CL_FALSE, 0, 64, ref, 0, NULL, NULL);
  read_rc = clEnqueueReadBuffer(q, read_only, CL_FALSE, 32, 64, got, 0, NULL, NULL);
  printf("non-blocking: write to a host-read-only buffer %d, read past its end %d; clFinish %d\n", write_rc,
         read_rc, clFinish(q));
  CHECK(clReleaseMemObject(read_only));
  /* Copies and fills the driver refuses fail at once, and the blocking read after them reads
   * what was written (before, they failed late, and the read returned their error instead). */
  cl_mem small = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
  CHECK(err);
  CHECK(clEnqueueWriteBuffer(q, small, CL_TRUE, 0, 64, ref, 0, NULL, NULL));
  unsigned char pattern[4] = { 1, 2, 3, 4 };
  cl_int past = clEnqueueCopyBuffer(q, small, m, 32, 0, 64, 0, NULL, NULL);
  cl_int overlap = clEnqueueCopyBuffer(q, small, small, 0, 8, 16, 0, NULL, NULL);
  cl_int three = clEnqueueFillBuffer(q, small, pattern, 3, 0, 63, 0, NULL, NULL);
  cl_int beyond = clEnqueueFillBuffer(q, small, pattern, 4, 32, 64, 0, NULL, NULL);
  cl_int read_after = clEnqueueReadBuffer(q, small, CL_TRUE, 0, 64, got, 0, NULL, NULL);
  printf("copy past the end %d, overlapping %d; fill of pattern size 3 %d, past the end %d; the read after them %d\n",
         past, overlap, three, beyond, read_after);
  same(got, ref, 64, "a buffer after refused copies and fills", 64);
  /* An offset not a multiple of the pattern: pocl refuses it, NVIDIA's driver fills. Caged, the
   * driver decides at the call (the shim posts no fill it cannot vouch for). */
  cl_int misaligned = clEnqueueFillBuffer(q, small, pattern, 4, 2, 8, 0, NULL, NULL);
  printf("fill at an offset not a multiple of the pattern: %d, clFinish %d\n", misaligned, clFinish(q));
  CHECK(clReleaseMemObject(small));
  /* Order: an idle write, a kernel, a non-blocking write behind the kernel, a kernel, a blocking
   * read behind it: ref+1 overwritten by ref2, then +1. */
  CHECK(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, N, ref, 0, NULL, NULL));
  run_add1(m, N);
  unsigned char *ref2 = malloc(N);
  randomize(ref2, N);
  CHECK(clEnqueueWriteBuffer(q, m, CL_FALSE, 0, N, ref2, 0, NULL, NULL));
  run_add1(m, N);
  CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, N, got, 0, NULL, NULL));
  for (size_t i = 0; i < N; i++) ref2[i] += 1;
  same(got, ref2, N, "write behind a kernel, read behind another", N);
  /* Back to back on the now idle queue, at odd offsets: what was written is read. */
  for (int k = 0; k < 50; k++) {
    size_t off, len;
    range(N, &off, &len);
    randomize(ref + off, len);
    CHECK(clEnqueueWriteBuffer(q, m, k % 2, off, len, ref + off, 0, NULL, NULL));
    memcpy(ref2 + off, ref + off, len);
    range(N, &off, &len);
    CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, off, len, got, 0, NULL, NULL));
    same(got, ref2 + off, len, "idle writes and reads", N);
  }
  CHECK(clReleaseMemObject(m));
  free(ref);
  free(ref2);
  free(got);
  printf("direct transfer rules ok\n");
}

/* Blocking and non-blocking transfers with an event, as pyopencl makes every one, on an idle
 * queue (the cage copies these itself and has the worker make the event): every byte lands, the
 * event is complete when a blocking call returns, says the transfer's command type, queue and
 * context, is no user event the application may set, works in a wait list and in
 * clWaitForEvents, and runs a callback. On a profiling queue the event has its timestamps. */
static volatile int event_callback_status = 1;
static void CL_CALLBACK note_status(cl_event e, cl_int status, void *user_data) {
  (void)e; (void)user_data;
  event_callback_status = status;
}
static void event_info(cl_event ev, const char *what) {
  cl_int status = 1;
  cl_uint type = 0;
  cl_command_queue eq = NULL;
  cl_context ec = NULL;
  CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
  CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
  CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_QUEUE, sizeof eq, &eq, NULL));
  CHECK(clGetEventInfo(ev, CL_EVENT_CONTEXT, sizeof ec, &ec, NULL));
  printf("%s: status %d, command type %#x, its queue %d, its context %d\n", what, status, type, eq == q, ec == ctx);
}
static void transfers_with_events(size_t n) {
  cl_int err;
  unsigned char *ref = malloc(n), *got = malloc(n);
  randomize(ref, n);
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &err);
  CHECK(err);
  CHECK(clFinish(q));
  cl_event w, r;
  CHECK(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, n, ref, 0, NULL, &w));
  event_info(w, "blocking write's event");
  CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, got, 0, NULL, &r));
  event_info(r, "blocking read's event");
  same(got, ref, n, "a write and a read with events", n);
  printf("setting a transfer's event as a user event: %d\n", clSetUserEventStatus(w, CL_COMPLETE));
  /* In a wait list, and waited for. */
  cl_event both[2] = { w, r }, k;
  size_t g = n;
  CHECK(clSetKernelArg(add1, 0, sizeof m, &m));
  CHECK(clEnqueueNDRangeKernel(q, add1, 1, NULL, &g, NULL, 2, both, &k));
  CHECK(clWaitForEvents(2, both));
  CHECK(clWaitForEvents(1, &k));
  for (size_t i = 0; i < n; i++) ref[i] += 1;
  CHECK(clFinish(q));
  cl_event r2;
  CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, got, 0, NULL, &r2));
  same(got, ref, n, "a kernel behind transfers' events", n);
  /* A callback on a complete transfer's event runs, with CL_COMPLETE. */
  event_callback_status = 1;
  CHECK(clSetEventCallback(r2, CL_COMPLETE, note_status, NULL));
  for (int i = 0; i < 500 && event_callback_status == 1; i++) usleep(10000);
  printf("callback on a read's event: %d\n", event_callback_status);
  /* Non-blocking, at an odd offset: complete once the queue is finished. */
  size_t off = n / 3, len = n - n / 3 - 1;
  randomize(ref + off, len);
  cl_event nb;
  CHECK(clFinish(q));
  CHECK(clEnqueueWriteBuffer(q, m, CL_FALSE, off, len, ref + off, 0, NULL, &nb));
  CHECK(clWaitForEvents(1, &nb));
  event_info(nb, "non-blocking write's event, waited for");
  CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, got, 0, NULL, NULL));
  same(got, ref, n, "a non-blocking write with an event", n);
  /* A map and its unmap with events, as pyopencl makes them: on the idle queue, then with a
   * kernel enqueued between them (the unmap's event is then the driver's, after the kernel). */
  cl_event me, ue;
  CHECK(clFinish(q));
  unsigned char *p0 = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, n, 0, NULL, &me, &err);
  CHECK(err);
  event_info(me, "idle map's event");
  same(p0, ref, n, "a map with an event", n);
  randomize(p0, n / 2);
  memcpy(ref, p0, n / 2);
  CHECK(clEnqueueUnmapMemObject(q, m, p0, 0, NULL, &ue));
  /* Not blocking: its status before the wait is the implementation's to say. */
  CHECK(clWaitForEvents(1, &ue));
  event_info(ue, "idle unmap's event, waited for");
  CHECK(clReleaseEvent(me));
  CHECK(clReleaseEvent(ue));
  p0 = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_WRITE, 0, n, 0, NULL, &me, &err);
  CHECK(err);
  randomize(p0 + n / 2, n - n / 2);
  memcpy(ref + n / 2, p0 + n / 2, n - n / 2);
  cl_mem other = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
  CHECK(err);
  run_add1(other, 64);
  CHECK(clEnqueueUnmapMemObject(q, m, p0, 0, NULL, &ue));
  CHECK(clWaitForEvents(1, &ue));
  event_info(ue, "unmap's event behind a kernel, waited for");
  CHECK(clReleaseEvent(me));
  CHECK(clReleaseEvent(ue));
  CHECK(clReleaseMemObject(other));
  CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, got, 0, NULL, NULL));
  same(got, ref, n, "maps and unmaps with events", n);
  /* A profiling queue's transfer events carry their timestamps. */
  cl_command_queue pq = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
  CHECK(err);
  cl_event p;
  cl_ulong start = 0, end = 0;
  CHECK(clFinish(pq));
  CHECK(clEnqueueReadBuffer(pq, m, CL_TRUE, 0, n, got, 0, NULL, &p));
  same(got, ref, n, "a read on a profiling queue", n);
  cl_int s1 = clGetEventProfilingInfo(p, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL);
  cl_int s2 = clGetEventProfilingInfo(p, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL);
  printf("profiling queue read's event: start %d, end %d, end after start %d\n", s1, s2, end >= start);
  cl_event done[] = { w, r, k, r2, nb, p };
  for (int i = 0; i < 6; i++) CHECK(clReleaseEvent(done[i]));
  CHECK(clReleaseCommandQueue(pq));
  CHECK(clReleaseMemObject(m));
  free(ref);
  free(got);
  printf("transfers with events of %zu bytes ok\n", n);
}

/* Another thread fills a buffer with one byte value after another (in order, on the same
 * queue) while this one reads it whole with blocking reads: on an in-order queue no fill runs
 * while a read does, so every read sees one value. Sizes the cage copies itself (64 KiB+), maps
 * in place (256 KiB+) and pipelines (4 MiB+). With `main_first`, this thread enqueues before the
 * other starts; without, it never enqueues at all (only reads and clFinish). With `own_memory`,
 * the buffer is made over the application's memory. */
#include <pthread.h>
/* What each of these cases starts from: a queue of its own, made current in `q` (its reads must
 * not change what the other sections' queue knows), and a buffer of `n` zero bytes (zeroed by
 * creation, no enqueue) with host memory `got` as large; with `own_memory`, the buffer is made
 * over zeroed memory of the application's own (`CL_MEM_USE_HOST_PTR`). `scene_end` lets go of
 * them. */
struct scene { cl_command_queue saved; cl_mem m; unsigned char *got, *own; };
static struct scene scene_begin(size_t n, int own_memory) {
  cl_int err;
  struct scene s = { q, NULL, calloc(n, 1), own_memory ? calloc(n, 1) : NULL };
  q = clCreateCommandQueue(ctx, dev, 0, &err);
  CHECK(err);
  cl_mem_flags how = own_memory ? CL_MEM_USE_HOST_PTR : CL_MEM_COPY_HOST_PTR;
  s.m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | how, n, own_memory ? s.own : s.got, &err);
  CHECK(err);
  return s;
}
static void scene_end(struct scene *s) {
  CHECK(clReleaseMemObject(s->m));
  CHECK(clReleaseCommandQueue(q));
  q = s->saved;
  free(s->got);
  free(s->own);
}
struct producer { cl_mem m; size_t n; volatile int done; };
static void *produce(void *arg) {
  struct producer *p = arg;
  for (int i = 1; i <= 120; i++) {
    unsigned char v = (unsigned char)i;
    CHECK(clEnqueueFillBuffer(q, p->m, &v, 1, 0, p->n, 0, NULL, NULL));
    CHECK(clFlush(q));
    usleep(200 + (i * 37) % 500);
  }
  p->done = 1;
  return NULL;
}
static void reads_beside_a_producer(size_t n, int main_first, int own_memory) {
  struct scene s = scene_begin(n, own_memory);
  unsigned char *got = s.got;
  struct producer p = { s.m, n, 0 };
  if (main_first) {
    unsigned char zero = 0;
    CHECK(clEnqueueFillBuffer(q, p.m, &zero, 1, 0, n, 0, NULL, NULL));
  }
  CHECK(clFinish(q));
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, produce, &p) == 0, "no thread");
  int reads = 0;
  while (!p.done) {
    CHECK(clFinish(q));
    CHECK(clEnqueueReadBuffer(q, p.m, CL_TRUE, 0, n, got, 0, NULL, NULL));
    reads++;
    for (size_t k = 1; k < n; k += 509)
      EXPECT(got[k] == got[0], "read %d of %zu bytes%s beside another thread's fills is torn: byte %zu is %u, byte 0 %u",
             reads, n, own_memory ? " (CL_MEM_USE_HOST_PTR)" : "", k, got[k], got[0]);
  }
  EXPECT(pthread_join(t, NULL) == 0, "join");
  CHECK(clFinish(q));
  scene_end(&s);
}
/* A callback (on the driver's or the cage's callback thread) that enqueues on the queue while
 * this thread's large blocking read of it waits: the read must not wait for the callback,
 * which the cage holds back until the read is done. Another thread completes the callback's
 * event, then, 100 ms later, the user event the read waits for. */
struct gates { cl_event callback_gate, read_gate; };
static void *open_gates(void *arg) {
  struct gates *g = arg;
  CHECK(clSetUserEventStatus(g->callback_gate, CL_COMPLETE));
  usleep(100000);
  CHECK(clSetUserEventStatus(g->read_gate, CL_COMPLETE));
  return NULL;
}
static cl_mem callback_target;
static volatile int callback_ran;
static void CL_CALLBACK enqueue_in_callback(cl_event e, cl_int status, void *user_data) {
  (void)e; (void)status; (void)user_data;
  unsigned char v = 7;
  CHECK(clEnqueueFillBuffer(q, callback_target, &v, 1, 0, 4096, 0, NULL, NULL));
  callback_ran = 1;
}
static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}
static void read_beside_a_callback(size_t n) {
  cl_int err;
  struct scene s = scene_begin(n, 0);
  callback_target = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
  CHECK(err);
  struct gates g = { clCreateUserEvent(ctx, &err), NULL };
  CHECK(err);
  g.read_gate = clCreateUserEvent(ctx, &err);
  CHECK(err);
  callback_ran = 0;
  CHECK(clSetEventCallback(g.callback_gate, CL_COMPLETE, enqueue_in_callback, NULL));
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, open_gates, &g) == 0, "no thread");
  double start = seconds();
  CHECK(clEnqueueReadBuffer(q, s.m, CL_TRUE, 0, n, s.got, 1, &g.read_gate, NULL));
  double took = seconds() - start;
  EXPECT(pthread_join(t, NULL) == 0, "join");
  EXPECT(took < 5, "a %zu-byte read took %.1f s beside a callback that enqueues", n, took);
  CHECK(clFinish(q));
  EXPECT(callback_ran, "the callback did not run");
  CHECK(clReleaseEvent(g.callback_gate));
  CHECK(clReleaseEvent(g.read_gate));
  CHECK(clReleaseMemObject(callback_target));
  scene_end(&s);
}

/* This thread's large blocking read waits (behind a marker of its own, or by its wait list) for
 * a user event another thread completes only after its own first enqueue on the queue: the read
 * must not hold that enqueue back (it would wait for ever). */
struct gatekeeper { cl_event gate; cl_mem m; };
static void *enqueue_then_open(void *arg) {
  struct gatekeeper *g = arg;
  usleep(50000);
  unsigned char v = 9;
  CHECK(clEnqueueFillBuffer(q, g->m, &v, 1, 0, 4096, 0, NULL, NULL));
  CHECK(clSetUserEventStatus(g->gate, CL_COMPLETE));
  return NULL;
}
static void read_behind_another_threads_gate(size_t n, int by_wait_list) {
  cl_int err;
  struct scene s = scene_begin(n, 0);
  unsigned char *got = s.got;
  struct gatekeeper g = { clCreateUserEvent(ctx, &err), clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err) };
  CHECK(err);
  CHECK(clFinish(q));
  if (!by_wait_list) CHECK(clEnqueueMarkerWithWaitList(q, 1, &g.gate, NULL));
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, enqueue_then_open, &g) == 0, "no thread");
  CHECK(clEnqueueReadBuffer(q, s.m, CL_TRUE, 0, n, got, by_wait_list, by_wait_list ? &g.gate : NULL, NULL));
  EXPECT(pthread_join(t, NULL) == 0, "join");
  for (size_t k = 0; k < n; k += 4093) EXPECT(got[k] == 0, "byte %zu of a read behind a gate is %u", k, got[k]);
  CHECK(clFinish(q));
  CHECK(clReleaseEvent(g.gate));
  CHECK(clReleaseMemObject(g.m));
  scene_end(&s);
}

static void two_threads(void) {
  for (int by_wait_list = 0; by_wait_list < 2; by_wait_list++) {
    read_behind_another_threads_gate((512 << 10) + 64, by_wait_list);
    read_behind_another_threads_gate((8 << 20) + 64, by_wait_list);
  }
  read_beside_a_callback((512 << 10) + 64);
  read_beside_a_callback((8 << 20) + 64);
  size_t sizes[] = { (64 << 10) + 64, (512 << 10) + 64, (8 << 20) + 64 };
  for (int i = 0; i < 3; i++) {
    reads_beside_a_producer(sizes[i], 0, 0);
    reads_beside_a_producer(sizes[i], 1, 0);
  }
  /* Past the lane's 16 MiB, a buffer over the application's memory (its reads keep that memory
   * in step). */
  reads_beside_a_producer((17 << 20) + 64, 0, 1);
  printf("reads beside another thread's fills, behind its gates, and beside a callback's, ok\n");
}

/* Small buffers of odd sizes up to 70 KiB (the cage's slabs take up to 64 KiB each, 1 MiB a
 * slab), with and without COPY_HOST_PTR contents, kernels and writes into each, a map of each,
 * and every other one released as the next are made (released neighbours must not disturb the
 * living, nor the new ones take their bytes while they live). */
/* A buffer of 1 to `max` random bytes, given them at creation (two in three) or by a blocking
 * write, then one added to each by a kernel; `*ref` holds what it must hold then. */
static cl_mem small_buffer(int i, size_t max, unsigned char **ref, size_t *size) {
  cl_int err;
  size_t n = *size = 1 + next() % max;
  unsigned char *r = *ref = malloc(n);
  randomize(r, n);
  int copy = i % 3 != 0;
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | (copy ? CL_MEM_COPY_HOST_PTR : 0), n, copy ? r : NULL, &err);
  CHECK(err);
  if (!copy) CHECK(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, n, r, 0, NULL, NULL));
  run_add1(m, n);
  for (size_t k = 0; k < n; k++) r[k] += 1;
  return m;
}

static void small_buffers(void) {
  enum { COUNT = 400 };
  static cl_mem ms[COUNT];
  static unsigned char *refs[COUNT];
  static size_t ns[COUNT];
  cl_int err;
  for (int i = 0; i < COUNT; i++) {
    ms[i] = small_buffer(i, 70 << 10, &refs[i], &ns[i]);
    /* Every other older buffer goes while newer ones are made beside it. */
    if (i >= 8 && i % 2 == 0) {
      int old = i - 8;
      check_all(ms[old], refs[old], ns[old], "small buffer before its release");
      CHECK(clReleaseMemObject(ms[old]));
      ms[old] = NULL;
    }
  }
  for (int i = 0; i < COUNT; i++) {
    if (!ms[i]) continue;
    size_t n = ns[i], off, len;
    range(n, &off, &len);
    unsigned char *p = clEnqueueMapBuffer(q, ms[i], CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, off, len, 0, NULL, NULL, &err);
    CHECK(err);
    same(p, refs[i] + off, len, "small buffer map", n);
    randomize(p, len);
    memcpy(refs[i] + off, p, len);
    CHECK(clEnqueueUnmapMemObject(q, ms[i], p, 0, NULL, NULL));
    run_add1(ms[i], n);
    for (size_t k = 0; k < n; k++) refs[i][k] += 1;
  }
  for (int i = 0; i < COUNT; i++) {
    if (ms[i]) {
      check_all(ms[i], refs[i], ns[i], "small buffer");
      CHECK(clReleaseMemObject(ms[i]));
    }
    free(refs[i]);
  }
  printf("%d small buffers ok\n", COUNT);
}

/* Rounds of small buffers made, used and all released but one, so that the slabs they were
 * carved from come back empty and are carved again (caged, zero-copy): each round's bytes must
 * be its own, and the buffer each round keeps must hold its bytes to the end. */
static void recycled_buffers(void) {
  enum { ROUNDS = 6, PER_ROUND = 48 };
  static cl_mem kept[ROUNDS];
  static unsigned char *kept_refs[ROUNDS];
  static size_t kept_ns[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    cl_mem ms[PER_ROUND];
    unsigned char *refs[PER_ROUND];
    size_t ns[PER_ROUND];
    for (int i = 0; i < PER_ROUND; i++) ms[i] = small_buffer(i, 64 << 10, &refs[i], &ns[i]);
    for (int i = 0; i < PER_ROUND; i++) {
      check_all(ms[i], refs[i], ns[i], "recycled buffer");
      if (i == r % PER_ROUND) {
        kept[r] = ms[i], kept_refs[r] = refs[i], kept_ns[r] = ns[i];
        continue;
      }
      CHECK(clReleaseMemObject(ms[i]));
      free(refs[i]);
    }
    CHECK(clFinish(q));
  }
  for (int r = 0; r < ROUNDS; r++) {
    check_all(kept[r], kept_refs[r], kept_ns[r], "buffer kept among recycled ones");
    CHECK(clReleaseMemObject(kept[r]));
    free(kept_refs[r]);
  }
  printf("%d rounds of recycled buffers ok\n", ROUNDS);
}

/* Buffers of `min` to `max` bytes released while a kernel on each still waits (on another
 * queue, behind a user event): their memory must not be carved again for newer buffers before
 * the driver is done with them, or those kernels would add to the newer buffers' bytes once the
 * event is set. */
static void no_early_recycling_of(size_t min, size_t max, int count) {
  cl_int err;
  cl_command_queue q2 = clCreateCommandQueue(ctx, dev, 0, &err);
  CHECK(err);
  cl_event gate = clCreateUserEvent(ctx, &err);
  CHECK(err);
  unsigned char *data = malloc(max);
  randomize(data, max);
  for (int i = 0; i < count; i++) {
    size_t n = min + next() % (max - min + 1);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n, data, &err);
    CHECK(err);
    CHECK(clSetKernelArg(add1, 0, sizeof m, &m));
    CHECK(clEnqueueNDRangeKernel(q2, add1, 1, NULL, &n, NULL, 1, &gate, NULL));
    CHECK(clReleaseMemObject(m));
  }
  /* More than the spare slabs earlier phases left can hold. */
  cl_mem *ms = calloc(4 * count, sizeof *ms);
  size_t *ns = calloc(4 * count, sizeof *ns);
  for (int i = 0; i < 4 * count; i++) {
    ns[i] = min + next() % (max - min + 1);
    ms[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, ns[i], data, &err);
    CHECK(err);
  }
  CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
  CHECK(clFinish(q2));
  for (int i = 0; i < 4 * count; i++) {
    check_all(ms[i], data, ns[i], "buffer made while released ones were still in use");
    CHECK(clReleaseMemObject(ms[i]));
  }
  /* Made, used and released one after the other: the memory of the ones before comes back
   * (the cage takes their slabs again), and each still holds its own bytes. */
  for (int i = 0; i < 2 * count; i++) {
    size_t n = min + next() % (max - min + 1);
    data[next() % n] ^= 0x5a;
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n, data, &err);
    CHECK(err);
    check_all(m, data, n, "buffer made after released ones were done");
    CHECK(clReleaseMemObject(m));
    CHECK(clFinish(q));
  }
  free(ms);
  free(ns);
  free(data);
  CHECK(clReleaseEvent(gate));
  CHECK(clReleaseCommandQueue(q2));
  printf("no memory of a buffer still in use was carved again (%zu to %zu bytes)\n", min, max);
}

/* Buffers carved from shared slabs, and buffers with a slab of their own. */
static void no_early_recycling(void) {
  no_early_recycling_of(1, 64 << 10, 48);
  no_early_recycling_of((64 << 10) + 1, 3 << 20, 12);
}

static void many_buffers(void) {
  enum { COUNT = 3000 };
  struct rlimit lim = { 256, 256 };
  CHECK(setrlimit(RLIMIT_NOFILE, &lim) == 0 ? CL_SUCCESS : -1);
  static cl_mem ms[COUNT];
  cl_int err;
  for (int i = 0; i < COUNT; i++) {
    ms[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64 << 10, NULL, &err);
    CHECK(err);
    CHECK(clEnqueueWriteBuffer(q, ms[i], CL_TRUE, 100, sizeof i, &i, 0, NULL, NULL));
  }
  if (getenv("HOLD")) {
    /* The test counts the worker's descriptors now. */
    printf("holding %d buffers\n", COUNT);
    fflush(stdout);
    sleep(2);
  }
  for (int i = 0; i < COUNT; i += 97) {
    int v = -1;
    CHECK(clEnqueueReadBuffer(q, ms[i], CL_TRUE, 100, sizeof v, &v, 0, NULL, NULL));
    EXPECT(v == i, "buffer %d holds %d", i, v);
  }
  for (int i = 0; i < COUNT; i++) CHECK(clReleaseMemObject(ms[i]));
  printf("%d buffers under a limit of 256 descriptors ok\n", COUNT);
}

int main(void) {
  cl_int err;
  ctx = first_device_context(&dev);
  q = clCreateCommandQueue(ctx, dev, 0, &err);
  CHECK(err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
  CHECK(err);
  CHECK(clBuildProgram(prog, 1, &dev, NULL, NULL, NULL));
  add1 = clCreateKernel(prog, "add1", &err);
  CHECK(err);
  /* The last is past the largest non-blocking transfer the cage stages through a segment of its
   * own (64 MiB): such a one runs as a blocking, pipelined one. */
  size_t sizes[] = { 4096 + 3, (64 << 10) + 17, (1 << 20) + 5, (20 << 20) + 123, (65 << 20) + 4099 };
  for (int i = 0; i < 5; i++) transfers(sizes[i]);
  sub_buffers();
  direct_rules();
  transfers_with_events(4096 + 3);
  transfers_with_events((256 << 10) + 7);
  transfers_with_events((1 << 20) + 5);
  /* Staged, a blocking write posts its chunks: up to 16 MiB each in a segment of its own, past
   * it reusing them. */
  transfers_with_events((20 << 20) + 123);
  direct_maps();
  two_threads();
  host_ptr_flags(4096);
  host_ptr_flags((1 << 20) + 3);
  /* Past the lane's bulk area: a USE_HOST_PTR buffer's blocking read travels in its chunks. */
  host_ptr_flags((17 << 20) + 3);
  small_buffers();
  recycled_buffers();
  no_early_recycling();
  many_buffers();
  CHECK(clReleaseKernel(add1));
  CHECK(clReleaseProgram(prog));
  CHECK(clReleaseCommandQueue(q));
  CHECK(clReleaseContext(ctx));
  printf("data integrity ok\n");
  return 0;
}
