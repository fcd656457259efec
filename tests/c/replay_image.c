/* Like replay.c, with images as filters use them: an input image (initial data, a row written
 * each iteration with clEnqueueWriteImage), a kernel that blurs it through a sampler into an
 * output image, and a blocking read of the whole output image each iteration.
 * usage: replay_image ITERATIONS [SLEEP_MS]; prints "iteration N", "checksum X", "done". */
#include "replay_common.h"

#define W 256
#define H 128

static const char *src =
    "__kernel void blur(read_only image2d_t in, write_only image2d_t out, sampler_t s, int k) {\n"
    "  int2 p = (int2)(get_global_id(0), get_global_id(1));\n"
    "  uint4 acc = (uint4)(0);\n"
    "  for (int dy = -1; dy <= 1; dy++)\n"
    "    for (int dx = -1; dx <= 1; dx++) acc += read_imageui(in, s, p + (int2)(dx, dy));\n"
    "  write_imageui(out, p, (acc / 9u + (uint4)(k)) & (uint4)(255));\n"
    "}\n";

int main(int argc, char **argv) {
    REPLAY_START(argc, argv, p, d, ctx, q, err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    STEP("program", err);
    STEP("build", clBuildProgram(prog, 0, NULL, NULL, NULL, NULL));
    cl_kernel blur = clCreateKernel(prog, "blur", &err);
    STEP("kernel", err);
    cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc desc = {0};
    desc.image_type = CL_MEM_OBJECT_IMAGE2D;
    desc.image_width = W;
    desc.image_height = H;
    static uint8_t pixels[H][W][4], out[H][W][4];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 4; c++) pixels[y][x][c] = (uint8_t)(x * 3 + y * 5 + c * 7);
    cl_mem in = clCreateImage(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, &fmt, &desc, pixels, &err);
    STEP("image in", err);
    cl_mem dst = clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &desc, NULL, &err);
    STEP("image out", err);
    cl_sampler s = clCreateSampler(ctx, CL_FALSE, CL_ADDRESS_CLAMP_TO_EDGE, CL_FILTER_NEAREST, &err);
    STEP("sampler", err);
    uint64_t sum = 1469598103934665603ull;
    size_t g[2] = {W, H};
    for (int it = 0; it < iterations; it++) {
        static uint8_t row[W][4];
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 4; c++) row[x][c] = (uint8_t)(it * 11 + x + c);
        size_t origin[3] = {0, (size_t)(it * 7) % H, 0}, region[3] = {W, 1, 1};
        STEP("write row", clEnqueueWriteImage(q, in, CL_FALSE, origin, region, 0, 0, row, 0, NULL, NULL));
        STEP("arg0", clSetKernelArg(blur, 0, sizeof in, &in));
        STEP("arg1", clSetKernelArg(blur, 1, sizeof dst, &dst));
        STEP("arg2", clSetKernelArg(blur, 2, sizeof s, &s));
        STEP("arg3", clSetKernelArg(blur, 3, sizeof it, &it));
        STEP("enqueue", clEnqueueNDRangeKernel(q, blur, 2, NULL, g, NULL, 0, NULL, NULL));
        /* Feed the output back as the next input, as a multi-pass filter does. */
        size_t zero[3] = {0, 0, 0}, all[3] = {W, H, 1};
        STEP("copy", clEnqueueCopyImage(q, dst, in, zero, zero, all, 0, NULL, NULL));
        STEP("read", clEnqueueReadImage(q, dst, CL_TRUE, zero, all, 0, 0, out, 0, NULL, NULL));
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++)
                for (int c = 0; c < 4; c++) sum = (sum ^ out[y][x][c]) * 1099511628211ull;
        iteration_done(it, sleep_ms);
    }
    STEP("finish", clFinish(q));
    printf("checksum %016llx\n", (unsigned long long)sum);
    clReleaseSampler(s);
    clReleaseMemObject(in);
    clReleaseMemObject(dst);
    clReleaseKernel(blur);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    printf("done\n");
    return 0;
}
