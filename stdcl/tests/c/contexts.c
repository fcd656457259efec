/* Default contexts: read as plain variables before any call, which devices they hold. */
#include <stdcl.h>
#include "check.h"

int main(void) {
    /* Read before any libstdcl call: the constructor must have set them. */
    CLCONTEXT* dev = stddev;
    CLCONTEXT* cpu = stdcpu;
    CHECK(dev != NULL, "stddev is set before any call");
    CHECK(cpu != NULL, "stdcpu is set before any call");
    CHECK(stdgpu == NULL, "stdgpu is NULL (no GPU here)");
    CHECK(stdrpu == NULL, "stdrpu is NULL (no accelerator here)");
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
