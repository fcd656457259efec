# A pyopencl loop as an application writes it (every transfer and kernel with its event, as
# pyopencl makes them): upload, an array expression, download, zeros, an in-place add, download;
# the median ms per round over N rounds (after ten for warm-up), for arrays of SIZE float32.
#   python3 pyloop.py N SIZE      (Debian's python3-pyopencl: /usr/bin/python3)
import sys, time
import numpy as np
import pyopencl as cl
import pyopencl.array as cla
n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
size = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 18
ctx = cl.create_some_context(interactive=False)
q = cl.CommandQueue(ctx)
host = np.random.rand(size).astype(np.float32)
times = []
for i in range(n + 10):
    t = time.perf_counter()
    a = cla.to_device(q, host)
    b = (a * 2 + 1).get()
    c = cla.zeros(q, size, np.float32)
    c += a
    d = c.get()
    times.append(time.perf_counter() - t)
assert np.allclose(b, host * 2 + 1) and np.allclose(d, host)
times = sorted(times[10:])
print(f"{size} floats: median {times[len(times)//2]*1e3:.3f} ms a round, min {times[0]*1e3:.3f}")
