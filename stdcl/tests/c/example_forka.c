/* The STDCL reference's first example (vector add on one device with clforka), on stddev
 * since this machine has CPU devices only. */
#include <stdio.h>
#include <stdcl.h>

int main(void) {
    stdcl_init();
    cl_uint n = 1024;
    if (!stddev) { printf("no devices\n"); return 1; }

    cl_float* a = (cl_float*)clmalloc(stddev, n * sizeof(cl_float), 0);
    cl_float* b = (cl_float*)clmalloc(stddev, n * sizeof(cl_float), 0);
    cl_float* c = (cl_float*)clmalloc(stddev, n * sizeof(cl_float), 0);
    for (cl_uint i = 0; i < n; i++) { a[i] = 1.1f * i; b[i] = 2.2f * i; c[i] = 0.0f; }

    void* h = clopen(stddev, "vecadd.cl", CLLD_NOW);
    cl_kernel krn = clsym(stddev, h, "vecadd_kern", 0);
    if (!h || !krn) { printf("load failed: %s\n", clerror()); return 1; }

    clndrange_t ndr = clndrange_init1d(0, n, 64);
    clmsync(stddev, 0, a, CL_MEM_DEVICE | CL_EVENT_NOWAIT);
    clmsync(stddev, 0, b, CL_MEM_DEVICE | CL_EVENT_NOWAIT);
    cl_event ev = clforka(stddev, 0, krn, &ndr, CL_EVENT_NOWAIT, a, b, c);
    if (ev == STDCL_EVENT_ERROR) { printf("clforka failed: %s\n", clerror()); return 1; }
    clmsync(stddev, 0, c, CL_MEM_HOST | CL_EVENT_NOWAIT);
    clwait(stddev, 0, CL_ALL_EVENT | CL_EVENT_RELEASE);

    int bad = 0;
    double sum = 0;
    for (cl_uint i = 0; i < n; i++) {
        if (c[i] != a[i] + b[i]) bad++;
        sum += c[i];
    }
    for (cl_uint i = 0; i < n; i += 256) printf("%u %f %f %f\n", i, a[i], b[i], c[i]);
    printf("sum %.1f, %d wrong\n", sum, bad);

    clclose(stddev, h);
    clfree(a);
    clfree(b);
    clfree(c);
    return bad != 0;
}
