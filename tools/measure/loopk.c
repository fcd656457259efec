// Layout probe: in ONE process, time the setarg pair on each of K kernels (different heap
// addresses), the int-only and buffer-only calls on kernel 0, and the cached info call.
#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define K 8
int main(int argc,char**argv){
  long n=argc>1?atol(argv[1]):100000; int runs=argc>2?atoi(argv[2]):10;
  cl_device_id d; cl_int e;
  cl_context c=first_context(&d);
  const char*s="__kernel void empty(__global int*a,int b){}";
  cl_program pr=built_program(c,d,s);
  cl_kernel k[K]; for(int j=0;j<K;j++){ k[j]=clCreateKernel(pr,"empty",&e); volatile char*pad=malloc(64*(j+1)*13); (void)pad; }
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,4096,0,&e);
  int v=0; char name[256];
  printf("pair per kernel:");
  for(int j=0;j<K;j++){ double best=1e18; for(int r=0;r<runs;r++){ double t=now();
    for(long i=0;i<n;i++){ v++; clSetKernelArg(k[j],0,sizeof b,&b); clSetKernelArg(k[j],1,4,&v); }
    double x=(now()-t)/n; if(x<best)best=x; } printf(" %.1f",best); }
  double bi=1e18,bb=1e18,bn=1e18;
  for(int r=0;r<runs;r++){ double t=now(); for(long i=0;i<n;i++){ v++; clSetKernelArg(k[0],1,4,&v);} double x=(now()-t)/n; if(x<bi)bi=x;
    t=now(); for(long i=0;i<n;i++){ clSetKernelArg(k[0],0,sizeof b,&b);} x=(now()-t)/n; if(x<bb)bb=x;
    t=now(); for(long i=0;i<n;i++){ clGetDeviceInfo(d,CL_DEVICE_NAME,sizeof name,name,0);} x=(now()-t)/n; if(x<bn)bn=x; }
  printf(" | int %.1f buf %.1f info %.1f\n",bi,bb,bn);
  return 0;}
