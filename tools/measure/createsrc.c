// clCreateBuffer(CL_MEM_COPY_HOST_PTR) and its release, by where the contents come from: malloc, memfd pages, memfd
// pages a CL_MEM_USE_HOST_PTR buffer pinned. Usage: createsrc [SIZE]
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
#define REG (1<<22)
int main(int argc,char**argv){
  size_t sz=argc>1?atol(argv[1]):65536; int reps=2000;
  cl_platform_id p; cl_device_id d; cl_int e;
  clGetPlatformIDs(1,&p,0); clGetDeviceIDs(p,CL_DEVICE_TYPE_ALL,1,&d,0);
  cl_context c=clCreateContext(0,1,&d,0,0,&e);
  char *mal=aligned_alloc(4096,REG); memset(mal,1,REG);
  int fd=memfd_create("x",0); ftruncate(fd,REG);
  char *shm=mmap(0,REG,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); memset(shm,3,REG);
  int fd2=memfd_create("y",0); ftruncate(fd2,REG);
  char *pin=mmap(0,REG,PROT_READ|PROT_WRITE,MAP_SHARED,fd2,0); memset(pin,3,REG);
  cl_mem pb=clCreateBuffer(c,CL_MEM_USE_HOST_PTR|CL_MEM_READ_WRITE,REG,pin,&e);
  char *srcs[3]={mal,shm,pin}; const char*names[3]={"malloc","memfd","memfd pinned"};
  double *t=malloc(sizeof(double)*reps);
  for(int k=0;k<3;k++){ for(int r=0;r<reps;r++){ double x=now(); cl_mem m=clCreateBuffer(c,CL_MEM_READ_WRITE|CL_MEM_COPY_HOST_PTR,sz,srcs[k]+(r%16)*sz%REG,&e); clReleaseMemObject(m); t[r]=now()-x; }
    qsort(t,reps,sizeof(double),cmp); printf("%zu B COPY_HOST_PTR create+release from %-13s med %.2f us  p10 %.2f\n",sz,names[k],t[reps/2]/1e3,t[reps/10]/1e3); }
  (void)pb; return 0;}
