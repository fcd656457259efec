// N x (a marker with an event, a CL_COMPLETE callback on it, clWaitForEvents, the release): us per
// iteration, and how many callbacks ran. Usage: callback N.
#include "probe.h"
static volatile int hits;
static void CL_CALLBACK cb(cl_event e, cl_int s, void *u) { (void)e; (void)s; (void)u; __sync_fetch_and_add(&hits, 1); }
int main(int argc,char**argv){
  long n=atol(argv[1]); cl_device_id d; cl_int e; cl_context c=first_context(&d);
  cl_command_queue q=clCreateCommandQueueWithProperties(c,d,0,&e);
  double t=now();
  for(long i=0;i<n;i++){ cl_event ev; clEnqueueMarkerWithWaitList(q,0,0,&ev); clSetEventCallback(ev,CL_COMPLETE,cb,0); clWaitForEvents(1,&ev); clReleaseEvent(ev); }
  clFinish(q);
  printf("marker+callback %.2f us, %d callbacks\n",(now()-t)/n/1e3, hits); return 0;}
