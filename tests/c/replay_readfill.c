/* Writes whose source a read under way fills, across a worker's death (replay mode): each
 * iteration reads `acc` into host memory without blocking, held back by a user event, then
 * writes that memory into `in` (a buffer write) and into `rows` (a rectangle write), both
 * non-blocking, so they carry the read's bytes (the read is enqueued first, on the same in-order
 * queue); sets the event, finishes, runs a kernel folding `in` and `rows` into `acc` (where a
 * test crashes the driver), and reads `acc` back into a checksum, which a run whose driver
 * crashed must match. Replay writes `in` and `rows` again from its journal: it must hold the
 * read's bytes, not what the memory held when the writes were enqueued.
 *
 * usage: replay_readfill ITERATIONS [SLEEP_MS]
 * Prints "iteration N", "context notified (replay): ..." for each pfn_notify, then
 * "checksum X" and "done", or "ERROR step=... code=..." and exits 1. */
#include "replay_common.h"

#define W 256 /* a row of `rows`, in uints */
#define H 32
#define N (W * H) /* 32 KiB a buffer: below the size from which the journal keeps a write's staging */

static const char *src =
    "__kernel void fold(__global uint *acc, __global const uint *in, __global const uint *rows, uint k) {\n"
    "  size_t i = get_global_id(0);\n"
    "  acc[i] = acc[i] * 5u + in[i] + rows[i] * 3u + k;\n"
    "}\n";

int main(int argc, char **argv) {
    REPLAY_START(argc, argv, p, d, ctx, q, err);
    REPLAY_PROGRAM(prog, ctx, src, err);
    REPLAY_KERNEL(fold_kernel, prog, "fold", err);
    static cl_uint start[N], h[N], out[N];
    for (int i = 0; i < N; i++) start[i] = (cl_uint)i * 2654435761u;
    cl_mem acc = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof start, start, &err);
    STEP("acc", err);
    cl_mem in = clCreateBuffer(ctx, CL_MEM_READ_ONLY, sizeof start, NULL, &err);
    STEP("in", err);
    cl_mem rows = clCreateBuffer(ctx, CL_MEM_READ_ONLY, sizeof start, NULL, &err);
    STEP("rows", err);
    STEP("arg0", clSetKernelArg(fold_kernel, 0, sizeof acc, &acc));
    STEP("arg1", clSetKernelArg(fold_kernel, 1, sizeof in, &in));
    STEP("arg2", clSetKernelArg(fold_kernel, 2, sizeof rows, &rows));
    uint64_t sum = FOLD_START;
    size_t g = N;
    size_t origin[3] = {0, 0, 0}, region[3] = {W * sizeof(cl_uint), H, 1};
    for (int it = 0; it < iterations; it++) {
        cl_event gate = clCreateUserEvent(ctx, &err);
        STEP("user event", err);
        /* `h` still holds the last iteration's `acc` (or zeros): the writes must not take that. */
        STEP("read", clEnqueueReadBuffer(q, acc, CL_FALSE, 0, sizeof h, h, 1, &gate, NULL));
        STEP("write", clEnqueueWriteBuffer(q, in, CL_FALSE, 0, sizeof h, h, 0, NULL, NULL));
        STEP("write rect", clEnqueueWriteBufferRect(q, rows, CL_FALSE, origin, origin, region, W * sizeof(cl_uint), 0,
                                                    W * sizeof(cl_uint), 0, h, 0, NULL, NULL));
        STEP("set", clSetUserEventStatus(gate, CL_COMPLETE));
        STEP("finish", clFinish(q));
        clReleaseEvent(gate);
        cl_uint k = (cl_uint)it * 7u + 1u;
        STEP("arg3", clSetKernelArg(fold_kernel, 3, sizeof k, &k));
        /* The driver may die here: replay writes `in` and `rows` again from its journal. */
        STEP("fold", clEnqueueNDRangeKernel(q, fold_kernel, 1, NULL, &g, NULL, 0, NULL, NULL));
        STEP("read back", clEnqueueReadBuffer(q, acc, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
        sum = fold(sum, out, N);
        iteration_done(it, sleep_ms);
    }
    print_result(sum);
    return 0;
}
