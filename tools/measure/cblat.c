// When a CL_COMPLETE callback runs, against the return of the clWaitForEvents on its event:
// N x (a marker with an event, the callback, the wait, then a spin until the callback has run).
// Prints the p10/p50/p90 of (callback's time - wait's return) in us (negative: the callback ran
// before the wait returned, as pocl and the cage promise) and how many ran after the wait.
// Usage: cblat N.
#include "probe.h"
static volatile int ran;
static volatile double ran_at;
static void CL_CALLBACK cb(cl_event e, cl_int s, void *u) { (void)e; (void)s; (void)u; ran_at = now(); __sync_synchronize(); ran = 1; }
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 2000; cl_device_id d; cl_int e; cl_context c = first_context(&d);
  cl_command_queue q = clCreateCommandQueueWithProperties(c, d, 0, &e);
  double *lag = malloc(n * sizeof *lag); long after = 0;
  for (long i = 0; i < n; i++) {
    cl_event ev; ran = 0;
    clEnqueueMarkerWithWaitList(q, 0, 0, &ev); clSetEventCallback(ev, CL_COMPLETE, cb, 0);
    clWaitForEvents(1, &ev); double back = now();
    while (!ran) {}
    lag[i] = (ran_at - back) / 1e3; after += lag[i] > 0;
    clReleaseEvent(ev);
  }
  qsort(lag, n, sizeof *lag, cmp);
  printf("callback - wait return: p10 %.2f p50 %.2f p90 %.2f us; %ld of %ld ran after the wait returned\n", lag[n / 10], lag[n / 2], lag[n * 9 / 10], after, n);
  return 0;
}
