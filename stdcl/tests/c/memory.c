/* Memory: clmalloc/clsizeofmem/clmsync, clmrealloc (host and device contents kept), detached
 * memory with clmattach/clmdetach, clmcopy, clmctl, zero sizes, GL calls. */
#include <stdcl.h>
#include "check.h"

static const char* src = "__kernel void twice(__global int* x) { int i = get_global_id(0); x[i] = 2 * x[i]; }\n";

int main(void) {
    CLCONTEXT* cp = stdcpu;
    void* h = clsopen(cp, src, CLLD_NOW);
    cl_kernel k = clsym(cp, h, "twice", 0);
    CHECK(k != NULL, "kernel twice");

    size_t n = 1000;
    int* a = (int*)clmalloc(cp, n * sizeof(int), 0);
    CHECK(a != NULL && clsizeofmem(a) == n * sizeof(int), "clmalloc: %zu bytes", clsizeofmem(a));
    CHECK(((size_t)a & 63) == 0, "clmalloc memory is aligned for vector types");
    for (size_t i = 0; i < n; i++) a[i] = (int)i;
    clndrange_t ndr = clndrange_init1d(0, n, 0);
    clmsync(cp, 0, a, CL_MEM_DEVICE | CL_EVENT_WAIT);
    clforka(cp, 0, k, &ndr, CL_EVENT_WAIT, a);
    a[999] = -1; /* host-only change, overwritten by the sync back */
    clmsync(cp, 0, a, CL_MEM_HOST | CL_EVENT_WAIT);
    CHECK(a[10] == 20 && a[999] == 1998, "one pointer on host and device: a[10]=%d a[999]=%d", a[10], a[999]);

    /* Grow: host contents kept; the device copy of the old part too (no sync before the kernel). */
    int* b = (int*)clmrealloc(cp, a, 2 * n * sizeof(int), 0);
    CHECK(b != NULL && clsizeofmem(b) == 2 * n * sizeof(int), "clmrealloc grows to %zu bytes", clsizeofmem(b));
    CHECK(b[10] == 20 && b[999] == 1998, "clmrealloc keeps the host contents");
    errno = 0;
    CHECK(b == a || (clsizeofmem(a) == 0 && errno == EINVAL), "the old pointer is gone after a move");
    clerror();
    clforka(cp, 0, k, &ndr, CL_EVENT_WAIT, b);
    clmsync(cp, 0, b, CL_MEM_HOST | CL_EVENT_WAIT);
    CHECK(b[10] == 40 && b[999] == 3996, "clmrealloc keeps the device contents: b[10]=%d", b[10]);
    int* s = (int*)clmrealloc(cp, b, 10 * sizeof(int), 0);
    CHECK(s && clsizeofmem(s) == 10 * sizeof(int) && s[9] == 36, "clmrealloc shrinks, keeping the head");
    int* r = (int*)clmrealloc(cp, NULL, 64, 0);
    CHECK(r && clsizeofmem(r) == 64, "clmrealloc(NULL) allocates");

    /* Zero sizes give unique pointers that clfree takes. */
    void* z1 = clmalloc(cp, 0, 0);
    void* z2 = clmalloc(cp, 0, 0);
    CHECK(z1 && z2 && z1 != z2 && clsizeofmem(z1) == 0, "clmalloc(0) gives unique pointers");
    clfree(z1);
    clfree(z2);

    /* Detached memory, attached and detached again. */
    int* d = (int*)clmalloc(cp, 16 * sizeof(int), CL_MEM_DETACHED);
    CHECK(d && (clmctl(d, CL_MCTL_GET_STATUS) & CL_MEM_DETACHED), "CL_MEM_DETACHED: not attached");
    errno = 0;
    CHECK(clmsync(cp, 0, d, CL_MEM_DEVICE | CL_EVENT_WAIT) == STDCL_EVENT_ERROR && errno == EINVAL,
          "clmsync of detached memory fails (EINVAL)");
    clerror();
    CHECK(clmattach(cp, d) == 0 && !(clmctl(d, CL_MCTL_GET_STATUS) & CL_MEM_DETACHED), "clmattach");
    errno = 0;
    CHECK(clmattach(cp, d) == -1 && errno == EBUSY, "clmattach twice fails (EBUSY)");
    clerror();
    for (int i = 0; i < 16; i++) d[i] = 100 + i;
    clndrange_t n16 = clndrange_init1d(0, 16, 0);
    clmsync(cp, 0, d, CL_MEM_DEVICE | CL_EVENT_NOWAIT);
    clforka(cp, 0, k, &n16, CL_EVENT_NOWAIT, d);
    clmsync(cp, 0, d, CL_MEM_HOST | CL_EVENT_NOWAIT);
    clwait(cp, 0, CL_ALL_EVENT);
    CHECK(d[15] == 230, "attached memory works in kernels: d[15]=%d", d[15]);
    CHECK(clmdetach(d) == 0 && d[15] == 230, "clmdetach keeps the host memory");
    errno = 0;
    CHECK(clmdetach(d) == -1 && errno == EINVAL, "clmdetach twice fails (EINVAL)");
    clerror();
    CHECK(clmattach(stddev, d) == 0, "re-attached to another context (stddev)");
    void* hd = clsopen(stddev, src, CLLD_NOW);
    cl_kernel kd = clsym(stddev, hd, "twice", 0);
    clmsync(stddev, 0, d, CL_MEM_DEVICE | CL_EVENT_WAIT);
    clforka(stddev, 0, kd, &n16, CL_EVENT_WAIT, d);
    clmsync(stddev, 0, d, CL_MEM_HOST | CL_EVENT_WAIT);
    CHECK(d[1] == 404, "and runs there (202 doubled again): d[1]=%d", d[1]);
    errno = 0;
    CHECK(clarg_set_global(cp, k, 0, d) == -1 && errno == EINVAL, "memory of another context is refused");
    clerror();
    clclose(stddev, hd);

    /* clmcopy: device to device. */
    int* src_m = (int*)clmalloc(cp, 8 * sizeof(int), 0);
    int* dst_m = (int*)clmalloc(cp, 8 * sizeof(int), 0);
    for (int i = 0; i < 8; i++) { src_m[i] = 7 * i; dst_m[i] = 0; }
    clmsync(cp, 0, src_m, CL_MEM_DEVICE | CL_EVENT_NOWAIT);
    clmsync(cp, 0, dst_m, CL_MEM_DEVICE | CL_EVENT_NOWAIT);
    CHECK(clmcopy(cp, 0, dst_m, src_m, CL_EVENT_NOWAIT) != STDCL_EVENT_ERROR, "clmcopy");
    clmsync(cp, 0, dst_m, CL_MEM_HOST | CL_EVENT_NOWAIT);
    clwait(cp, 0, CL_MEM_EVENT);
    CHECK(dst_m[7] == 49, "clmcopy copied the device contents: dst[7]=%d", dst_m[7]);
    errno = 0;
    CHECK(clmcopy(cp, 0, s, dst_m, CL_EVENT_WAIT) != STDCL_EVENT_ERROR, "clmcopy into a larger buffer");
    CHECK(clmcopy(cp, 0, dst_m, s, CL_EVENT_WAIT) == STDCL_EVENT_ERROR && errno == EINVAL,
          "clmcopy into a smaller buffer fails (EINVAL)");
    clerror();

    /* clmctl */
    CHECK(clmctl(src_m, CL_MCTL_GET_DEVNUM) == 0, "clmctl GET_DEVNUM is 0 at first");
    CHECK(clmctl(src_m, CL_MCTL_SET_DEVNUM, 0) == 0, "clmctl SET_DEVNUM 0");
    errno = 0;
    CHECK(clmctl(src_m, CL_MCTL_SET_DEVNUM, 99) == -1 && errno == EINVAL, "clmctl SET_DEVNUM 99 fails (EINVAL)");
    clerror();
    CHECK((clmctl(src_m, CL_MCTL_GET_STATUS) & 3) == 0, "GET_STATUS reports the access flags given (0)");
    int* ro = (int*)clmalloc(cp, 16, CL_MEM_RO);
    CHECK(ro && (clmctl(ro, CL_MCTL_GET_STATUS) & 3) == CL_MEM_RO, "CL_MEM_RO memory");

    /* GL sharing is not there. */
    errno = 0;
    CHECK(clglmalloc(cp, 1, 0) == NULL && errno == ENOTSUP, "clglmalloc fails (ENOTSUP)");
    const char* m = clerror();
    CHECK(m && strstr(m, "GL sharing is not available"), "and says why: %s", m ? m : "(none)");
    CHECK(clglmsync(cp, 0, src_m, 0) == STDCL_EVENT_ERROR && errno == ENOTSUP, "clglmsync fails (ENOTSUP)");
    clerror();

    clfree(s);
    clfree(r);
    clfree(d);
    clfree(src_m);
    clfree(dst_m);
    clfree(ro);
    clclose(cp, h);
    DONE();
}
