// Whether a slow run is slow code or a slow moment: in each of PHASES phases a tenth of a second
// apart, a clSetKernelArg pair's ns (best of three runs of 2M) and a chain of dependent
// multiply-adds' ns per step, printed as pair/step. Usage: loop2 [PHASES] (default 5).
#include "probe.h"
#include <unistd.h>
int main(int argc,char**argv){
  int phases=argc>1?atoi(argv[1]):5; long n=2000000;
  cl_device_id d; cl_int e; cl_context c=first_context(&d);
  cl_program pr=built_program(c,d,"__kernel void empty(__global int*a,int b){}");
  cl_kernel k=clCreateKernel(pr,"empty",&e);
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,4096,0,&e);
  int v=0; volatile unsigned long sink;
  for(int p=0;p<phases;p++){
    double best=1e18, bestc=1e18;
    for(int r=0;r<3;r++){
      double t=now(); for(long i=0;i<n;i++){ v++; clSetKernelArg(k,0,sizeof b,&b); clSetKernelArg(k,1,4,&v);} double x=(now()-t)/n; if(x<best)best=x;
      unsigned long a=r+1; t=now(); for(long i=0;i<20000000;i++){ a=a*6364136223846793005UL+1442695040888963407UL; } sink=a; x=(now()-t)/2e7; if(x<bestc)bestc=x;
    }
    printf("%.1f/%.2f ", best, bestc); fflush(stdout); usleep(100000);
  }
  printf("\n"); (void)sink; return 0;}
