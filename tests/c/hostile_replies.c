/* A client of the scripted hostile worker (tests/src/bin/hostile_worker.rs): each mode makes
 * the calls whose replies that worker lies in, with every buffer it hands the driver surrounded
 * by guard bytes. The worker must never decide how many bytes land in the application's memory
 * (issue 11, class 1), and no callback may run after the object it belongs to was released
 * (class 3). Prints "GUARDS INTACT" / "CALLBACKS OK" and exits 0 only when all held. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GUARD 0x5A
#define SLACK (1 << 17)

static int failed = 0;

static void check(const char *what, int ok) {
    printf("%s %s\n", ok ? "ok" : "FAILED", what);
    if (!ok)
        failed = 1;
}

/* `len` usable bytes followed by SLACK guard bytes, all inside one allocation, so an
 * overflow lands in memory we own and can be seen instead of corrupting the heap. */
static unsigned char *guarded(size_t len) {
    unsigned char *p = malloc(len + SLACK);
    memset(p, 0, len);
    memset(p + len, GUARD, SLACK);
    return p;
}

static int intact(const unsigned char *p, size_t len) {
    for (size_t i = 0; i < SLACK; i++)
        if (p[len + i] != GUARD)
            return 0;
    return 1;
}

static cl_context ctx;
static cl_device_id dev;

static int setup(void) {
    cl_platform_id p;
    cl_uint n = 0;
    cl_int err = clGetPlatformIDs(1, &p, &n);
    if (err != CL_SUCCESS || n == 0) {
        printf("no platform (%d)\n", err);
        return 0;
    }
    err = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &dev, NULL);
    if (err != CL_SUCCESS) {
        printf("no device (%d)\n", err);
        return 0;
    }
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        printf("no context (%d)\n", err);
        return 0;
    }
    return 1;
}

static cl_program built_program(void) {
    const char *src = "__kernel void k(__global int *o) { o[0] = 1; }";
    cl_int err;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    check("program created", err == CL_SUCCESS);
    check("program built", clBuildProgram(prog, 0, NULL, NULL, NULL, NULL) == CL_SUCCESS);
    return prog;
}

static void long_binary(void) {
    cl_program prog = built_program();
    size_t size = 0;
    check("binary sizes", clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) == CL_SUCCESS);
    unsigned char *bin = guarded(size);
    unsigned char *bins[1] = {bin};
    cl_int err = clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL);
    printf("CL_PROGRAM_BINARIES: %d (told %zu bytes)\n", err, size);
    check("a longer binary is a worker fault", err == CL_DEVICE_NOT_AVAILABLE);
    check("guard bytes after the binary buffer", intact(bin, size));
}

static void huge_num_args(void) {
    cl_program prog = built_program();
    cl_int err;
    cl_kernel k = clCreateKernel(prog, "k", &err);
    printf("clCreateKernel: %d\n", err);
    check("a kernel of 2^32-1 arguments is a worker fault", err == CL_DEVICE_NOT_AVAILABLE && k == NULL);
}

static void wide_pitch(void) {
    cl_int err;
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    check("queue", err == CL_SUCCESS);
    cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc desc = {0};
    desc.image_type = CL_MEM_OBJECT_IMAGE2D;
    desc.image_width = 16;
    desc.image_height = 16;
    cl_mem img = clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &desc, NULL, &err);
    check("image", err == CL_SUCCESS);
    size_t origin[3] = {0, 0, 0}, region[3] = {16, 16, 1}, row_pitch = 0;
    void *p = clEnqueueMapImage(q, img, CL_TRUE, CL_MAP_WRITE, origin, region, &row_pitch, NULL, 0, NULL, NULL, &err);
    printf("clEnqueueMapImage: %d, row pitch %zu\n", err, row_pitch);
    /* Writing 16 rows at that pitch is what the application would do next. */
    check("no pitch past the mapping's packed rows",
          (err == CL_DEVICE_NOT_AVAILABLE && p == NULL) || (err == CL_SUCCESS && row_pitch == 16 * 4));
}

/* The driver (accept-all) accepts transfers past a CL_MEM_USE_HOST_PTR buffer's end; the shim,
 * which copies into the application's memory itself, must refuse them. */
static void use_host_ptr(void) {
    cl_int err;
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    check("queue", err == CL_SUCCESS);
    const size_t len = 64, big = 4096;
    unsigned char *host = guarded(len);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_USE_HOST_PTR, len, host, &err);
    check("CL_MEM_USE_HOST_PTR buffer", err == CL_SUCCESS);
    unsigned char *dst = guarded(big);
    err = clEnqueueReadBuffer(q, buf, CL_TRUE, 0, big, dst, 0, NULL, NULL);
    printf("blocking read past the end: %d\n", err);
    check("blocking read past the end refused", err == CL_INVALID_VALUE);
    err = clEnqueueReadBuffer(q, buf, CL_FALSE, 32, big, dst, 0, NULL, NULL);
    clFinish(q);
    printf("non-blocking read past the end: %d\n", err);
    check("non-blocking read past the end refused", err == CL_INVALID_VALUE);
    void *m = clEnqueueMapBuffer(q, buf, CL_TRUE, CL_MAP_READ, 0, big, 0, NULL, NULL, &err);
    printf("map past the end: %d\n", err);
    check("map past the end refused", err == CL_INVALID_VALUE && m == NULL);
    size_t bo[3] = {0, 0, 0}, ho[3] = {0, 0, 0}, region[3] = {16, 16, 1};
    err = clEnqueueReadBufferRect(q, buf, CL_TRUE, bo, ho, region, 16, 0, 16, 0, dst, 0, NULL, NULL);
    printf("rectangle read past the end: %d\n", err);
    check("rectangle read past the end refused", err == CL_INVALID_VALUE);
    cl_buffer_region sub = {32, 64};
    cl_mem s = clCreateSubBuffer(buf, 0, CL_BUFFER_CREATE_TYPE_REGION, &sub, &err);
    printf("sub-buffer past the end: %d\n", err);
    check("sub-buffer past the end refused", err == CL_INVALID_VALUE && s == NULL);
    check("guard bytes after the CL_MEM_USE_HOST_PTR memory", intact(host, len));
    check("guard bytes after the read buffer", intact(dst, big));
}

/* A zero-copy buffer (the worker says the device is host-unified): the shim computes every
 * address it hands out or copies through from the buffer's size, whatever the worker says, and
 * the worker scribbling over the shared memory changes data, never where it goes. */
static void zero_copy(void) {
    cl_int err;
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    check("queue", err == CL_SUCCESS);
    const size_t len = 1 << 20, big = 2 << 20;
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, len, NULL, &err);
    check("zero-copy buffer", err == CL_SUCCESS);
    unsigned char *dst = guarded(big);
    err = clEnqueueReadBuffer(q, buf, CL_TRUE, 0, big, dst, 0, NULL, NULL);
    printf("blocking read past the end: %d\n", err);
    check("blocking read past the end refused", err == CL_INVALID_VALUE);
    err = clEnqueueReadBuffer(q, buf, CL_TRUE, 0, len, dst, 0, NULL, NULL);
    check("blocking read", err == CL_SUCCESS);
    err = clEnqueueWriteBuffer(q, buf, CL_TRUE, len / 2, len, dst, 0, NULL, NULL);
    check("blocking write past the end refused", err == CL_INVALID_VALUE);
    void *m = clEnqueueMapBuffer(q, buf, CL_TRUE, CL_MAP_READ, len / 2, len, 0, NULL, NULL, &err);
    printf("map past the end: %d\n", err);
    check("map past the end refused", err == CL_INVALID_VALUE && m == NULL);
    unsigned char *p = clEnqueueMapBuffer(q, buf, CL_TRUE, CL_MAP_WRITE, 0, len, 0, NULL, NULL, &err);
    check("map", err == CL_SUCCESS && p != NULL);
    if (p) {
        memset(p, 1, len);
        check("unmap", clEnqueueUnmapMemObject(q, buf, p, 0, NULL, NULL) == CL_SUCCESS);
    }
    cl_buffer_region sub = {len / 2, len};
    cl_mem s = clCreateSubBuffer(buf, 0, CL_BUFFER_CREATE_TYPE_REGION, &sub, &err);
    printf("sub-buffer past the end: %d\n", err);
    check("sub-buffer past the end refused", err == CL_INVALID_VALUE && s == NULL);
    sub.size = len / 4;
    s = clCreateSubBuffer(buf, 0, CL_BUFFER_CREATE_TYPE_REGION, &sub, &err);
    check("sub-buffer", err == CL_SUCCESS);
    m = clEnqueueMapBuffer(q, s, CL_TRUE, CL_MAP_READ, 0, len / 2, 0, NULL, NULL, &err);
    check("sub-buffer map past its end refused", err == CL_INVALID_VALUE && m == NULL);
    check("guard bytes after the read buffer", intact(dst, big));
}

static volatile int released_ctx = 0, ran_after_release = 0, live_heard = 0;

static void CL_CALLBACK released_notify(const char *info, const void *pi, size_t cb, void *user_data) {
    (void)info, (void)pi, (void)cb, (void)user_data; /* user_data is freed: never looked at */
    if (released_ctx)
        ran_after_release = 1;
}

static void CL_CALLBACK live_notify(const char *info, const void *pi, size_t cb, void *user_data) {
    (void)info, (void)pi, (void)cb;
    *(volatile int *)user_data = 1;
}

/* A context released (and its user_data freed) before the worker dies must not hear of it; a
 * live one must. The worker (die-on-finish) exits at clFinish. */
static void context_callback(void) {
    cl_int err;
    char *user_data = malloc(64);
    strcpy(user_data, "alive");
    cl_context gone = clCreateContext(NULL, 1, &dev, released_notify, user_data, &err);
    check("context with a notify callback", err == CL_SUCCESS);
    cl_context live = clCreateContext(NULL, 1, &dev, live_notify, (void *)&live_heard, &err);
    check("second context", err == CL_SUCCESS);
    check("release", clReleaseContext(gone) == CL_SUCCESS);
    released_ctx = 1;
    memset(user_data, 0xDD, 64);
    free(user_data);
    cl_command_queue q = clCreateCommandQueueWithProperties(live, dev, NULL, &err);
    check("queue", err == CL_SUCCESS);
    err = clFinish(q); /* the worker dies here */
    printf("clFinish on a dying worker: %d\n", err);
    for (int i = 0; i < 50 && !live_heard; i++)
        usleep(100 * 1000);
    check("the live context heard of the death", live_heard);
    check("the released context's callback did not run", !ran_after_release);
}

/* Two non-blocking reads, then clFinish: the worker answers the shim's status query for both
 * events with one status. The shim must cut the worker off, and copy nothing it did not vouch
 * for into our memory. */
static void few_statuses(void) {
    cl_int err;
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
    unsigned char *a = guarded(4096), *b = guarded(4096);
    memset(a, 0x11, 4096);
    memset(b, 0x22, 4096);
    clEnqueueReadBuffer(q, m, CL_FALSE, 0, 4096, a, 0, NULL, NULL);
    clEnqueueReadBuffer(q, m, CL_FALSE, 0, 4096, b, 0, NULL, NULL);
    err = clFinish(q);
    printf("clFinish: %d\n", err);
    /* The finish itself the worker answered; the status query after it cut the worker off. */
    err = clFinish(q);
    printf("clFinish again: %d\n", err);
    check("a short status answer is a fault", err == CL_DEVICE_NOT_AVAILABLE);
    int untouched = 1;
    for (int i = 0; i < 4096; i++)
        untouched &= a[i] == 0x11 && b[i] == 0x22;
    check("nothing was copied into the application's memory", untouched);
    check("guards intact", intact(a, 4096) && intact(b, 4096));
}

/* NDRanges with no local size, of one to three dimensions and several global sizes, each twice:
 * the worker says the kernel requires work-groups of 0 x 2^64-1 x 3 work-items. That answer
 * only sorts the NDRanges into launch shapes (which of them the shim posts); every one must
 * return what the worker, which accepts everything, answers. */
static void group_size(void) {
    cl_int err;
    cl_program prog = built_program();
    cl_kernel k = clCreateKernel(prog, "k", &err);
    check("kernel", err == CL_SUCCESS);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
    check("kernel argument", clSetKernelArg(k, 0, sizeof m, &m) == CL_SUCCESS);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    const size_t sizes[][3] = {{1, 1, 1}, {3, 5, 6}, {64, 64, 9}, {(size_t)-1, 2, 3}, {7, (size_t)-1, 0}};
    int accepted = 0, tried = 0;
    for (cl_uint dim = 1; dim <= 3; dim++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int twice = 0; twice < 2; twice++) {
                tried++;
                accepted += clEnqueueNDRangeKernel(q, k, dim, NULL, sizes[s], NULL, 0, NULL, NULL) == CL_SUCCESS;
            }
    printf("NDRanges accepted: %d of %d\n", accepted, tried);
    check("every NDRange returned the worker's answer", accepted == tried);
    check("clFinish", clFinish(q) == CL_SUCCESS);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "huge-welcome") == 0) {
        cl_uint n = 0;
        cl_int err = clGetPlatformIDs(0, NULL, &n);
        printf("clGetPlatformIDs: %d, %u platforms\n", err, n);
        check("a worker announcing 40 000 objects is refused", n == 0);
        printf("survived\n");
        return failed;
    }
    if (!setup())
        return 1;
    if (strcmp(mode, "long-binary") == 0)
        long_binary();
    else if (strcmp(mode, "huge-num-args") == 0)
        huge_num_args();
    else if (strcmp(mode, "wide-pitch") == 0)
        wide_pitch();
    else if (strcmp(mode, "use-host-ptr") == 0)
        use_host_ptr();
    else if (strcmp(mode, "zero-copy") == 0)
        zero_copy();
    else if (strcmp(mode, "context-callback") == 0)
        context_callback();
    else if (strcmp(mode, "few-statuses") == 0)
        few_statuses();
    else if (strcmp(mode, "group-size") == 0)
        group_size();
    else {
        printf("unknown mode %s\n", mode);
        return 2;
    }
    printf("survived\n");
    return failed;
}
