// Creating and releasing a buffer with contents (CL_MEM_COPY_HOST_PTR) in a loop: microseconds per
// creation and per release, and the slowest creation. Usage: createdata [N] [SIZE] [WITH_DATA=1]
#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc,char**argv){
  int n=argc>1?atoi(argv[1]):4096; size_t sz=argc>2?atol(argv[2]):65536; int flags=argc>3?atoi(argv[3]):1;
  cl_device_id d; cl_int e; cl_context c=first_context(&d);
  char*data=malloc(sz); memset(data,7,sz);
  double tc=0,tr=0,mx=0;
  for(int i=0;i<n;i++){ double a=now(); cl_mem t=clCreateBuffer(c,CL_MEM_READ_WRITE|(flags?CL_MEM_COPY_HOST_PTR:0),sz,flags?data:0,&e); double b=now(); clReleaseMemObject(t); double x=now(); tc+=b-a; tr+=x-b; if(b-a>mx)mx=b-a;}
  printf("create %.2f (max %.0f) release %.2f us\n",tc/n/1e3,mx/1e3,tr/n/1e3); return 0;}
