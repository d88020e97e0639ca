"""Allocates (stand-in) GPU memory through ctypes from named functions, for
the Python frame tests.

Usage: CUDA_STUB_LIMIT=BYTES python3 gpu.py LIBCUDART COUNT MIB

Loads the CUDA runtime LIBCUDART with ctypes, prints "ready" and waits for
SIGUSR1; then load_adapter allocates COUNT blocks of MIB MiB with cudaMalloc
and keeps them (a leak), warmup_kv_cache asks for more than CUDA_STUB_LIMIT,
which fails, and prefill_batch allocates 80 blocks of MIB MiB and frees them
at once (a burst gone before anyone polls). Prints "done" and sleeps until
killed. The tests find the calling lines by their "alloc:" comments.
"""
import ctypes
import signal
import sys
import time


def load_adapter(rt, count, size, kept):
    for _ in range(count):
        ptr = ctypes.c_void_p()
        rc = rt.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(size))  # alloc: leak
        if rc != 0:
            raise RuntimeError("cudaMalloc returned %d" % rc)
        kept.append(ptr)


def warmup_kv_cache(rt, size):
    ptr = ctypes.c_void_p()
    return rt.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(size))  # alloc: fail


def prefill_batch(rt, count, size):
    ptrs = []
    for _ in range(count):
        ptr = ctypes.c_void_p()
        rc = rt.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(size))  # alloc: burst
        if rc != 0:
            raise RuntimeError("cudaMalloc returned %d" % rc)
        ptrs.append(ptr)
    for ptr in ptrs:
        rt.cudaFree(ptr)


def main():
    rt = ctypes.CDLL(sys.argv[1])
    count, size = int(sys.argv[2]), int(sys.argv[3]) << 20
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    print("ready", flush=True)
    signal.sigwait([signal.SIGUSR1])
    kept = []
    load_adapter(rt, count, size, kept)
    rc = warmup_kv_cache(rt, 64 * size)
    prefill_batch(rt, 80, size)
    print("done", rc, flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
