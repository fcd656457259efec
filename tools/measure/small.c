// Per-op cost of small transfers on NVIDIA by source memory: pageable malloc, shared memfd pages,
// and memfd pages pinned by a CL_MEM_USE_HOST_PTR buffer over them (what the worker's staging does).
#define _GNU_SOURCE
#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>
#define REG (1<<20)
int main(int argc,char**argv){
  cl_device_id d; cl_int e; int reps=300;
  cl_context c=first_context(&d);
  cl_command_queue q=clCreateCommandQueueWithProperties(c,d,0,&e);
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,1<<20,0,&e);
  char *mal=aligned_alloc(4096,REG); memset(mal,1,REG);
  int fd=memfd_create("x",0); ftruncate(fd,2*REG);
  char *shm=mmap(0,REG,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); memset(shm,2,REG);
  char *pin=mmap(0,REG,PROT_READ|PROT_WRITE,MAP_SHARED,fd,REG); memset(pin,3,REG);
  cl_mem keep=clCreateBuffer(c,CL_MEM_USE_HOST_PTR|CL_MEM_READ_WRITE,REG,pin,&e);
  if(e) printf("pin failed %d\n",e);
  char *srcs[3]={mal,shm,pin}; const char*names[3]={"malloc","memfd","memfd pinned"};
  size_t sizes[3]={4096,65536,262144};
  for(int si=0;si<3;si++){ size_t sz=sizes[si];
  for(int s=0;s<3;s++){
    double t[4][400];
    for(int r=0;r<reps;r++){
      int n=50; double x=now();
      for(int i=0;i<n;i++) clEnqueueWriteBuffer(q,b,CL_FALSE,(i%4)*sz%(1<<20),sz,srcs[s]+(i%4)*sz%REG,0,0,0);
      clFinish(q); t[0][r]=(now()-x)/n/1e3;
      x=now(); for(int i=0;i<10;i++) clEnqueueWriteBuffer(q,b,CL_TRUE,0,sz,srcs[s],0,0,0); t[1][r]=(now()-x)/10/1e3;
      x=now(); for(int i=0;i<10;i++) clEnqueueReadBuffer(q,b,CL_TRUE,0,sz,srcs[s],0,0,0); t[2][r]=(now()-x)/10/1e3;
      x=now(); for(int i=0;i<n;i++) clEnqueueReadBuffer(q,b,CL_FALSE,(i%4)*sz%(1<<20),sz,srcs[s]+(i%4)*sz%REG,0,0,0); clFinish(q); t[3][r]=(now()-x)/n/1e3;
    }
    for(int k=0;k<4;k++) qsort(t[k],reps,sizeof(double),cmp);
    printf("%7zu B %-13s nb write %6.2f  write %6.2f  read %6.2f  nb read %6.2f us/op (medians)\n",sz,names[s],t[0][reps/2],t[1][reps/2],t[2][reps/2],t[3][reps/2]);
  }}
  (void)keep; return 0;}
