/* The OpenCL 1.2-3.0 families beyond the forwarding core: images of every dimensionality with
 * pitched host memory, samplers, sub-buffers, rectangular transfers, program binaries,
 * separate compile/link with headers, cloned kernels, migration, destructor callbacks,
 * sub-devices, pipes. Every result is checked against the host; the same binary runs directly
 * and through cloister, and prints the same lines. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define CHECK(x) do { cl_int e_ = (x); if (e_ != CL_SUCCESS) { printf("FAIL %s:%d %s = %d\n", __FILE__, __LINE__, #x, e_); exit(1);} } while (0)
#define EXPECT(c, ...) do { if (!(c)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); exit(1);} } while (0)

static char order[64]; static int norder = 0;
static void note(void *ud) { order[norder++] = (char)(size_t)ud; }
static void CL_CALLBACK mem_destructor(cl_mem m, void *ud) { (void)m; note(ud); }
static void CL_CALLBACK ctx_destructor(cl_context c, void *ud) { (void)c; note(ud); }
static int link_cb = 0;
static void CL_CALLBACK on_link(cl_program p, void *ud) { (void)p; link_cb += ud == (void *)0x77; }

static const char *SRC =
  "__constant sampler_t nearest = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP_TO_EDGE | CLK_FILTER_NEAREST;\n"
  "__kernel void img_double(read_only image2d_t in, write_only image2d_t out) {\n"
  "  int2 p = (int2)(get_global_id(0), get_global_id(1));\n"
  "  write_imageui(out, p, read_imageui(in, nearest, p) * 2u); }\n"
  "__kernel void sample(read_only image2d_t in, sampler_t s, __global uint *out, int w) {\n"
  "  int2 p = (int2)(get_global_id(0), get_global_id(1));\n"
  "  out[p.y * w + p.x] = read_imageui(in, s, p).x; }\n"
  "__kernel void inc(__global int *a) { a[get_global_id(0)] += 1; }\n";

int main(void) {
  cl_platform_id p; cl_device_id d; cl_int err;
  CHECK(clGetPlatformIDs(1, &p, NULL));
  CHECK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));
  cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err); CHECK(err);
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d, NULL, &err); CHECK(err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err); CHECK(err);
  CHECK(clBuildProgram(prog, 1, &d, NULL, NULL, NULL));

  /* Sources in several strings, one of them empty, with and without lengths (an empty string
   * once crashed the caged driver: it got a length of 0 and no NUL to find). */
  {
    const char *parts[3] = { "__kernel void part1(__global int *a) { a[0] = 1; }\n", "", "__kernel void part2(__global int *a) { a[1] = 2; }\n" };
    size_t lens[3] = { strlen(parts[0]), 0, strlen(parts[2]) };
    for (int with_lengths = 0; with_lengths < 2; with_lengths++) {
      cl_program pp = clCreateProgramWithSource(ctx, 3, parts, with_lengths ? lens : NULL, &err); CHECK(err);
      CHECK(clBuildProgram(pp, 1, &d, NULL, NULL, NULL));
      cl_uint nk = 0; CHECK(clCreateKernelsInProgram(pp, 0, NULL, &nk));
      EXPECT(nk == 2, "kernels from three strings: %u", nk);
      CHECK(clReleaseProgram(pp));
    }
  }

  /* Supported formats. */
  cl_uint nf = 0; CHECK(clGetSupportedImageFormats(ctx, CL_MEM_READ_WRITE, CL_MEM_OBJECT_IMAGE2D, 0, NULL, &nf));
  cl_image_format *fmts = malloc(nf * sizeof *fmts);
  CHECK(clGetSupportedImageFormats(ctx, CL_MEM_READ_WRITE, CL_MEM_OBJECT_IMAGE2D, nf, fmts, NULL));
  int has_rgba8 = 0; for (cl_uint i = 0; i < nf; i++) has_rgba8 |= fmts[i].image_channel_order == CL_RGBA && fmts[i].image_channel_data_type == CL_UNSIGNED_INT8;
  EXPECT(nf > 0 && has_rgba8, "formats %u", nf);
  printf("formats %u\n", nf);

  /* 2D image from pitched host memory (COPY_HOST_PTR), read back with another pitch. */
  enum { W = 37, H = 19, PITCH = W * 4 + 24 };
  cl_image_format f = { CL_RGBA, CL_UNSIGNED_INT8 };
  unsigned char *host = calloc(PITCH * H, 1);
  for (int y = 0; y < H; y++) for (int x = 0; x < W * 4; x++) host[y * PITCH + x] = (unsigned char)(x + 3 * y);
  cl_image_desc desc = { CL_MEM_OBJECT_IMAGE2D, W, H, 1, 0, PITCH, 0, 0, 0, { NULL } };
  cl_mem img = clCreateImage(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, &f, &desc, host, &err); CHECK(err);
  size_t origin[3] = { 0, 0, 0 }, region[3] = { W, H, 1 };
  enum { RP = W * 4 + 8 };
  unsigned char *back = malloc(RP * H); memset(back, 0xEE, RP * H);
  CHECK(clEnqueueReadImage(q, img, CL_TRUE, origin, region, RP, 0, back, 0, NULL, NULL));
  for (int y = 0; y < H; y++) {
    for (int x = 0; x < W * 4; x++) EXPECT(back[y * RP + x] == host[y * PITCH + x], "read image at %d,%d", x, y);
    for (int x = W * 4; x < RP; x++) EXPECT(back[y * RP + x] == 0xEE, "read image wrote the gap at %d,%d", x, y);
  }
  size_t elem = 0; CHECK(clGetImageInfo(img, CL_IMAGE_ELEMENT_SIZE, sizeof elem, &elem, NULL));
  EXPECT(elem == 4, "element size %zu", elem);

  /* A kernel reads one image and writes another; a sub-rectangle written from the host. */
  cl_mem img2 = clCreateImage2D(ctx, CL_MEM_READ_WRITE, &f, W, H, 0, NULL, &err); CHECK(err);
  cl_kernel kd = clCreateKernel(prog, "img_double", &err); CHECK(err);
  CHECK(clSetKernelArg(kd, 0, sizeof img, &img)); CHECK(clSetKernelArg(kd, 1, sizeof img2, &img2));
  size_t gws[2] = { W, H };
  CHECK(clEnqueueNDRangeKernel(q, kd, 2, NULL, gws, NULL, 0, NULL, NULL));
  size_t sub_o[3] = { 5, 4, 0 }, sub_r[3] = { 3, 2, 1 };
  unsigned char patch[3 * 2 * 4]; for (int i = 0; i < 24; i++) patch[i] = (unsigned char)(200 + i);
  CHECK(clEnqueueWriteImage(q, img2, CL_TRUE, sub_o, sub_r, 0, 0, patch, 0, NULL, NULL));
  CHECK(clEnqueueReadImage(q, img2, CL_TRUE, origin, region, 0, 0, back, 0, NULL, NULL));
  for (int y = 0; y < H; y++) for (int x = 0; x < W * 4; x++) {
    int in_patch = y >= 4 && y < 6 && x >= 20 && x < 32;
    int twice = host[y * PITCH + x] * 2;
    unsigned char want = in_patch ? patch[(y - 4) * 12 + (x - 20)] : (unsigned char)(twice > 255 ? 255 : twice); /* write_imageui saturates */
    EXPECT(back[y * W * 4 + x] == want, "doubled image at %d,%d: %d != %d", x, y, back[y * W * 4 + x], want);
  }
  printf("image2d ok\n");

  /* Image <-> buffer copies, image copy, fill, map with write-back. */
  cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, W * H * 4, NULL, &err); CHECK(err);
  CHECK(clEnqueueCopyImageToBuffer(q, img, buf, origin, region, 0, 0, NULL, NULL));
  cl_mem img3 = clCreateImage2D(ctx, CL_MEM_READ_WRITE, &f, W, H, 0, NULL, &err); CHECK(err);
  CHECK(clEnqueueCopyBufferToImage(q, buf, img3, 0, origin, region, 0, NULL, NULL));
  cl_mem img4 = clCreateImage2D(ctx, CL_MEM_READ_WRITE, &f, W, H, 0, NULL, &err); CHECK(err);
  CHECK(clEnqueueCopyImage(q, img3, img4, origin, origin, region, 0, NULL, NULL));
  cl_uint4 color = { { 9, 8, 7, 6 } };
  size_t fo[3] = { 1, 1, 0 }, fr[3] = { 2, 2, 1 };
  CHECK(clEnqueueFillImage(q, img4, &color, fo, fr, 0, NULL, NULL));
  size_t rowp = 0, slicep = 1;
  unsigned char *mp = clEnqueueMapImage(q, img4, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, origin, region, &rowp, &slicep, 0, NULL, NULL, &err); CHECK(err);
  EXPECT(rowp >= W * 4 && slicep == 0, "map pitches %zu %zu", rowp, slicep);
  for (int y = 0; y < H; y++) for (int x = 0; x < W * 4; x++) {
    int filled = y >= 1 && y < 3 && x >= 4 && x < 12;
    unsigned char want = filled ? (unsigned char)(9 - x % 4) : host[y * PITCH + x];
    EXPECT(mp[y * rowp + x] == want, "mapped image at %d,%d: %d != %d", x, y, mp[y * rowp + x], want);
  }
  mp[2 * rowp + 40] = 111;
  CHECK(clEnqueueUnmapMemObject(q, img4, mp, 0, NULL, NULL));
  size_t px[3] = { 10, 2, 0 }, one[3] = { 1, 1, 1 };
  unsigned char pix[4]; CHECK(clEnqueueReadImage(q, img4, CL_TRUE, px, one, 0, 0, pix, 0, NULL, NULL));
  EXPECT(pix[0] == 111 && pix[1] == host[2 * PITCH + 41], "unmap wrote back %d %d", pix[0], pix[1]);
  printf("image copies ok\n");

  /* A CL_MEM_USE_HOST_PTR image: a map returns the application's own memory, at its pitch,
   * holding what a kernel wrote; what is written through the map reaches the device. */
  unsigned char *uhost = calloc(PITCH * H, 1);
  cl_mem uimg = clCreateImage(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, &f, &desc, uhost, &err); CHECK(err);
  CHECK(clSetKernelArg(kd, 0, sizeof img, &img)); CHECK(clSetKernelArg(kd, 1, sizeof uimg, &uimg));
  CHECK(clEnqueueNDRangeKernel(q, kd, 2, NULL, gws, NULL, 0, NULL, NULL));
  size_t uo[3] = { 2, 3, 0 }, ur[3] = { 4, 5, 1 }, urow = 0;
  unsigned char *um = clEnqueueMapImage(q, uimg, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, uo, ur, &urow, NULL, 0, NULL, NULL, &err); CHECK(err);
  EXPECT(um == uhost + 3 * PITCH + 2 * 4 && urow == PITCH, "USE_HOST_PTR image map %p (row pitch %zu), want %p", (void *)um, urow, (void *)(uhost + 3 * PITCH + 8));
  { int t = host[4 * PITCH + 9] * 2; EXPECT(um[PITCH + 1] == (t > 255 ? 255 : t), "USE_HOST_PTR image holds the kernel's result"); }
  um[2 * PITCH + 3] = 77;
  CHECK(clEnqueueUnmapMemObject(q, uimg, um, 0, NULL, NULL));
  size_t upx[3] = { 2, 5, 0 };
  CHECK(clEnqueueReadImage(q, uimg, CL_TRUE, upx, one, 0, 0, pix, 0, NULL, NULL));
  EXPECT(pix[3] == 77, "write through a USE_HOST_PTR image map: %d", pix[3]);
  void *uhp = NULL; CHECK(clGetMemObjectInfo(uimg, CL_MEM_HOST_PTR, sizeof uhp, &uhp, NULL));
  EXPECT(uhp == uhost, "USE_HOST_PTR image host ptr %p", uhp);
  CHECK(clReleaseMemObject(uimg));
  printf("use_host_ptr image ok\n");

  /* A sampler as a kernel argument (both create calls). */
  cl_sampler s1 = clCreateSampler(ctx, CL_FALSE, CL_ADDRESS_CLAMP_TO_EDGE, CL_FILTER_NEAREST, &err); CHECK(err);
  cl_sampler_properties sp[] = { CL_SAMPLER_NORMALIZED_COORDS, CL_FALSE, CL_SAMPLER_FILTER_MODE, CL_FILTER_NEAREST, 0 };
  cl_sampler s2 = clCreateSamplerWithProperties(ctx, sp, &err); CHECK(err);
  cl_uint am = 0; CHECK(clGetSamplerInfo(s2, CL_SAMPLER_ADDRESSING_MODE, sizeof am, &am, NULL));
  cl_context sc = NULL; CHECK(clGetSamplerInfo(s1, CL_SAMPLER_CONTEXT, sizeof sc, &sc, NULL));
  EXPECT(am == CL_ADDRESS_CLAMP && sc == ctx, "sampler info %x %p", am, (void *)sc);
  cl_mem outb = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, W * H * 4, NULL, &err); CHECK(err);
  cl_kernel ks = clCreateKernel(prog, "sample", &err); CHECK(err);
  int w = W;
  CHECK(clSetKernelArg(ks, 0, sizeof img, &img)); CHECK(clSetKernelArg(ks, 1, sizeof s1, &s1));
  CHECK(clSetKernelArg(ks, 2, sizeof outb, &outb)); CHECK(clSetKernelArg(ks, 3, sizeof w, &w));
  CHECK(clEnqueueNDRangeKernel(q, ks, 2, NULL, gws, NULL, 0, NULL, NULL));
  cl_uint *vals = malloc(W * H * 4);
  CHECK(clEnqueueReadBuffer(q, outb, CL_TRUE, 0, W * H * 4, vals, 0, NULL, NULL));
  for (int y = 0; y < H; y++) for (int x = 0; x < W; x++) EXPECT(vals[y * W + x] == host[y * PITCH + 4 * x], "sampled %d,%d", x, y);
  printf("sampler ok\n");

  /* The driver's answers where a forwarder is tempted to answer itself (found by the Khronos
   * CTS): printed, so the caged run must print the same codes and sizes. */
  {
    size_t psz = 99;
    CHECK(clGetSamplerInfo(s1, CL_SAMPLER_PROPERTIES, 0, NULL, &psz));
    printf("1.x sampler properties size %zu\n", psz);
    cl_sampler s3 = clCreateSamplerWithProperties(ctx, NULL, &err);
    printf("NULL-properties sampler -> %d\n", err);
    if (s3) CHECK(clReleaseSampler(s3));
    cl_mem nb = clCreateBufferWithProperties(ctx, NULL, CL_MEM_READ_WRITE, 64, NULL, &err); CHECK(err);
    CHECK(clGetMemObjectInfo(nb, CL_MEM_PROPERTIES, 0, NULL, &psz));
    printf("NULL-properties buffer properties size %zu\n", psz);
    cl_mem_properties none[] = { 0 };
    cl_mem zb = clCreateBufferWithProperties(ctx, none, CL_MEM_READ_WRITE, 64, NULL, &err); CHECK(err);
    CHECK(clGetMemObjectInfo(zb, CL_MEM_PROPERTIES, 0, NULL, &psz));
    printf("empty-properties buffer properties size %zu\n", psz);
    cl_kernel ki = clCreateKernel(prog, "inc", &err); CHECK(err);
    printf("set arg: buffer with size 16 -> %d, NULL value size 0 -> %d, int for buffer -> %d, ok -> %d\n",
           clSetKernelArg(ki, 0, 16, &nb), clSetKernelArg(ki, 0, 0, NULL), clSetKernelArg(ki, 0, 4, &(int){ 1 }),
           clSetKernelArg(ki, 0, sizeof nb, &nb));
    printf("program release callback -> %d\n", clSetProgramReleaseCallback(prog, (void (CL_CALLBACK *)(cl_program, void *))note, NULL));
    printf("default device queue NULL -> %d\n", clSetDefaultDeviceCommandQueue(ctx, d, NULL));
    cl_ulong dt = 0, ht = 0;
    printf("device and host timer -> %d\n", clGetDeviceAndHostTimer(d, &dt, &ht));
    CHECK(clReleaseKernel(ki)); CHECK(clReleaseMemObject(nb)); CHECK(clReleaseMemObject(zb));
  }

  /* 3D and 1D-array images: rows and slices at the application's pitches. */
  enum { W3 = 5, H3 = 4, D3 = 3 };
  cl_image_format f1 = { CL_R, CL_UNSIGNED_INT16 };
  cl_image_desc d3 = { CL_MEM_OBJECT_IMAGE3D, W3, H3, D3, 0, 0, 0, 0, 0, { NULL } };
  cl_mem i3 = clCreateImage(ctx, CL_MEM_READ_WRITE, &f1, &d3, NULL, &err); CHECK(err);
  unsigned short v3[D3][H3 + 1][W3 + 2]; memset(v3, 0, sizeof v3);
  for (int z = 0; z < D3; z++) for (int y = 0; y < H3; y++) for (int x = 0; x < W3; x++) v3[z][y][x] = (unsigned short)(100 * z + 10 * y + x);
  size_t r3[3] = { W3, H3, D3 };
  CHECK(clEnqueueWriteImage(q, i3, CL_TRUE, origin, r3, (W3 + 2) * 2, (H3 + 1) * (W3 + 2) * 2, v3, 0, NULL, NULL));
  unsigned short b3[D3 * H3 * W3];
  size_t o3[3] = { 1, 1, 1 }, rr3[3] = { 3, 2, 2 };
  CHECK(clEnqueueReadImage(q, i3, CL_TRUE, o3, rr3, 0, 0, b3, 0, NULL, NULL));
  for (int z = 0; z < 2; z++) for (int y = 0; y < 2; y++) for (int x = 0; x < 3; x++)
    EXPECT(b3[(z * 2 + y) * 3 + x] == 100 * (z + 1) + 10 * (y + 1) + x + 1, "3d at %d,%d,%d", x, y, z);
  cl_image_desc d1a = { CL_MEM_OBJECT_IMAGE1D_ARRAY, 8, 1, 1, 3, 0, 0, 0, 0, { NULL } };
  cl_mem i1a = clCreateImage(ctx, CL_MEM_READ_WRITE, &f1, &d1a, NULL, &err); CHECK(err);
  unsigned short a1[3][8]; for (int i = 0; i < 3; i++) for (int x = 0; x < 8; x++) a1[i][x] = (unsigned short)(i * 1000 + x);
  size_t r1a[3] = { 8, 3, 1 };
  /* Default pitches: pocl 3.1 itself mishandles an explicit slice pitch on 1D arrays. */
  CHECK(clEnqueueWriteImage(q, i1a, CL_TRUE, origin, r1a, 0, 0, a1, 0, NULL, NULL));
  unsigned short b1a[3][8];
  CHECK(clEnqueueReadImage(q, i1a, CL_TRUE, origin, r1a, 0, 0, b1a, 0, NULL, NULL));
  for (int i = 0; i < 3; i++) for (int x = 0; x < 8; x++) EXPECT(b1a[i][x] == a1[i][x], "1d array at %d,%d", x, i);
  size_t rp1 = 0, sp1 = 0;
  unsigned short *m1 = clEnqueueMapImage(q, i1a, CL_TRUE, CL_MAP_READ, origin, r1a, &rp1, &sp1, 0, NULL, NULL, &err); CHECK(err);
  EXPECT(m1[sp1 / 2 * 2 + 5] == 2005, "1d array map %d (pitches %zu %zu)", m1[sp1 / 2 * 2 + 5], rp1, sp1);
  CHECK(clEnqueueUnmapMemObject(q, i1a, m1, 0, NULL, NULL));
  printf("image3d/1darray ok\n");

  /* Non-blocking image read gated by a user event: lands before the event says complete. */
  cl_event gate = clCreateUserEvent(ctx, &err); CHECK(err);
  cl_event rd;
  memset(back, 0, RP * H);
  CHECK(clEnqueueReadImage(q, img, CL_FALSE, origin, region, RP, 0, back, 1, &gate, &rd));
  CHECK(clSetUserEventStatus(gate, CL_COMPLETE));
  CHECK(clWaitForEvents(1, &rd));
  EXPECT(back[7 * RP + 13] == host[7 * PITCH + 13], "non-blocking image read");
  printf("nonblocking image ok\n");

  /* Non-blocking maps gated by a user event: nothing blocks, and the data is there once the
   * map's event completes (plain buffer, USE_HOST_PTR buffer, image). */
  int *hostmem = malloc(256 * 4); for (int i = 0; i < 256; i++) hostmem[i] = 7 * i;
  cl_mem ub = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, 256 * 4, hostmem, &err); CHECK(err);
  cl_mem pb = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, 256 * 4, hostmem, &err); CHECK(err);
  int minus = -1; CHECK(clEnqueueFillBuffer(q, ub, &minus, 4, 16, 16, 0, NULL, NULL)); CHECK(clFinish(q));
  cl_event gate2 = clCreateUserEvent(ctx, &err); CHECK(err);
  cl_event me[3];
  int *mu = clEnqueueMapBuffer(q, ub, CL_FALSE, CL_MAP_READ | CL_MAP_WRITE, 0, 256 * 4, 1, &gate2, &me[0], &err); CHECK(err);
  int *mpb = clEnqueueMapBuffer(q, pb, CL_FALSE, CL_MAP_READ, 4, 64, 1, &gate2, &me[1], &err); CHECK(err);
  size_t mrow = 0;
  unsigned char *mi = clEnqueueMapImage(q, img, CL_FALSE, CL_MAP_READ, origin, region, &mrow, NULL, 1, &gate2, &me[2], &err); CHECK(err);
  cl_int st = 0; CHECK(clGetEventInfo(me[0], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
  EXPECT(st != CL_COMPLETE, "a map gated by a user event completed early");
  EXPECT(mu == hostmem, "non-blocking USE_HOST_PTR map returned %p not %p", (void *)mu, (void *)hostmem);
  CHECK(clSetUserEventStatus(gate2, CL_COMPLETE));
  CHECK(clWaitForEvents(3, me));
  EXPECT(mu[4] == -1 && mu[3] == 21 && mu[255] == 7 * 255, "non-blocking USE_HOST_PTR map data %d %d", mu[4], mu[3]);
  EXPECT(mpb[0] == 7 && mpb[15] == 7 * 16, "non-blocking map data %d %d", mpb[0], mpb[15]);
  EXPECT(mi[5 * mrow + 9] == host[5 * PITCH + 9], "non-blocking image map data");
  mu[100] = 4242;
  CHECK(clEnqueueUnmapMemObject(q, ub, mu, 0, NULL, NULL));
  CHECK(clEnqueueUnmapMemObject(q, pb, mpb, 0, NULL, NULL));
  CHECK(clEnqueueUnmapMemObject(q, img, mi, 0, NULL, NULL));
  int check = 0; CHECK(clEnqueueReadBuffer(q, ub, CL_TRUE, 400, 4, &check, 0, NULL, NULL));
  EXPECT(check == 4242, "write through a non-blocking map: %d", check);
  /* Unmapped before the map was waited for: the buffer keeps its contents. */
  cl_event gate3 = clCreateUserEvent(ctx, &err); CHECK(err);
  int *early = clEnqueueMapBuffer(q, pb, CL_FALSE, CL_MAP_WRITE, 0, 256 * 4, 1, &gate3, NULL, &err); CHECK(err);
  CHECK(clEnqueueUnmapMemObject(q, pb, early, 0, NULL, NULL));
  CHECK(clSetUserEventStatus(gate3, CL_COMPLETE));
  CHECK(clFinish(q));
  CHECK(clEnqueueReadBuffer(q, pb, CL_TRUE, 40, 4, &check, 0, NULL, NULL));
  EXPECT(check == 70, "early unmap changed the buffer: %d", check);
  for (int i = 0; i < 3; i++) CHECK(clReleaseEvent(me[i]));
  printf("nonblocking maps ok\n");

  /* Sub-buffers, and rectangular reads/writes/copies with pitches on both sides. */
  int *ints = malloc(64 * 4); for (int i = 0; i < 64; i++) ints[i] = i;
  cl_mem big = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, 64 * 4, ints, &err); CHECK(err);
  cl_buffer_region br = { 32 * 4, 16 * 4 };
  cl_mem sub = clCreateSubBuffer(big, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &br, &err); CHECK(err);
  cl_kernel ki = clCreateKernel(prog, "inc", &err); CHECK(err);
  CHECK(clSetKernelArg(ki, 0, sizeof sub, &sub));
  size_t sixteen = 16; CHECK(clEnqueueNDRangeKernel(q, ki, 1, NULL, &sixteen, NULL, 0, NULL, NULL));
  int got[64]; CHECK(clEnqueueReadBuffer(q, big, CL_TRUE, 0, 64 * 4, got, 0, NULL, NULL));
  for (int i = 0; i < 64; i++) EXPECT(got[i] == i + (i >= 32 && i < 48), "sub-buffer at %d: %d", i, got[i]);
  void *hp = NULL; CHECK(clGetMemObjectInfo(sub, CL_MEM_HOST_PTR, sizeof hp, &hp, NULL));
  EXPECT(hp == (void *)(ints + 32), "sub-buffer host ptr %p", hp);
  cl_mem parent = NULL; size_t off = 0;
  CHECK(clGetMemObjectInfo(sub, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL));
  CHECK(clGetMemObjectInfo(sub, CL_MEM_OFFSET, sizeof off, &off, NULL));
  EXPECT(parent == big && off == 128, "sub-buffer parent %p offset %zu", (void *)parent, off);
  /* The 64 ints are an 8x8 matrix; read the 3x2 block at (2,1) into a host array with pitch 5. */
  int blk[2][5]; memset(blk, 0xFF, sizeof blk);
  size_t bo[3] = { 2 * 4, 1, 0 }, ho[3] = { 4, 0, 0 }, rr[3] = { 3 * 4, 2, 1 };
  CHECK(clEnqueueReadBufferRect(q, big, CL_TRUE, bo, ho, rr, 8 * 4, 0, 5 * 4, 0, blk, 0, NULL, NULL));
  for (int y = 0; y < 2; y++) {
    EXPECT(blk[y][0] == -1 && blk[y][4] == -1, "rect read wrote outside the block");
    for (int x = 0; x < 3; x++) EXPECT(blk[y][x + 1] == got[(y + 1) * 8 + x + 2], "rect read %d,%d", x, y);
  }
  int wr[2][5]; for (int i = 0; i < 10; i++) ((int *)wr)[i] = 1000 + i;
  CHECK(clEnqueueWriteBufferRect(q, big, CL_TRUE, bo, ho, rr, 8 * 4, 0, 5 * 4, 0, wr, 0, NULL, NULL));
  cl_mem copy = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64 * 4, NULL, &err); CHECK(err);
  int zero = 0; CHECK(clEnqueueFillBuffer(q, copy, &zero, 4, 0, 64 * 4, 0, NULL, NULL));
  size_t co[3] = { 0, 0, 0 };
  CHECK(clEnqueueCopyBufferRect(q, big, copy, bo, co, rr, 8 * 4, 0, 3 * 4, 0, 0, NULL, NULL));
  int c6[6]; CHECK(clEnqueueReadBuffer(q, copy, CL_TRUE, 0, 24, c6, 0, NULL, NULL));
  for (int i = 0; i < 6; i++) EXPECT(c6[i] == 1000 + (i / 3) * 5 + i % 3 + 1, "rect copy %d: %d", i, c6[i]);
  cl_mem mig[2] = { big, copy };
  CHECK(clEnqueueMigrateMemObjects(q, 2, mig, CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED, 0, NULL, NULL));
  printf("sub-buffer/rect ok\n");

  /* Program binaries: get them, create a program from them, run its kernel. */
  size_t bsz = 0; CHECK(clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof bsz, &bsz, NULL));
  unsigned char *bin = malloc(bsz); unsigned char *bins[1] = { bin };
  size_t bret = 0; CHECK(clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bins, bins, &bret));
  EXPECT(bsz > 0 && bret == sizeof bins, "binaries %zu %zu", bsz, bret);
  cl_int bstat = -1;
  cl_program fromb = clCreateProgramWithBinary(ctx, 1, &d, &bsz, (const unsigned char **)bins, &bstat, &err); CHECK(err);
  EXPECT(bstat == CL_SUCCESS, "binary status %d", bstat);
  CHECK(clBuildProgram(fromb, 1, &d, NULL, NULL, NULL));
  cl_kernel kb = clCreateKernel(fromb, "inc", &err); CHECK(err);
  CHECK(clSetKernelArg(kb, 0, sizeof copy, &copy));
  size_t six = 6; CHECK(clEnqueueNDRangeKernel(q, kb, 1, NULL, &six, NULL, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, copy, CL_TRUE, 0, 24, c6, 0, NULL, NULL));
  EXPECT(c6[0] == 1002, "kernel from binary %d", c6[0]);
  printf("binaries ok\n");

  /* Separate compilation with an embedded header, then link (with a callback). */
  const char *hdr = "#define STEP 5\n";
  const char *usesrc = "#include \"step.h\"\n__kernel void add_step(__global int *a) { a[get_global_id(0)] += STEP; }\n";
  cl_program hp_ = clCreateProgramWithSource(ctx, 1, &hdr, NULL, &err); CHECK(err);
  cl_program cp = clCreateProgramWithSource(ctx, 1, &usesrc, NULL, &err); CHECK(err);
  const char *names[1] = { "step.h" };
  CHECK(clCompileProgram(cp, 1, &d, NULL, 1, &hp_, names, NULL, NULL));
  cl_program linked = clLinkProgram(ctx, 1, &d, NULL, 1, &cp, on_link, (void *)0x77, &err); CHECK(err);
  cl_kernel kl = clCreateKernel(linked, "add_step", &err); CHECK(err);
  CHECK(clSetKernelArg(kl, 0, sizeof copy, &copy));
  cl_kernel klc = clCloneKernel(kl, &err); CHECK(err);
  CHECK(clEnqueueNDRangeKernel(q, klc, 1, NULL, &six, NULL, 0, NULL, NULL));
  CHECK(clFinish(q));
  CHECK(clEnqueueReadBuffer(q, copy, CL_TRUE, 0, 24, c6, 0, NULL, NULL));
  EXPECT(c6[0] == 1007 && link_cb == 1, "linked/cloned kernel %d, link callback %d", c6[0], link_cb);
  printf("compile/link ok\n");

  /* Pipes (where the device has them). */
  cl_bool pipes = CL_FALSE; clGetDeviceInfo(d, CL_DEVICE_PIPE_SUPPORT, sizeof pipes, &pipes, NULL);
  if (pipes) {
    cl_mem pipe = clCreatePipe(ctx, CL_MEM_READ_WRITE, 8, 16, NULL, &err); CHECK(err);
    cl_uint ps = 0; CHECK(clGetPipeInfo(pipe, CL_PIPE_PACKET_SIZE, sizeof ps, &ps, NULL));
    EXPECT(ps == 8, "pipe packet size %u", ps);
    CHECK(clReleaseMemObject(pipe));
  }
  printf("pipes %s\n", pipes ? "ok" : "unsupported");

  /* Sub-devices, where partitioning is supported. */
  cl_uint cus = 0; CHECK(clGetDeviceInfo(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cus, &cus, NULL));
  cl_device_partition_property pp[] = { CL_DEVICE_PARTITION_EQUALLY, 1, 0 };
  cl_uint nsub = 0;
  err = clCreateSubDevices(d, pp, 0, NULL, &nsub);
  if (err == CL_SUCCESS && nsub > 0) {
    cl_device_id *subs = malloc(nsub * sizeof *subs);
    CHECK(clCreateSubDevices(d, pp, nsub, subs, NULL));
    cl_device_id par = NULL; CHECK(clGetDeviceInfo(subs[0], CL_DEVICE_PARENT_DEVICE, sizeof par, &par, NULL));
    cl_uint subcus = 0; CHECK(clGetDeviceInfo(subs[0], CL_DEVICE_MAX_COMPUTE_UNITS, sizeof subcus, &subcus, NULL));
    EXPECT(par == d && subcus == 1, "sub-device parent %p cus %u", (void *)par, subcus);
    for (cl_uint i = 0; i < nsub; i++) CHECK(clReleaseDevice(subs[i]));
    printf("sub-devices %u\n", nsub);
  } else {
    printf("sub-devices unsupported (%d)\n", err);
  }

  /* Destructor callbacks: once each, last registered first, when the last reference goes. */
  cl_mem dm = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 16, NULL, &err); CHECK(err);
  CHECK(clSetMemObjectDestructorCallback(dm, mem_destructor, (void *)'a'));
  CHECK(clSetMemObjectDestructorCallback(dm, mem_destructor, (void *)'b'));
  CHECK(clRetainMemObject(dm)); CHECK(clReleaseMemObject(dm));
  EXPECT(norder == 0, "destructor ran early");
  CHECK(clReleaseMemObject(dm));
  CHECK(clFinish(q));
  cl_context c2 = clCreateContext(NULL, 1, &d, NULL, NULL, &err); CHECK(err);
  CHECK(clSetContextDestructorCallback(c2, ctx_destructor, (void *)'c'));
  CHECK(clReleaseContext(c2));
  EXPECT(norder == 3 && memcmp(order, "bac", 3) == 0, "destructor order %.*s", norder, order);
  printf("destructors ok\n");

  /* What the device advertises matches what works. */
  cl_device_exec_capabilities caps = 0; CHECK(clGetDeviceInfo(d, CL_DEVICE_EXECUTION_CAPABILITIES, sizeof caps, &caps, NULL));
  cl_device_svm_capabilities svm = 0; clGetDeviceInfo(d, CL_DEVICE_SVM_CAPABILITIES, sizeof svm, &svm, NULL);
  printf("native kernels %s, svm %s\n", caps & CL_EXEC_NATIVE_KERNEL ? "yes" : "no", svm ? "yes" : "no");
  printf("PASS\n");
  return 0;
}
