/* CL_COMPLETE callbacks have run by the time a wait on their event returns (issue 16, item 9),
 * as pocl does directly: after clWaitForEvents, after clFinish, and after a blocking read, 20
 * times each; and a wait called from inside a callback returns. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>

static const char *SRC = "kernel void k(global int *o) { int i = get_global_id(0); int v = i;\n"
                         "  for (int j = 0; j < 2000; j++) v = v * 7 + j; o[i] = v; }";

static volatile int ran;
static void CL_CALLBACK on_complete(cl_event e, cl_int status, void *user) {
    (void)e; (void)user;
    if (status == CL_COMPLETE) __atomic_store_n(&ran, 1, __ATOMIC_SEQ_CST);
}

static cl_event inner;
static volatile int inner_wait = -100;
static void CL_CALLBACK waits_inside(cl_event e, cl_int status, void *user) {
    (void)e; (void)status; (void)user;
    inner_wait = clWaitForEvents(1, &inner);
}

int main(void) {
    cl_platform_id plat;
    cl_device_id d;
    cl_int err;
    if (clGetPlatformIDs(1, &plat, NULL) || clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &d, NULL)) return 2;
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    cl_program p = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
    if (clBuildProgram(p, 1, &d, "", NULL, NULL)) return 3;
    cl_kernel k = clCreateKernel(p, "k", &err);
    static int host[1 << 16];
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof host, NULL, &err);
    clSetKernelArg(k, 0, sizeof m, &m);
    size_t g = 1 << 16;
    const char *how[] = {"clWaitForEvents", "clFinish", "blocking read"};
    for (int w = 0; w < 3; w++) {
        int before = 0;
        for (int i = 0; i < 20; i++) {
            cl_event ev;
            ran = 0;
            if (w < 2) {
                if (clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, &ev)) return 4;
            } else if (clEnqueueReadBuffer(q, m, CL_FALSE, 0, sizeof host, host, 0, NULL, &ev)) {
                return 4;
            }
            clSetEventCallback(ev, CL_COMPLETE, on_complete, NULL);
            if (w == 0) clWaitForEvents(1, &ev);
            if (w == 1) clFinish(q);
            if (w == 2 && clEnqueueReadBuffer(q, m, CL_TRUE, 0, 4, host, 0, NULL, NULL)) return 5;
            before += __atomic_load_n(&ran, __ATOMIC_SEQ_CST);
            clFinish(q);
            clReleaseEvent(ev);
        }
        printf("callback ran before %s returned: %d/20\n", how[w], before);
    }
    cl_event outer;
    clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, &inner);
    clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, &outer);
    clSetEventCallback(outer, CL_COMPLETE, waits_inside, NULL);
    clWaitForEvents(1, &outer);
    clFinish(q);
    printf("a wait inside a callback returned: %d\n", inner_wait);
    return 0;
}
