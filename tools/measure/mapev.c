// Blocking map of SIZE bytes for writing with an event, a touch, and its unmap with an event,
// waited for (as pyopencl's enqueue_map_buffer and its release make them): median us per map
// and unmap over N.   mapev N SIZE
#include "probe.h"
#include <string.h>
int main(int argc,char**argv){
  int n=argc>1?atoi(argv[1]):200; size_t sz=argc>2?atol(argv[2]):1<<20;
  cl_device_id d; cl_int e; cl_context c=first_context(&d);
  cl_command_queue q=clCreateCommandQueueWithProperties(c,d,0,&e);
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,sz,0,&e);
  clFinish(q);
  double *t=malloc(8*n);
  for(int i=0;i<n;i++){ cl_event me, ue; double x=now();
    char *p=clEnqueueMapBuffer(q,b,CL_TRUE,CL_MAP_WRITE,0,sz,0,0,&me,&e);
    p[i%sz]=(char)i;
    clEnqueueUnmapMemObject(q,b,p,0,0,&ue); clWaitForEvents(1,&ue);
    clReleaseEvent(me); clReleaseEvent(ue); t[i]=(now()-x)/1e3; }
  qsort(t,n,8,cmp);
  printf("%zu B map+unmap with events: med %.1f us, min %.1f\n",sz,t[n/2],t[0]); return 0;}
