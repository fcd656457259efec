/* An application that recovers from driver faults the way DESIGN.md promises: when a call
 * returns CL_DEVICE_NOT_AVAILABLE it drops its objects, creates a new context on the same device
 * handle, and does its work again. Prints the number of faults it survived, the fd count of the
 * process before and after, and whether the final results are right.
 *   recover [MAX_ATTEMPTS [ROUND_PAUSE_MS]]
 * Each attempt sets up (context, program, kernel, buffer), says "attempt N running", then runs
 * three rounds with a pause after each (100 ms unless given): a test that must act while an
 * attempt runs waits for that line and gives itself a wider window with a longer pause.      */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int count_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

/* Prints what each open fd is, so a count that differs says which one. */
static void list_fds(const char *when) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    if (!d) return;
    printf("fds %s:", when);
    while ((e = readdir(d))) {
        char path[300], target[256];
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof target - 1);
        target[len > 0 ? len : 0] = 0;
        printf(" %s=%s", e->d_name, target);
    }
    printf("\n");
    closedir(d);
}

static void CL_CALLBACK on_context_error(const char *errinfo, const void *info, size_t cb, void *user) {
    (void)info; (void)cb;
    printf("context notified (%s): %s\n", (const char *)user, errinfo);
    fflush(stdout);
}

static int round_pause_ms = 100;

static const char *SRC = "__kernel void k(__global int *o) { o[get_global_id(0)] = 3 * get_global_id(0); }";

/* One attempt at the whole job; returns CL_SUCCESS or the first error. */
static cl_int attempt(cl_device_id d, int *correct, int n) {
    cl_int err, rc = CL_SUCCESS;
    cl_context ctx = NULL; cl_command_queue q = NULL; cl_program p = NULL; cl_kernel k = NULL; cl_mem m = NULL;
    int out[4096];
    size_t g = 4096;
    *correct = 0;
#define TRY(x) do { rc = (x); if (rc != CL_SUCCESS) goto done; } while (0)
    ctx = clCreateContext(NULL, 1, &d, on_context_error, "recover", &err); TRY(err);
    q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err); TRY(err);
    p = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err); TRY(err);
    TRY(clBuildProgram(p, 0, NULL, NULL, NULL, NULL));
    k = clCreateKernel(p, "k", &err); TRY(err);
    m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof out, NULL, &err); TRY(err);
    TRY(clSetKernelArg(k, 0, sizeof m, &m));
    /* Set up: a test that must act while the attempt runs its rounds waits for this line. */
    printf("attempt %d running\n", n);
    fflush(stdout);
    /* Three rounds with pauses, so a driver crash that lands after a call returned is met. */
    for (int round = 0; round < 3; round++) {
        TRY(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
        TRY(clFinish(q));
        usleep(round_pause_ms * 1000);
    }
    TRY(clEnqueueReadBuffer(q, m, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
    *correct = 1;
    for (int i = 0; i < 4096; i++) if (out[i] != 3 * i) *correct = 0;
done:
    /* Releases succeed even when the worker is gone. */
    if (m && clReleaseMemObject(m) != CL_SUCCESS) { printf("release failed\n"); exit(2); }
    if (k) clReleaseKernel(k);
    if (p) clReleaseProgram(p);
    if (q) clReleaseCommandQueue(q);
    if (ctx && clReleaseContext(ctx) != CL_SUCCESS) { printf("release failed\n"); exit(2); }
    return rc;
}

int main(int argc, char **argv) {
    int max = argc > 1 ? atoi(argv[1]) : 5;
    if (argc > 2) round_pause_ms = atoi(argv[2]);
    cl_platform_id plat; cl_device_id dev;
    if (clGetPlatformIDs(1, &plat, NULL) != CL_SUCCESS) { printf("no platform\n"); return 1; }
    if (clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS) { printf("no device\n"); return 1; }
    int fds_before = -1, faults = 0, correct = 0;
    for (int i = 0; i < max; i++) {
        printf("attempt %d starting\n", i + 1);
        fflush(stdout);
        cl_int rc = attempt(dev, &correct, i + 1);
        if (rc == CL_SUCCESS) {
            printf("attempt %d succeeded after %d faults; results %s\n", i + 1, faults, correct ? "correct" : "WRONG");
            printf("fds: %d then %d\n", fds_before, count_fds());
            return correct ? 0 : 1;
        }
        if (rc != CL_DEVICE_NOT_AVAILABLE) { printf("attempt %d: unexpected error %d\n", i + 1, rc); return 1; }
        faults++;
        cl_bool avail = CL_TRUE;
        clGetDeviceInfo(dev, CL_DEVICE_AVAILABLE, sizeof avail, &avail, NULL);
        printf("attempt %d: CL_DEVICE_NOT_AVAILABLE; device available now: %s\n", i + 1, avail ? "yes" : "no");
        /* After the first restart, in the phase of the last count below: the availability query
         * waited for the replacement, so its connection is open. Counted right after the failed
         * attempt instead, a replacement still connecting on a loaded machine made it one fd
         * short (CI: 14 then 15). */
        if (i == 1) { fds_before = count_fds(); list_fds("before"); }
    }
    printf("gave up after %d faults\n", faults);
    list_fds("after");
    printf("fds: %d then %d\n", fds_before, count_fds());
    return 3;
}
