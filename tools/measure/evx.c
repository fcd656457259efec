// Blocking write, then read, of SIZE bytes with an event each (as pyopencl makes every transfer),
// the event released after: the median us per transfer of each over N.   evx N SIZE
#include "probe.h"
#include <string.h>
int main(int argc,char**argv){
  int n=argc>1?atoi(argv[1]):200; size_t sz=argc>2?atol(argv[2]):1<<20;
  cl_device_id d; cl_int e; cl_context c=first_context(&d);
  cl_command_queue q=clCreateCommandQueueWithProperties(c,d,0,&e);
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,sz,0,&e);
  char *h=malloc(sz); memset(h,1,sz);
  double *tw=malloc(8*n),*tr=malloc(8*n);
  for(int i=0;i<n;i++){ cl_event ev; double x=now();
    clEnqueueWriteBuffer(q,b,CL_TRUE,0,sz,h,0,0,&ev); clReleaseEvent(ev); tw[i]=(now()-x)/1e3;
    x=now(); clEnqueueReadBuffer(q,b,CL_TRUE,0,sz,h,0,0,&ev); clReleaseEvent(ev); tr[i]=(now()-x)/1e3; }
  qsort(tw,n,8,cmp); qsort(tr,n,8,cmp);
  printf("%zu B with event: write med %.1f us, read med %.1f us\n",sz,tw[n/2],tr[n/2]); return 0;}
