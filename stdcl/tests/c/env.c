/* Prints the default contexts as the environment shaped them: "stddev 2 stdcpu 2 stdgpu NULL
 * stdrpu NULL". With arguments "hold FILE": prints, then keeps the contexts (and their device
 * locks) until FILE exists (at most 60 s). */
#include <stdcl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void show(const char* name, CLCONTEXT* cp) {
    if (cp)
        printf("%s %u", name, clgetndev(cp));
    else
        printf("%s NULL", name);
}

int main(int argc, char** argv) {
    show("stddev", stddev);
    show(" stdcpu", stdcpu);
    show(" stdgpu", stdgpu);
    show(" stdrpu", stdrpu);
    printf("\n");
    const char* why = clerror();
    if (why) printf("why: %s\n", why);
    /* A context that exists works. */
    if (stdcpu) {
        int* x = (int*)clmalloc(stdcpu, 4 * sizeof(int), 0);
        void* h = clsopen(stdcpu, "__kernel void one(__global int* x) { x[get_global_id(0)] = 1; }", 0);
        clndrange_t ndr = clndrange_init1d(0, 4, 0);
        clforka(stdcpu, 0, clsym(stdcpu, h, "one", 0), &ndr, CL_EVENT_WAIT, x);
        clmsync(stdcpu, 0, x, CL_MEM_HOST | CL_EVENT_WAIT);
        printf("stdcpu works: %d\n", x[0] + x[1] + x[2] + x[3]);
    }
    fflush(stdout);
    if (argc == 3 && strcmp(argv[1], "hold") == 0)
        for (int i = 0; i < 600 && access(argv[2], F_OK) != 0; i++) usleep(100000);
    return 0;
}
