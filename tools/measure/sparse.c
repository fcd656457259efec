// Long-lived small buffers among short-lived ones: N times a 64 KiB buffer made with data and
// released, and every 16th time a 4 KiB buffer made with data and kept. Prints the shared
// memory this process maps and has touched (RssShmem: slabs and buffer segments) at the end,
// and the microseconds per creation. Usage: sparse [N]
#include "probe.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static long rss_shmem_kb(void){
  FILE*f=fopen("/proc/self/status","r"); char l[256]; long kb=-1;
  while(f&&fgets(l,sizeof l,f)) if(!strncmp(l,"RssShmem:",9)) kb=atol(l+9);
  if(f) fclose(f); return kb;}
int main(int argc,char**argv){
  int n=argc>1?atoi(argv[1]):4096;
  cl_device_id d; cl_int e;
  cl_context c=first_context(&d);
  static char data[64<<10]; memset(data,7,sizeof data);
  cl_mem *kept=malloc(sizeof(cl_mem)*(n/16+1)); int k=0;
  double t0=now();
  for(int i=0;i<n;i++){
    cl_mem t=clCreateBuffer(c,CL_MEM_READ_WRITE|CL_MEM_COPY_HOST_PTR,sizeof data,data,&e);
    if(e){printf("create failed %d\n",e);return 1;}
    clReleaseMemObject(t);
    if(i%16==15){ kept[k++]=clCreateBuffer(c,CL_MEM_READ_WRITE|CL_MEM_COPY_HOST_PTR,4096,data,&e); if(e){printf("keep failed %d\n",e);return 1;} }
  }
  double t1=now();
  printf("%d buffers (%d kept): %.2f us per creation, RssShmem %ld MiB\n",n+k,k,(t1-t0)/(n+k)/1e3,rss_shmem_kb()/1024);
  for(int i=0;i<k;i++) clReleaseMemObject(kept[i]);
  return 0;}
