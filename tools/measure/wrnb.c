// Stream of non-blocking 4 KiB writes (batches of 50, then clFinish): us per write, min and median
// of batches, and the median of the posting phase alone (the 50 calls, before clFinish). A third
// argument (any) writes every one to offset 0 of a buffer of one write's size, as `cloister
// bench`'s write_4k_nb does.
#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
int main(int argc,char**argv){
  int reps=argc>1?atoi(argv[1]):400; size_t sz=argc>2?atol(argv[2]):4096; int n=50; int same=argc>3;
  cl_device_id d; cl_int e;
  cl_context c=first_context(&d);
  cl_command_queue q=clCreateCommandQueueWithProperties(c,d,0,&e);
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,same?sz:sz*n,0,&e);
  char *h=malloc(sz*n); memset(h,1,sz*n);
  double *t=malloc(sizeof(double)*reps),*tp=malloc(sizeof(double)*reps);
  for(int r=0;r<reps;r++){ double x=now();
    for(int i=0;i<n;i++) clEnqueueWriteBuffer(q,b,CL_FALSE,same?0:i*sz,sz,h+(same?0:i*sz),0,0,0);
    tp[r]=(now()-x)/n/1e3;
    clFinish(q); t[r]=(now()-x)/n/1e3; }
  qsort(t,reps,sizeof(double),cmp); qsort(tp,reps,sizeof(double),cmp);
  printf("nb write %zu B: min %.2f med %.2f us/op, posting med %.2f\n",sz,t[0],t[reps/2],tp[reps/2]); return 0;}
