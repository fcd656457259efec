/* Image mappings held across a worker's death (replay mode): each iteration maps a box of one
 * image for writing and all of another for reading, runs a kernel on a buffer (where a test
 * crashes the driver) and waits, and only then reads through the one mapping and writes
 * through the other, unmaps both, and runs a kernel that blends both images into the second.
 * Every result is folded into a checksum, which a run whose driver crashed while the mappings
 * were held must match.
 *
 * usage: replay_imagemap ITERATIONS [SLEEP_MS]
 * Prints "iteration N", "context notified (replay): ..." for each pfn_notify, then
 * "checksum X" and "done", or "ERROR step=... code=..." and exits 1. */
#include "replay_common.h"

#define W 64
#define H 48
#define N 4096

static const char *src =
    "__kernel void busy(__global int *x) {\n"
    "  size_t i = get_global_id(0);\n"
    "  x[i] = x[i] * 3 + 1;\n"
    "}\n"
    "__kernel void blend(__read_only image2d_t a, __read_only image2d_t b, __write_only image2d_t out) {\n"
    "  int2 p = (int2)(get_global_id(0), get_global_id(1));\n"
    "  uint4 x = read_imageui(a, p), y = read_imageui(b, p);\n"
    "  write_imageui(out, p, x * 5u + y);\n"
    "}\n";


int main(int argc, char **argv) {
    REPLAY_START(argc, argv, p, d, ctx, q, err);
    REPLAY_PROGRAM(prog, ctx, src, err);
    REPLAY_KERNEL(busy, prog, "busy", err);
    REPLAY_KERNEL(blend, prog, "blend", err);
    static cl_uint zeros[N]; /* N >= W * H */
    cl_image_format fmt = {CL_R, CL_UNSIGNED_INT32};
    cl_image_desc desc = {.image_type = CL_MEM_OBJECT_IMAGE2D, .image_width = W, .image_height = H};
    cl_mem in = clCreateImage(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, &fmt, &desc, zeros, &err);
    STEP("image in", err);
    cl_mem acc = clCreateImage(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, &fmt, &desc, zeros, &err);
    STEP("image acc", err);
    cl_mem out = clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &desc, NULL, &err);
    STEP("image out", err);
    cl_mem other = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, N * sizeof(int), zeros, &err);
    STEP("other", err);
    STEP("arg", clSetKernelArg(busy, 0, sizeof other, &other));
    STEP("arg", clSetKernelArg(blend, 0, sizeof in, &in));
    STEP("arg", clSetKernelArg(blend, 1, sizeof acc, &acc));
    STEP("arg", clSetKernelArg(blend, 2, sizeof out, &out));
    uint64_t sum = FOLD_START;
    size_t n = N, whole[3] = {W, H, 1}, corner[3] = {0, 0, 0};
    for (int it = 0; it < iterations; it++) {
        /* A box of `in` (not its corner), for writing; all of `acc`, for reading. */
        size_t origin[3] = {(size_t)(it % 3) * 8, (size_t)(it % 4) * 4, 0}, box[3] = {24, 20, 1};
        size_t wpitch, rpitch;
        cl_uint *w = clEnqueueMapImage(q, in, CL_TRUE, CL_MAP_WRITE, origin, box, &wpitch, NULL, 0, NULL, NULL, &err);
        STEP("map in", err);
        cl_uint *r = clEnqueueMapImage(q, acc, CL_TRUE, CL_MAP_READ, corner, whole, &rpitch, NULL, 0, NULL, NULL, &err);
        STEP("map acc", err);
        /* The driver may die here, with both mappings held. */
        STEP("busy", clEnqueueNDRangeKernel(q, busy, 1, NULL, &n, NULL, 0, NULL, NULL));
        STEP("finish", clFinish(q));
        for (size_t y = 0; y < H; y++) sum = fold(sum, (const cl_uint *)((const char *)r + y * rpitch), W);
        for (size_t y = 0; y < box[1]; y++) {
            cl_uint *row = (cl_uint *)((char *)w + y * wpitch);
            for (size_t x = 0; x < box[0]; x++) row[x] = (cl_uint)(x * 7 + y * 3 + it * 11);
        }
        STEP("unmap acc", clEnqueueUnmapMemObject(q, acc, r, 0, NULL, NULL));
        STEP("unmap in", clEnqueueUnmapMemObject(q, in, w, 0, NULL, NULL));
        STEP("blend", clEnqueueNDRangeKernel(q, blend, 2, NULL, whole, NULL, 0, NULL, NULL));
        STEP("copy back", clEnqueueCopyImage(q, out, acc, corner, corner, whole, 0, NULL, NULL));
        static int host[N];
        STEP("read", clEnqueueReadBuffer(q, other, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
        sum = fold(sum, (const cl_uint *)host, N);
        iteration_done(it, sleep_ms);
    }
    static cl_uint last[W * H];
    STEP("read acc", clEnqueueReadImage(q, acc, CL_TRUE, corner, whole, 0, 0, last, 0, NULL, NULL));
    sum = fold(sum, last, W * H);
    print_result(sum);
    return 0;
}
