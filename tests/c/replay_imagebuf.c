/* Replay of an image made from a buffer (CL_MEM_OBJECT_IMAGE1D_BUFFER): a kernel reads the
 * image, another writes the buffer behind it, each iteration, with a blocking read of the
 * result. One context, never recreated; every result folded into a checksum, which a run whose
 * driver crashed mid-run must match.
 *
 * usage: replay_imagebuf ITERATIONS [SLEEP_MS]
 * Prints "iteration N", "context notified (replay): ..." for each pfn_notify, then
 * "checksum X" and "done", or "ERROR step=... code=..." and exits 1. */
#include "replay_common.h"

#define N 4096

static const char *src =
    "__kernel void sample(__read_only image1d_buffer_t img, __global uint *out, uint k) {\n"
    "  int i = get_global_id(0);\n"
    "  uint4 v = read_imageui(img, i);\n"
    "  out[i] = out[i] * 33u + v.x * k + v.w;\n"
    "}\n"
    "__kernel void feed(__global uint *px, __global const uint *out) {\n"
    "  int i = get_global_id(0);\n"
    "  px[i] = (out[(i * 7) % 4096] & 0xFFu) * 0x01010101u;\n"
    "}\n";

int main(int argc, char **argv) {
    REPLAY_START(argc, argv, p, d, ctx, q, err);
    REPLAY_PROGRAM(prog, ctx, src, err);
    REPLAY_KERNEL(sample, prog, "sample", err);
    REPLAY_KERNEL(feed, prog, "feed", err);
    static cl_uint init[N], host[N];
    for (int i = 0; i < N; i++) init[i] = (cl_uint)(i * 2654435761u);
    cl_mem px = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof init, init, &err);
    STEP("pixels", err);
    cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc desc = {0};
    desc.image_type = CL_MEM_OBJECT_IMAGE1D_BUFFER;
    desc.image_width = N;
    desc.buffer = px;
    cl_mem img = clCreateImage(ctx, CL_MEM_READ_ONLY, &fmt, &desc, NULL, &err);
    STEP("image from buffer", err);
    for (int i = 0; i < N; i++) init[i] = 0;
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof init, init, &err);
    STEP("out", err);
    STEP("arg", clSetKernelArg(sample, 0, sizeof img, &img));
    STEP("arg", clSetKernelArg(sample, 1, sizeof out, &out));
    STEP("arg", clSetKernelArg(feed, 0, sizeof px, &px));
    STEP("arg", clSetKernelArg(feed, 1, sizeof out, &out));
    uint64_t sum = FOLD_START;
    size_t global = N;
    for (int it = 0; it < iterations; it++) {
        cl_uint k = (cl_uint)it + 3;
        STEP("arg", clSetKernelArg(sample, 2, sizeof k, &k));
        STEP("sample", clEnqueueNDRangeKernel(q, sample, 1, NULL, &global, NULL, 0, NULL, NULL));
        STEP("feed", clEnqueueNDRangeKernel(q, feed, 1, NULL, &global, NULL, 0, NULL, NULL));
        STEP("read", clEnqueueReadBuffer(q, out, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
        for (int i = 0; i < N; i++) sum = (sum ^ host[i]) * 1099511628211ull;
        iteration_done(it, sleep_ms);
    }
    STEP("finish", clFinish(q));
    print_result(sum);
    clReleaseKernel(sample);
    clReleaseKernel(feed);
    clReleaseMemObject(img);
    clReleaseMemObject(px);
    clReleaseMemObject(out);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
