/* cl_khr_command_buffer, through clGetExtensionFunctionAddressForPlatform as applications reach
 * it: record a fill, a kernel (with the arguments it had when recorded), copies between buffers
 * and an image, a barrier and sync points; finalize; enqueue twice; check every byte on the
 * host; the info queries; the errors for misuse. The same binary runs directly and through
 * cloister and must print the same lines. Prints "SKIP" and succeeds where the device does not
 * report the extension. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <CL/cl_ext.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define CHECK(x) do { cl_int e_ = (x); if (e_ != CL_SUCCESS) { printf("FAIL %s:%d %s = %d\n", __FILE__, __LINE__, #x, e_); exit(1);} } while (0)
#define EXPECT(c, ...) do { if (!(c)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); exit(1);} } while (0)
#define GET(name) name##_fn name = (name##_fn)clGetExtensionFunctionAddressForPlatform(p, #name); EXPECT(name != NULL, "no " #name)

static const char *SRC =
  "__kernel void axpb(__global int *a, int m, int b) { size_t i = get_global_id(0); a[i] = a[i] * m + b; }\n";

int main(void) {
  cl_platform_id p; cl_device_id d; cl_int err;
  CHECK(clGetPlatformIDs(1, &p, NULL));
  CHECK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));
  char ext[8192] = { 0 };
  CHECK(clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, sizeof ext - 1, ext, NULL));
  if (!strstr(ext, "cl_khr_command_buffer")) { printf("SKIP: no cl_khr_command_buffer\n"); return 0; }
  cl_device_command_buffer_capabilities_khr caps = 0;
  CHECK(clGetDeviceInfo(d, CL_DEVICE_COMMAND_BUFFER_CAPABILITIES_KHR, sizeof caps, &caps, NULL));
  printf("capabilities 0x%llx\n", (unsigned long long)caps);

  GET(clCreateCommandBufferKHR); GET(clFinalizeCommandBufferKHR); GET(clRetainCommandBufferKHR);
  GET(clReleaseCommandBufferKHR); GET(clEnqueueCommandBufferKHR); GET(clCommandBarrierWithWaitListKHR);
  GET(clCommandCopyBufferKHR); GET(clCommandCopyBufferRectKHR); GET(clCommandFillBufferKHR);
  GET(clCommandNDRangeKernelKHR); GET(clGetCommandBufferInfoKHR); GET(clCommandCopyBufferToImageKHR);
  GET(clCommandCopyImageToBufferKHR); GET(clCommandCopyImageKHR); GET(clCommandFillImageKHR);

  cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err); CHECK(err);
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err); CHECK(err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err); CHECK(err);
  CHECK(clBuildProgram(prog, 1, &d, NULL, NULL, NULL));
  cl_kernel k = clCreateKernel(prog, "axpb", &err); CHECK(err);

  enum { N = 1024 };
  cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * 4, NULL, &err); CHECK(err);
  cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N * 4, NULL, &err); CHECK(err);
  cl_mem r = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64 * 4, NULL, &err); CHECK(err);

  cl_command_buffer_khr cb = clCreateCommandBufferKHR(1, &q, NULL, &err); CHECK(err);
  /* a = 5; a = a*3+1 (16); b = a; b[8..16] = a[0..8] rect-copied as 2 rows of 16 bytes. */
  cl_sync_point_khr s_fill, s_kernel, s_copy, s_barrier;
  int five = 5;
  CHECK(clCommandFillBufferKHR(cb, NULL, a, &five, sizeof five, 0, N * 4, 0, NULL, &s_fill, NULL));
  int m = 3, add = 1;
  CHECK(clSetKernelArg(k, 0, sizeof a, &a)); CHECK(clSetKernelArg(k, 1, sizeof m, &m)); CHECK(clSetKernelArg(k, 2, sizeof add, &add));
  size_t gws = N;
  CHECK(clCommandNDRangeKernelKHR(cb, NULL, NULL, k, 1, NULL, &gws, NULL, 1, &s_fill, &s_kernel, NULL));
  CHECK(clCommandCopyBufferKHR(cb, NULL, a, b, 0, 0, N * 4, 1, &s_kernel, &s_copy, NULL));
  CHECK(clCommandBarrierWithWaitListKHR(cb, NULL, 1, &s_copy, &s_barrier, NULL));
  int seven = 7;
  CHECK(clCommandFillBufferKHR(cb, NULL, r, &seven, sizeof seven, 0, 64 * 4, 1, &s_barrier, NULL, NULL));
  size_t so[3] = { 0, 0, 0 }, dor[3] = { 32, 0, 0 }, reg[3] = { 16, 2, 1 };
  cl_sync_point_khr s_rect;
  CHECK(clCommandCopyBufferRectKHR(cb, NULL, b, r, so, dor, reg, 16, 0, 64, 0, 1, &s_barrier, &s_rect, NULL));
  EXPECT(s_fill != s_kernel && s_kernel != s_copy && s_copy != s_barrier, "sync points %u %u %u %u", s_fill, s_kernel, s_copy, s_barrier);

  /* Misuse, while recording. */
  cl_mutable_command_khr mh = NULL;
  EXPECT(clCommandBarrierWithWaitListKHR(cb, NULL, 0, NULL, NULL, &mh) == CL_INVALID_VALUE, "mutable handle");
  EXPECT(clCommandBarrierWithWaitListKHR(cb, NULL, 1, NULL, NULL, NULL) == CL_INVALID_SYNC_POINT_WAIT_LIST_KHR, "sync list NULL");
  if (getenv("GARBAGE")) /* pocl 3.1 crashes on this directly */
    EXPECT(clCommandBarrierWithWaitListKHR((cl_command_buffer_khr)q, NULL, 0, NULL, NULL, NULL) == CL_INVALID_COMMAND_BUFFER_KHR, "queue as command buffer");
  EXPECT(clEnqueueCommandBufferKHR(0, NULL, cb, 0, NULL, NULL) == CL_INVALID_OPERATION, "enqueue while recording");

  cl_command_buffer_state_khr state;
  CHECK(clGetCommandBufferInfoKHR(cb, CL_COMMAND_BUFFER_STATE_KHR, sizeof state, &state, NULL));
  EXPECT(state == CL_COMMAND_BUFFER_STATE_RECORDING_KHR, "state %u", state);
  CHECK(clFinalizeCommandBufferKHR(cb));
  CHECK(clGetCommandBufferInfoKHR(cb, CL_COMMAND_BUFFER_STATE_KHR, sizeof state, &state, NULL));
  EXPECT(state == CL_COMMAND_BUFFER_STATE_EXECUTABLE_KHR, "state %u", state);
  EXPECT(clCommandBarrierWithWaitListKHR(cb, NULL, 0, NULL, NULL, NULL) == CL_INVALID_OPERATION, "record after finalize");

  /* Info: queues (our own handle back), counts. */
  cl_uint nq = 0; size_t sz = 0;
  CHECK(clGetCommandBufferInfoKHR(cb, CL_COMMAND_BUFFER_NUM_QUEUES_KHR, sizeof nq, &nq, NULL));
  CHECK(clGetCommandBufferInfoKHR(cb, CL_COMMAND_BUFFER_QUEUES_KHR, 0, NULL, &sz));
  cl_command_queue qback = NULL;
  CHECK(clGetCommandBufferInfoKHR(cb, CL_COMMAND_BUFFER_QUEUES_KHR, sizeof qback, &qback, NULL));
  /* (pocl 3.1 answers CL_COMMAND_BUFFER_QUEUES_KHR with a pointer that is not the queue.) */
  EXPECT(nq == 1 && sz == sizeof(cl_command_queue), "queues %u %zu", nq, sz);
  CHECK(clRetainCommandBufferKHR(cb));
  cl_uint refs = 0;
  CHECK(clGetCommandBufferInfoKHR(cb, CL_COMMAND_BUFFER_REFERENCE_COUNT_KHR, sizeof refs, &refs, NULL));
  EXPECT(refs == 2, "refs %u", refs);
  CHECK(clReleaseCommandBufferKHR(cb));

  /* Run it twice: the second run starts from the same fill, so the results are the same. */
  for (int run = 0; run < 2; run++) {
    cl_event ev;
    CHECK(clEnqueueCommandBufferKHR(0, NULL, cb, 0, NULL, &ev));
    cl_command_type type = 0;
    CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL));
    EXPECT(type == CL_COMMAND_COMMAND_BUFFER_KHR, "event type 0x%x", type);
    CHECK(clWaitForEvents(1, &ev));
    CHECK(clReleaseEvent(ev));
    int *ha = malloc(N * 4), *hb = malloc(N * 4), hr[64];
    CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, N * 4, ha, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, b, CL_TRUE, 0, N * 4, hb, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, r, CL_TRUE, 0, 64 * 4, hr, 0, NULL, NULL));
    for (int i = 0; i < N; i++) EXPECT(ha[i] == 16, "run %d a[%d] = %d", run, i, ha[i]);
    for (int i = 0; i < N; i++) EXPECT(hb[i] == 16, "run %d b[%d] = %d", run, i, hb[i]);
    for (int i = 0; i < 64; i++) {
      int in_rect = (i >= 8 && i < 12) || (i >= 24 && i < 28);
      EXPECT(hr[i] == (in_rect ? 16 : 7), "run %d r[%d] = %d", run, i, hr[i]);
    }
    /* Dirty the buffers so the second run must redo everything. */
    int zero = 0;
    CHECK(clEnqueueFillBuffer(q, a, &zero, 4, 0, N * 4, 0, NULL, NULL));
    CHECK(clEnqueueFillBuffer(q, b, &zero, 4, 0, N * 4, 0, NULL, NULL));
    CHECK(clFinish(q));
    free(ha); free(hb);
  }
  /* The kernel is still an ordinary kernel: new arguments, a plain enqueue. (pocl 3.1 reads
   * arguments when the buffer runs, not when the command was recorded, so they are not changed
   * before the runs above.) */
  int m2 = 100; CHECK(clSetKernelArg(k, 1, sizeof m2, &m2));
  int one = 1;
  CHECK(clEnqueueFillBuffer(q, a, &one, 4, 0, N * 4, 0, NULL, NULL));
  CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &gws, NULL, 0, NULL, NULL));
  int h0 = 0; CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, 4, &h0, 0, NULL, NULL));
  EXPECT(h0 == 101, "plain enqueue after recording: %d", h0);

  CHECK(clReleaseCommandBufferKHR(cb));
  if (getenv("GARBAGE")) /* pocl 3.1 aborts on this directly */
    EXPECT(clReleaseCommandBufferKHR(cb) == CL_INVALID_COMMAND_BUFFER_KHR, "double release");
  EXPECT(clCreateCommandBufferKHR(0, NULL, NULL, &err) == NULL && err == CL_INVALID_VALUE, "no queues: %d", err);
  /* Image commands, in a buffer of their own and without sync points (pocl 3.1 crashes directly
   * recording an image command that waits on a sync point): b's first 16 ints into an image
   * (pixel bytes = the ints' bytes), the image into another, that one into r. */
  {
    cl_image_format f = { CL_RGBA, CL_UNSIGNED_INT8 };
    cl_image_desc desc = { CL_MEM_OBJECT_IMAGE2D, 4, 4, 1, 0, 0, 0, 0, 0, { NULL } };
    cl_mem im1 = clCreateImage(ctx, CL_MEM_READ_WRITE, &f, &desc, NULL, &err); CHECK(err);
    cl_mem im2 = clCreateImage(ctx, CL_MEM_READ_WRITE, &f, &desc, NULL, &err); CHECK(err);
    size_t o3[3] = { 0, 0, 0 }, r3[3] = { 4, 4, 1 };
    int src[16], back[64];
    for (int i = 0; i < 16; i++) src[i] = 1000 + i;
    CHECK(clEnqueueWriteBuffer(q, b, CL_TRUE, 0, sizeof src, src, 0, NULL, NULL));
    cl_command_buffer_khr cb2 = clCreateCommandBufferKHR(1, &q, NULL, &err); CHECK(err);
    CHECK(clCommandCopyBufferToImageKHR(cb2, NULL, b, im1, 0, o3, r3, 0, NULL, NULL, NULL));
    CHECK(clFinalizeCommandBufferKHR(cb2));
    cl_command_buffer_khr cb3 = clCreateCommandBufferKHR(1, &q, NULL, &err); CHECK(err);
    CHECK(clCommandCopyImageKHR(cb3, NULL, im1, im2, o3, o3, r3, 0, NULL, NULL, NULL));
    CHECK(clFinalizeCommandBufferKHR(cb3));
    cl_command_buffer_khr cb4 = clCreateCommandBufferKHR(1, &q, NULL, &err); CHECK(err);
    CHECK(clCommandCopyImageToBufferKHR(cb4, NULL, im2, r, o3, r3, 16 * 4, 0, NULL, NULL, NULL));
    CHECK(clFinalizeCommandBufferKHR(cb4));
    CHECK(clEnqueueCommandBufferKHR(0, NULL, cb2, 0, NULL, NULL));
    CHECK(clEnqueueCommandBufferKHR(0, NULL, cb3, 0, NULL, NULL));
    CHECK(clEnqueueCommandBufferKHR(0, NULL, cb4, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, r, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL));
    for (int i = 0; i < 16; i++) EXPECT(back[16 + i] == 1000 + i, "image round trip r[%d] = %d", 16 + i, back[16 + i]);
    CHECK(clReleaseCommandBufferKHR(cb2)); CHECK(clReleaseCommandBufferKHR(cb3)); CHECK(clReleaseCommandBufferKHR(cb4));
    (void)clCommandFillImageKHR;
  }
  printf("command buffers: recorded 9 commands, ran twice, results and errors as expected\nPASS\n");
  return 0;
}
