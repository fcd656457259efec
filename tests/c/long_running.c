/* A long-running client for cloister's on-demand and at-exit statistics (tests/tests/intercept.rs).
   Allocates memory objects of known sizes: buffers of 4 MiB and 1 MiB, a 64x64 RGBA8 image
   (16 KiB) and a 4 KiB sub-buffer of the 1 MiB one, all live at once (peak: 5 MiB + 16 KiB, the
   sub-buffer holding no memory of its own); releases the 4 MiB buffer, the image and the
   sub-buffer; allocates 2 MiB. Then runs rounds of a kernel and a read on the 1 MiB buffer;
   after ROUNDS rounds (default 5) it writes its pid to READY_FILE, and goes on until STOP_FILE
   exists (or forever without it), then prints the rounds it ran and releases everything.
   FORK_CHILD=1: first forks a child that waits, ends it with SIGTERM and says how it ended (the
   child inherits cloister's SIGTERM handler, which must end the child, not its parent). */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#define CHECK(x) do { cl_int e_ = (x); if (e_ != CL_SUCCESS) { printf("FAIL %s:%d %s = %d\n", __FILE__, __LINE__, #x, e_); exit(1);} } while (0)

static const char *src = "__kernel void fill(__global int *out) { int i = get_global_id(0); out[i] = i; }\n";

int main(void) {
  cl_platform_id p; cl_device_id dev; cl_int err;
  CHECK(clGetPlatformIDs(1, &p, NULL));
  CHECK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); CHECK(err);
  cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err); CHECK(err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err); CHECK(err);
  CHECK(clBuildProgram(prog, 1, &dev, NULL, NULL, NULL));
  cl_kernel k = clCreateKernel(prog, "fill", &err); CHECK(err);

  cl_mem big = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4 << 20, NULL, &err); CHECK(err);
  cl_mem work = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 1 << 20, NULL, &err); CHECK(err);
  cl_image_format fmt = { CL_RGBA, CL_UNORM_INT8 };
  cl_image_desc desc = { 0 };
  desc.image_type = CL_MEM_OBJECT_IMAGE2D; desc.image_width = 64; desc.image_height = 64;
  cl_mem img = clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &desc, NULL, &err); CHECK(err);
  cl_buffer_region region = { 0, 4096 };
  cl_mem sub = clCreateSubBuffer(work, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err); CHECK(err);
  CHECK(clReleaseMemObject(big)); CHECK(clReleaseMemObject(img)); CHECK(clReleaseMemObject(sub));
  cl_mem later = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 2 << 20, NULL, &err); CHECK(err);

  if (getenv("FORK_CHILD")) {
    pid_t child = fork();
    if (child == 0) { pause(); _exit(0); }
    if (child < 0) { printf("FAIL fork\n"); return 1; }
    usleep(100000);
    kill(child, SIGTERM);
    int st = 0;
    waitpid(child, &st, 0);
    printf("child ended by signal %d\n", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  }

  const char *ready = getenv("READY_FILE"), *stop = getenv("STOP_FILE");
  int rounds = getenv("ROUNDS") ? atoi(getenv("ROUNDS")) : 5;
  static int host[1 << 18];
  long done = 0;
  for (;;) {
    size_t n = 1 << 18;
    CHECK(clSetKernelArg(k, 0, sizeof work, &work));
    CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL));
    CHECK(clEnqueueReadBuffer(q, work, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
    if (host[12345] != 12345) { printf("FAIL result %d\n", host[12345]); return 1; }
    done++;
    if (done == rounds && ready) {
      char tmp[4096]; snprintf(tmp, sizeof tmp, "%s.tmp", ready);
      FILE *f = fopen(tmp, "w"); if (!f) { printf("FAIL cannot write %s\n", tmp); return 1; }
      fprintf(f, "%d\n", (int)getpid()); fclose(f);
      rename(tmp, ready);
    }
    if (done >= rounds && stop && access(stop, F_OK) == 0) break;
    if (done >= rounds) usleep(20000);
  }
  printf("rounds %ld\n", done);
  CHECK(clReleaseMemObject(later)); CHECK(clReleaseMemObject(work));
  CHECK(clReleaseKernel(k)); CHECK(clReleaseProgram(prog));
  CHECK(clReleaseCommandQueue(q)); CHECK(clReleaseContext(ctx));
  printf("PASS\n");
  return 0;
}
