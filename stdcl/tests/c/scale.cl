/* Scales a vector in place; SCALE comes from the build options (-D SCALE=...) or is 2. */
#ifndef SCALE
#define SCALE 2
#endif
__kernel void scale_kern(__global int* x) {
    int i = get_global_id(0);
    x[i] = x[i] * SCALE;
}
