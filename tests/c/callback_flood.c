/* Callbacks registered on many events that are already complete, each event released by the
 * application right after (so its callback holds the last reference, and the release happens on
 * the thread that runs callbacks), after another thread of the application has enqueued once
 * (a callback, or a thread of its own: MODE 1 or 2). The driver may call such a callback inside
 * clSetEventCallback. Caged, this once deadlocked the application and its worker: the thread
 * running callbacks waited, in the release, for the worker to take the main thread's commands,
 * while the worker's thread for them waited to hand that thread a notification.
 *
 * usage: callback_flood [N=2000] [MODE=1]
 * Prints "callbacks N of N" and "value V" (N + 2 with MODE 1, N + 1 with MODE 2). */
#include "check.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static const char *src = "__kernel void inc(__global int *a) { a[get_global_id(0)] += 1; }\n";
static cl_command_queue q;
static cl_kernel k;
static size_t n = 64;
static volatile int count, enqueued;

static void CL_CALLBACK enqueue_once(cl_event ev, cl_int st, void *ud) {
    (void)ev; (void)st; (void)ud;
    clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL);
    enqueued = 1;
}

static void *enqueue_in_thread(void *a) {
    (void)a;
    clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL);
    return NULL;
}

static void CL_CALLBACK counted(cl_event ev, cl_int st, void *ud) {
    (void)ev; (void)st; (void)ud;
    __sync_fetch_and_add(&count, 1);
}

int main(int argc, char **argv) {
    int total = argc > 1 ? atoi(argv[1]) : 2000, mode = argc > 2 ? atoi(argv[2]) : 1;
    cl_device_id d;
    cl_int err;
    cl_context ctx = first_device_context(&d);
    q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    if (clBuildProgram(prog, 1, &d, NULL, NULL, NULL) != CL_SUCCESS) return 1;
    k = clCreateKernel(prog, "inc", &err);
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n * sizeof(int), NULL, &err);
    int zero = 0;
    clEnqueueFillBuffer(q, b, &zero, sizeof zero, 0, n * sizeof(int), 0, NULL, NULL);
    clSetKernelArg(k, 0, sizeof b, &b);
    if (mode == 1) {
        cl_event first;
        clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, &first);
        clSetEventCallback(first, CL_COMPLETE, enqueue_once, NULL);
        clFinish(q);
        while (!enqueued) usleep(1000);
        clReleaseEvent(first);
    } else {
        pthread_t t;
        pthread_create(&t, NULL, enqueue_in_thread, NULL);
        pthread_join(t, NULL);
    }
    clFinish(q);
    cl_event *events = malloc(total * sizeof(cl_event));
    for (int i = 0; i < total; i++) clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, &events[i]);
    clFinish(q);
    for (int i = 0; i < total; i++) {
        clSetEventCallback(events[i], CL_COMPLETE, counted, NULL);
        clReleaseEvent(events[i]);
    }
    clFinish(q);
    for (int t = 0; t < 1000 && count < total; t++) usleep(10000);
    printf("callbacks %d of %d\n", count, total);
    int value = -1;
    clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof value, &value, 0, NULL, NULL);
    printf("value %d\n", value);
    return 0;
}
