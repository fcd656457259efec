// Does where the data was last written matter to a small non-blocking write from pinned pages?
// 50 x 4 KiB writes enqueued back to back from a pinned memfd region, then clFinish; us per
// write (median of REPS batches). The chunks are filled before the timed part: by this thread
// (A), by a thread on another core with plain stores (B), or with non-temporal stores (C).
#define _GNU_SOURCE
#include "probe.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <immintrin.h>
#define REG (1<<22)
#define REPS 300
#define N 50
static char *pin, *src; static size_t sz; static atomic_int go, done; static int nt;
static void fill(int ntst){
  if(!ntst){ memcpy(pin,src,sz*N); return; }
  for(size_t i=0;i<sz*N;i+=16) _mm_stream_si128((__m128i*)(pin+i), _mm_load_si128((__m128i*)(src+i)));
  _mm_sfence();
}
static void *helper(void *arg){
  cpu_set_t s; CPU_ZERO(&s); CPU_SET((long)arg,&s); sched_setaffinity(0,sizeof s,&s);
  for(;;){ int g; while((g=atomic_load(&go))==0) ; if(g<0) return 0; fill(nt); atomic_store(&go,0); atomic_store(&done,1); }
}
int main(int argc,char**argv){
  sz=argc>1?atol(argv[1]):4096; int ncpu=sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t s; CPU_ZERO(&s); CPU_SET(1,&s); sched_setaffinity(0,sizeof s,&s);
  cl_device_id d; cl_int e; cl_context c=first_context(&d);
  cl_command_queue q=clCreateCommandQueueWithProperties(c,d,0,&e);
  cl_mem b=clCreateBuffer(c,CL_MEM_READ_WRITE,REG,0,&e);
  src=aligned_alloc(4096,REG); memset(src,7,REG);
  int fd=memfd_create("x",0); ftruncate(fd,REG);
  pin=mmap(0,REG,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); memset(pin,3,REG);
  cl_mem keep=clCreateBuffer(c,CL_MEM_USE_HOST_PTR|CL_MEM_READ_WRITE,REG,pin,&e);
  if(e) printf("pin failed %d\n",e);
  pthread_t th; pthread_create(&th,0,helper,(void*)(long)(ncpu>4?ncpu/2+1:0));
  double t[4][REPS], f[4][REPS];
  for(int r=0;r<REPS;r++) for(int m=0;m<3;m++){
    double x=now();
    if(m==0) fill(0); else { nt=(m==2); atomic_store(&done,0); atomic_store(&go,1); while(!atomic_load(&done)) ; }
    f[m][r]=now()-x; x=now();
    for(int i=0;i<N;i++) clEnqueueWriteBuffer(q,b,CL_FALSE,i*sz,sz,pin+i*sz,0,0,0);
    clFinish(q); t[m][r]=(now()-x)/N;
  }
  atomic_store(&go,-1); pthread_join(th,0);
  for(int m=0;m<3;m++){ qsort(t[m],REPS,sizeof(double),cmp); qsort(f[m],REPS,sizeof(double),cmp); }
  printf("%zu B nb write from pinned, us/op: filled here %.2f  by another core %.2f  by another core, non-temporal %.2f  (fill of %d chunks: %.1f / %.1f / %.1f us)\n",
    sz,t[0][REPS/2]/1e3,t[1][REPS/2]/1e3,t[2][REPS/2]/1e3,N,f[0][REPS/2]/1e3,f[1][REPS/2]/1e3,f[2][REPS/2]/1e3);
  (void)keep; return 0;}
