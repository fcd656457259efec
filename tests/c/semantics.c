/* The semantics a naive forwarder gets wrong, one section each (issue 3): where non-blocking
 * reads land, what an unmap writes back, CL_MEM_USE_HOST_PTR memory, callbacks (once, right
 * arguments, free to call the API, never on a thread the application is blocked in), user
 * events gating work across queues, out-of-order queues, events across contexts, profiling
 * timestamps, the info-query size protocol for every kind of value, kernel arguments set
 * in a loop (swapped buffers, values set twice, errors after many calls), writes through
 * the mapping of a buffer released while mapped, and objects released while others keep them.
 *
 * Every line printed is a finding that must be the same directly and caged, except lines
 * starting with "impl:": what the spec leaves undefined or to the implementation, where drivers
 * differ among themselves and the cage makes its own documented choice. A failed check prints
 * FAIL and exits 1.
 *
 * With GARBAGE=1 (for --drop-in, where no ICD loader dereferences handles first) it also
 * passes garbage, NULL and released handles of every type and expects the right CL_INVALID_*. */
#include "check.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


enum { N = 1024 };

static const char *SRC =
  "__kernel void times3(__global int *a) { int i = get_global_id(0); a[i] = i * 3; }\n"
  "__kernel void plus(__global const int *src, __global int *dst, int k) { int i = get_global_id(0); dst[i] = src[i] + k; }\n"
  "__kernel void spin(__global int *a, int n) { int s = 0; for (int j = 0; j < n; j++) s += j ^ s; a[get_global_id(0)] = s; }\n";

static cl_context ctx;
static cl_device_id dev;
static cl_program prog;

static cl_int status_of(cl_event e) {
  cl_int st;
  CHECK(clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
  return st;
}

static int holds(const int *p, int n, int base, int mul) {
  for (int i = 0; i < n; i++) if (p[i] != base + mul * i) return 0;
  return 1;
}

static void fill(int *p, int n, int base, int mul) { for (int i = 0; i < n; i++) p[i] = base + mul * i; }

/* ---- non-blocking reads: the bytes are there whenever completion is first observed ---- */

struct landing { int *dst; int ok; int calls; };
static void CL_CALLBACK read_landed(cl_event e, cl_int st, void *ud) {
  struct landing *l = ud;
  (void)e;
  l->calls++;
  l->ok = st == CL_COMPLETE && holds(l->dst, N, 5, 1);
}

static void nonblocking_reads(cl_command_queue q) {
  static int src[N], dst[N];
  fill(src, N, 5, 1);
  cl_int err;
  cl_mem b = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sizeof src, src, &err); CHECK(err);
  /* The ways from "another queue's" on wait on a second queue for the read's event; the last
   * one maps another buffer on the read's own (in-order) queue. */
  cl_command_queue q2 = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  cl_mem other = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err); CHECK(err);
  const char *how[] = { "poll", "wait", "finish", "callback", "another queue's clFinish after a marker on it",
                        "another queue's blocking read", "another queue's blocking map", "a blocking map on its queue" };
  for (int way = 0; way < 8; way++) {
    memset(dst, 0, sizeof dst);
    cl_event gate = clCreateUserEvent(ctx, &err); CHECK(err);
    cl_event rd;
    CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, sizeof dst, dst, 1, &gate, &rd));
    struct landing l = { dst, 0, 0 };
    if (way == 3) CHECK(clSetEventCallback(rd, CL_COMPLETE, read_landed, &l));
    EXPECT(status_of(rd) != CL_COMPLETE, "a read gated by a user event completed early");
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    int ok = 0;
    unsigned char tmp[64];
    void *mapped = NULL;
    switch (way) {
    case 0: while (status_of(rd) != CL_COMPLETE) usleep(100); break;
    case 1: CHECK(clWaitForEvents(1, &rd)); break;
    case 2: CHECK(clFinish(q)); break;
    case 3: CHECK(clFinish(q)); for (int i = 0; i < 2000 && !l.calls; i++) usleep(1000); break;
    case 4: CHECK(clEnqueueMarkerWithWaitList(q2, 1, &rd, NULL)); CHECK(clFinish(q2)); break;
    case 5: CHECK(clEnqueueReadBuffer(q2, other, CL_TRUE, 0, sizeof tmp, tmp, 1, &rd, NULL)); break;
    case 6: mapped = clEnqueueMapBuffer(q2, other, CL_TRUE, CL_MAP_READ, 0, 64, 1, &rd, NULL, &err); CHECK(err); break;
    case 7: mapped = clEnqueueMapBuffer(q, other, CL_TRUE, CL_MAP_READ, 0, 64, 0, NULL, NULL, &err); CHECK(err); break;
    }
    ok = way == 3 ? l.ok && l.calls == 1 : holds(dst, N, 5, 1);
    EXPECT(ok, "non-blocking read not landed when completion was seen through %s", how[way]);
    if (mapped) CHECK(clEnqueueUnmapMemObject(way == 6 ? q2 : q, other, mapped, 0, NULL, NULL));
    CHECK(clFinish(q)); CHECK(clFinish(q2));
    CHECK(clReleaseEvent(rd)); CHECK(clReleaseEvent(gate));
  }
  CHECK(clReleaseMemObject(other));
  CHECK(clReleaseCommandQueue(q2));
  CHECK(clReleaseMemObject(b));
  printf("non-blocking read landed: poll, wait, finish, callback, another queue's finish, read and map, a map on its queue\n");
}

/* Two ordered non-blocking reads into overlapping memory (the second waits for the first, which
 * waits for a user event) land in the order they ran, the second's bytes last. A marker with a
 * callback just before them has the cage's callback thread settle transfers meanwhile (one such
 * settle put the older read back behind the newer one, which then landed first: 95-124 of 300
 * wrong). */
static void CL_CALLBACK nothing(cl_event e, cl_int st, void *ud) { (void)e; (void)st; (void)ud; }
static void ordered_reads_into_overlapping_memory(cl_command_queue q) {
  enum { HALF = N / 2 };
  static int first[N], second[N], host[N + HALF], want[N + HALF];
  fill(first, N, 100000, 1);
  fill(second, N, 200000, 1);
  memcpy(want, first, HALF * sizeof(int));
  memcpy(want + HALF, second, N * sizeof(int));
  cl_int err;
  cl_mem a = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sizeof first, first, &err); CHECK(err);
  cl_mem b = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sizeof second, second, &err); CHECK(err);
  cl_command_queue other = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  int wrong = 0;
  for (int i = 0; i < 200; i++) {
    memset(host, 0, sizeof host);
    cl_event gate = clCreateUserEvent(ctx, &err), marker, r1, r2;
    CHECK(err);
    CHECK(clEnqueueMarkerWithWaitList(other, 0, NULL, &marker));
    CHECK(clSetEventCallback(marker, CL_COMPLETE, nothing, NULL));
    CHECK(clEnqueueReadBuffer(q, a, CL_FALSE, 0, sizeof first, host, 1, &gate, &r1));
    usleep(i % 7 * 20);
    CHECK(clEnqueueReadBuffer(q, b, CL_FALSE, 0, sizeof second, host + HALF, 1, &r1, &r2));
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    CHECK(clWaitForEvents(1, &r2));
    wrong += memcmp(host, want, sizeof want) != 0;
    CHECK(clReleaseEvent(marker)); CHECK(clReleaseEvent(r1)); CHECK(clReleaseEvent(r2)); CHECK(clReleaseEvent(gate));
  }
  CHECK(clFinish(other)); CHECK(clReleaseCommandQueue(other));
  CHECK(clReleaseMemObject(a)); CHECK(clReleaseMemObject(b));
  printf("ordered reads into overlapping memory, 200 times: %d landed out of order\n", wrong);
}

/* A write whose source is memory a read enqueued before it fills (in order on one queue, across
 * queues by the read's event, behind a user event set after both calls, and blocking): pocl
 * reads the source when the write runs, after the read, so the write carries the read's bytes;
 * NVIDIA's driver now and then carries the old bytes (a 4 KiB write in order, once or twice a
 * run on the H200), which the spec allows: the application may not use the read's memory before
 * the read completes. The cage carries the read's bytes, as the commands' order says (before, it
 * took the source at the call: the old bytes every time). */
static void writes_from_memory_a_read_fills(cl_command_queue q) {
  cl_int err;
  cl_command_queue q2 = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  const char *how[] = { "in order", "by the read's event on another queue", "behind a user event set after both",
                        "blocking, in order", "blocking, by the read's event on another queue",
                        "as a rectangle, in order", "as a rectangle, blocking, in order" };
  int sizes[] = { N, 256 * N };
  for (int si = 0; si < 2; si++) {
    int n = sizes[si];
    size_t bytes = n * sizeof(int);
    int *src = malloc(bytes), *host = malloc(bytes), *got = malloc(bytes);
    fill(src, n, 300 + si, 7);
    cl_mem from = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, bytes, src, &err); CHECK(err);
    for (int way = 0; way < 7; way++) {
      cl_mem to = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err); CHECK(err);
      memset(host, 0, bytes);
      cl_event gate = clCreateUserEvent(ctx, &err), rd, wr = NULL;
      CHECK(err);
      int gated = way == 2;
      CHECK(clEnqueueReadBuffer(q, from, CL_FALSE, 0, bytes, host, gated, gated ? &gate : NULL, &rd));
      cl_bool blocking = way == 3 || way == 4 || way == 6;
      cl_command_queue wq = way == 1 || way == 4 ? q2 : q;
      int listed = way == 1 || way == 2 || way == 4;
      if (way >= 5) {
        /* Rows of a quarter of the buffer each, at the same pitches both sides. */
        size_t origin[3] = { 0, 0, 0 }, region[3] = { bytes / 4, 4, 1 };
        CHECK(clEnqueueWriteBufferRect(wq, to, blocking, origin, origin, region, bytes / 4, 0, bytes / 4, 0, host, 0, NULL,
                                       &wr));
      } else {
        CHECK(clEnqueueWriteBuffer(wq, to, blocking, 0, bytes, host, listed, listed ? &rd : NULL, &wr));
      }
      CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
      CHECK(clWaitForEvents(1, &wr));
      CHECK(clEnqueueReadBuffer(q2, to, CL_TRUE, 0, bytes, got, 0, NULL, NULL));
      printf("impl: a %zu-byte write from memory a read fills, %s: %s\n", bytes, how[way],
             holds(got, n, 300 + si, 7) ? "the read's bytes" : "the old bytes");
      CHECK(clReleaseEvent(rd)); CHECK(clReleaseEvent(wr)); CHECK(clReleaseEvent(gate));
      CHECK(clReleaseMemObject(to));
    }
    CHECK(clReleaseMemObject(from));
    free(src); free(host); free(got);
  }
  CHECK(clFinish(q)); CHECK(clReleaseCommandQueue(q2));
}

/* Non-blocking transfers past 64 MiB behind a user event this thread sets only after the call
 * returns (by the read's wait list, or behind a kernel that waits for it): the call must return
 * at once (the cage made them before returning, and waited for ever). */
static void large_non_blocking_behind_a_gate(cl_command_queue q, cl_kernel times3) {
  size_t n = (size_t)70 << 20, ints = n / sizeof(int);
  int *out = malloc(n), *src = malloc(n);
  cl_int err;
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &err); CHECK(err);
  CHECK(clSetKernelArg(times3, 0, sizeof m, &m));
  const char *how[] = { "a read waiting for it", "a read behind a kernel waiting for it",
                        "a write behind a kernel waiting for it" };
  for (int way = 0; way < 3; way++) {
    cl_event gate = clCreateUserEvent(ctx, &err), done;
    CHECK(err);
    memset(out, 0, n);
    fill(src, (int)ints, 7, 2);
    CHECK(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, n, src, 0, NULL, NULL));
    if (way == 0) {
      CHECK(clEnqueueReadBuffer(q, m, CL_FALSE, 0, n, out, 1, &gate, &done));
    } else {
      CHECK(clEnqueueNDRangeKernel(q, times3, 1, NULL, &ints, NULL, 1, &gate, NULL));
      if (way == 1) CHECK(clEnqueueReadBuffer(q, m, CL_FALSE, 0, n, out, 0, NULL, &done));
      else CHECK(clEnqueueWriteBuffer(q, m, CL_FALSE, 0, n, src, 0, NULL, &done));
    }
    CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
    CHECK(clWaitForEvents(1, &done));
    if (way == 2) CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, out, 0, NULL, NULL));
    EXPECT(way == 1 ? holds(out, (int)ints, 0, 3) : holds(out, (int)ints, 7, 2), "70 MiB behind %s: wrong data", how[way]);
    CHECK(clReleaseEvent(done)); CHECK(clReleaseEvent(gate));
  }
  CHECK(clReleaseMemObject(m));
  free(out);
  free(src);
  printf("70 MiB non-blocking transfers behind a user event set after the call: returned, and right\n");
}

/* ---- maps: unmap writes back exactly the mapped region, as the flags say ---- */

static void maps(cl_command_queue q) {
  static int init[N], got[N];
  fill(init, N, 0, 1);
  cl_int err;
  cl_mem b = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sizeof init, init, &err); CHECK(err);

  /* A write map of [256, 512) while [0, 16) is rewritten by the queue: the unmap must not carry
   * stale bytes of the rest of the buffer back over it. */
  int *m = clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_WRITE, 256 * 4, 256 * 4, 0, NULL, NULL, &err); CHECK(err);
  EXPECT(holds(m, 256, 256, 1), "a write map does not show the buffer's bytes");
  int sevens[16]; for (int i = 0; i < 16; i++) sevens[i] = 7777;
  CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, sizeof sevens, sevens, 0, NULL, NULL));
  for (int i = 0; i < 256; i++) m[i] = -(256 + i);
  CHECK(clEnqueueUnmapMemObject(q, b, m, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
  for (int i = 0; i < 16; i++) EXPECT(got[i] == 7777, "unmap wrote back outside its region at %d: %d", i, got[i]);
  EXPECT(holds(got + 16, 240, 16, 1), "bytes before the mapped region changed");
  EXPECT(holds(got + 256, 256, -256, -1), "the mapped region was not written back");
  EXPECT(holds(got + 512, 512, 512, 1), "bytes after the mapped region changed");
  printf("write map: exactly its region written back\n");

  /* CL_MAP_WRITE_INVALIDATE_REGION: whatever the application leaves there is the new content. */
  m = clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 512 * 4, 128 * 4, 0, NULL, NULL, &err); CHECK(err);
  fill(m, 128, 9000, 1);
  CHECK(clEnqueueUnmapMemObject(q, b, m, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
  EXPECT(holds(got + 512, 128, 9000, 1), "invalidate-region map not written back");
  EXPECT(holds(got + 640, N - 640, 640, 1), "invalidate-region map wrote past its region");
  printf("invalidate-region map: its region written back\n");

  /* Two overlapping read maps at once, each unmapped by its own pointer. */
  int *r1 = clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_READ, 0, 64 * 4, 0, NULL, NULL, &err); CHECK(err);
  int *r2 = clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_READ, 32 * 4, 64 * 4, 0, NULL, NULL, &err); CHECK(err);
  EXPECT(r1[0] == 7777 && r2[0] == 32, "overlapping read maps show %d and %d", r1[0], r2[0]);
  CHECK(clEnqueueUnmapMemObject(q, b, r2, 0, NULL, NULL));
  CHECK(clEnqueueUnmapMemObject(q, b, r1, 0, NULL, NULL));
  printf("overlapping read maps: both see the buffer\n");

  /* Writing through a read map is undefined: the cage writes nothing back; a zero-copy driver
   * (pocl) shows the scribble. Printed, not compared. */
  m = clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_READ, 700 * 4, 16 * 4, 0, NULL, NULL, &err); CHECK(err);
  for (int i = 0; i < 16; i++) m[i] = -1;
  CHECK(clEnqueueUnmapMemObject(q, b, m, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
  printf("impl: read map scribble %s\n", holds(got + 700, 16, 700, 1) ? "not written back" : "written back");
  CHECK(clReleaseMemObject(b));
}

/* ---- CL_MEM_USE_HOST_PTR: the application's memory is the buffer ---- */

static void use_host_ptr(cl_command_queue q, cl_kernel times3) {
  static int host[N], other[N];
  memset(host, 0, sizeof host);
  cl_int err;
  cl_mem b = clCreateBuffer(ctx, CL_MEM_USE_HOST_PTR, sizeof host, host, &err); CHECK(err);
  void *hp = NULL;
  CHECK(clGetMemObjectInfo(b, CL_MEM_HOST_PTR, sizeof hp, &hp, NULL));
  EXPECT(hp == host, "CL_MEM_HOST_PTR is %p, not the application's %p", hp, (void *)host);
  size_t gws = N;
  CHECK(clSetKernelArg(times3, 0, sizeof b, &b));
  CHECK(clEnqueueNDRangeKernel(q, times3, 1, NULL, &gws, NULL, 0, NULL, NULL));
  int *m = clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_READ, 64 * 4, 128 * 4, 0, NULL, NULL, &err); CHECK(err);
  EXPECT(m == host + 64, "map at offset returned %p, not host_ptr + offset %p", (void *)m, (void *)(host + 64));
  EXPECT(holds(host + 64, 128, 192, 3), "the application's memory lacks the kernel's results after a map");
  CHECK(clEnqueueUnmapMemObject(q, b, m, 0, NULL, NULL));
  /* A write map: the application's own memory, edited in place, reaches the device. */
  m = clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_WRITE, 0, sizeof host, 0, NULL, NULL, &err); CHECK(err);
  EXPECT(m == host, "write map returned %p, not host_ptr", (void *)m);
  fill(host, N, 1, 2);
  CHECK(clEnqueueUnmapMemObject(q, b, m, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof other, other, 0, NULL, NULL));
  EXPECT(holds(other, N, 1, 2), "edits made through a USE_HOST_PTR map did not reach the device");
  /* After a blocking read of the buffer the application's memory may hold the device's results:
   * the spec only promises that after a map (pocl and the cage do; NVIDIA does not). */
  CHECK(clEnqueueNDRangeKernel(q, times3, 1, NULL, &gws, NULL, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof other, other, 0, NULL, NULL));
  EXPECT(holds(other, N, 0, 3), "a blocking read of a USE_HOST_PTR buffer read stale data");
  printf("impl: after a blocking read host_ptr %s\n", holds(host, N, 0, 3) ? "holds the device's results" : "is stale");
  CHECK(clReleaseMemObject(b));
  printf("use_host_ptr: map returns host_ptr + offset, memory holds device results\n");
}

/* ---- callbacks: once, right arguments, free to call the API ---- */

struct seen { cl_event ev; cl_int want; int calls; int args_ok; int api_ok; pthread_t thread; };
static pthread_t main_thread;
static cl_event chain_next;

static void CL_CALLBACK saw(cl_event e, cl_int st, void *ud) {
  struct seen *s = ud;
  s->calls++;
  s->thread = pthread_self();
  /* The status passed is the one registered for, or a later one (an error status counts too). */
  s->args_ok = e == s->ev && st <= s->want;
  cl_int now;
  s->api_ok = clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof now, &now, NULL) == CL_SUCCESS && now <= s->want;
}

static void CL_CALLBACK release_next(cl_event e, cl_int st, void *ud) {
  (void)e; (void)st; (void)ud;
  /* Completes the user event the main thread is blocked on: a forwarder that ran callbacks on the
   * thread serving the main thread's call would deadlock here. */
  clSetUserEventStatus(chain_next, CL_COMPLETE);
}

static void *fail_later(void *ev) {
  usleep(100 * 1000);
  CHECK(clSetUserEventStatus((cl_event)ev, -1234));
  return NULL;
}

static void *open_gate_later(void *gate) {
  usleep(50 * 1000);
  clSetUserEventStatus((cl_event)gate, CL_COMPLETE);
  return NULL;
}

static void callbacks(cl_command_queue q, cl_kernel times3) {
  cl_int err;
  cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * 4, NULL, &err); CHECK(err);
  CHECK(clSetKernelArg(times3, 0, sizeof b, &b));
  cl_event gate = clCreateUserEvent(ctx, &err); CHECK(err);
  cl_event k;
  size_t gws = N;
  CHECK(clEnqueueNDRangeKernel(q, times3, 1, NULL, &gws, NULL, 1, &gate, &k));
  CHECK(clFlush(q));
  struct seen s[3] = { { k, CL_SUBMITTED, 0, 0, 0, 0 }, { k, CL_RUNNING, 0, 0, 0, 0 }, { k, CL_COMPLETE, 0, 0, 0, 0 } };
  for (int i = 0; i < 3; i++) CHECK(clSetEventCallback(k, s[i].want, saw, &s[i]));
  chain_next = clCreateUserEvent(ctx, &err); CHECK(err);
  CHECK(clSetEventCallback(k, CL_COMPLETE, release_next, NULL));
  pthread_t opener;
  pthread_create(&opener, NULL, open_gate_later, gate);
  CHECK(clWaitForEvents(1, &chain_next));
  pthread_join(opener, NULL);
  CHECK(clFinish(q));
  for (int t = 0; t < 2000 && (s[0].calls + s[1].calls + s[2].calls) < 3; t++) usleep(1000);
  usleep(20 * 1000); /* room for a wrongly doubled call to show */
  for (int i = 0; i < 3; i++) {
    EXPECT(s[i].calls == 1, "callback for status %d ran %d times", s[i].want, s[i].calls);
    EXPECT(s[i].args_ok, "callback for status %d got the wrong event or status", s[i].want);
    EXPECT(s[i].api_ok, "clGetEventInfo inside the callback for status %d failed", s[i].want);
    EXPECT(!pthread_equal(s[i].thread, main_thread), "callback ran on the main thread while it waited");
  }
  /* A callback on an event already complete fires too, once. */
  struct seen late = { k, CL_COMPLETE, 0, 0, 0, 0 };
  CHECK(clSetEventCallback(k, CL_COMPLETE, saw, &late));
  for (int t = 0; t < 2000 && !late.calls; t++) usleep(1000);
  usleep(20 * 1000);
  EXPECT(late.calls == 1 && late.args_ok, "callback on a completed event ran %d times", late.calls);
  /* Bad registrations are refused. */
  printf("callback with NULL function -> %d, with status CL_QUEUED -> %d\n",
         clSetEventCallback(k, CL_COMPLETE, NULL, NULL), clSetEventCallback(k, CL_QUEUED, saw, &late));
  CHECK(clReleaseEvent(k)); CHECK(clReleaseEvent(gate)); CHECK(clReleaseEvent(chain_next));
  CHECK(clReleaseMemObject(b));
  printf("callbacks: each once, right event and status, API usable inside, not on the waiting thread\n");
}

/* ---- user events gate work across queues ---- */

static void gating_across_queues(cl_kernel plus) {
  cl_int err;
  cl_command_queue q1 = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  cl_command_queue q2 = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  cl_command_queue q3 = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  static int src[N], zero[N], got[N];
  fill(src, N, 100, 1);
  cl_mem x = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sizeof zero, zero, &err); CHECK(err);
  cl_mem y = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, sizeof zero, zero, &err); CHECK(err);
  cl_event gate = clCreateUserEvent(ctx, &err); CHECK(err);
  cl_event wrote, ran;
  CHECK(clEnqueueWriteBuffer(q1, x, CL_FALSE, 0, sizeof src, src, 1, &gate, &wrote));
  int k = 1;
  CHECK(clSetKernelArg(plus, 0, sizeof x, &x)); CHECK(clSetKernelArg(plus, 1, sizeof y, &y));
  CHECK(clSetKernelArg(plus, 2, sizeof k, &k));
  size_t gws = N;
  CHECK(clEnqueueNDRangeKernel(q2, plus, 1, NULL, &gws, NULL, 1, &wrote, &ran));
  CHECK(clFlush(q1)); CHECK(clFlush(q2));
  usleep(100 * 1000);
  EXPECT(status_of(wrote) != CL_COMPLETE && status_of(ran) != CL_COMPLETE, "gated work ran before its user event");
  CHECK(clEnqueueReadBuffer(q3, y, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
  EXPECT(holds(got, N, 0, 0), "the kernel on the second queue ran before the gate opened");
  CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
  CHECK(clWaitForEvents(1, &ran));
  CHECK(clEnqueueReadBuffer(q3, y, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
  EXPECT(holds(got, N, 101, 1), "gated chain across queues gave wrong results");
  /* A user event set to an error fails the commands waiting on it. */
  cl_event bad = clCreateUserEvent(ctx, &err); CHECK(err);
  cl_event doomed;
  CHECK(clEnqueueWriteBuffer(q1, x, CL_FALSE, 0, sizeof src, src, 1, &bad, &doomed));
  CHECK(clSetUserEventStatus(bad, -1234));
  cl_int w = clWaitForEvents(1, &doomed);
  printf("wait on a command behind a failed user event -> %s, status %s\n",
         w == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST ? "error for events in wait list" : w == CL_SUCCESS ? "success" : "other",
         status_of(doomed) < 0 ? "negative" : "not negative");
  CHECK(clReleaseEvent(doomed)); CHECK(clReleaseEvent(bad));
  /* Blocking transfers behind a user event another thread fails meanwhile, and one after a
     failed command: what the driver's blocking calls return (the cage's worker may make them
     non-blocking and wait, and must not change the answer). */
  static int back[N];
  for (int write = 0; write < 2; write++) {
    cl_event fails = clCreateUserEvent(ctx, &err); CHECK(err);
    pthread_t failer;
    pthread_create(&failer, NULL, fail_later, fails);
    cl_int r = write ? clEnqueueWriteBuffer(q1, x, CL_TRUE, 0, sizeof src, src, 1, &fails, NULL)
                     : clEnqueueReadBuffer(q1, x, CL_TRUE, 0, sizeof back, back, 1, &fails, NULL);
    pthread_join(failer, NULL);
    printf("blocking %s behind a user event failed meanwhile -> %s\n", write ? "write" : "read",
           r == CL_SUCCESS ? "success" : r == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST ? "error for events in wait list" : "other error");
    CHECK(clReleaseEvent(fails));
  }
  cl_event fails = clCreateUserEvent(ctx, &err); CHECK(err);
  cl_event failed;
  CHECK(clEnqueueWriteBuffer(q1, x, CL_FALSE, 0, sizeof src, src, 1, &fails, &failed));
  CHECK(clFlush(q1));
  CHECK(clSetUserEventStatus(fails, -1234));
  cl_int after = clEnqueueReadBuffer(q1, x, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL);
  /* Implementation-defined (the failed command is not in the read's wait list), and on
     NVIDIA's driver a matter of timing: directly an error in four runs of four, through the
     cage an error in three runs of one build and success in five runs of the next. */
  printf("impl: blocking read after a failed command -> %s\n", after == CL_SUCCESS ? "success" : "an error");
  CHECK(clReleaseEvent(failed)); CHECK(clReleaseEvent(fails));
  CHECK(clReleaseEvent(wrote)); CHECK(clReleaseEvent(ran)); CHECK(clReleaseEvent(gate));
  CHECK(clReleaseMemObject(x)); CHECK(clReleaseMemObject(y));
  CHECK(clReleaseCommandQueue(q1)); CHECK(clReleaseCommandQueue(q2)); CHECK(clReleaseCommandQueue(q3));
  printf("user event gates a chain across three queues\n");
}

/* ---- out-of-order queues ---- */

static void out_of_order(cl_kernel plus) {
  cl_command_queue_properties can = 0;
  CHECK(clGetDeviceInfo(dev, CL_DEVICE_QUEUE_ON_HOST_PROPERTIES, sizeof can, &can, NULL));
  if (!(can & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) { printf("out-of-order queues: not supported by the device\n"); return; }
  cl_int err;
  cl_queue_properties props[] = { CL_QUEUE_PROPERTIES, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE | CL_QUEUE_PROFILING_ENABLE, 0 };
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, props, &err); CHECK(err);
  cl_command_queue_properties have;
  CHECK(clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES, sizeof have, &have, NULL));
  EXPECT(have == (CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE | CL_QUEUE_PROFILING_ENABLE), "queue properties read %llx", (unsigned long long)have);
  static int a[N], got[N], fillgot[N];
  fill(a, N, 0, 1);
  cl_mem A = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof a, NULL, &err); CHECK(err);
  cl_mem B = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof a, NULL, &err); CHECK(err);
  cl_mem C = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof a, NULL, &err); CHECK(err);
  cl_mem D = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof a, NULL, &err); CHECK(err);
  cl_kernel plus2 = clCreateKernel(prog, "plus", &err); CHECK(err);
  cl_event e[4];
  size_t gws = N;
  int one = 1, ten = 10, pat = 42;
  /* A chain expressed only through events: write A -> A+1 into B -> B+10 into C. */
  CHECK(clEnqueueWriteBuffer(q, A, CL_FALSE, 0, sizeof a, a, 0, NULL, &e[0]));
  CHECK(clSetKernelArg(plus, 0, sizeof A, &A)); CHECK(clSetKernelArg(plus, 1, sizeof B, &B)); CHECK(clSetKernelArg(plus, 2, sizeof one, &one));
  CHECK(clEnqueueNDRangeKernel(q, plus, 1, NULL, &gws, NULL, 1, &e[0], &e[1]));
  CHECK(clSetKernelArg(plus2, 0, sizeof B, &B)); CHECK(clSetKernelArg(plus2, 1, sizeof C, &C)); CHECK(clSetKernelArg(plus2, 2, sizeof ten, &ten));
  CHECK(clEnqueueNDRangeKernel(q, plus2, 1, NULL, &gws, NULL, 1, &e[1], &e[2]));
  /* Independent work, then a barrier that orders everything before the reads. */
  CHECK(clEnqueueFillBuffer(q, D, &pat, sizeof pat, 0, sizeof a, 0, NULL, &e[3]));
  CHECK(clEnqueueBarrierWithWaitList(q, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, C, CL_FALSE, 0, sizeof got, got, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, D, CL_FALSE, 0, sizeof fillgot, fillgot, 0, NULL, NULL));
  /* A marker with no wait list waits for everything enqueued before it. */
  cl_event all;
  CHECK(clEnqueueMarkerWithWaitList(q, 0, NULL, &all));
  CHECK(clWaitForEvents(1, &all));
  EXPECT(holds(got, N, 11, 1), "out-of-order chain through events gave %d %d", got[0], got[1]);
  EXPECT(holds(fillgot, N, 42, 0), "fill on the out-of-order queue gave %d", fillgot[0]);
  for (int i = 0; i < 4; i++) EXPECT(status_of(e[i]) == CL_COMPLETE, "event %d not complete after the marker", i);
  cl_ulong end0, start1, end1, start2;
  CHECK(clGetEventProfilingInfo(e[0], CL_PROFILING_COMMAND_END, 8, &end0, NULL));
  CHECK(clGetEventProfilingInfo(e[1], CL_PROFILING_COMMAND_START, 8, &start1, NULL));
  CHECK(clGetEventProfilingInfo(e[1], CL_PROFILING_COMMAND_END, 8, &end1, NULL));
  CHECK(clGetEventProfilingInfo(e[2], CL_PROFILING_COMMAND_START, 8, &start2, NULL));
  EXPECT(end0 <= start1 && end1 <= start2, "dependent commands overlapped on the out-of-order queue");
  for (int i = 0; i < 4; i++) CHECK(clReleaseEvent(e[i]));
  CHECK(clReleaseEvent(all)); CHECK(clReleaseKernel(plus2));
  CHECK(clReleaseMemObject(A)); CHECK(clReleaseMemObject(B)); CHECK(clReleaseMemObject(C)); CHECK(clReleaseMemObject(D));
  CHECK(clReleaseCommandQueue(q));
  printf("out-of-order queue: event chains, barrier and marker order the work\n");
}

/* ---- events across contexts ---- */

static void across_contexts(cl_command_queue q) {
  cl_int err;
  cl_context other = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); CHECK(err);
  cl_command_queue oq = clCreateCommandQueueWithProperties(other, dev, NULL, &err); CHECK(err);
  cl_event mine = clCreateUserEvent(ctx, &err); CHECK(err);
  cl_event theirs = clCreateUserEvent(other, &err); CHECK(err);
  cl_context seen = NULL;
  CHECK(clGetEventInfo(theirs, CL_EVENT_CONTEXT, sizeof seen, &seen, NULL));
  EXPECT(seen == other, "an event's context reads %p, not %p", (void *)seen, (void *)other);
  /* Complete first: a driver that does not check contexts must not leave these calls waiting. */
  CHECK(clSetUserEventStatus(mine, CL_COMPLETE)); CHECK(clSetUserEventStatus(theirs, CL_COMPLETE));
  cl_event both[2] = { mine, theirs };
  printf("wait on events of two contexts -> %d\n", clWaitForEvents(2, both));
  printf("marker on a queue waiting for another context's event -> %d\n", clEnqueueMarkerWithWaitList(oq, 1, &mine, NULL));
  cl_mem ob = clCreateBuffer(other, CL_MEM_READ_WRITE, 64, NULL, &err); CHECK(err);
  printf("copy between buffers of two contexts -> %d\n", clEnqueueCopyBuffer(q, ob, ob, 0, 0, 16, 0, NULL, NULL));
  /* Each of these the cage would post if its objects were of one context: refused at the call. */
  int word = 5;
  printf("non-blocking write into another context's buffer -> %d\n", clEnqueueWriteBuffer(q, ob, CL_FALSE, 0, sizeof word, &word, 0, NULL, NULL));
  printf("fill of another context's buffer -> %d\n", clEnqueueFillBuffer(q, ob, &word, sizeof word, 0, 16, 0, NULL, NULL));
  cl_program op = clCreateProgramWithSource(other, 1, &SRC, NULL, &err); CHECK(err);
  CHECK(clBuildProgram(op, 1, &dev, NULL, NULL, NULL));
  cl_kernel ok = clCreateKernel(op, "times3", &err); CHECK(err);
  CHECK(clSetKernelArg(ok, 0, sizeof ob, &ob));
  size_t four = 4;
  printf("NDRange of another context's kernel -> %d\n", clEnqueueNDRangeKernel(q, ok, 1, NULL, &four, NULL, 0, NULL, NULL));
  cl_event done = NULL;
  CHECK(clEnqueueMarkerWithWaitList(oq, 0, NULL, &done));
  printf("kernel of its own context waiting for another context's marker -> %d\n", clEnqueueNDRangeKernel(oq, ok, 1, NULL, &four, NULL, 1, &mine, NULL));
  /* And the same commands within the other context run: posted, their results read back. */
  CHECK(clEnqueueNDRangeKernel(oq, ok, 1, NULL, &four, NULL, 1, &done, NULL));
  CHECK(clEnqueueWriteBuffer(oq, ob, CL_FALSE, 0, sizeof word, &word, 0, NULL, NULL));
  int back[4] = { 0 };
  CHECK(clEnqueueReadBuffer(oq, ob, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
  printf("in the other context: %d %d %d %d\n", back[0], back[1], back[2], back[3]);
  CHECK(clReleaseEvent(done)); CHECK(clReleaseKernel(ok)); CHECK(clReleaseProgram(op));
  CHECK(clReleaseEvent(mine)); CHECK(clReleaseEvent(theirs));
  CHECK(clReleaseMemObject(ob)); CHECK(clReleaseCommandQueue(oq)); CHECK(clReleaseContext(other));
}

/* ---- profiling timestamps ---- */

static void profiling(cl_command_queue q, cl_kernel spin) {
  cl_int err;
  cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * 4, NULL, &err); CHECK(err);
  int n = 20000;
  CHECK(clSetKernelArg(spin, 0, sizeof b, &b)); CHECK(clSetKernelArg(spin, 1, sizeof n, &n));
  cl_event gate = clCreateUserEvent(ctx, &err); CHECK(err);
  cl_event k;
  size_t gws = N;
  CHECK(clEnqueueNDRangeKernel(q, spin, 1, NULL, &gws, NULL, 1, &gate, &k));
  cl_ulong t;
  printf("profiling before completion -> %d\n", clGetEventProfilingInfo(k, CL_PROFILING_COMMAND_END, sizeof t, &t, NULL));
  printf("profiling a user event -> %d\n", clGetEventProfilingInfo(gate, CL_PROFILING_COMMAND_START, sizeof t, &t, NULL));
  CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
  CHECK(clWaitForEvents(1, &k));
  cl_profiling_info names[] = { CL_PROFILING_COMMAND_QUEUED, CL_PROFILING_COMMAND_SUBMIT, CL_PROFILING_COMMAND_START,
                                CL_PROFILING_COMMAND_END, CL_PROFILING_COMMAND_COMPLETE };
  cl_ulong ts[5];
  for (int i = 0; i < 5; i++) CHECK(clGetEventProfilingInfo(k, names[i], sizeof ts[i], &ts[i], NULL));
  for (int i = 1; i < 5; i++) EXPECT(ts[i - 1] <= ts[i], "profiling timestamp %d (%llu) after %d (%llu)", i - 1, (unsigned long long)ts[i - 1], i, (unsigned long long)ts[i]);
  EXPECT(ts[3] > ts[2], "a kernel that spins took no time");
  printf("profiling with a small buffer -> %d\n", clGetEventProfilingInfo(k, CL_PROFILING_COMMAND_START, 4, &t, NULL));
  cl_command_queue plain = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  cl_event pk;
  CHECK(clEnqueueNDRangeKernel(plain, spin, 1, NULL, &gws, NULL, 0, NULL, &pk));
  CHECK(clWaitForEvents(1, &pk));
  printf("profiling on a queue without profiling -> %d\n", clGetEventProfilingInfo(pk, CL_PROFILING_COMMAND_START, sizeof t, &t, NULL));
  CHECK(clReleaseEvent(pk)); CHECK(clReleaseCommandQueue(plain));
  CHECK(clReleaseEvent(k)); CHECK(clReleaseEvent(gate)); CHECK(clReleaseMemObject(b));
  printf("profiling: queued <= submit <= start < end <= complete\n");
  /* A 16 MiB blocking transfer's event spans it (the cage makes it of several commands): measured
   * from a marker's end just before the call, its start lies in the first half of its span, not
   * at its last command, in at least one of five rounds. Not a speed: a round where the machine
   * held the call back before the transfer began may miss, but with the event's start at the
   * last of eight chunks none can meet it. */
  size_t big = 16 << 20;
  /* A queue of its own, which only this thread has used (the cage's fastest ways need that). */
  cl_queue_properties timed[] = { CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0 };
  cl_command_queue own = clCreateCommandQueueWithProperties(ctx, dev, timed, &err); CHECK(err);
  cl_mem large = clCreateBuffer(ctx, CL_MEM_READ_WRITE, big, NULL, &err); CHECK(err);
  char *host = calloc(big, 1);
  for (int write = 0; write < 2; write++) {
    int early = 0;
    for (int round = 0; round < 5; round++) {
      cl_event before, transfer;
      CHECK(clEnqueueMarkerWithWaitList(own, 0, NULL, &before));
      CHECK(clFinish(own));
      CHECK(write ? clEnqueueWriteBuffer(own, large, CL_TRUE, 0, big, host, 0, NULL, &transfer)
                  : clEnqueueReadBuffer(own, large, CL_TRUE, 0, big, host, 0, NULL, &transfer));
      cl_ulong marked, start, end;
      CHECK(clGetEventProfilingInfo(before, CL_PROFILING_COMMAND_END, sizeof marked, &marked, NULL));
      CHECK(clGetEventProfilingInfo(transfer, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL));
      CHECK(clGetEventProfilingInfo(transfer, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL));
      early += start >= marked && start - marked < end - start;
      cl_command_type type = 0;
      CHECK(clGetEventInfo(transfer, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
      EXPECT(type == (write ? CL_COMMAND_WRITE_BUFFER : CL_COMMAND_READ_BUFFER), "a blocking transfer's event says command 0x%x", type);
      EXPECT(status_of(transfer) == CL_COMPLETE, "a blocking transfer's event is not complete when the call returned");
      CHECK(clReleaseEvent(before)); CHECK(clReleaseEvent(transfer));
    }
    printf("profiling a 16 MiB blocking %s: its start in the first half of its span %s; its event's type the %s's, complete\n",
           write ? "write" : "read", early >= 1 ? "(at least 1 of 5)" : "(0 of 5)", write ? "write" : "read");
  }
  free(host);
  CHECK(clReleaseMemObject(large));
  CHECK(clReleaseCommandQueue(own));
}

/* ---- the info-query size protocol, for each kind of value ---- */

typedef cl_int (*info_fn)(void *obj, cl_uint name, size_t size, void *value, size_t *size_ret);
static void protocol(const char *what, info_fn f, void *obj, cl_uint name) {
  size_t need = 0;
  cl_int a = f(obj, name, 0, NULL, &need);
  unsigned char buf[4096];
  size_t got = 12345;
  /* pocl 3.1 crashes when an empty value is queried with no output at all or with a zero-size
   * buffer: those queries are only made for values that have a size. */
  cl_int exact = need == 0 ? f(obj, name, 0, NULL, &got) : need <= sizeof buf ? f(obj, name, need, buf, &got) : -9999;
  size_t big_ret = 12345;
  cl_int big = f(obj, name, sizeof buf, buf, &big_ret);
  cl_int small = need > 0 ? f(obj, name, need - 1, buf, NULL) : CL_INVALID_VALUE;
  cl_int nothing = need > 0 ? f(obj, name, 0, NULL, NULL) : CL_SUCCESS;
  printf("%s: size query %d (%zu bytes), exact %d (ret %zu), larger %d (ret %zu), one short %d, no outputs %d\n",
         what, a, need, exact, got, big, big_ret, small, nothing);
}

#define INFO(fn, obj, name) protocol(#name, (info_fn)fn, (void *)(obj), name)

static void info_protocol(cl_command_queue q, cl_kernel k) {
  cl_platform_id plat;
  CHECK(clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL));
  cl_int err;
  cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err); CHECK(err);
  cl_event ev;
  CHECK(clEnqueueMarkerWithWaitList(q, 0, NULL, &ev)); CHECK(clWaitForEvents(1, &ev));
  INFO(clGetPlatformInfo, plat, CL_PLATFORM_VERSION);              /* string */
  INFO(clGetDeviceInfo, dev, CL_DEVICE_NAME);                      /* string */
  INFO(clGetDeviceInfo, dev, CL_DEVICE_MAX_WORK_ITEM_SIZES);       /* array */
  INFO(clGetDeviceInfo, dev, CL_DEVICE_TYPE);                      /* bitfield */
  INFO(clGetDeviceInfo, dev, CL_DEVICE_PLATFORM);                  /* handle */
  INFO(clGetDeviceInfo, dev, CL_DEVICE_PARTITION_PROPERTIES);      /* array, maybe one zero */
  INFO(clGetDeviceInfo, dev, CL_DEVICE_MAX_COMPUTE_UNITS);         /* scalar */
  INFO(clGetContextInfo, ctx, CL_CONTEXT_DEVICES);                 /* handle array */
  INFO(clGetContextInfo, ctx, CL_CONTEXT_PROPERTIES);              /* empty array */
  INFO(clGetCommandQueueInfo, q, CL_QUEUE_CONTEXT);                /* handle */
  INFO(clGetCommandQueueInfo, q, CL_QUEUE_PROPERTIES);             /* bitfield */
  INFO(clGetMemObjectInfo, b, CL_MEM_FLAGS);                       /* bitfield */
  INFO(clGetMemObjectInfo, b, CL_MEM_HOST_PTR);                    /* NULL pointer */
  INFO(clGetMemObjectInfo, b, CL_MEM_TYPE);                        /* enum, the shim's own */
  cl_mem_object_type b_type = 0;
  CHECK(clGetMemObjectInfo(b, CL_MEM_TYPE, sizeof b_type, &b_type, NULL));
  printf("a buffer's CL_MEM_TYPE: %#x\n", b_type);
  INFO(clGetProgramInfo, prog, CL_PROGRAM_KERNEL_NAMES);           /* string */
  INFO(clGetProgramInfo, prog, CL_PROGRAM_BINARY_SIZES);           /* array */
  INFO(clGetKernelInfo, k, CL_KERNEL_FUNCTION_NAME);               /* string */
  INFO(clGetKernelInfo, k, CL_KERNEL_PROGRAM);                     /* handle */
  INFO(clGetEventInfo, ev, CL_EVENT_COMMAND_QUEUE);                /* handle */
  INFO(clGetEventInfo, ev, CL_EVENT_COMMAND_TYPE);                 /* enum */
  size_t sz = 0;
  printf("unknown device info name -> %d\n", clGetDeviceInfo(dev, 0x7fff, 0, NULL, &sz));
  printf("unknown event info name -> %d\n", clGetEventInfo(ev, 0x7fff, 0, NULL, &sz));
  /* Handles read back are the application's own. */
  cl_context c2; cl_device_id d2; cl_program p2; cl_command_queue q2;
  CHECK(clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof c2, &c2, NULL));
  CHECK(clGetContextInfo(ctx, CL_CONTEXT_DEVICES, sizeof d2, &d2, NULL));
  CHECK(clGetKernelInfo(k, CL_KERNEL_PROGRAM, sizeof p2, &p2, NULL));
  CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_QUEUE, sizeof q2, &q2, NULL));
  EXPECT(c2 == ctx && d2 == dev && p2 == prog && q2 == q, "handles read back are not the application's");
  CHECK(clReleaseEvent(ev)); CHECK(clReleaseMemObject(b));
  printf("info: handles read back are the application's own\n");
}

/* ---- garbage, NULL and released handles (--drop-in only) ---- */

static void garbage_handles(void) {
  cl_int err;
  void *junk = (void *)0x1234;
  size_t sz;
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err); CHECK(err);
  cl_sampler_properties sp[] = { CL_SAMPLER_NORMALIZED_COORDS, CL_FALSE, 0 };
  cl_sampler s = clCreateSamplerWithProperties(ctx, sp, &err); CHECK(err);
  cl_program p = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err); CHECK(err);
  CHECK(clBuildProgram(p, 1, &dev, NULL, NULL, NULL));
  cl_kernel k = clCreateKernel(p, "times3", &err); CHECK(err);
  cl_event e = clCreateUserEvent(ctx, &err); CHECK(err);
  cl_context c = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); CHECK(err);
  CHECK(clSetUserEventStatus(e, CL_COMPLETE));
  CHECK(clReleaseCommandQueue(q)); CHECK(clReleaseMemObject(b)); CHECK(clReleaseSampler(s));
  CHECK(clReleaseKernel(k)); CHECK(clReleaseProgram(p)); CHECK(clReleaseEvent(e)); CHECK(clReleaseContext(c));
  struct { const char *what; cl_int want; cl_int got[3]; } r[] = {
    { "platform", CL_INVALID_PLATFORM, { clGetPlatformInfo(junk, CL_PLATFORM_NAME, 0, NULL, &sz), clGetPlatformInfo((cl_platform_id)&sz, CL_PLATFORM_NAME, 0, NULL, &sz), CL_INVALID_PLATFORM } },
    { "device", CL_INVALID_DEVICE, { clGetDeviceInfo(junk, CL_DEVICE_NAME, 0, NULL, &sz), clGetDeviceInfo(NULL, CL_DEVICE_NAME, 0, NULL, &sz), CL_INVALID_DEVICE } },
    { "context", CL_INVALID_CONTEXT, { clGetContextInfo(junk, CL_CONTEXT_NUM_DEVICES, 0, NULL, &sz), clGetContextInfo(NULL, CL_CONTEXT_NUM_DEVICES, 0, NULL, &sz), clRetainContext(c) } },
    { "queue", CL_INVALID_COMMAND_QUEUE, { clFinish(junk), clFinish(NULL), clFlush(q) } },
    { "memory object", CL_INVALID_MEM_OBJECT, { clGetMemObjectInfo(junk, CL_MEM_SIZE, 0, NULL, &sz), clRetainMemObject(NULL), clGetMemObjectInfo(b, CL_MEM_SIZE, 0, NULL, &sz) } },
    { "sampler", CL_INVALID_SAMPLER, { clRetainSampler(junk), clGetSamplerInfo(NULL, CL_SAMPLER_NORMALIZED_COORDS, 0, NULL, &sz), clReleaseSampler(s) } },
    { "program", CL_INVALID_PROGRAM, { clBuildProgram(junk, 0, NULL, NULL, NULL, NULL), clRetainProgram(NULL), clGetProgramInfo(p, CL_PROGRAM_NUM_DEVICES, 0, NULL, &sz) } },
    { "kernel", CL_INVALID_KERNEL, { clSetKernelArg(junk, 0, 4, &sz), clRetainKernel(NULL), clGetKernelInfo(k, CL_KERNEL_NUM_ARGS, 0, NULL, &sz) } },
    { "event", CL_INVALID_EVENT, { clGetEventInfo(junk, CL_EVENT_COMMAND_TYPE, 0, NULL, &sz), clRetainEvent(NULL), clSetUserEventStatus(e, CL_COMPLETE) } },
  };
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
    for (int j = 0; j < 3; j++)
      EXPECT(r[i].got[j] == r[i].want, "%s handle (%s): got %d, want %d", r[i].what, j == 0 ? "garbage" : j == 1 ? "NULL or wrong type" : "released", r[i].got[j], r[i].want);
  cl_event wl[1] = { junk };
  printf("garbage in a wait list -> %d\n", clWaitForEvents(1, wl));
  printf("garbage handles: every type answers its CL_INVALID_*\n");
}

/* ---- kernel arguments: set before every enqueue, as applications do in their loops (the shim
 * records a value of a known shape without asking the driver): buffers swapped every time,
 * a value set twice before one enqueue (the last wins), the same value again, and errors after
 * the kernel was used many times ---- */

static void kernel_arguments(cl_command_queue q, cl_kernel plus) {
  static int init[N], got[N];
  cl_int err;
  fill(init, N, 0, 1);
  cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof init, init, &err); CHECK(err);
  cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof init, NULL, &err); CHECK(err);
  size_t n = N;
  int sum = 0;
  for (int i = 0; i < 64; i++) {
    cl_mem src = i % 2 ? b : a, dst = i % 2 ? a : b;
    int decoy = 1000 + i;
    CHECK(clSetKernelArg(plus, 0, sizeof src, &src));
    CHECK(clSetKernelArg(plus, 1, sizeof dst, &dst));
    CHECK(clSetKernelArg(plus, 2, sizeof decoy, &decoy));
    CHECK(clSetKernelArg(plus, 2, sizeof i, &i));
    CHECK(clSetKernelArg(plus, 1, sizeof dst, &dst));
    CHECK(clEnqueueNDRangeKernel(q, plus, 1, NULL, &n, NULL, 0, NULL, NULL));
    sum += i;
  }
  CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
  EXPECT(holds(got, N, sum, 1), "after 64 swapped enqueues a[1] = %d, not %d", got[1], sum + 1);
  int k = 7;
  cl_int wrong_index = clSetKernelArg(plus, 3, sizeof k, &k);
  cl_int wrong_size = clSetKernelArg(plus, 0, sizeof k, &k);
  cl_int null_value = clSetKernelArg(plus, 2, sizeof k, NULL);
  /* The recorded values still hold after the failed calls: one more enqueue computes a from b
   * (which holds the sum up to 62) plus 63 again. */
  memset(got, 0, sizeof got);
  CHECK(clEnqueueWriteBuffer(q, a, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
  CHECK(clEnqueueNDRangeKernel(q, plus, 1, NULL, &n, NULL, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
  EXPECT(holds(got, N, sum, 1), "after the failed calls a[1] = %d, not %d", got[1], sum + 1);
  printf("kernel arguments: swapped buffers, the last value wins; wrong index %d, wrong size %d, NULL value %d\n",
         wrong_index, wrong_size, null_value);
  CHECK(clReleaseMemObject(a)); CHECK(clReleaseMemObject(b));
}

/* A buffer released while the application still holds a mapping of it (legal; pocl keeps the
 * buffer until the unmap): writing through the mapping must not fault, nor land in buffers made
 * after the release. Blocking maps for writing, made idle and behind an event; 4 KiB and 64 KiB
 * buffers share slabs in the cage, 1 MiB ones have memory of their own. */
/* Regions larger than the object, with the application's memory only 1 MiB: the driver refuses
 * them before it touches any memory (CL_INVALID_VALUE), and so must the cage, which copies the
 * application's rows itself (a caged 1 GiB rectangle write read past the 1 MiB and crashed), and
 * regions whose byte counts overflow (the cage said CL_OUT_OF_HOST_MEMORY). */
static void oversized_regions(cl_command_queue q) {
  cl_int err;
  unsigned char *host = calloc(1, 1 << 20);
  cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err); CHECK(err);
  size_t o[3] = { 0, 0, 0 }, gib[3] = { 1 << 16, 1 << 14, 1 }, huge[3] = { (size_t)1 << 33, (size_t)1 << 33, 1 };
  cl_int rect_nb = clEnqueueWriteBufferRect(q, b, CL_FALSE, o, o, gib, 0, 0, 0, 0, host, 0, NULL, NULL);
  cl_int rect_b = clEnqueueWriteBufferRect(q, b, CL_TRUE, o, o, gib, 0, 0, 0, 0, host, 0, NULL, NULL);
  cl_int rect_read = clEnqueueReadBufferRect(q, b, CL_TRUE, o, o, huge, 0, 0, 0, 0, host, 0, NULL, NULL);
  printf("oversized buffer rectangles: write %d, blocking %d, overflowing read %d\n", rect_nb, rect_b, rect_read);
  cl_image_format fmt = { CL_RGBA, CL_UNSIGNED_INT8 };
  cl_image_desc d = { .image_type = CL_MEM_OBJECT_IMAGE2D, .image_width = 16, .image_height = 16 };
  cl_mem im = clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &d, NULL, &err);
  if (err == CL_SUCCESS) {
    size_t quarter_gib[3] = { 1 << 14, 1 << 14, 1 }, wide_row[3] = { (size_t)1 << 62, 1, 1 }, pitch;
    cl_int img_b = clEnqueueWriteImage(q, im, CL_TRUE, o, quarter_gib, 0, 0, host, 0, NULL, NULL);
    cl_int img_nb = clEnqueueWriteImage(q, im, CL_FALSE, o, quarter_gib, 0, 0, host, 0, NULL, NULL);
    cl_int img_read = clEnqueueReadImage(q, im, CL_TRUE, o, huge, 0, 0, host, 0, NULL, NULL);
    cl_int map = 1;
    void *p = clEnqueueMapImage(q, im, CL_TRUE, CL_MAP_READ, o, wide_row, &pitch, NULL, 0, NULL, NULL, &map);
    printf("oversized image regions: write %d, non-blocking %d, overflowing read %d, overflowing map %d (%s)\n", img_b,
           img_nb, img_read, map, p ? "mapped" : "NULL");
    cl_mem_object_type type = 0;
    CHECK(clGetMemObjectInfo(im, CL_MEM_TYPE, sizeof type, &type, NULL));
    printf("an image's CL_MEM_TYPE: %#x\n", type);
    CHECK(clReleaseMemObject(im));
  } else {
    printf("oversized image regions: no 2D images here\n");
  }
  CHECK(clFinish(q));
  CHECK(clReleaseMemObject(b));
  free(host);
}

/* The lines of /proc/self/maps: the process's memory mappings. */
static int count_mappings(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return 0;
  int lines = 0;
  for (int c; (c = fgetc(f)) != EOF;) lines += c == '\n';
  fclose(f);
  return lines;
}

static void released_while_mapped(cl_command_queue q) {
  size_t sizes[] = { 4096, 64 << 10, 1 << 20 };
  for (int i = 0; i < 3; i++) {
    size_t n = sizes[i];
    for (int with_event = 0; with_event < 2; with_event++) {
      cl_int err;
      cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &err); CHECK(err);
      CHECK(clFinish(q));
      cl_event ev = NULL;
      unsigned char *p = clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_WRITE, 0, n, 0, NULL, with_event ? &ev : NULL, &err);
      CHECK(err);
      if (ev) CHECK(clReleaseEvent(ev));
      CHECK(clReleaseMemObject(b));
      /* Buffers made after the release, with known contents. */
      cl_mem later[4];
      unsigned char *want = malloc(n), *got = malloc(n);
      memset(want, 0x5a, n);
      for (int k = 0; k < 4; k++) {
        later[k] = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n, want, &err); CHECK(err);
      }
      memset(p, 0xa5, n);
      for (int k = 0; k < 4; k++) {
        CHECK(clEnqueueReadBuffer(q, later[k], CL_TRUE, 0, n, got, 0, NULL, NULL));
        EXPECT(memcmp(got, want, n) == 0, "a write through the mapping of a released %zu-byte buffer landed in a later one", n);
        CHECK(clReleaseMemObject(later[k]));
      }
      printf("impl: unmap of a released %zu-byte buffer -> %s\n", n,
             clEnqueueUnmapMemObject(q, b, p, 0, NULL, NULL) == CL_SUCCESS ? "success" : "an error");
      free(want); free(got);
    }
  }
  /* Their memory is given back at the unmap: 200 more released while mapped, written through
   * and unmapped, counted in this process's memory mappings (a 1 MiB buffer's memory is a
   * mapping of its own, directly and caged) over the second hundred (the first fill the pools
   * the cage keeps its staging memory in). */
  int before = 0, failed = 0;
  for (int i = 0; i < 200; i++) {
    if (i == 100) before = count_mappings();
    cl_int err;
    size_t n = 1 << 20;
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &err); CHECK(err);
    void *p = clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_WRITE, 0, n, 0, NULL, NULL, &err); CHECK(err);
    CHECK(clReleaseMemObject(b));
    memset(p, i, n);
    failed += clEnqueueUnmapMemObject(q, b, p, 0, NULL, NULL) != CL_SUCCESS;
  }
  CHECK(clFinish(q));
  int grown = count_mappings() - before;
  printf("impl: unmaps of 200 released buffers that failed: %d\n", failed);
  /* NVIDIA's driver refuses the unmap of a released buffer and keeps its memory; pocl's and the
   * cage's unmap it and give it back. */
  printf("impl: 200 buffers released while mapped, then unmapped: their memory %s\n", grown < 50 ? "given back" : "kept");
  printf("writes through mappings of released buffers ok\n");
}

/* Objects the application released stay while others keep them alive, as the driver keeps
 * them: a kernel its program, a sub-buffer its buffer, a queue and a buffer their context. Their
 * handles still answer (the info queries that name them, new kernels and buffers made from
 * them), and the context's destructor callback runs only once its last object is gone. */
static int context_destroyed;
static void CL_CALLBACK context_gone(cl_context c, void *ud) { (void)c; (void)ud; context_destroyed++; }

static void parents_outlive_their_release(void) {
  cl_int err;
  cl_context c2 = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); CHECK(err);
  CHECK(clSetContextDestructorCallback(c2, context_gone, NULL));
  cl_command_queue q2 = clCreateCommandQueueWithProperties(c2, dev, NULL, &err); CHECK(err);
  cl_program p2 = clCreateProgramWithSource(c2, 1, &SRC, NULL, &err); CHECK(err);
  CHECK(clBuildProgram(p2, 1, &dev, NULL, NULL, NULL));
  cl_kernel k2 = clCreateKernel(p2, "times3", &err); CHECK(err);
  cl_mem whole = clCreateBuffer(c2, CL_MEM_READ_WRITE, 2 * N * sizeof(int), NULL, &err); CHECK(err);
  cl_buffer_region half = { N * sizeof(int), N * sizeof(int) };
  cl_mem sub = clCreateSubBuffer(whole, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &half, &err); CHECK(err);

  CHECK(clReleaseProgram(p2));
  cl_program kp = NULL;
  CHECK(clGetKernelInfo(k2, CL_KERNEL_PROGRAM, sizeof kp, &kp, NULL));
  size_t kernels_in = 0;
  cl_int info_rc = clGetProgramInfo(kp, CL_PROGRAM_NUM_KERNELS, sizeof kernels_in, &kernels_in, NULL);
  cl_kernel again = clCreateKernel(kp, "plus", &err);
  printf("a released program its kernel keeps: CL_KERNEL_PROGRAM %s, its info %d (%zu kernels), a new kernel from it %d\n",
         kp == p2 ? "the same handle" : "another handle", info_rc, kernels_in, err);
  if (err == CL_SUCCESS) CHECK(clReleaseKernel(again));

  CHECK(clReleaseMemObject(whole));
  cl_mem parent = NULL;
  CHECK(clGetMemObjectInfo(sub, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL));
  size_t parent_size = 0;
  cl_int size_rc = clGetMemObjectInfo(parent, CL_MEM_SIZE, sizeof parent_size, &parent_size, NULL);
  CHECK(clSetKernelArg(k2, 0, sizeof sub, &sub));
  size_t g = N;
  CHECK(clEnqueueNDRangeKernel(q2, k2, 1, NULL, &g, NULL, 0, NULL, NULL));
  int got[N];
  CHECK(clEnqueueReadBuffer(q2, sub, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
  printf("a released buffer its sub-buffer keeps: CL_MEM_ASSOCIATED_MEMOBJECT %s, its size %d (%zu), the sub-buffer %s\n",
         parent == whole ? "the same handle" : "another handle", size_rc, parent_size,
         holds(got, N, 0, 3) ? "works" : "WRONG");

  CHECK(clReleaseContext(c2));
  cl_context qc = NULL;
  CHECK(clGetCommandQueueInfo(q2, CL_QUEUE_CONTEXT, sizeof qc, &qc, NULL));
  cl_mem more = clCreateBuffer(qc, CL_MEM_READ_WRITE, 64, NULL, &err);
  printf("a released context its queue keeps: CL_QUEUE_CONTEXT %s, a new buffer in it %d, destroyed %d\n",
         qc == c2 ? "the same handle" : "another handle", err, context_destroyed);
  if (err == CL_SUCCESS) CHECK(clReleaseMemObject(more));
  CHECK(clReleaseKernel(k2));
  CHECK(clReleaseMemObject(sub));
  printf("context destroyed once its objects were released, its queue last: before the queue %d, ", context_destroyed);
  fflush(stdout);
  CHECK(clReleaseCommandQueue(q2));
  /* pocl destroys it a moment later now and then. */
  for (int i = 0; i < 400 && !context_destroyed; i++) usleep(5000);
  printf("after %d\n", context_destroyed);
}

/* An enqueue's event keeps its queue, as a driver's does: released by the application, the
   queue still answers through the event, and its release's implicit flush still happens. */
static void events_keep_their_queue(void) {
  cl_int err;
  cl_command_queue q3 = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  cl_event user = clCreateUserEvent(ctx, &err); CHECK(err);
  cl_event ev;
  CHECK(clEnqueueMarkerWithWaitList(q3, 1, &user, &ev));
  CHECK(clReleaseCommandQueue(q3));
  cl_command_queue eq = NULL;
  CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_QUEUE, sizeof eq, &eq, NULL));
  cl_device_id qd = NULL;
  cl_int rc = clGetCommandQueueInfo(eq, CL_QUEUE_DEVICE, sizeof qd, &qd, NULL);
  CHECK(clSetUserEventStatus(user, CL_COMPLETE));
  CHECK(clWaitForEvents(1, &ev));
  cl_int status = 0;
  CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
  printf("a released queue its event keeps: CL_EVENT_COMMAND_QUEUE %s, its device %d (%s), the marker %s\n",
         eq == q3 ? "the same handle" : "another handle", rc, qd == dev ? "the queue's" : "another",
         status == CL_COMPLETE ? "complete" : "NOT COMPLETE");
  CHECK(clReleaseEvent(ev));
  CHECK(clReleaseEvent(user));
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  main_thread = pthread_self();
  cl_int err;
  ctx = first_device_context(&dev);
  cl_queue_properties props[] = { CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0 };
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, props, &err); CHECK(err);
  prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err); CHECK(err);
  CHECK(clBuildProgram(prog, 1, &dev, NULL, NULL, NULL));
  cl_kernel times3 = clCreateKernel(prog, "times3", &err); CHECK(err);
  cl_kernel plus = clCreateKernel(prog, "plus", &err); CHECK(err);
  cl_kernel spin = clCreateKernel(prog, "spin", &err); CHECK(err);

  nonblocking_reads(q);
  ordered_reads_into_overlapping_memory(q);
  writes_from_memory_a_read_fills(q);
  large_non_blocking_behind_a_gate(q, times3);
  maps(q);
  use_host_ptr(q, times3);
  callbacks(q, times3);
  gating_across_queues(plus);
  out_of_order(plus);
  across_contexts(q);
  profiling(q, spin);
  info_protocol(q, times3);
  kernel_arguments(q, plus);
  released_while_mapped(q);
  oversized_regions(q);
  parents_outlive_their_release();
  events_keep_their_queue();
  if (getenv("GARBAGE")) garbage_handles();

  CHECK(clReleaseKernel(times3)); CHECK(clReleaseKernel(plus)); CHECK(clReleaseKernel(spin));
  CHECK(clReleaseProgram(prog)); CHECK(clReleaseCommandQueue(q)); CHECK(clReleaseContext(ctx));
  printf("PASS\n");
  return 0;
}
