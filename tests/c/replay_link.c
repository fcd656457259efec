/* Replay of programs made by clCompileProgram (with a header program) and clLinkProgram,
 * every program released once its kernel exists (as applications do: the kernel keeps what it
 * needs). One context, never recreated; every result folded into a checksum, which a run whose
 * worker died mid-run must match.
 *
 * usage: replay_link ITERATIONS [SLEEP_MS]
 * Prints "iteration N", "context notified (replay): ..." for each pfn_notify, then
 * "checksum X" and "done", or "ERROR step=... code=..." and exits 1. */
#include "replay_common.h"

#define N 8192

static const char *header = "int churn(int a, int b);\n#define SALT 40503\n";
static const char *lib_src =
    "#include \"churn.h\"\n"
    "int churn(int a, int b) { return (a * SALT) ^ (b + (a >> 3)); }\n";
static const char *main_src =
    "#include \"churn.h\"\n"
    "__kernel void advance(__global int *acc, int k) {\n"
    "  size_t i = get_global_id(0);\n"
    "  acc[i] = churn(acc[i], k + (int)i);\n"
    "}\n";

int main(int argc, char **argv) {
    REPLAY_START(argc, argv, p, d, ctx, q, err);
    /* The programs first, the header last: a rebuild must not compile before it exists. */
    cl_program lib = clCreateProgramWithSource(ctx, 1, &lib_src, NULL, &err);
    STEP("lib", err);
    cl_program mainp = clCreateProgramWithSource(ctx, 1, &main_src, NULL, &err);
    STEP("main", err);
    cl_program h = clCreateProgramWithSource(ctx, 1, &header, NULL, &err);
    STEP("header", err);
    const char *name = "churn.h";
    STEP("compile lib", clCompileProgram(lib, 1, &d, "", 1, &h, &name, NULL, NULL));
    STEP("compile main", clCompileProgram(mainp, 1, &d, "", 1, &h, &name, NULL, NULL));
    cl_program both[2] = {mainp, lib};
    cl_program linked = clLinkProgram(ctx, 1, &d, "", 2, both, NULL, NULL, &err);
    STEP("link", err);
    cl_kernel k = clCreateKernel(linked, "advance", &err);
    STEP("kernel", err);
    STEP("release header", clReleaseProgram(h));
    STEP("release lib", clReleaseProgram(lib));
    STEP("release main", clReleaseProgram(mainp));
    STEP("release linked", clReleaseProgram(linked));
    static int host[N];
    for (int i = 0; i < N; i++) host[i] = i * 13 + 1;
    cl_mem acc = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof host, host, &err);
    STEP("acc", err);
    STEP("arg", clSetKernelArg(k, 0, sizeof acc, &acc));
    uint64_t sum = 1469598103934665603ull;
    size_t global = N;
    for (int it = 0; it < iterations; it++) {
        STEP("arg", clSetKernelArg(k, 1, sizeof it, &it));
        STEP("step", clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
        STEP("step", clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
        STEP("read", clEnqueueReadBuffer(q, acc, CL_TRUE, 0, sizeof host, host, 0, NULL, NULL));
        for (int i = 0; i < N; i++) sum = (sum ^ (uint32_t)host[i]) * 1099511628211ull;
        iteration_done(it, sleep_ms);
    }
    STEP("finish", clFinish(q));
    print_result(sum);
    clReleaseKernel(k);
    clReleaseMemObject(acc);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
