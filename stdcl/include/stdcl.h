/* stdcl.h: cloister's libstdcl, the STDCL rev 1.3 interface ("Standard Compute Layer",
 * Brown Deer Technology) re-implemented over the standard OpenCL API.
 *
 * Link with -lstdcl (and -lOpenCL when the program calls OpenCL itself). The library goes
 * through the system's ICD loader, so a program runs directly on the installed drivers or,
 * unchanged, with its driver caged under `cloister run -- PROGRAM`.
 *
 * Errors: calls returning a pointer return NULL, calls returning int return -1, calls returning
 * cl_event return (cl_event)-1 (STDCL_EVENT_ERROR); errno says what went wrong, clerror()
 * describes it and clgeterror() gives the OpenCL error code behind it (CL_SUCCESS when none).
 * Nothing aborts the program.
 */
#ifndef STDCL_H
#define STDCL_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <stdarg.h>
#include <stddef.h>

#define STDCL_VERSION_STR "1.3"
#define STDCL_VERSION_HEX 0x00010300

#ifdef __cplusplus
extern "C" {
#endif

/* ---- default contexts ---- */

/* Opaque: a context with its devices, one in-order command queue per device and, per device,
 * an ordered list of kernel events and one of memory events. */
typedef struct _stdcl_context CLCONTEXT;
#define CONTEXT CLCONTEXT

/* All devices, CPUs, GPUs, accelerators ("reconfigurable processors") of one platform each;
 * NULL when there are none (or the context is disabled, see README "STDCL"). Valid from program
 * start (the library initialises them in its constructor) until exit. */
extern CLCONTEXT* stddev;
extern CLCONTEXT* stdcpu;
extern CLCONTEXT* stdgpu;
extern CLCONTEXT* stdrpu;

/* Creates the default contexts if the constructor has not (static links); idempotent. */
void stdcl_init(void);
/* Number of devices of a context (0 for NULL). */
cl_uint clgetndev(CLCONTEXT* cp);

/* ---- errors ---- */

/* The most recent error of this thread, in words, since the previous clerror() call; NULL if
 * none. The string stays valid until the next clerror() call of the thread. */
char* clerror(void);
/* The OpenCL error code behind the most recent error of this thread (CL_SUCCESS if it was not
 * an OpenCL error). */
cl_int clgeterror(void);
#define STDCL_EVENT_ERROR ((cl_event)(-1))

/* ---- dynamic CL program loader ---- */

#define CLLD_DEFAULT 0
#define CLLD_LAZY 1    /* build at the first clsym() */
#define CLLD_NOW 2     /* build now (the default) */
#define CLLD_NOBUILD 4 /* do not build: call clbuild() */

/* Loads a CL source or binary file (NULL: the programs embedded with stdcl-clld). Opening the
 * same file in the same context again returns the same handle with one more reference. */
void* clopen(CLCONTEXT* cp, const char* filename, int flags);
/* Loads a CL program from a source string (a new handle each time). */
void* clsopen(CLCONTEXT* cp, const char* srcstr, int flags);
/* Builds a handle opened with CLLD_NOBUILD: the default options, then `options`. */
void* clbuild(CLCONTEXT* cp, void* handle, char* options, int flags);
/* The kernel `sname` of `handle` (NULL: of every program loaded in the context). */
cl_kernel clsym(CLCONTEXT* cp, void* handle, const char* sname, int flags);
/* Drops one reference; returns the references left (0: unloaded), -1 on error. */
int clclose(CLCONTEXT* cp, void* handle);

/* ---- memory ---- */

#define CL_MEM_RO 0x0001
#define CL_MEM_WO 0x0002
#define CL_MEM_RW 0x0003
#define CL_MEM_HOST 0x0100
#define CL_MEM_DEVICE 0x0200
#define CL_MEM_NOCOPY 0x0400
#define CL_MEM_DETACHED 0x1000
#define CL_MEM_NOFORCE 0x2000

#define CL_MCTL_GET_STATUS 1
#define CL_MCTL_GET_DEVNUM 2
#define CL_MCTL_SET_DEVNUM 3
#define CL_MCTL_MARK_CLEAN 4
#define CL_MCTL_SET_IMAGE2D 5

void* clmalloc(CLCONTEXT* cp, size_t size, int flags);
void* clmrealloc(CLCONTEXT* cp, void* ptr, size_t size, int flags);
void clfree(void* ptr);
size_t clsizeofmem(void* ptr);
int clmattach(CLCONTEXT* cp, void* ptr);
int clmdetach(void* ptr);
cl_event clmsync(CLCONTEXT* cp, unsigned int devnum, void* ptr, int flags);
/* Copies the device copy of `src` into the device copy of `dst` (both attached to cp). */
cl_event clmcopy(CLCONTEXT* cp, unsigned int devnum, void* dst, void* src, int flags);
/* GL sharing is not available: these fail with errno ENOTSUP. */
void* clglmalloc(CLCONTEXT* cp, cl_uint glbuf, int flags);
cl_event clglmsync(CLCONTEXT* cp, unsigned int devnum, void* ptr, int flags);

int __stdcl_clmctl(void* ptr, int op, long arg);
static __inline__ int clmctl_va(void* ptr, int op, va_list ap) {
    long arg = 0;
    if (op == CL_MCTL_SET_DEVNUM) arg = va_arg(ap, int);
    return __stdcl_clmctl(ptr, op, arg);
}
static __inline__ int clmctl(void* ptr, int op, ...) {
    va_list ap;
    va_start(ap, op);
    int rc = clmctl_va(ptr, op, ap);
    va_end(ap);
    return rc;
}

/* ---- kernels ---- */

#define CL_FAST 0x08
#define CL_EVENT_WAIT 0x01
#define CL_EVENT_NOWAIT 0x02
#define CL_EVENT_RELEASE 0x04 /* deprecated: waited-for events are released unless NORELEASE */
#define CL_EVENT_NORELEASE 0x40
#define CL_KERNEL_EVENT 0x10
#define CL_MEM_EVENT 0x20
#define CL_ALL_EVENT (CL_KERNEL_EVENT | CL_MEM_EVENT)
#define CL_ALL_EVENTS CL_ALL_EVENT

typedef struct clndrange_struct {
    size_t dim;
    size_t gtid_offset[4];
    size_t gtid[4];
    size_t ltid[4]; /* 0: let the driver choose the work-group size */
} clndrange_t;

#define clndrange_init1d(o0, g0, l0) ((clndrange_t){1, {(o0), 0, 0, 0}, {(g0), 0, 0, 0}, {(l0), 0, 0, 0}})
#define clndrange_init2d(o0, g0, l0, o1, g1, l1) \
    ((clndrange_t){2, {(o0), (o1), 0, 0}, {(g0), (g1), 0, 0}, {(l0), (l1), 0, 0}})
#define clndrange_init3d(o0, g0, l0, o1, g1, l1, o2, g2, l2) \
    ((clndrange_t){3, {(o0), (o1), (o2), 0}, {(g0), (g1), (g2), 0}, {(l0), (l1), (l2), 0}})

int __stdcl_clarg_set(CLCONTEXT* cp, cl_kernel krn, unsigned int argnum, size_t size, const void* value);
/* Sets a by-value argument of any scalar or vector type: the size comes from the value's type,
 * the value may be any expression (a copy is passed). */
#define clarg_set(cp, krn, argnum, arg) \
    __stdcl_clarg_set((cp), (krn), (argnum), sizeof(arg), (const void*)(__typeof__(arg)[1]){(arg)})
/* Sets a __global/__constant argument to the device copy of clmalloc'd memory. */
int clarg_set_global(CLCONTEXT* cp, cl_kernel krn, unsigned int argnum, void* ptr);
/* Sets a __local argument of `size` bytes. */
int clarg_set_local(CLCONTEXT* cp, cl_kernel krn, unsigned int argnum, size_t size);

cl_event clfork(CLCONTEXT* cp, unsigned int devnum, cl_kernel krn, clndrange_t* ndr, int flags);

struct __stdcl_arg {
    size_t size;
    const void* value;
};
cl_event __stdcl_clforka(CLCONTEXT* cp, unsigned int devnum, cl_kernel krn, clndrange_t* ndr, int flags,
                         size_t nargs, const struct __stdcl_arg* args);

/* clforka(cp, devnum, krn, ndr, flags, arg0, arg1, ...): sets every argument of the kernel, in
 * order, then forks it. Each argument is passed as its value and size; the library asks the
 * kernel (clGetKernelArgInfo) what each argument is: a __global/__constant argument takes a
 * clmalloc'd pointer, a __local one its size in bytes, any other the value itself, whose size
 * must match the kernel's type (pass 1.0f, not 1.0, to a float). 1 to 32 arguments. */
#define __STDCL_ARG(a) {sizeof(a), (const void*)(__typeof__(a)[1]){(a)}}
#define __STDCL_CAT(a, b) __STDCL_CAT_(a, b)
#define __STDCL_CAT_(a, b) a##b
#define __STDCL_MAP(f, ...) __STDCL_CAT(__STDCL_MAP, __STDCL_NARG(__VA_ARGS__))(f, __VA_ARGS__)
#define clforka(cp, devnum, krn, ndr, flags, ...)                                           \
    __stdcl_clforka((cp), (devnum), (krn), (ndr), (flags), __STDCL_NARG(__VA_ARGS__), \
                    (const struct __stdcl_arg[]){__STDCL_MAP(__STDCL_ARG, __VA_ARGS__)})
#define __STDCL_MAP1(f, a) f(a)
#define __STDCL_MAP2(f, a, ...) f(a), __STDCL_MAP1(f, __VA_ARGS__)
#define __STDCL_MAP3(f, a, ...) f(a), __STDCL_MAP2(f, __VA_ARGS__)
#define __STDCL_MAP4(f, a, ...) f(a), __STDCL_MAP3(f, __VA_ARGS__)
#define __STDCL_MAP5(f, a, ...) f(a), __STDCL_MAP4(f, __VA_ARGS__)
#define __STDCL_MAP6(f, a, ...) f(a), __STDCL_MAP5(f, __VA_ARGS__)
#define __STDCL_MAP7(f, a, ...) f(a), __STDCL_MAP6(f, __VA_ARGS__)
#define __STDCL_MAP8(f, a, ...) f(a), __STDCL_MAP7(f, __VA_ARGS__)
#define __STDCL_MAP9(f, a, ...) f(a), __STDCL_MAP8(f, __VA_ARGS__)
#define __STDCL_MAP10(f, a, ...) f(a), __STDCL_MAP9(f, __VA_ARGS__)
#define __STDCL_MAP11(f, a, ...) f(a), __STDCL_MAP10(f, __VA_ARGS__)
#define __STDCL_MAP12(f, a, ...) f(a), __STDCL_MAP11(f, __VA_ARGS__)
#define __STDCL_MAP13(f, a, ...) f(a), __STDCL_MAP12(f, __VA_ARGS__)
#define __STDCL_MAP14(f, a, ...) f(a), __STDCL_MAP13(f, __VA_ARGS__)
#define __STDCL_MAP15(f, a, ...) f(a), __STDCL_MAP14(f, __VA_ARGS__)
#define __STDCL_MAP16(f, a, ...) f(a), __STDCL_MAP15(f, __VA_ARGS__)
#define __STDCL_MAP17(f, a, ...) f(a), __STDCL_MAP16(f, __VA_ARGS__)
#define __STDCL_MAP18(f, a, ...) f(a), __STDCL_MAP17(f, __VA_ARGS__)
#define __STDCL_MAP19(f, a, ...) f(a), __STDCL_MAP18(f, __VA_ARGS__)
#define __STDCL_MAP20(f, a, ...) f(a), __STDCL_MAP19(f, __VA_ARGS__)
#define __STDCL_MAP21(f, a, ...) f(a), __STDCL_MAP20(f, __VA_ARGS__)
#define __STDCL_MAP22(f, a, ...) f(a), __STDCL_MAP21(f, __VA_ARGS__)
#define __STDCL_MAP23(f, a, ...) f(a), __STDCL_MAP22(f, __VA_ARGS__)
#define __STDCL_MAP24(f, a, ...) f(a), __STDCL_MAP23(f, __VA_ARGS__)
#define __STDCL_MAP25(f, a, ...) f(a), __STDCL_MAP24(f, __VA_ARGS__)
#define __STDCL_MAP26(f, a, ...) f(a), __STDCL_MAP25(f, __VA_ARGS__)
#define __STDCL_MAP27(f, a, ...) f(a), __STDCL_MAP26(f, __VA_ARGS__)
#define __STDCL_MAP28(f, a, ...) f(a), __STDCL_MAP27(f, __VA_ARGS__)
#define __STDCL_MAP29(f, a, ...) f(a), __STDCL_MAP28(f, __VA_ARGS__)
#define __STDCL_MAP30(f, a, ...) f(a), __STDCL_MAP29(f, __VA_ARGS__)
#define __STDCL_MAP31(f, a, ...) f(a), __STDCL_MAP30(f, __VA_ARGS__)
#define __STDCL_MAP32(f, a, ...) f(a), __STDCL_MAP31(f, __VA_ARGS__)
#define __STDCL_NARG(...) __STDCL_NARG_(__VA_ARGS__, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
#define __STDCL_NARG_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21, _22, _23, _24, _25, _26, _27, _28, _29, _30, _31, _32, N, ...) N

/* ---- synchronization ---- */

/* Flushes the device's queue (with CL_EVENT_WAIT: and waits for it to finish). 0 or -1. */
int clflush(CLCONTEXT* cp, unsigned int devnum, int flags);
/* Waits for the device's kernel events (CL_KERNEL_EVENT), then its memory events
 * (CL_MEM_EVENT), and releases them; with CL_EVENT_NORELEASE they stay listed and the last one
 * is returned. */
cl_event clwait(CLCONTEXT* cp, unsigned int devnum, int flags);

/* ---- embedded programs (written by stdcl-clld) ---- */

struct __stdcl_embedded {
    const char* name;
    const unsigned char* data;
    size_t size;
    int kind; /* 0 source, 1 binary */
};
int stdcl_register_embedded(const struct __stdcl_embedded* table, size_t n);

#ifdef __cplusplus
}
#endif

#endif
