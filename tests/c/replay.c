/* A client written like most OpenCL applications: one context, never recreated. It builds a
 * program, fills buffers (initial data, writes), and runs a loop of kernels, a copy and a fill,
 * with a blocking read each iteration, folding every result into a checksum. Under
 * CLOISTER_RECOVERY=replay a worker killed mid-run must change nothing: the checksum is the
 * undisturbed run's and every call succeeds.
 *
 * usage: replay ITERATIONS [SLEEP_MS]; REPLAY_BIG_MIB sets the size of the buffer `scale`
 * rewrites each iteration (default 1 MiB).
 * Prints "iteration N" as it goes (a test kills the worker after some), "context notified: ..."
 * for each pfn_notify, then "checksum X" and "done", or "ERROR step=... code=..." and exits 1. */
#include <string.h>
#include "replay_common.h"

#define N 4096
#define BIG (256 * 1024) /* floats by default: a zero-copy buffer on host-unified devices */

static volatile int completed_callbacks, failed_callbacks;

static void CL_CALLBACK on_event(cl_event e, cl_int status, void *user) {
    (void)e;
    (void)user;
    if (status == CL_COMPLETE)
        __sync_fetch_and_add(&completed_callbacks, 1);
    else
        __sync_fetch_and_add(&failed_callbacks, 1);
}

static const char *src =
    "__kernel void accum(__global const int *in, __global int *acc, int k) {\n"
    "  size_t i = get_global_id(0);\n"
    "  acc[i] = acc[i] * 31 + in[i] * k + (int)i;\n"
    "}\n"
    "__kernel void scale(__global float *big, float f) {\n"
    "  size_t i = get_global_id(0);\n"
    "  big[i] = big[i] * f + 1.0f;\n"
    "}\n";

int main(int argc, char **argv) {
    REPLAY_START(argc, argv, p, d, ctx, q, err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    STEP("program", err);
    STEP("build", clBuildProgram(prog, 0, NULL, "-cl-fast-relaxed-math", NULL, NULL));
    cl_kernel step = clCreateKernel(prog, "accum", &err);
    STEP("kernel", err);
    cl_kernel scale = clCreateKernel(prog, "scale", &err);
    STEP("kernel2", err);

    static int init[N], host[N], out[N];
    for (int i = 0; i < N; i++) init[i] = i * 7 + 3;
    cl_mem in = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof init, init, &err);
    STEP("buffer in", err);
    cl_mem acc = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof host, NULL, &err);
    STEP("buffer acc", err);
    cl_mem copy = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof host, NULL, &err);
    STEP("buffer copy", err);
    size_t big_n = getenv("REPLAY_BIG_MIB") ? (size_t)atoi(getenv("REPLAY_BIG_MIB")) << 18 : BIG;
    float *bigh = malloc(big_n * sizeof(float));
    if (!bigh) {
        printf("ERROR step=malloc code=0\n");
        return 1;
    }
    for (size_t i = 0; i < big_n; i++) bigh[i] = (float)(i % 97);
    cl_mem big = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, big_n * sizeof(float), bigh, &err);
    STEP("buffer big", err);
    memset(host, 0, sizeof host);
    STEP("write acc", clEnqueueWriteBuffer(q, acc, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
    /* A sub-buffer (a window of acc) and a sampler, rebuilt like the rest. */
    cl_buffer_region window = {1024 * sizeof(int), 1024 * sizeof(int)};
    cl_mem part = clCreateSubBuffer(acc, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &window, &err);
    STEP("sub-buffer", err);
    cl_sampler sampler = clCreateSampler(ctx, CL_TRUE, CL_ADDRESS_CLAMP, CL_FILTER_NEAREST, &err);
    STEP("sampler", err);
    STEP("arg0", clSetKernelArg(step, 0, sizeof in, &in));
    STEP("arg1", clSetKernelArg(step, 1, sizeof acc, &acc));
    STEP("big arg0", clSetKernelArg(scale, 0, sizeof big, &big));

    uint64_t sum = 1469598103934665603ull;
    size_t g = N, gb = big_n;
    for (int it = 0; it < iterations; it++) {
        int k = it + 1;
        float f = 0.5f + (float)(it % 3);
        STEP("arg2", clSetKernelArg(step, 2, sizeof k, &k));
        STEP("big arg1", clSetKernelArg(scale, 1, sizeof f, &f));
        cl_event ev;
        STEP("enqueue", clEnqueueNDRangeKernel(q, step, 1, NULL, &g, NULL, 0, NULL, &ev));
        STEP("callback", clSetEventCallback(ev, CL_COMPLETE, on_event, NULL));
        /* accum has run (it changed acc in place) when the next NDRange is enqueued: a crash
         * there must run it again on acc as it was before, not on its result. */
        STEP("wait accum", clWaitForEvents(1, &ev));
        STEP("enqueue big", clEnqueueNDRangeKernel(q, scale, 1, NULL, &gb, NULL, 1, &ev, NULL));
        STEP("copy", clEnqueueCopyBuffer(q, acc, copy, 0, 0, sizeof host, 0, NULL, NULL));
        int pattern = it;
        STEP("fill", clEnqueueFillBuffer(q, copy, &pattern, sizeof pattern, 0, 64 * sizeof(int), 0, NULL, NULL));
        STEP("fill part", clEnqueueFillBuffer(q, part, &pattern, sizeof pattern, 8 * sizeof(int), 8 * sizeof(int), 0, NULL, NULL));
        if (it % 4 == 3) {
            /* A partial write the journal must replay with its data. */
            static int patch[16]; /* non-blocking: it must outlive the call */
            for (int i = 0; i < 16; i++) patch[i] = it * 1000 + i;
            STEP("write patch", clEnqueueWriteBuffer(q, acc, CL_FALSE, 128 * sizeof(int), sizeof patch, patch, 0, NULL, NULL));
        }
        if (it % 5 == 2) {
            /* A rectangular write: a 4x4 box of acc seen as rows of 64 ints. */
            static int box[16]; /* non-blocking: it must outlive the call */
            for (int i = 0; i < 16; i++) box[i] = -it * 100 - i;
            size_t borigin[3] = {8 * sizeof(int), 40, 0}, horigin[3] = {0, 0, 0}, region[3] = {4 * sizeof(int), 4, 1};
            STEP("write rect", clEnqueueWriteBufferRect(q, acc, CL_FALSE, borigin, horigin, region, 64 * sizeof(int), 0,
                                                        4 * sizeof(int), 0, box, 0, NULL, NULL));
        }
        /* A non-blocking read, landed through its event (the worker may die before it does). */
        static int snap[N];
        cl_event rev;
        STEP("read nb", clEnqueueReadBuffer(q, acc, CL_FALSE, 0, sizeof snap, snap, 0, NULL, &rev));
        STEP("read", clEnqueueReadBuffer(q, copy, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
        STEP("wait nb", clWaitForEvents(1, &rev));
        STEP("release nb", clReleaseEvent(rev));
        for (int i = 0; i < N; i++) sum = (sum ^ (uint32_t)snap[i]) * 1099511628211ull;
        cl_int status;
        STEP("event", clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL));
        if (status != CL_COMPLETE) {
            printf("ERROR step=event-status code=%d\n", status);
            return 1;
        }
        STEP("release event", clReleaseEvent(ev));
        for (int i = 0; i < N; i++) sum = (sum ^ (uint32_t)out[i]) * 1099511628211ull;
        iteration_done(it, sleep_ms);
    }
    STEP("finish", clFinish(q));
    cl_bool normalized = CL_FALSE;
    STEP("sampler info", clGetSamplerInfo(sampler, CL_SAMPLER_NORMALIZED_COORDS, sizeof normalized, &normalized, NULL));
    if (!normalized) {
        printf("ERROR step=sampler-info code=0\n");
        return 1;
    }
    STEP("read big", clEnqueueReadBuffer(q, big, CL_TRUE, 0, big_n * sizeof(float), bigh, 0, NULL, NULL));
    for (size_t i = 0; i < big_n; i++) {
        uint32_t b;
        memcpy(&b, &bigh[i], sizeof b);
        sum = (sum ^ b) * 1099511628211ull;
    }
    STEP("read acc", clEnqueueReadBuffer(q, acc, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
    for (int i = 0; i < N; i++) sum = (sum ^ (uint32_t)out[i]) * 1099511628211ull;
    printf("checksum %016llx\n", (unsigned long long)sum);
    /* Every kernel's callback ran, once, with CL_COMPLETE (events are waited on above). */
    for (int i = 0; i < 200 && completed_callbacks + failed_callbacks < iterations; i++) usleep(10 * 1000);
    printf("callbacks %d complete, %d failed\n", completed_callbacks, failed_callbacks);
    clReleaseKernel(step);
    clReleaseKernel(scale);
    clReleaseProgram(prog);
    clReleaseSampler(sampler);
    clReleaseMemObject(part);
    clReleaseMemObject(in);
    clReleaseMemObject(acc);
    clReleaseMemObject(copy);
    clReleaseMemObject(big);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    printf("done\n");
    return 0;
}
