/* clarg_set with every scalar and vector type: each kernel stores its by-value argument, the
 * host compares the bytes. Also rvalue arguments, clarg_set_local and clarg_set_global. */
#include <stdcl.h>
#include <stdlib.h>
#include "check.h"

static char src[1 << 16];
static size_t len = 0;

/* One kernel per type: store_T(T v, __global T* out) { out[0] = v; } */
#define KERNEL(T) len += snprintf(src + len, sizeof src - len, \
    "__kernel void store_" #T "(" #T " v, __global " #T "* o) { o[0] = v; }\n");

#define TYPES(X)                                                                                   \
    X(char) X(uchar) X(short) X(ushort) X(int) X(uint) X(long) X(ulong) X(float) X(double)           \
    X(char2) X(char4) X(char8) X(char16) X(uchar2) X(uchar4) X(uchar8) X(uchar16)                   \
    X(short2) X(short4) X(short8) X(short16) X(ushort2) X(ushort4) X(ushort8) X(ushort16)           \
    X(int2) X(int3) X(int4) X(int8) X(int16) X(uint2) X(uint4) X(uint8) X(uint16)                   \
    X(long2) X(long3) X(long4) X(long8) X(long16) X(ulong2) X(ulong4) X(ulong8) X(ulong16)          \
    X(float2) X(float3) X(float4) X(float8) X(float16) X(double2) X(double3) X(double4) X(double8) X(double16)

static CLCONTEXT* cp;
static void* h;

/* Sets the value with clarg_set (size from its type), runs, compares the stored bytes. */
#define TRY(T)                                                                                     \
    {                                                                                              \
        cl_##T v;                                                                                  \
        unsigned char* p = (unsigned char*)&v;                                                     \
        for (size_t i = 0; i < sizeof v; i++) p[i] = (unsigned char)(i * 7 + 3);                   \
        if (sizeof(cl_##T) >= 4 && (#T[0] == 'f' || #T[0] == 'd')) fill_fp(p, sizeof v, #T[0]);   \
        cl_kernel k = clsym(cp, h, "store_" #T, 0);                                                \
        unsigned char* o = (unsigned char*)clmalloc(cp, sizeof v, 0);                              \
        memset(o, 0, sizeof v);                                                                    \
        clmsync(cp, 0, o, CL_MEM_DEVICE | CL_EVENT_WAIT);                                          \
        int rc = clarg_set(cp, k, 0, v);                                                           \
        rc |= clarg_set_global(cp, k, 1, o);                                                       \
        clndrange_t one = clndrange_init1d(0, 1, 1);                                               \
        rc |= clfork(cp, 0, k, &one, CL_EVENT_WAIT) == STDCL_EVENT_ERROR;                          \
        clmsync(cp, 0, o, CL_MEM_HOST | CL_EVENT_WAIT);                                            \
        /* 3-vectors occupy 4 elements; only the first 3 are defined */                           \
        size_t cmp = #T[strlen(#T) - 1] == '3' ? sizeof v * 3 / 4 : sizeof v;                      \
        CHECK(k && rc == 0 && memcmp(o, &v, cmp) == 0, "clarg_set %-8s (%2zu bytes)", #T, sizeof v); \
        clfree(o);                                                                                 \
    }

/* Floating-point lanes get ordinary numbers (byte patterns could be NaNs). */
static void fill_fp(unsigned char* p, size_t n, char kind) {
    if (kind == 'f')
        for (size_t i = 0; i < n / 4; i++) ((float*)p)[i] = 1.5f + (float)i;
    else
        for (size_t i = 0; i < n / 8; i++) ((double*)p)[i] = -2.25 + (double)i;
}

int main(void) {
    cp = stdcpu;
    TYPES(KERNEL)
    len += snprintf(src + len, sizeof src - len,
        "__kernel void sum_local(int n, __local int* tmp, __global int* o) {\n"
        "  int l = get_local_id(0); tmp[l] = l + n; barrier(CLK_LOCAL_MEM_FENCE);\n"
        "  if (l == 0) { int s = 0; for (int i = 0; i < get_local_size(0); i++) s += tmp[i]; o[0] = s; } }\n");
    h = clsopen(cp, src, CLLD_NOW);
    CHECK(h != NULL, "built %zu bytes of kernels%s%s", len, h ? "" : ": ", h ? "" : why());
    TYPES(TRY)

    /* An rvalue argument, a __local argument and a __global one. */
    cl_kernel k = clsym(cp, h, "sum_local", 0);
    int* o = (int*)clmalloc(cp, sizeof(int), 0);
    int base = 40;
    int rc = clarg_set(cp, k, 0, base + 2);
    rc |= clarg_set_local(cp, k, 1, 16 * sizeof(int));
    rc |= clarg_set_global(cp, k, 2, o);
    clndrange_t ndr = clndrange_init1d(0, 16, 16);
    rc |= clfork(cp, 0, k, &ndr, CL_EVENT_WAIT) == STDCL_EVENT_ERROR;
    clmsync(cp, 0, o, CL_MEM_HOST | CL_EVENT_WAIT);
    CHECK(rc == 0 && o[0] == 16 * 42 + 120, "rvalue, __local and __global arguments: %d", o[0]);
    clfree(o);
    clclose(cp, h);
    DONE();
}
