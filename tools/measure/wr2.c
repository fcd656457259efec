// Batches of 50 non-blocking 4 KiB writes, then clFinish: medians over batches of the posting
// phase per write and of the whole per write.
#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc,char**argv){
  int reps=argc>1?atoi(argv[1]):400; size_t sz=argc>2?atol(argv[2]):4096; int n=50;
  cl_device_id d; cl_int e; cl_context c=first_context(&d);
  cl_command_queue q=clCreateCommandQueueWithProperties(c,d,0,&e);
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,sz*n,0,&e);
  char *h=malloc(sz*n); memset(h,1,sz*n);
  double *tp=malloc(8*reps),*tt=malloc(8*reps);
  for(int r=0;r<reps;r++){ double x=now();
    for(int i=0;i<n;i++) clEnqueueWriteBuffer(q,b,CL_FALSE,i*sz,sz,h+i*sz,0,0,0);
    double y=now(); clFinish(q); double z=now(); tp[r]=(y-x)/n/1e3; tt[r]=(z-x)/n/1e3; }
  qsort(tp,reps,8,cmp); qsort(tt,reps,8,cmp);
  printf("nb write %zu B: posting %.2f  whole %.2f us/op (medians)\n",sz,tp[reps/2],tt[reps/2]); return 0;}
