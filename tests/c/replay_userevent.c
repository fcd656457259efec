/* Commands held back by a user event across a worker's death (replay mode): each iteration
 * enqueues, on one queue, a kernel, a write, a non-blocking read and a non-blocking map that all
 * wait on a user event not set yet, then runs a kernel on a second queue (where a test crashes
 * the driver) and finishes it, and only then sets the user event, waits for the read and the
 * map, and folds what they brought into a checksum, which a run whose driver crashed while the
 * commands were held back must match. The rebuild cannot finish those commands (the event is
 * set only after the call that met the death returns): they must be enqueued in the
 * replacement without waiting, the read and the map landing once the event is set.
 *
 * usage: replay_userevent ITERATIONS [SLEEP_MS]
 * Prints "iteration N", "context notified (replay): ..." for each pfn_notify, then
 * "checksum X" and "done", or "ERROR step=... code=..." and exits 1. */
#include "replay_common.h"

#define N 4096

static const char *src =
    "__kernel void accumulate(__global int *acc, __global const int *in, int k) {\n"
    "  size_t i = get_global_id(0);\n"
    "  acc[i] = acc[i] * 5 + in[i] + k;\n"
    "}\n"
    "__kernel void busy(__global int *x) {\n"
    "  size_t i = get_global_id(0);\n"
    "  x[i] = x[i] * 3 + 1;\n"
    "}\n";


int main(int argc, char **argv) {
    REPLAY_START(argc, argv, p, d, ctx, q, err);
    cl_command_queue q2 = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    STEP("queue 2", err);
    REPLAY_PROGRAM(prog, ctx, src, err);
    REPLAY_KERNEL(accumulate, prog, "accumulate", err);
    REPLAY_KERNEL(busy, prog, "busy", err);
    static int zeros[N];
    cl_mem acc = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zeros, zeros, &err);
    STEP("acc", err);
    cl_mem in = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof zeros, zeros, &err);
    STEP("in", err);
    cl_mem other = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zeros, zeros, &err);
    STEP("other", err);
    STEP("arg", clSetKernelArg(accumulate, 0, sizeof acc, &acc));
    STEP("arg", clSetKernelArg(accumulate, 1, sizeof in, &in));
    STEP("arg", clSetKernelArg(busy, 0, sizeof other, &other));
    uint64_t sum = FOLD_START;
    size_t n = N;
    static int data[N], snap[N];
    for (int it = 0; it < iterations; it++) {
        cl_event gate = clCreateUserEvent(ctx, &err);
        STEP("user event", err);
        for (int i = 0; i < N; i++) data[i] = i * 3 + it * 17;
        /* Held back by `gate`: a write of `in`, the kernel, a read of `acc`, a map of `in`. */
        STEP("write", clEnqueueWriteBuffer(q, in, CL_FALSE, 0, sizeof data, data, 1, &gate, NULL));
        int k = it + 1;
        STEP("arg", clSetKernelArg(accumulate, 2, sizeof k, &k));
        STEP("accumulate", clEnqueueNDRangeKernel(q, accumulate, 1, NULL, &n, NULL, 1, &gate, NULL));
        cl_event read, map;
        STEP("read", clEnqueueReadBuffer(q, acc, CL_FALSE, 0, sizeof snap, snap, 1, &gate, &read));
        int *m = clEnqueueMapBuffer(q, in, CL_FALSE, CL_MAP_READ, 0, sizeof data, 1, &gate, &map, &err);
        STEP("map", err);
        STEP("flush", clFlush(q));
        /* The driver may die here, with all of the above held back. */
        STEP("busy", clEnqueueNDRangeKernel(q2, busy, 1, NULL, &n, NULL, 0, NULL, NULL));
        STEP("finish 2", clFinish(q2));
        STEP("set", clSetUserEventStatus(gate, CL_COMPLETE));
        STEP("wait read", clWaitForEvents(1, &read));
        STEP("wait map", clWaitForEvents(1, &map));
        sum = fold(sum, snap, N);
        sum = fold(sum, m, N);
        STEP("unmap", clEnqueueUnmapMemObject(q, in, m, 0, NULL, NULL));
        STEP("finish", clFinish(q));
        clReleaseEvent(read);
        clReleaseEvent(map);
        clReleaseEvent(gate);
        iteration_done(it, sleep_ms);
    }
    STEP("read acc", clEnqueueReadBuffer(q, acc, CL_TRUE, 0, sizeof snap, snap, 0, NULL, NULL));
    sum = fold(sum, snap, N);
    print_result(sum);
    return 0;
}
