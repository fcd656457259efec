/* Default contexts: read as plain variables before any call, which devices they hold. */
#include <stdcl.h>
#include "check.h"

/* Devices of a type over all platforms, asked with plain OpenCL. */
static cl_uint count(cl_device_type t) {
    cl_platform_id p[16];
    cl_uint np = 0, total = 0;
    if (clGetPlatformIDs(16, p, &np) != CL_SUCCESS) return 0;
    for (cl_uint i = 0; i < np && i < 16; i++) {
        cl_uint n = 0;
        if (clGetDeviceIDs(p[i], t, 0, NULL, &n) == CL_SUCCESS) total += n;
    }
    return total;
}

int main(void) {
    /* Read before any libstdcl call: the constructor must have set them. */
    CLCONTEXT* dev = stddev;
    CLCONTEXT* cpu = stdcpu;
    CHECK(dev != NULL, "stddev is set before any call");
    CHECK(cpu != NULL, "stdcpu is set before any call");
    CHECK((stdgpu == NULL) == (count(CL_DEVICE_TYPE_GPU) == 0), "stdgpu is %s (%u GPUs)",
          stdgpu ? "set" : "NULL", count(CL_DEVICE_TYPE_GPU));
    CHECK((stdrpu == NULL) == (count(CL_DEVICE_TYPE_ACCELERATOR) == 0), "stdrpu is %s (%u accelerators)",
          stdrpu ? "set" : "NULL", count(CL_DEVICE_TYPE_ACCELERATOR));
    stdcl_init();
    CHECK(stddev == dev && stdcpu == cpu, "stdcl_init keeps the same contexts");
    CHECK(clgetndev(stdcpu) >= 1, "stdcpu has %u device(s)", clgetndev(stdcpu));
    CHECK(clgetndev(stddev) >= clgetndev(stdcpu), "stddev has at least stdcpu's devices");
    errno = 0;
    CHECK(clgetndev(NULL) == 0 && errno == EINVAL, "clgetndev(NULL) is 0 with EINVAL");
    CHECK(clgetndev(stdgpu) == 0, "clgetndev(stdgpu) is 0");

    /* Work left outstanding at exit: the teardown waits for it and releases it. */
    float* m = (float*)clmalloc(stdcpu, 1 << 20, 0);
    CHECK(m != NULL, "clmalloc before exit");
    memset(m, 0, 1 << 20);
    CHECK(clmsync(stdcpu, 0, m, CL_MEM_DEVICE | CL_EVENT_NOWAIT) != STDCL_EVENT_ERROR, "a sync left pending at exit");
    DONE();
}
