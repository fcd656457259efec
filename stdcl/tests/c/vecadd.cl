/* The kernel of the two reference examples: c = a + b. */
__kernel void vecadd_kern(__global float* a, __global float* b, __global float* c) {
    int i = get_global_id(0);
    c[i] = a[i] + b[i];
}
