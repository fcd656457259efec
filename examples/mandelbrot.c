/* cloister demo: renders a Mandelbrot zoom with OpenCL, one PPM file per frame, and survives a
 * driver crash mid-run. When a call fails with CL_DEVICE_NOT_AVAILABLE (the caged driver died),
 * it drops its OpenCL objects, creates a new context on the same device and renders the frame
 * again. Without cloister the same crash kills the program.
 *
 *   cc examples/mandelbrot.c -lOpenCL -o mandelbrot
 *   ./mandelbrot [FRAMES] [OUTDIR]                                                            */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>

#define W 320
#define H 240

static const char *SRC =
    "__kernel void mandel(__global uchar *rgb, float cx, float cy, float scale) {\n"
    "  int x = get_global_id(0), y = get_global_id(1);\n"
    "  float zr = 0, zi = 0, cr = cx + (x - 160) * scale, ci = cy + (y - 120) * scale;\n"
    "  int i = 0;\n"
    "  for (; i < 255 && zr * zr + zi * zi < 4; i++) { float t = zr * zr - zi * zi + cr; zi = 2 * zr * zi + ci; zr = t; }\n"
    "  int o = 3 * (y * 320 + x);\n"
    "  rgb[o] = i * 7; rgb[o + 1] = i * 3; rgb[o + 2] = 255 - i;\n"
    "}\n";

struct gpu { cl_context ctx; cl_command_queue q; cl_program prog; cl_kernel k; cl_mem out; };

static void teardown(struct gpu *g) {
    if (g->out) clReleaseMemObject(g->out);
    if (g->k) clReleaseKernel(g->k);
    if (g->prog) clReleaseProgram(g->prog);
    if (g->q) clReleaseCommandQueue(g->q);
    if (g->ctx) clReleaseContext(g->ctx);
    struct gpu zero = {0};
    *g = zero;
}

static cl_int setup(struct gpu *g, cl_device_id dev) {
    cl_int err;
    g->ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); if (err) return err;
    g->q = clCreateCommandQueueWithProperties(g->ctx, dev, NULL, &err); if (err) return err;
    g->prog = clCreateProgramWithSource(g->ctx, 1, &SRC, NULL, &err); if (err) return err;
    if ((err = clBuildProgram(g->prog, 0, NULL, NULL, NULL, NULL))) return err;
    g->k = clCreateKernel(g->prog, "mandel", &err); if (err) return err;
    g->out = clCreateBuffer(g->ctx, CL_MEM_WRITE_ONLY, W * H * 3, NULL, &err);
    return err;
}

static cl_int render(struct gpu *g, int frame, unsigned char *rgb) {
    float cx = -0.743643f, cy = 0.131825f, scale = 0.01f;
    for (int i = 0; i < frame; i++) scale *= 0.85f;
    size_t global[2] = {W, H};
    cl_int err;
    if ((err = clSetKernelArg(g->k, 0, sizeof g->out, &g->out))) return err;
    clSetKernelArg(g->k, 1, sizeof cx, &cx);
    clSetKernelArg(g->k, 2, sizeof cy, &cy);
    clSetKernelArg(g->k, 3, sizeof scale, &scale);
    if ((err = clEnqueueNDRangeKernel(g->q, g->k, 2, NULL, global, NULL, 0, NULL, NULL))) return err;
    return clEnqueueReadBuffer(g->q, g->out, CL_TRUE, 0, W * H * 3, rgb, 0, NULL, NULL);
}

int main(int argc, char **argv) {
    int frames = argc > 1 ? atoi(argv[1]) : 12;
    const char *dir = argc > 2 ? argv[2] : ".";
    cl_platform_id plat; cl_device_id dev;
    if (clGetPlatformIDs(1, &plat, NULL) || clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL)) {
        fprintf(stderr, "mandelbrot: no OpenCL device\n");
        return 1;
    }
    static unsigned char rgb[W * H * 3];
    struct gpu g = {0};
    int recoveries = 0;
    cl_int err = setup(&g, dev);
    for (int f = 0; f < frames; f++) {
        if (!err) err = render(&g, f, rgb);
        if (err == CL_DEVICE_NOT_AVAILABLE && recoveries < 3) {
            recoveries++;
            printf("frame %d: the driver is gone (CL_DEVICE_NOT_AVAILABLE); recreating the context on the same device\n", f);
            teardown(&g);
            err = setup(&g, dev);
            f--; /* render this frame again */
            continue;
        }
        if (err) { fprintf(stderr, "mandelbrot: frame %d failed with %d\n", f, err); return 1; }
        char path[512];
        snprintf(path, sizeof path, "%s/frame%02d.ppm", dir, f);
        FILE *fp = fopen(path, "wb");
        if (!fp) { perror(path); return 1; }
        fprintf(fp, "P6 %d %d 255\n", W, H);
        fwrite(rgb, 1, sizeof rgb, fp);
        fclose(fp);
        printf("frame %d written to %s\n", f, path);
    }
    teardown(&g);
    printf("rendered %d frames; recovered from %d driver crash%s\n", frames, recoveries, recoveries == 1 ? "" : "es");
    return 0;
}
