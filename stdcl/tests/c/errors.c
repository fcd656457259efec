/* Failures: each call returns its failure value, sets errno, and clerror()/clgeterror() say
 * why; nothing aborts. */
#include <stdcl.h>
#include "check.h"

int main(void) {
    CLCONTEXT* cp = stdcpu;
    int not_a_context = 0;
    CLCONTEXT* bogus = (CLCONTEXT*)&not_a_context;

    CHECK(clerror() == NULL, "clerror() is NULL before any error");
    errno = 0;
    CHECK(clopen(NULL, "scale.cl", 0) == NULL && errno == EINVAL, "clopen(NULL context): EINVAL");
    const char* m = clerror();
    CHECK(m != NULL && strstr(m, "clopen") != NULL, "clerror names the call: %s", m ? m : "(none)");
    CHECK(clerror() == NULL, "and is NULL again after it was read");
    CHECK(clmalloc(bogus, 16, 0) == NULL && errno == EINVAL, "a pointer that is not a context: EINVAL");
    clerror();
    CHECK(clopen(cp, "no-such-file.cl", 0) == NULL && errno == ENOENT, "clopen of a missing file: ENOENT");
    clerror();

    void* h = clsopen(cp, "__kernel void k(__global int* x) { x[0] = undefined_name; }", CLLD_NOW);
    CHECK(h == NULL && errno == ENOEXEC && clgeterror() == CL_BUILD_PROGRAM_FAILURE,
          "a source that does not build: ENOEXEC, CL_BUILD_PROGRAM_FAILURE");
    m = clerror();
    CHECK(m && strstr(m, "build log") && strstr(m, "undefined_name"), "clerror carries the build log");

    h = clsopen(cp, "__kernel void k(__global float* x, float f) { x[0] = f; }", CLLD_NOW);
    cl_kernel k = clsym(cp, h, "k", 0);
    CHECK(k != NULL, "a good kernel");
    CHECK(clsym(cp, h, "nope", 0) == NULL && errno == ENOENT, "clsym of a missing kernel: ENOENT");
    clerror();
    CHECK(clsym(cp, (void*)0x7770, "k", 0) == NULL && errno == EINVAL, "clsym with a made-up handle: EINVAL");
    clerror();
    CHECK(clclose(cp, (void*)0x7770) == -1 && errno == EINVAL, "clclose of a made-up handle: -1, EINVAL");
    clerror();
    CHECK(clsym(stddev, h, "k", 0) == NULL && errno == EINVAL, "a handle used with another context: EINVAL");
    clerror();

    double d = 1.0;
    CHECK(clarg_set(cp, k, 1, d) == -1 && clgeterror() == CL_INVALID_ARG_SIZE,
          "clarg_set of a double to a float argument: CL_INVALID_ARG_SIZE");
    clerror();
    CHECK(clarg_set(cp, k, 7, 1.0f) == -1 && clgeterror() == CL_INVALID_ARG_INDEX, "argument 7 of 2: CL_INVALID_ARG_INDEX");
    clerror();
    int plain[4];
    CHECK(clarg_set_global(cp, k, 0, plain) == -1 && errno == EINVAL, "clarg_set_global of malloc'd memory: EINVAL");
    clerror();
    float* x = (float*)clmalloc(cp, 4 * sizeof(float), 0);
    clndrange_t ndr = clndrange_init1d(0, 1, 1);
    CHECK(clforka(cp, 0, k, &ndr, CL_EVENT_WAIT, x, 2.0) == STDCL_EVENT_ERROR && clgeterror() == CL_INVALID_ARG_SIZE,
          "clforka with a double for a float: CL_INVALID_ARG_SIZE");
    clerror();
    CHECK(clforka(cp, 0, k, &ndr, CL_EVENT_WAIT, x, 2.0f) == NULL, "the same with a float works");
    CHECK(clfork(cp, 0, k, NULL, CL_EVENT_WAIT) == STDCL_EVENT_ERROR && errno == EINVAL, "clfork without ndr: EINVAL");
    clerror();
    CHECK(clfork(cp, 9, k, &ndr, CL_EVENT_WAIT) == STDCL_EVENT_ERROR && errno == EINVAL, "clfork on device 9: EINVAL");
    clerror();
    clndrange_t bad = ndr;
    bad.dim = 4;
    CHECK(clfork(cp, 0, k, &bad, CL_EVENT_WAIT) == STDCL_EVENT_ERROR && errno == EINVAL, "4 dimensions: EINVAL");
    clerror();
    CHECK(clmsync(cp, 0, x, CL_EVENT_WAIT) == STDCL_EVENT_ERROR && errno == EINVAL, "clmsync without HOST or DEVICE: EINVAL");
    clerror();
    CHECK(clmsync(cp, 0, plain, CL_MEM_HOST) == STDCL_EVENT_ERROR && errno == EINVAL, "clmsync of malloc'd memory: EINVAL");
    clerror();
    CHECK(clflush(cp, 5, 0) == -1 && errno == EINVAL, "clflush on device 5: EINVAL");
    clerror();
    CHECK(clwait(stdgpu, 0, CL_ALL_EVENT) == STDCL_EVENT_ERROR && errno == EINVAL, "clwait on a NULL context: EINVAL");
    clerror();
    clfree(plain);
    CHECK(errno == EINVAL, "clfree of malloc'd memory: EINVAL, nothing freed");
    clerror();
    CHECK(clsizeofmem(plain) == 0 && errno == EINVAL, "clsizeofmem of malloc'd memory: 0, EINVAL");
    clerror();
    CHECK(clmalloc(cp, (size_t)-1 / 2, 0) == NULL && errno != 0, "an impossible clmalloc: NULL, errno set");
    clerror();
    CHECK(clmctl(x, 77) == -1 && errno == EINVAL, "clmctl with an unknown operation: EINVAL");
    clerror();
    clfree(x);
    clclose(cp, h);
    DONE();
}
