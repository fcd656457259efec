/* clfork/clforka, index spaces in 1 to 3 dimensions, and the event flags of clfork, clmsync,
 * clflush and clwait. */
#include <stdcl.h>
#include "check.h"

static const char* src =
    "__kernel void axpy(int n, float a, __global const float* x, __global float* y, __local float* t, float4 v) {\n"
    "  int i = get_global_id(0); t[get_local_id(0)] = x[i];\n"
    "  barrier(CLK_LOCAL_MEM_FENCE);\n"
    "  if (i < n) y[i] = a * t[get_local_id(0)] + y[i] + v.x + v.w; }\n"
    "__kernel void where(__global int* o) {\n"
    "  size_t x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);\n"
    "  size_t w = get_global_size(0), h = get_global_size(1);\n"
    "  size_t ox = get_global_offset(0), oy = get_global_offset(1), oz = get_global_offset(2);\n"
    "  o[((z - oz) * h + (y - oy)) * w + (x - ox)] = (int)(x * 10000 + y * 100 + z); }\n"
    "__kernel void spin(__global int* o) { int s = 0; for (int i = 0; i < 200000; i++) s += i % 7; o[get_global_id(0)] = s; }\n";

static cl_int status(cl_event ev) {
    cl_int s = -1;
    clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof s, &s, NULL);
    return s;
}

int main(void) {
    CLCONTEXT* cp = stdcpu;
    void* h = clsopen(cp, src, CLLD_NOW);
    cl_kernel axpy = clsym(cp, h, "axpy", 0);
    cl_kernel where = clsym(cp, h, "where", 0);
    cl_kernel spin = clsym(cp, h, "spin", 0);
    CHECK(axpy && where && spin, "kernels%s%s", h ? "" : ": ", h ? "" : why());

    /* clforka with every kind of argument: int, float, two __global, __local (a size), float4. */
    int n = 64;
    float* x = (float*)clmalloc(cp, n * sizeof(float), 0);
    float* y = (float*)clmalloc(cp, n * sizeof(float), 0);
    for (int i = 0; i < n; i++) { x[i] = (float)i; y[i] = 1.0f; }
    clndrange_t ndr = clndrange_init1d(0, n, 16);
    cl_float4 v = {{0.25f, 9.0f, 9.0f, 0.5f}};
    clmsync(cp, 0, x, CL_MEM_DEVICE | CL_EVENT_NOWAIT);
    clmsync(cp, 0, y, CL_MEM_DEVICE | CL_EVENT_NOWAIT);
    cl_event ev = clforka(cp, 0, axpy, &ndr, CL_EVENT_NOWAIT, n, 2.0f, x, y, 16 * sizeof(float), v);
    CHECK(ev != STDCL_EVENT_ERROR && ev != NULL, "clforka NOWAIT returns the kernel's event%s%s",
          ev == STDCL_EVENT_ERROR ? ": " : "", ev == STDCL_EVENT_ERROR ? why() : "");
    clmsync(cp, 0, y, CL_MEM_HOST | CL_EVENT_NOWAIT);
    CHECK(clwait(cp, 0, CL_ALL_EVENT) == NULL, "clwait(CL_ALL_EVENT) releases and returns NULL");
    CHECK(y[10] == 2.0f * 10 + 1.0f + 0.75f && y[63] == 2.0f * 63 + 1.75f, "clforka results: y[10]=%g y[63]=%g", y[10], y[63]);
    errno = 0;
    CHECK(clforka(cp, 0, axpy, &ndr, CL_EVENT_WAIT, n, 2.0f, x) == STDCL_EVENT_ERROR && errno == EINVAL,
          "clforka with too few arguments fails (EINVAL)");
    clerror();

    /* 2D and 3D index spaces with offsets. */
    int* o = (int*)clmalloc(cp, 4 * 3 * 2 * sizeof(int), 0);
    clndrange_t n2 = clndrange_init2d(1, 4, 2, 5, 3, 1);
    CHECK(clforka(cp, 0, where, &n2, CL_EVENT_WAIT, o) == NULL, "clforka WAIT returns NULL (event released)");
    clmsync(cp, 0, o, CL_MEM_HOST | CL_EVENT_WAIT);
    CHECK(o[0] == 10500 && o[4 * 3 - 1] == 40700, "2D: o[0]=%d o[11]=%d", o[0], o[11]);
    clndrange_t n3 = clndrange_init3d(0, 4, 0, 0, 3, 0, 2, 2, 0);
    clarg_set_global(cp, where, 0, o);
    CHECK(clfork(cp, 0, where, &n3, CL_EVENT_WAIT) == NULL, "clfork 3D");
    clmsync(cp, 0, o, CL_MEM_HOST | CL_EVENT_WAIT);
    CHECK(o[0] == 2 && o[23] == 30203, "3D: o[0]=%d o[23]=%d", o[0], o[23]);

    /* CL_EVENT_NORELEASE with WAIT: the caller gets a completed event to release. */
    cl_event mine = clfork(cp, 0, where, &n3, CL_EVENT_WAIT | CL_EVENT_NORELEASE);
    CHECK(mine && mine != STDCL_EVENT_ERROR && status(mine) == CL_COMPLETE, "WAIT|NORELEASE returns a completed event");
    clReleaseEvent(mine);
    mine = clmsync(cp, 0, o, CL_MEM_HOST | CL_EVENT_WAIT | CL_EVENT_NORELEASE);
    CHECK(mine && mine != STDCL_EVENT_ERROR && status(mine) == CL_COMPLETE, "clmsync WAIT|NORELEASE too");
    clReleaseEvent(mine);

    /* The lists: clwait(CL_MEM_EVENT) leaves kernel events; NORELEASE keeps them listed. */
    int* so = (int*)clmalloc(cp, 4 * sizeof(int), 0);
    clndrange_t four = clndrange_init1d(0, 4, 0);
    clarg_set_global(cp, spin, 0, so);
    cl_event kev = clfork(cp, 0, spin, &four, CL_EVENT_NOWAIT);
    cl_event mev = clmsync(cp, 0, so, CL_MEM_HOST | CL_EVENT_NOWAIT);
    CHECK(clwait(cp, 0, CL_MEM_EVENT) == NULL, "clwait(CL_MEM_EVENT)");
    CHECK(status(kev) == CL_COMPLETE, "in-order queue: the kernel before the read is complete too");
    cl_event last = clwait(cp, 0, CL_KERNEL_EVENT | CL_EVENT_NORELEASE);
    CHECK(last == kev, "clwait(KERNEL|NORELEASE) returns the kernel event still listed");
    CHECK(clwait(cp, 0, CL_KERNEL_EVENT) == NULL, "a second clwait releases it");
    CHECK(clwait(cp, 0, CL_ALL_EVENT | CL_EVENT_NORELEASE) == NULL, "nothing left to wait for");
    (void)mev;
    errno = 0;
    CHECK(clwait(cp, 0, 0) == STDCL_EVENT_ERROR && errno == EINVAL, "clwait without a list fails (EINVAL)");
    clerror();

    /* clflush: flush, or with CL_EVENT_WAIT finish. */
    kev = clfork(cp, 0, spin, &four, CL_EVENT_NOWAIT);
    CHECK(clflush(cp, 0, 0) == 0, "clflush");
    CHECK(clflush(cp, 0, CL_EVENT_WAIT) == 0 && status(kev) == CL_COMPLETE, "clflush(CL_EVENT_WAIT) finishes the queue");
    clwait(cp, 0, CL_ALL_EVENT);
    errno = 0;
    CHECK(clfork(cp, 0, spin, &four, CL_EVENT_WAIT | CL_EVENT_NOWAIT) == STDCL_EVENT_ERROR && errno == EINVAL,
          "WAIT and NOWAIT together fail (EINVAL)");
    clerror();

    clfree(x);
    clfree(y);
    clfree(o);
    clfree(so);
    clclose(cp, h);
    DONE();
}
