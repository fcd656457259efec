// Non-blocking 4 KiB writes after N blocking writes and reads of the same buffer (as cloister bench's
// 4 KiB rows run): per batch of 50 writes, the us per write and the clFinish after them.
#include "probe.h"
#include <string.h>
int main(int argc,char**argv){
  int pre=argc>1?atoi(argv[1]):200; int reps=argc>2?atoi(argv[2]):40;
  cl_device_id d; cl_int e; cl_context c=first_context(&d);
  cl_command_queue q=clCreateCommandQueueWithProperties(c,d,0,&e);
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,4096,0,&e);
  char h[4096]; memset(h,1,sizeof h);
  for(int i=0;i<pre;i++) clEnqueueWriteBuffer(q,b,CL_TRUE,0,4096,h,0,0,0);
  for(int i=0;i<pre;i++) clEnqueueReadBuffer(q,b,CL_TRUE,0,4096,h,0,0,0);
  for(int r=0;r<reps;r++){ double x=now();
    for(int i=0;i<50;i++) clEnqueueWriteBuffer(q,b,CL_FALSE,0,4096,h,0,0,0);
    double y=now(); clFinish(q); double z=now();
    printf("%.2f/%.1f ",(y-x)/50/1e3,(z-y)/1e3); }
  printf("\n"); return 0;}
