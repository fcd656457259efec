// N blocking reads of SIZE bytes (4 KiB) into malloc memory: p10/p50/p90 us. Usage: rd4k [N] [SIZE].
#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
int main(int argc,char**argv){
  int n=argc>1?atoi(argv[1]):5000; size_t sz=argc>2?atol(argv[2]):4096;
  cl_device_id d; cl_int e; cl_context c=first_context(&d);
  cl_command_queue q=clCreateCommandQueueWithProperties(c,d,0,&e);
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,sz,0,&e);
  char*h=malloc(sz); double*t=malloc(n*8);
  for(int i=0;i<200;i++) clEnqueueReadBuffer(q,b,CL_TRUE,0,sz,h,0,0,0);
  for(int i=0;i<n;i++){ double a=now(); clEnqueueReadBuffer(q,b,CL_TRUE,0,sz,h,0,0,0); t[i]=now()-a; }
  qsort(t,n,8,cmp); printf("read %zu B blocking: p10 %.2f p50 %.2f p90 %.2f us\n",sz,t[n/10]/1e3,t[n/2]/1e3,t[n*9/10]/1e3);
  return 0;}
