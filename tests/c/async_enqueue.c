/* Asynchronous enqueues (cloister posts the enqueues it can vouch for and returns at once):
 * what an application must still see. Run directly, caged, and caged with CLOISTER_SYNC=1.
 *
 *   stream  20 000 posted kernels incrementing one counter, fills and copies around them, from
 *           two threads' queues; every result read back.
 *   late    an NDRange the driver rejects though it took one of the same shape (run on the fault
 *           driver with enqueue:refuse-odd, which refuses odd global sizes with
 *           CL_OUT_OF_RESOURCES): what the call, its event, the context's callback, the queue's
 *           clFinish and the commands behind it say.
 *   shapes  NDRanges whose work-group sizes the driver refuses (larger than the kernel allows,
 *           partial work-groups where the device has none, not the kernel's required size), each
 *           twice, and ones it takes: every call says what it says directly.
 *   death   many enqueues queued behind one that crashes the driver (with the fault driver):
 *           every later call returns, none hangs.
 *   alloc   a buffer whose allocation the driver fails (the fault driver fails odd sizes):
 *           what its creation, setting it as a kernel's argument, a fill of it, a blocking map
 *           of it, blocking transfers on the idle queue, the context's callback and its release
 *           say, and that a buffer made after it works. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(x)                                                                     \
  do {                                                                               \
    cl_int e_ = (x);                                                                 \
    if (e_ != CL_SUCCESS) {                                                          \
      printf("FAIL %s:%d %s -> %d\n", __FILE__, __LINE__, #x, e_);                   \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

static cl_device_id dev;
static cl_context ctx;
static cl_program prog;
static char heard[4096];
static pthread_mutex_t heard_lock = PTHREAD_MUTEX_INITIALIZER;

static void CL_CALLBACK on_error(const char *info, const void *p, size_t n, void *u) {
  (void)p; (void)n; (void)u;
  pthread_mutex_lock(&heard_lock);
  if (!heard[0]) snprintf(heard, sizeof heard, "%s", info);
  pthread_mutex_unlock(&heard_lock);
}

/* Prints what the context's callback heard, as "WHO: notify heard: ...". The callback runs on
 * cloister's own thread: it gets up to 5 s. */
static void print_heard(const char *who) {
  for (int i = 0; i < 500; i++) {
    pthread_mutex_lock(&heard_lock);
    int got = heard[0] != 0;
    pthread_mutex_unlock(&heard_lock);
    if (got) break;
    usleep(10000);
  }
  printf("%s: notify heard: %s\n", who, heard[0] ? heard : "(nothing)");
}

static const char *SRC =
    "__kernel void inc(__global int *a) { a[get_global_id(0)] += 1; }\n"
    "__kernel __attribute__((reqd_work_group_size(8, 1, 1))) void eight(__global int *a) { a[get_global_id(0)] = 8; }\n"
    "__kernel void twice(__global const int *a, __global int *b) { b[get_global_id(0)] = 2 * a[get_global_id(0)]; }\n";

static void setup(void) {
  cl_platform_id p;
  CHECK(clGetPlatformIDs(1, &p, NULL));
  CHECK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
  cl_int err;
  /* OTHER_CONTEXTS: contexts made before and after this one (one released at once, two kept),
   * as applications and language bindings make them; this one's commands see no difference. */
  int others = getenv("OTHER_CONTEXTS") != NULL;
  cl_context before = NULL, after = NULL;
  if (others) {
    before = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); CHECK(err);
    cl_context gone = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); CHECK(err);
    CHECK(clReleaseContext(gone));
  }
  ctx = clCreateContext(NULL, 1, &dev, on_error, NULL, &err); CHECK(err);
  if (others) { after = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); CHECK(err); }
  (void)before; (void)after;
  prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err); CHECK(err);
  CHECK(clBuildProgram(prog, 1, &dev, NULL, NULL, NULL));
}

/* ---- stream ---- */

#define KERNELS 20000
#define N 64

struct stream_arg { int which; int result[N]; int doubled[N]; };

static void *stream_thread(void *v) {
  struct stream_arg *s = v;
  cl_int err;
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  cl_kernel inc = clCreateKernel(prog, "inc", &err); CHECK(err);
  cl_kernel twice = clCreateKernel(prog, "twice", &err); CHECK(err);
  cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(int), NULL, &err); CHECK(err);
  cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * sizeof(int), NULL, &err); CHECK(err);
  int start = 1000 * s->which, garbage = -7;
  static int starts[2][N];
  for (int i = 0; i < N; i++) starts[s->which][i] = start;
  /* A fill, then a non-blocking write over it: both posted, in this order. */
  CHECK(clEnqueueFillBuffer(q, a, &garbage, sizeof garbage, 0, N * sizeof(int), 0, NULL, NULL));
  CHECK(clEnqueueWriteBuffer(q, a, CL_FALSE, 0, N * sizeof(int), starts[s->which], 0, NULL, NULL));
  CHECK(clSetKernelArg(inc, 0, sizeof a, &a));
  size_t g = N;
  cl_event mid = NULL;
  for (int i = 0; i < KERNELS; i++)
    CHECK(clEnqueueNDRangeKernel(q, inc, 1, NULL, &g, NULL, 0, NULL, i == KERNELS / 2 ? &mid : NULL));
  CHECK(clSetKernelArg(twice, 0, sizeof a, &a));
  CHECK(clSetKernelArg(twice, 1, sizeof b, &b));
  CHECK(clEnqueueNDRangeKernel(q, twice, 1, NULL, &g, NULL, 0, NULL, NULL));
  /* A copy back and a barrier behind it, all without waiting. */
  CHECK(clEnqueueCopyBuffer(q, b, a, 0, 0, N * sizeof(int), 0, NULL, NULL));
  CHECK(clEnqueueBarrierWithWaitList(q, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof s->doubled, s->doubled, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof s->result, s->result, 0, NULL, NULL));
  cl_int st;
  CHECK(clGetEventInfo(mid, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
  if (st != CL_COMPLETE) printf("FAIL the event of kernel %d reads %d after a later blocking read\n", KERNELS / 2, st);
  CHECK(clReleaseEvent(mid));
  CHECK(clReleaseMemObject(a)); CHECK(clReleaseMemObject(b));
  CHECK(clReleaseKernel(inc)); CHECK(clReleaseKernel(twice));
  CHECK(clReleaseCommandQueue(q));
  return NULL;
}

/* Another thread's enqueues are in the driver once its call returned: a thread told of them
 * (here through a pthread barrier, while the enqueuing thread lives on) finds them there. */
struct cross { cl_command_queue q; cl_kernel k; pthread_barrier_t posted, read; };

static void *cross_poster(void *v) {
  struct cross *c = v;
  size_t g = 1;
  for (int i = 0; i < 5000; i++) CHECK(clEnqueueNDRangeKernel(c->q, c->k, 1, NULL, &g, NULL, 0, NULL, NULL));
  pthread_barrier_wait(&c->posted);
  pthread_barrier_wait(&c->read);
  return NULL;
}

static void cross_thread(void) {
  cl_int err;
  struct cross c;
  c.q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  c.k = clCreateKernel(prog, "inc", &err); CHECK(err);
  cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof(int), NULL, &err); CHECK(err);
  int v = 0;
  CHECK(clEnqueueWriteBuffer(c.q, a, CL_TRUE, 0, sizeof v, &v, 0, NULL, NULL));
  CHECK(clSetKernelArg(c.k, 0, sizeof a, &a));
  pthread_barrier_init(&c.posted, NULL, 2);
  pthread_barrier_init(&c.read, NULL, 2);
  pthread_t t;
  pthread_create(&t, NULL, cross_poster, &c);
  pthread_barrier_wait(&c.posted);
  /* No clFinish: an in-order queue runs the read after everything enqueued before it. */
  CHECK(clEnqueueReadBuffer(c.q, a, CL_TRUE, 0, sizeof v, &v, 0, NULL, NULL));
  pthread_barrier_wait(&c.read);
  pthread_join(t, NULL);
  printf("another thread's 5000 enqueues, then a read here: %d\n", v);
  CHECK(clReleaseMemObject(a)); CHECK(clReleaseKernel(c.k)); CHECK(clReleaseCommandQueue(c.q));
}

static void stream(void) {
  struct stream_arg s[2] = { { .which = 0 }, { .which = 1 } };
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, stream_thread, &s[i]);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  for (int w = 0; w < 2; w++) {
    int want = 1000 * w + KERNELS;
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= s[w].doubled[i] == 2 * want && s[w].result[i] == 2 * want;
    printf("stream %d: %d increments then double, copy back: %s (%d, %d)\n", w, KERNELS, ok ? "right" : "WRONG",
           s[w].result[0], s[w].doubled[N - 1]);
  }
}

/* ---- late ---- */

static cl_int status_of(cl_event e) {
  cl_int st = 1;
  cl_int rc = clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL);
  return rc == CL_SUCCESS ? st : rc;
}

static void late(void) {
  cl_int err;
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  cl_kernel inc = clCreateKernel(prog, "inc", &err); CHECK(err);
  /* `odd` work-items: the fault driver refuses the NDRange; `global`: it runs it. Both let the
   * driver pick the local size, so they are one shape to the cage, which has seen the driver
   * take it. */
  size_t global = 64, odd = 63;
  cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE, global * sizeof(int), NULL, &err); CHECK(err);
  int zero = 0;
  CHECK(clSetKernelArg(inc, 0, sizeof a, &a));
  CHECK(clEnqueueNDRangeKernel(q, inc, 1, NULL, &global, NULL, 0, NULL, NULL));
  CHECK(clEnqueueFillBuffer(q, a, &zero, sizeof zero, 0, global * sizeof(int), 0, NULL, NULL));
  CHECK(clFinish(q));
  cl_event ev = NULL;
  cl_int rc = clEnqueueNDRangeKernel(q, inc, 1, NULL, &odd, NULL, 0, NULL, &ev);
  printf("rejected NDRange -> %d\n", rc);
  if (rc == CL_SUCCESS) {
    /* Cloister posted it: the driver's error comes late. */
    cl_int fin = clFinish(q);
    printf("late: clFinish -> %d\n", fin);
    printf("late: event status %d\n", status_of(ev));
    printf("late: wait on its event -> %d\n", clWaitForEvents(1, &ev));
    cl_event after = NULL;
    CHECK(clEnqueueMarkerWithWaitList(q, 1, &ev, &after));
    cl_int w = clWaitForEvents(1, &after);
    printf("late: a marker waiting on it: wait -> %d, status %s\n", w, status_of(after) < 0 ? "negative" : "not negative");
    printf("late: clFinish again -> %d\n", clFinish(q));
    /* The next blocking call on the queue, whichever it is, returns the late error once. */
    CHECK(clEnqueueNDRangeKernel(q, inc, 1, NULL, &odd, NULL, 0, NULL, NULL));
    cl_int mrc = 1;
    void *mp = clEnqueueMapBuffer(q, a, CL_TRUE, CL_MAP_READ, 0, sizeof(int), 0, NULL, NULL, &mrc);
    printf("late: then a blocking map -> %d (%s)\n", mrc, mp ? "mapped" : "NULL");
    if (mp) CHECK(clEnqueueUnmapMemObject(q, a, mp, 0, NULL, NULL));
    CHECK(clEnqueueNDRangeKernel(q, inc, 1, NULL, &odd, NULL, 0, NULL, NULL));
    int one;
    printf("late: then a blocking read -> %d\n", clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof one, &one, 0, NULL, NULL));
    printf("late: and the next one -> %d\n", clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof one, &one, 0, NULL, NULL));
    /* A blocking write that meets a late error is still made, and the error is returned once: by
     * the write (the shim's own copy into a zero-copy buffer; 8 MiB through the buffer's memory,
     * or pipelined through staging), or by the clFinish after it where the write was posted (a
     * small staged one). */
    CHECK(clEnqueueNDRangeKernel(q, inc, 1, NULL, &odd, NULL, 0, NULL, NULL));
    int seven = 7, back = 0;
    cl_int wrc = clEnqueueWriteBuffer(q, a, CL_TRUE, 0, sizeof seven, &seven, 0, NULL, NULL);
    cl_int frc = clFinish(q);
    CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof back, &back, 0, NULL, NULL));
    printf("late: then a blocking write -> %d, clFinish -> %d, read back %d\n", wrc, frc, back);
    size_t big_size = 8 << 20;
    cl_mem big = clCreateBuffer(ctx, CL_MEM_READ_WRITE, big_size, NULL, &err); CHECK(err);
    unsigned char *src = malloc(big_size), *dst = malloc(big_size);
    if (!src || !dst) { printf("FAIL out of memory\n"); exit(1); }
    for (size_t i = 0; i < big_size; i++) src[i] = (unsigned char)(i * 7 + 3);
    memset(dst, 0, big_size);
    CHECK(clEnqueueNDRangeKernel(q, inc, 1, NULL, &odd, NULL, 0, NULL, NULL));
    cl_int brc = clEnqueueWriteBuffer(q, big, CL_TRUE, 0, big_size, src, 0, NULL, NULL);
    cl_int bfrc = clFinish(q);
    CHECK(clEnqueueReadBuffer(q, big, CL_TRUE, 0, big_size, dst, 0, NULL, NULL));
    printf("late: then an 8 MiB blocking write -> %d, clFinish -> %d, read back %s\n", brc, bfrc,
           memcmp(src, dst, big_size) ? "different" : "the same");
    free(src);
    free(dst);
    CHECK(clReleaseMemObject(big));
    CHECK(clReleaseEvent(after));
    CHECK(clReleaseEvent(ev));
    print_heard("late");
  }
  /* The queue still works, with the kernel's arguments as they were set. */
  size_t g = global;
  CHECK(clEnqueueNDRangeKernel(q, inc, 1, NULL, &g, NULL, 0, NULL, NULL));
  int got[2];
  CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, (global - 2) * sizeof(int), sizeof got, got, 0, NULL, NULL));
  printf("afterwards a good NDRange: %d %d\n", got[0], got[1]);
  /* Overlapping copies between a buffer and its sub-buffer, and between two sub-buffers of one
   * buffer: the driver refuses them at the call, and so does the cage (before, it posted them:
   * CL_SUCCESS, then clFinish -8). */
  cl_mem parent = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 65536, NULL, &err); CHECK(err);
  cl_buffer_region first = { 0, 8192 }, second = { 4096, 8192 };
  cl_mem sub1 = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &first, &err); CHECK(err);
  cl_mem sub2 = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &second, &err); CHECK(err);
  cl_int subs = clEnqueueCopyBuffer(q, sub1, sub2, 4096, 0, 4096, 0, NULL, NULL);
  cl_int parent_sub = clEnqueueCopyBuffer(q, parent, sub2, 4096, 0, 4096, 0, NULL, NULL);
  cl_int disjoint = clEnqueueCopyBuffer(q, sub1, sub2, 0, 4096, 4096, 0, NULL, NULL);
  cl_int fin = clFinish(q);
  printf("overlapping copies: sub-buffer to sub-buffer %d, buffer to its sub-buffer %d; disjoint %d; clFinish %d\n",
         subs, parent_sub, disjoint, fin);
  CHECK(clReleaseMemObject(sub1)); CHECK(clReleaseMemObject(sub2)); CHECK(clReleaseMemObject(parent));
  CHECK(clReleaseMemObject(a)); CHECK(clReleaseKernel(inc)); CHECK(clReleaseCommandQueue(q));
}

/* ---- death ---- */

static void death(void) {
  cl_int err;
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  cl_kernel inc = clCreateKernel(prog, "inc", &err); CHECK(err);
  cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof(int), NULL, &err); CHECK(err);
  CHECK(clSetKernelArg(inc, 0, sizeof a, &a));
  size_t g = 1;
  cl_event evs[3] = { NULL, NULL, NULL };
  int ok = 0, first_error = 0;
  /* The fault driver crashes in the second NDRange (CLOISTER_FAULT_SKIP=1; the first, of a new
   * launch shape, goes as a call): the worker dies with the rest queued. */
  for (int i = 0; i < 3000; i++) {
    cl_event *e = i == 0 ? &evs[0] : i == 1500 ? &evs[1] : i == 2999 ? &evs[2] : NULL;
    cl_int rc = clEnqueueNDRangeKernel(q, inc, 1, NULL, &g, NULL, 0, NULL, e);
    if (rc == CL_SUCCESS) ok++;
    else if (!first_error) first_error = rc;
  }
  printf("death: %d enqueues returned CL_SUCCESS, then %d\n", ok, first_error);
  printf("death: clFinish -> %d\n", clFinish(q));
  for (int i = 0; i < 3; i++) {
    if (!evs[i]) { printf("death: event %d was never returned\n", i); continue; }
    printf("death: wait on event %d -> %d, status %d\n", i, clWaitForEvents(1, &evs[i]), status_of(evs[i]));
    clReleaseEvent(evs[i]);
  }
  int v = 0;
  printf("death: blocking read -> %d\n", clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof v, &v, 0, NULL, NULL));
  clReleaseMemObject(a); clReleaseKernel(inc); clReleaseCommandQueue(q);
  printf("death: still running\n");
}

/* ---- alloc ---- */

static void alloc(void) {
  cl_int err;
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  cl_kernel inc = clCreateKernel(prog, "inc", &err); CHECK(err);
  cl_mem bad = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4099, NULL, &err);
  printf("odd-sized buffer -> %d\n", err);
  if (err == CL_SUCCESS) {
    /* Cloister posted its creation: the driver's failure comes at its uses. */
    printf("alloc: as a kernel's argument -> %d\n", clSetKernelArg(inc, 0, sizeof bad, &bad));
    int zero = 0;
    printf("alloc: a fill of it -> %d\n", clEnqueueFillBuffer(q, bad, &zero, sizeof zero, 0, 4, 0, NULL, NULL));
    printf("alloc: clFinish -> %d\n", clFinish(q));
    cl_int mrc = 1;
    void *mp = clEnqueueMapBuffer(q, bad, CL_TRUE, CL_MAP_READ, 0, 4, 0, NULL, NULL, &mrc);
    printf("alloc: blocking map -> %d (%s)\n", mrc, mp ? "mapped" : "NULL");
    /* With the queue idle again, a transfer cloister would make itself (a zero-copy buffer on a
     * CPU device) must still fail as the driver's does, not land in memory no buffer owns. */
    printf("alloc: clFinish again -> %d\n", clFinish(q));
    int v = 7;
    printf("alloc: blocking write -> %d\n", clEnqueueWriteBuffer(q, bad, CL_TRUE, 0, sizeof v, &v, 0, NULL, NULL));
    printf("alloc: blocking read -> %d\n", clEnqueueReadBuffer(q, bad, CL_TRUE, 0, sizeof v, &v, 0, NULL, NULL));
    printf("alloc: clFinish after them -> %d\n", clFinish(q));
    /* A blocking write large enough to be pipelined (staged, its chunks are posted): the
     * driver's code from the call, and said once. */
    size_t big = (4 << 20) + 1;
    cl_mem big_bad = clCreateBuffer(ctx, CL_MEM_READ_WRITE, big, NULL, &err); CHECK(err);
    char *src = calloc(1, big);
    if (!src) { printf("FAIL out of memory\n"); exit(1); }
    cl_int brc = clEnqueueWriteBuffer(q, big_bad, CL_TRUE, 0, big, src, 0, NULL, NULL);
    printf("alloc: a 4 MiB blocking write -> %d, clFinish after it -> %d\n", brc, clFinish(q));
    free(src);
    CHECK(clReleaseMemObject(big_bad));
    printf("alloc: release -> %d\n", clReleaseMemObject(bad));
    print_heard("alloc");
  }
  /* The same with contents (posted with them in a pooled segment when not zero-copy). */
  static char contents[4099];
  cl_mem bad2 = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof contents, contents, &err);
  printf("odd-sized buffer with contents -> %d\n", err);
  if (err == CL_SUCCESS) {
    printf("alloc: with contents, as a kernel's argument -> %d\n", clSetKernelArg(inc, 0, sizeof bad2, &bad2));
    printf("alloc: with contents, release -> %d\n", clReleaseMemObject(bad2));
  }
  /* The context, the queue and the kernel still work, with a buffer the driver could make. */
  cl_mem good = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err); CHECK(err);
  int zero = 0, got = -1;
  CHECK(clEnqueueFillBuffer(q, good, &zero, sizeof zero, 0, 4096, 0, NULL, NULL));
  CHECK(clSetKernelArg(inc, 0, sizeof good, &good));
  size_t g = 8;
  CHECK(clEnqueueNDRangeKernel(q, inc, 1, NULL, &g, NULL, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, good, CL_TRUE, 0, sizeof got, &got, 0, NULL, NULL));
  printf("afterwards a buffer the driver could make: %d\n", got);
  CHECK(clReleaseMemObject(good)); CHECK(clReleaseKernel(inc)); CHECK(clReleaseCommandQueue(q));
}

/* ---- shapes ---- */

/* Each NDRange twice (the second of a shape the driver took is posted), then clFinish. */
static void shape(cl_command_queue q, cl_kernel k, const char *what, size_t global, const size_t *local) {
  cl_int first = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, local, 0, NULL, NULL);
  cl_int second = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, local, 0, NULL, NULL);
  printf("shapes: %s -> %d, again %d, clFinish %d\n", what, first, second, clFinish(q));
}

static void shapes(void) {
  cl_int err;
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err); CHECK(err);
  cl_kernel inc = clCreateKernel(prog, "inc", &err); CHECK(err);
  cl_kernel eight = clCreateKernel(prog, "eight", &err); CHECK(err);
  size_t wg = 0;
  CHECK(clGetKernelWorkGroupInfo(inc, dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL));
  cl_bool non_uniform = CL_FALSE;
  CHECK(clGetDeviceInfo(dev, CL_DEVICE_NON_UNIFORM_WORK_GROUP_SUPPORT, sizeof non_uniform, &non_uniform, NULL));
  printf("shapes: the device has non-uniform work-groups: %s\n", non_uniform ? "yes" : "no");
  size_t n = wg * 4;
  cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n * sizeof(int), NULL, &err); CHECK(err);
  CHECK(clSetKernelArg(inc, 0, sizeof a, &a));
  CHECK(clSetKernelArg(eight, 0, sizeof a, &a));
  size_t too_large = wg * 2, whole = wg, sixteen = 16, four = 4, eight_ = 8;
  shape(q, inc, "a work-group larger than the kernel allows", wg * 2, &too_large);
  shape(q, inc, "the kernel's largest work-group", wg * 2, &whole);
  shape(q, inc, "60 work-items in groups of 16 (OpenCL C 1.2: uniform)", 60, &sixteen);
  shape(q, inc, "64 work-items in groups of 16", 64, &sixteen);
  shape(q, inc, "60 work-items, the driver's groups", 60, NULL);
  shape(q, eight, "required 8, groups of 4", 64, &four);
  shape(q, eight, "required 8, groups of 8", 64, &eight_);
  shape(q, eight, "required 8, 60 work-items, the driver's groups", 60, NULL);
  shape(q, eight, "required 8, 64 work-items, the driver's groups", 64, NULL);
  int got[2] = { 0, 0 };
  CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL));
  printf("shapes: read back %d %d\n", got[0], got[1]);
  CHECK(clReleaseMemObject(a)); CHECK(clReleaseKernel(inc)); CHECK(clReleaseKernel(eight));
  CHECK(clReleaseCommandQueue(q));
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *mode = argc > 1 ? argv[1] : "stream";
  setup();
  if (!strcmp(mode, "stream")) { stream(); cross_thread(); }
  else if (!strcmp(mode, "late")) late();
  else if (!strcmp(mode, "shapes")) shapes();
  else if (!strcmp(mode, "death")) death();
  else if (!strcmp(mode, "alloc")) alloc();
  else { printf("unknown mode %s\n", mode); return 2; }
  printf("done\n");
  return 0;
}
