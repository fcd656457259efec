// Two clSetKernelArg (a buffer, then an int that changes) or one cached clGetDeviceInfo in a tight loop:
// ns per iteration, best of RUNS runs of N. Usage: loop W N [RUNS] (W=1 setarg pair, W=0 info).
#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(int argc,char**argv){
  int w=atoi(argv[1]); long n=atol(argv[2]); int runs=argc>3?atoi(argv[3]):1;
  cl_device_id d; cl_int e;
  cl_context c=first_context(&d);
  const char*s="__kernel void empty(__global int*a,int b){}";
  cl_program pr=built_program(c,d,s);
  cl_kernel k=clCreateKernel(pr,"empty",&e);
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,4096,0,&e);
  char name[256]; int v=0; double best=1e18;
  for(int r=0;r<runs;r++){ double t=now();
  for(long i=0;i<n;i++){
    if(w==0) clGetDeviceInfo(d,CL_DEVICE_NAME,sizeof name,name,0);
    else { v++; clSetKernelArg(k,0,sizeof b,&b); clSetKernelArg(k,1,4,&v); }
  }
  double x=(now()-t)/n; if(x<best)best=x; }
  printf("%s %.1f ns/iter\n", w?"setarg-pair":"info", best);
  return 0;}
