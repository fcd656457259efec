// Round trip split: time in clEnqueueNDRangeKernel and in clFinish, per iteration (medians over
// n iterations), and the whole; then the whole's p10/p50/p90/p99 and mean. argv[1]: iterations
// (5000), argv[2]: more buffers made beside (0; each is a record of the replay journal).
#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(int argc,char**argv){
  int n=argc>1?atoi(argv[1]):5000;
  int extra=argc>2?atoi(argv[2]):0;
  cl_device_id d; cl_int e;
  cl_context c=first_context(&d);
  cl_command_queue q=clCreateCommandQueueWithProperties(c,d,0,&e);
  const char*s="__kernel void empty(__global int*a,int b){}";
  cl_program pr=built_program(c,d,s);
  cl_kernel k=clCreateKernel(pr,"empty",&e);
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,4096,0,&e);
  for(int i=0;i<extra;i++) clCreateBuffer(c,CL_MEM_READ_WRITE,4096,0,&e);
  int v=0; clSetKernelArg(k,0,sizeof b,&b); clSetKernelArg(k,1,4,&v);
  size_t one=1; double *te=malloc(n*8),*tf=malloc(n*8),*tt=malloc(n*8);
  for(int i=0;i<200;i++){ clEnqueueNDRangeKernel(q,k,1,0,&one,0,0,0,0); clFinish(q);} 
  for(int i=0;i<n;i++){ double a=now(); clEnqueueNDRangeKernel(q,k,1,0,&one,0,0,0,0); double b2=now(); clFinish(q); double c2=now(); te[i]=b2-a; tf[i]=c2-b2; tt[i]=c2-a; }
  qsort(te,n,8,cmp); qsort(tf,n,8,cmp); qsort(tt,n,8,cmp);
  printf("enqueue %.2f  finish %.2f  whole %.2f us (medians)\n",te[n/2]/1e3,tf[n/2]/1e3,tt[n/2]/1e3);
  double sum=0; for(int i=0;i<n;i++) sum+=tt[i];
  printf("whole p10 %.1f p50 %.1f p90 %.1f p99 %.1f mean %.1f us\n",tt[n/10]/1e3,tt[n/2]/1e3,tt[n*9/10]/1e3,tt[n*99/100]/1e3,sum/n/1e3);
  return 0;}
