"""usage: python3 scripts/gpu-load.py [SECONDS]  (on a GPU node; no CUDA toolkit needed)

A CUDA load without a CUDA toolkit: the driver API through ctypes. One context, 2 GiB
on the GPU, a spin kernel (PTX, JIT-compiled by the driver) on every SM, and host-to-device
copies from pinned memory between launches, for SECONDS. Prints what it did."""
import ctypes as C, sys, time, os
secs = float(sys.argv[1]) if len(sys.argv) > 1 else 60
cu = C.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        name = C.c_char_p(); cu.cuGetErrorName(r, C.byref(name))
        raise SystemExit(f"{what}: {r} {name.value}")
ck(cu.cuInit(0), "cuInit")
dev = C.c_int(); ck(cu.cuDeviceGet(C.byref(dev), 0), "cuDeviceGet")
ctx = C.c_void_p(); ck(cu.cuCtxCreate_v2(C.byref(ctx), 0, dev), "cuCtxCreate")
sms = C.c_int(); ck(cu.cuDeviceGetAttribute(C.byref(sms), 16, dev), "attr SM count")
PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry spin(.param .u64 out, .param .u64 n) {
  .reg .u64 %rd<6>;
  .reg .pred %p;
  ld.param.u64 %rd1, [out];
  ld.param.u64 %rd3, [n];
  mov.u64 %rd2, 0;
LOOP:
  add.u64 %rd2, %rd2, 1;
  setp.lt.u64 %p, %rd2, %rd3;
  @%p bra LOOP;
  cvta.to.global.u64 %rd4, %rd1;
  st.global.u64 [%rd4], %rd2;
  ret;
}
"""
mod = C.c_void_p(); ck(cu.cuModuleLoadData(C.byref(mod), C.c_char_p(PTX)), "cuModuleLoadData")
fn = C.c_void_p(); ck(cu.cuModuleGetFunction(C.byref(fn), mod, b"spin"), "cuModuleGetFunction")
size = 2 << 30
dptr = C.c_uint64(); ck(cu.cuMemAlloc_v2(C.byref(dptr), C.c_size_t(size)), "cuMemAlloc")
chunk = 256 << 20
hptr = C.c_void_p(); ck(cu.cuMemAllocHost_v2(C.byref(hptr), C.c_size_t(chunk)), "cuMemAllocHost")
out = C.c_uint64(dptr.value); n = C.c_uint64(2_000_000)
params = (C.c_void_p * 2)(C.cast(C.byref(out), C.c_void_p), C.cast(C.byref(n), C.c_void_p))
print(f"pid {os.getpid()} SMs {sms.value}", flush=True)
end = time.time() + secs; launches = copies = 0
while time.time() < end:
    ck(cu.cuLaunchKernel(fn, sms.value * 4, 1, 1, 256, 1, 1, 0, None, params, None), "launch")
    launches += 1
    ck(cu.cuMemcpyHtoD_v2(C.c_uint64(dptr.value + (copies % 8) * chunk), hptr, C.c_size_t(chunk)), "HtoD")
    copies += 1
    ck(cu.cuCtxSynchronize(), "sync")
print(f"launches {launches}, copies {copies} x 256 MiB = {copies * chunk / 1e9:.1f} GB in {secs:.0f} s", flush=True)
