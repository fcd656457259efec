/* Programs embedded by stdcl-clld (scale.cl as source, bin_kern.bin as binary), loaded with
 * clopen(cp, NULL, ...). */
#include <stdcl.h>
#include "check.h"

int main(void) {
    CLCONTEXT* cp = stdcpu;
    void* h = clopen(cp, NULL, CLLD_NOW);
    CHECK(h != NULL, "clopen(cp, NULL) loads the embedded programs%s%s", h ? "" : ": ", h ? "" : why());
    cl_kernel ks = clsym(cp, h, "scale_kern", 0);
    cl_kernel kb = clsym(cp, h, "bin_kern", 0);
    CHECK(ks != NULL, "the embedded source's kernel");
    CHECK(kb != NULL, "the embedded binary's kernel");
    int* x = (int*)clmalloc(cp, 8 * sizeof(int), 0);
    for (int i = 0; i < 8; i++) x[i] = i;
    clndrange_t ndr = clndrange_init1d(0, 8, 0);
    clmsync(cp, 0, x, CL_MEM_DEVICE | CL_EVENT_NOWAIT);
    clforka(cp, 0, ks, &ndr, CL_EVENT_NOWAIT, x);
    clforka(cp, 0, kb, &ndr, CL_EVENT_NOWAIT, x);
    clmsync(cp, 0, x, CL_MEM_HOST | CL_EVENT_NOWAIT);
    clwait(cp, 0, CL_ALL_EVENT);
    CHECK(x[7] == 1014, "scale then +1000: x[7]=%d", x[7]);
    CHECK(clopen(cp, NULL, 0) == h && clclose(cp, h) == 1 && clclose(cp, h) == 0, "the embedded handle is counted");
    clfree(x);
    DONE();
}
