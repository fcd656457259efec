// Many small buffers: create N (256 bytes each), write 4 bytes of each non-blocking, clFinish
// (whose replay checkpoint reads them all back when zero-copy is off), release them all; the
// clFinish's time and the microseconds per create, write and release.
#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
int main(int argc,char**argv){
  int n=argc>1?atoi(argv[1]):10000;
  cl_device_id d; cl_int e;
  cl_context c=first_context(&d);
  cl_command_queue q=clCreateCommandQueueWithProperties(c,d,0,&e);
  cl_mem *m=malloc(sizeof(cl_mem)*n);
  double t0=now();
  for(int i=0;i<n;i++) m[i]=clCreateBuffer(c,CL_MEM_READ_WRITE,256,0,&e);
  double t1=now();
  int v=1; for(int i=0;i<n;i++) clEnqueueWriteBuffer(q,m[i],CL_FALSE,0,4,&v,0,0,0);
  double tf=now(); clFinish(q);
  double t2=now(); printf("finish %.2f ms  ",(t2-tf)/1e6);
  for(int i=0;i<n;i++) clReleaseMemObject(m[i]);
  double t3=now();
  printf("create %.2f write %.2f release %.2f us each (means)\n",(t1-t0)/n/1e3,(t2-t1)/n/1e3,(t3-t2)/n/1e3);
  return 0;}
