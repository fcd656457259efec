// Throughput of small non-blocking writes on NVIDIA by method: 50 enqueued back to back, then
// clFinish; us per write (median of 300 batches). Methods: write from malloc, write from pinned
// memfd pages, the same with an event per write (released after), and a device-side copy from a
// CL_MEM_USE_HOST_PTR buffer over the pinned pages (with and without events).
#define _GNU_SOURCE
#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>
#define REG (1<<22)
#define REPS 300
#define N 50
int main(int argc,char**argv){
  size_t sz=argc>1?atol(argv[1]):4096;
  cl_device_id d; cl_int e;
  cl_context c=first_context(&d);
  cl_command_queue q=clCreateCommandQueueWithProperties(c,d,0,&e);
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,1<<22,0,&e);
  char *mal=aligned_alloc(4096,REG); memset(mal,1,REG);
  int fd=memfd_create("x",0); ftruncate(fd,REG);
  char *pin=mmap(0,REG,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); memset(pin,3,REG);
  cl_mem pb=clCreateBuffer(c,CL_MEM_USE_HOST_PTR|CL_MEM_READ_WRITE,REG,pin,&e);
  if(e) printf("pin failed %d\n",e);
  double t[6][REPS]; cl_event ev[N];
  for(int r=0;r<REPS;r++){
    double x=now(); for(int i=0;i<N;i++) clEnqueueWriteBuffer(q,b,CL_FALSE,i*sz,sz,mal+i*sz,0,0,0); clFinish(q); t[0][r]=(now()-x)/N;
    x=now(); for(int i=0;i<N;i++) clEnqueueWriteBuffer(q,b,CL_FALSE,i*sz,sz,pin+i*sz,0,0,0); clFinish(q); t[1][r]=(now()-x)/N;
    x=now(); for(int i=0;i<N;i++) clEnqueueWriteBuffer(q,b,CL_FALSE,i*sz,sz,pin+i*sz,0,0,&ev[i]); clFinish(q);
      for(int i=0;i<N;i++){cl_int st; clGetEventInfo(ev[i],CL_EVENT_COMMAND_EXECUTION_STATUS,4,&st,0); clReleaseEvent(ev[i]);} t[2][r]=(now()-x)/N;
    x=now(); for(int i=0;i<N;i++) clEnqueueCopyBuffer(q,pb,b,i*sz,i*sz,sz,0,0,0); clFinish(q); t[3][r]=(now()-x)/N;
    x=now(); for(int i=0;i<N;i++) clEnqueueCopyBuffer(q,pb,b,i*sz,i*sz,sz,0,0,&ev[i]); clFinish(q);
      for(int i=0;i<N;i++){cl_int st; clGetEventInfo(ev[i],CL_EVENT_COMMAND_EXECUTION_STATUS,4,&st,0); clReleaseEvent(ev[i]);} t[4][r]=(now()-x)/N;
    x=now(); for(int i=0;i<N;i++) clEnqueueWriteBuffer(q,b,CL_FALSE,i*sz,sz,mal+i*sz,0,0,&ev[i]); clFinish(q);
      for(int i=0;i<N;i++){cl_int st; clGetEventInfo(ev[i],CL_EVENT_COMMAND_EXECUTION_STATUS,4,&st,0); clReleaseEvent(ev[i]);} t[5][r]=(now()-x)/N;
  }
  for(int k=0;k<6;k++) qsort(t[k],REPS,sizeof(double),cmp);
  printf("%zu B nb write, us/op: malloc %.2f  pinned %.2f  pinned+events %.2f  copy-from-pinned %.2f  copy+events %.2f  malloc+events %.2f\n",sz,
    t[0][REPS/2]/1e3,t[1][REPS/2]/1e3,t[2][REPS/2]/1e3,t[3][REPS/2]/1e3,t[4][REPS/2]/1e3,t[5][REPS/2]/1e3);
  return 0;}
