/* A kernel for ffmpeg's program_opencl filter (tests/tests/recovery_replay.rs): each frame inverted and
 * tinted, every other frame darkened (`index` is the frame's number). */
__kernel void invert(__write_only image2d_t dst, unsigned int index, __read_only image2d_t src) {
    const sampler_t s = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP_TO_EDGE | CLK_FILTER_NEAREST;
    int2 p = (int2)(get_global_id(0), get_global_id(1));
    float4 v = read_imagef(src, s, p);
    write_imagef(dst, p, (float4)(1.0f - v.x, v.y * 0.5f + 0.25f, 1.0f - v.z, v.w) * (0.5f + 0.5f * (index & 1)));
}
