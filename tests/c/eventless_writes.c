/* Non-blocking writes without an event (issue 12): caged, a write through a shared segment on an
 * in-order queue goes without an event of the shim's own, and its segment returns to the pool
 * once a later command of the same thread, a clFinish, a blocking transfer or the queue's
 * release says it completed. This client makes each of those the only thing that can, in turn,
 * checks every byte against its own reference, and checks that the shim's shared segments
 * (mappings named cloister-segment) stop growing after the first rounds: a segment never given
 * back would show as one more mapping per write.
 *
 * Patterns: writes then clFinish; writes then a blocking read; writes and no wait until the
 * end; writes on a queue released without a clFinish; writes from two threads (each with its queue), then clFinish. The last
 * line is "eventless writes ok"; a failed check prints FAIL and exits 1. */
#include "check.h"
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* Below the cage's zero-copy floor (64 KiB), so writes go through shared segments. */
#define SIZE (16 << 10)
#define WRITES 20
#define ROUNDS 600

static cl_context ctx;
static cl_device_id dev;

static void randomize(unsigned char *p, size_t n, uint64_t *rng) {
  for (size_t i = 0; i < n; i++) {
    *rng ^= *rng << 13; *rng ^= *rng >> 7; *rng ^= *rng << 17;
    p[i] = (unsigned char)*rng;
  }
}

/* The shim's shared segments mapped in this process (0 when run directly). */
static int segments(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "cloister-segment")) n++;
  fclose(f);
  return n;
}

/* One round: WRITES non-blocking writes of random chunks at random offsets of `m`, each from a
 * host chunk of its own (untouched until the round's sync point), applied to `ref` too. */
static void writes(cl_command_queue q, cl_mem m, unsigned char *ref, unsigned char (*src)[1024], uint64_t *rng) {
  for (int i = 0; i < WRITES; i++) {
    uint64_t r = *rng;
    size_t len = 1 + r % 1024, off = (r >> 20) % (SIZE - len + 1);
    randomize(src[i], len, rng);
    memcpy(ref + off, src[i], len);
    CHECK(clEnqueueWriteBuffer(q, m, CL_FALSE, off, len, src[i], 0, NULL, NULL));
  }
}

static void same(cl_command_queue q, cl_mem m, const unsigned char *ref, const char *what, int round) {
  unsigned char *got = malloc(SIZE);
  CHECK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, SIZE, got, 0, NULL, NULL));
  for (size_t i = 0; i < SIZE; i++)
    EXPECT(got[i] == ref[i], "%s, round %d: byte %zu is %d, expected %d", what, round, i, got[i], ref[i]);
  free(got);
}

/* Segments may be made for the first rounds (the pool fills); after that a round must find
 * them in the pool: at most `more` new ones (a leak makes one per write). */
static void bounded(int before, int more, const char *what) {
  int after = segments();
  EXPECT(after - before <= more, "%s: %d shared segments mapped after the first rounds, %d at the end", what, before, after);
  printf("%s: segments bounded\n", what);
}

struct worker { cl_mem m; unsigned char ref[SIZE]; uint64_t rng; int failed; };

static void *thread_writes(void *arg) {
  struct worker *w = arg;
  cl_int err;
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
  CHECK(err);
  static __thread unsigned char src[WRITES][1024];
  for (int round = 0; round < ROUNDS / 4; round++) {
    writes(q, w->m, w->ref, src, &w->rng);
    CHECK(clFinish(q));
  }
  same(q, w->m, w->ref, "two threads", ROUNDS / 4);
  CHECK(clReleaseCommandQueue(q));
  return NULL;
}

int main(void) {
  cl_int err;
  ctx = first_device_context(&dev);
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
  CHECK(err);
  static unsigned char ref[SIZE], src[WRITES][1024];
  memset(ref, 0, SIZE);
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, SIZE, ref, &err);
  CHECK(err);
  uint64_t rng = 0x9e3779b97f4a7c15ull;

  /* Writes, then clFinish: the finish says they completed. */
  int before = 0;
  for (int round = 0; round < ROUNDS; round++) {
    if (round == 20) before = segments();
    writes(q, m, ref, src, &rng);
    CHECK(clFinish(q));
  }
  same(q, m, ref, "writes then clFinish", ROUNDS);
  bounded(before, 2 * WRITES, "writes then clFinish");

  /* Writes, then a blocking read of the whole buffer: the read says they completed. */
  for (int round = 0; round < ROUNDS; round++) {
    if (round == 20) before = segments();
    writes(q, m, ref, src, &rng);
    same(q, m, ref, "writes then a blocking read", round);
  }
  bounded(before, 2 * WRITES, "writes then a blocking read");

  /* Writes and never a wait until the end: only the writes that take an event again once many
   * are pending (and a later one of the same thread completing) give the segments back. The
   * host chunks stay as they are meanwhile (a non-blocking write may read them until then). */
  static unsigned char fixed[WRITES][1024];
  for (int i = 0; i < WRITES; i++) randomize(fixed[i], sizeof fixed[i], &rng);
  for (int round = 0; round < ROUNDS; round++) {
    if (round == 20) before = segments();
    for (int i = 0; i < WRITES; i++) {
      size_t len = 1 + (round * 31 + i * 7) % 1024, off = (round * 997 + i * 131) % (SIZE - len + 1);
      memcpy(ref + off, fixed[i], len);
      CHECK(clEnqueueWriteBuffer(q, m, CL_FALSE, off, len, fixed[i], 0, NULL, NULL));
    }
  }
  CHECK(clFinish(q));
  same(q, m, ref, "writes without a wait", ROUNDS);
  /* Without waits the application runs ahead of the driver: the writes still in the lane's ring
   * or the driver's queue hold their segments, as many as the ring holds. A leak is one segment
   * per write, twelve thousand here. */
  bounded(before, ROUNDS * WRITES / 4, "writes without a wait");

  /* Writes on a queue released without a clFinish: only its release can say they completed.
   * Nothing orders them with another queue, so they go to a buffer of their own, never read,
   * from host chunks of their own, and only the segments are counted. */
  cl_mem unread = clCreateBuffer(ctx, CL_MEM_READ_WRITE, SIZE, NULL, &err);
  CHECK(err);
  static unsigned char scratch[SIZE], scratch_src[WRITES][1024];
  for (int round = 0; round < ROUNDS / 4; round++) {
    if (round == 20) before = segments();
    cl_command_queue q2 = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    CHECK(err);
    writes(q2, unread, scratch, scratch_src, &rng);
    CHECK(clReleaseCommandQueue(q2));
  }
  bounded(before, 2 * WRITES, "writes on a queue released unfinished");

  /* Writes from two threads, each on a queue of its own, then clFinish. */
  struct worker w[2];
  pthread_t t[2];
  for (int i = 0; i < 2; i++) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].rng = 0x1234567ull * (i + 1);
    w[i].m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, SIZE, w[i].ref, &err);
    CHECK(err);
    EXPECT(pthread_create(&t[i], NULL, thread_writes, &w[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < 2; i++) {
    pthread_join(t[i], NULL);
    CHECK(clReleaseMemObject(w[i].m));
  }
  printf("two threads: ok\n");

  /* And the main thread again, after the others posted. */
  for (int round = 0; round < ROUNDS / 4; round++) {
    writes(q, m, ref, src, &rng);
    CHECK(clFinish(q));
  }
  same(q, m, ref, "writes after other threads", ROUNDS / 4);

  CHECK(clReleaseMemObject(m));
  CHECK(clReleaseMemObject(unread));
  CHECK(clReleaseCommandQueue(q));
  CHECK(clReleaseContext(ctx));
  printf("eventless writes ok\n");
  return 0;
}
