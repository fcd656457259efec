/* The program loader: files, strings, reference counts, default options, -I of the working
 * folder, CLLD_NOW/LAZY/NOBUILD with clbuild, clsym over all programs, binaries. Writes
 * bin_kern.bin (a binary of this driver) for the embedded test. */
#include <stdcl.h>
#include <stdlib.h>
#include "check.h"

static const char* defs_src =
    "#include \"stdcl_test_inc.h\"\n"
    "__kernel void defs(__global int* o) {\n"
    "#ifdef __STDCL__\n o[0] = 1;\n#else\n o[0] = 0;\n#endif\n"
    "#ifdef __CPU__\n o[1] = 1;\n#else\n o[1] = 0;\n#endif\n"
    "#ifdef __GPU__\n o[2] = 1;\n#else\n o[2] = 0;\n#endif\n"
    "#ifdef __POCL__\n o[3] = 1;\n#else\n o[3] = 0;\n#endif\n"
    " o[4] = FROM_INCLUDE;\n}\n";

static const char* bin_src =
    "__kernel void bin_kern(__global int* x) { int i = get_global_id(0); x[i] = x[i] + 1000; }\n";

/* Runs a one-int-buffer kernel over n items of x (host values in, results out). */
static int run(CLCONTEXT* cp, cl_kernel k, int* x, size_t n) {
    clndrange_t ndr = clndrange_init1d(0, n, 0);
    if (clmsync(cp, 0, x, CL_MEM_DEVICE | CL_EVENT_WAIT) == STDCL_EVENT_ERROR) return -1;
    if (clforka(cp, 0, k, &ndr, CL_EVENT_WAIT, x) == STDCL_EVENT_ERROR) return -1;
    if (clmsync(cp, 0, x, CL_MEM_HOST | CL_EVENT_WAIT) == STDCL_EVENT_ERROR) return -1;
    return 0;
}

/* Writes the binary of bin_src for stdcpu's first device, with plain OpenCL. */
static int write_binary(const char* path) {
    cl_platform_id p;
    cl_device_id d;
    cl_int err;
    if (clGetPlatformIDs(1, &p, NULL) || clGetDeviceIDs(p, CL_DEVICE_TYPE_CPU, 1, &d, NULL)) return -1;
    cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &bin_src, NULL, &err);
    if (err || clBuildProgram(prog, 1, &d, "-cl-kernel-arg-info", NULL, NULL)) return -1;
    size_t sz = 0;
    clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof sz, &sz, NULL);
    unsigned char* bin = malloc(sz);
    clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL);
    FILE* f = fopen(path, "wb");
    if (!f) return -1;
    fwrite(bin, 1, sz, f);
    fclose(f);
    free(bin);
    clReleaseProgram(prog);
    clReleaseContext(ctx);
    return 0;
}

int main(void) {
    CLCONTEXT* cp = stdcpu;
    int* x = (int*)clmalloc(cp, 16 * sizeof(int), 0);

    /* A file, opened twice: one handle, counted. */
    void* h1 = clopen(cp, "scale.cl", CLLD_NOW);
    void* h2 = clopen(cp, "scale.cl", 0);
    CHECK(h1 != NULL, "clopen scale.cl");
    CHECK(h1 == h2, "clopen of the same file again gives the same handle");
    cl_kernel k = clsym(cp, h1, "scale_kern", 0);
    CHECK(k != NULL && clsym(cp, h1, "scale_kern", 0) == k, "clsym gives one kernel per name");
    for (int i = 0; i < 16; i++) x[i] = i;
    CHECK(run(cp, k, x, 16) == 0 && x[5] == 10 && x[15] == 30, "scale_kern ran: x[5]=%d x[15]=%d", x[5], x[15]);
    CHECK(clclose(cp, h2) == 1, "clclose leaves one reference");
    CHECK(clclose(cp, h1) == 0, "clclose unloads at zero");

    /* Default options: defines and -I of the working folder. */
    void* hd = clsopen(cp, defs_src, CLLD_NOW);
    CHECK(hd != NULL, "clsopen with an #include from the working folder%s%s", hd ? "" : ": ", hd ? "" : why());
    cl_kernel kd = clsym(cp, hd, "defs", 0);
    int* o = (int*)clmalloc(cp, 8 * sizeof(int), 0);
    clndrange_t one = clndrange_init1d(0, 1, 1);
    CHECK(kd && clforka(cp, 0, kd, &one, CL_EVENT_WAIT, o) != STDCL_EVENT_ERROR, "defs ran");
    clmsync(cp, 0, o, CL_MEM_HOST | CL_EVENT_WAIT);
    CHECK(o[0] == 1, "-D __STDCL__");
    CHECK(o[1] == 1 && o[2] == 0, "-D __CPU__ and no __GPU__ on stdcpu");
    CHECK(o[3] == 1, "vendor define -D __POCL__");
    CHECK(o[4] == 4242, "-I the working folder (FROM_INCLUDE=%d)", o[4]);
    clclose(cp, hd);

    /* CLLD_LAZY: nothing is built until clsym, so a broken source opens and fails there. */
    void* hl = clsopen(cp, "__kernel void broken(__global int* x) { x[0] = ; }", CLLD_LAZY);
    CHECK(hl != NULL, "CLLD_LAZY opens a source without building it");
    errno = 0;
    CHECK(clsym(cp, hl, "broken", 0) == NULL && errno == ENOEXEC && clgeterror() == CL_BUILD_PROGRAM_FAILURE,
          "the lazy build fails at clsym (ENOEXEC, CL_BUILD_PROGRAM_FAILURE)");
    clerror();
    clclose(cp, hl);
    void* hl2 = clopen(cp, "scale.cl", CLLD_LAZY);
    CHECK(hl2 && clsym(cp, hl2, "scale_kern", 0) != NULL, "a good lazy program builds at clsym");
    clclose(cp, hl2);

    /* CLLD_NOBUILD + clbuild with options after the defaults. */
    void* hn = clopen(cp, "scale.cl", CLLD_NOBUILD);
    errno = 0;
    CHECK(hn && clsym(cp, hn, "scale_kern", 0) == NULL && errno == ENOEXEC, "CLLD_NOBUILD: clsym before clbuild fails");
    clerror();
    CHECK(clbuild(cp, hn, "-D SCALE=3", 0) == hn, "clbuild with -D SCALE=3");
    cl_kernel k3 = clsym(cp, hn, "scale_kern", 0);
    for (int i = 0; i < 16; i++) x[i] = i;
    CHECK(k3 && run(cp, k3, x, 16) == 0 && x[5] == 15, "the clbuild options apply: x[5]=%d", x[5]);

    /* clsym with no handle searches every program of the context. */
    void* hv0 = clopen(cp, "vecadd.cl", CLLD_NOBUILD);
    void* hv = clopen(cp, "vecadd.cl", CLLD_NOW);
    CHECK(hv && hv == hv0, "clopen(CLLD_NOW) of a file opened with CLLD_NOBUILD builds the same handle");
    CHECK(clsym(cp, NULL, "vecadd_kern", 0) != NULL && clsym(cp, NULL, "scale_kern", 0) == k3,
          "clsym(cp, NULL, ...) finds kernels of every open program");
    CHECK(clclose(cp, hv) == 1 && clclose(cp, hv0) == 0, "both openings counted");
    clclose(cp, hn);

    /* A binary file. */
    CHECK(write_binary("bin_kern.bin") == 0, "wrote bin_kern.bin with plain OpenCL");
    void* hb = clopen(cp, "bin_kern.bin", CLLD_NOW);
    cl_kernel kb = clsym(cp, hb, "bin_kern", 0);
    for (int i = 0; i < 16; i++) x[i] = i;
    CHECK(kb && run(cp, kb, x, 16) == 0 && x[3] == 1003, "a binary loads and runs: x[3]=%d%s%s", x[3], kb ? "" : " ",
          kb ? "" : why());
    clclose(cp, hb);
    clfree(x);
    clfree(o);
    DONE();
}
