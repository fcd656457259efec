// Latency of ONE 4 KiB read / write on NVIDIA, by method: blocking from malloc, blocking from
// pinned memfd pages, non-blocking into pinned + clWaitForEvents, + clFinish, + spin on the
// event's status.
#define _GNU_SOURCE
#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>
#define REG (1<<20)
#define REPS 400
static cl_command_queue q; static cl_mem b;
static double t[REPS];
static double med(){ qsort(t,REPS,sizeof(double),cmp); return t[REPS/2]/1e3; }
static void spin(cl_event ev){ cl_int st=1; clFlush(q); while(st>0) clGetEventInfo(ev,CL_EVENT_COMMAND_EXECUTION_STATUS,sizeof st,&st,0); }
int main(int argc,char**argv){
  size_t sz=argc>1?atol(argv[1]):4096;
  cl_device_id d; cl_int e;
  cl_context c=first_context(&d);
  q=clCreateCommandQueueWithProperties(c,d,0,&e);
  b=clCreateBuffer(c,CL_MEM_READ_WRITE,1<<20,0,&e);
  char *mal=aligned_alloc(4096,REG); memset(mal,1,REG);
  int fd=memfd_create("x",0); ftruncate(fd,REG);
  char *pin=mmap(0,REG,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); memset(pin,3,REG);
  cl_mem keep=clCreateBuffer(c,CL_MEM_USE_HOST_PTR|CL_MEM_READ_WRITE,REG,pin,&e);
  if(e) printf("pin failed %d\n",e);
  for(int rw=0;rw<2;rw++){
    const char*what=rw?"write":"read";
#define OP(blk,dst,ev) (rw? clEnqueueWriteBuffer(q,b,blk,0,sz,dst,0,0,ev) : clEnqueueReadBuffer(q,b,blk,0,sz,dst,0,0,ev))
    for(int r=0;r<REPS;r++){ double x=now(); OP(CL_TRUE,mal,0); t[r]=now()-x; } double a=med();
    for(int r=0;r<REPS;r++){ double x=now(); OP(CL_TRUE,pin,0); t[r]=now()-x; } double bb=med();
    for(int r=0;r<REPS;r++){ cl_event ev; double x=now(); OP(CL_FALSE,pin,&ev); clWaitForEvents(1,&ev); t[r]=now()-x; clReleaseEvent(ev);} double cc=med();
    for(int r=0;r<REPS;r++){ double x=now(); OP(CL_FALSE,pin,0); clFinish(q); t[r]=now()-x; } double dd=med();
    for(int r=0;r<REPS;r++){ cl_event ev; double x=now(); OP(CL_FALSE,pin,&ev); spin(ev); t[r]=now()-x; clReleaseEvent(ev);} double ee=med();
    for(int r=0;r<REPS;r++){ cl_event ev; double x=now(); OP(CL_FALSE,mal,&ev); spin(ev); t[r]=now()-x; clReleaseEvent(ev);} double ff=med();
    printf("%zu B %-5s blocking malloc %6.2f  blocking pinned %6.2f  nb pinned+wait %6.2f  nb pinned+finish %6.2f  nb pinned+spin %6.2f  nb malloc+spin %6.2f us\n",sz,what,a,bb,cc,dd,ee,ff);
  }
  (void)keep; return 0;}
