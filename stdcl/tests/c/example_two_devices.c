/* The STDCL reference's second example (vector add split over two devices with
 * clarg_set_global + clfork + clflush), its buffer sizes made consistent: each device gets
 * half of the vectors in buffers of n/2 elements and an index space of n/2. Run with two
 * devices (pocl: POCL_DEVICES="cpu cpu"). */
#include <stdio.h>
#include <stdcl.h>

int main(void) {
    stdcl_init();
    cl_uint n = 2048;
    CLCONTEXT* cp = stddev;
    if (!cp || clgetndev(cp) < 2) { printf("need two devices, have %u\n", cp ? clgetndev(cp) : 0); return 1; }

    void* h = clopen(cp, "vecadd.cl", CLLD_NOW);
    cl_kernel krn = clsym(cp, h, "vecadd_kern", 0);
    if (!krn) { printf("load failed: %s\n", clerror()); return 1; }

    cl_float* a[2];
    cl_float* b[2];
    cl_float* c[2];
    size_t m = n / 2;
    for (int d = 0; d < 2; d++) {
        a[d] = (cl_float*)clmalloc(cp, m * sizeof(cl_float), 0);
        b[d] = (cl_float*)clmalloc(cp, m * sizeof(cl_float), 0);
        c[d] = (cl_float*)clmalloc(cp, m * sizeof(cl_float), 0);
        for (size_t i = 0; i < m; i++) {
            size_t g = d * m + i;
            a[d][i] = 1.1f * g;
            b[d][i] = 2.2f * g;
            c[d][i] = 0.0f;
        }
    }

    clndrange_t ndr = clndrange_init1d(0, m, 64);
    for (int d = 0; d < 2; d++) {
        clmsync(cp, d, a[d], CL_MEM_DEVICE | CL_EVENT_NOWAIT);
        clmsync(cp, d, b[d], CL_MEM_DEVICE | CL_EVENT_NOWAIT);
        clarg_set_global(cp, krn, 0, a[d]);
        clarg_set_global(cp, krn, 1, b[d]);
        clarg_set_global(cp, krn, 2, c[d]);
        if (clfork(cp, d, krn, &ndr, CL_EVENT_NOWAIT) == STDCL_EVENT_ERROR) {
            printf("clfork failed: %s\n", clerror());
            return 1;
        }
        clmsync(cp, d, c[d], CL_MEM_HOST | CL_EVENT_NOWAIT);
    }
    clflush(cp, 0, 0);
    clflush(cp, 1, 0);
    clwait(cp, 0, CL_ALL_EVENT | CL_EVENT_RELEASE);
    clwait(cp, 1, CL_ALL_EVENT | CL_EVENT_RELEASE);

    int bad = 0;
    double sum = 0;
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < m; i++) {
            if (c[d][i] != a[d][i] + b[d][i]) bad++;
            sum += c[d][i];
        }
    printf("devices %u\n", clgetndev(cp));
    printf("c[0] %f c[%zu] %f c[%u] %f\n", c[0][0], m, c[1][0], n - 1, c[1][m - 1]);
    printf("sum %.1f, %d wrong\n", sum, bad);
    for (int d = 0; d < 2; d++) { clfree(a[d]); clfree(b[d]); clfree(c[d]); }
    clclose(cp, h);
    return bad != 0;
}
