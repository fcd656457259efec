// Many callbacks outstanding at once: N x (32 markers, each with an event and a CL_COMPLETE
// callback, then clFinish, then a spin until all 32 callbacks ran, then the releases); us per
// batch (median). After a wait the cage asks the status of every event whose callback is still
// waiting (up to 64), so this is where asking them one call each, or all in one, shows.
// Usage: manycb N.
#include "probe.h"
#define K 32
static volatile int hits;
static void CL_CALLBACK cb(cl_event e, cl_int s, void *u) { (void)e; (void)s; (void)u; __sync_fetch_and_add(&hits, 1); }
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 500; cl_device_id d; cl_int e; cl_context c = first_context(&d);
  cl_command_queue q = clCreateCommandQueueWithProperties(c, d, 0, &e);
  double *t = malloc(sizeof(double) * n); cl_event ev[K];
  for (long r = 0; r < n; r++) {
    hits = 0; double x = now();
    for (int i = 0; i < K; i++) { clEnqueueMarkerWithWaitList(q, 0, 0, &ev[i]); clSetEventCallback(ev[i], CL_COMPLETE, cb, 0); }
    clFinish(q);
    while (__sync_fetch_and_add(&hits, 0) < K) ;
    for (int i = 0; i < K; i++) clReleaseEvent(ev[i]);
    t[r] = (now() - x) / 1e3;
  }
  qsort(t, n, sizeof(double), cmp);
  printf("%d markers with callbacks, clFinish, all callbacks run: p10 %.1f p50 %.1f p90 %.1f us a batch\n", K, t[n / 10], t[n / 2], t[9 * n / 10]);
  return 0;
}
