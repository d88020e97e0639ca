"""A training loop's host side on the stand-in CUDA runtime, for the
gpu_sync_storm tests: real Python, the GPU's side the stand-ins (ctypes).

Usage: CUDA_STUB_SYNC_US=US python3 syncstorm.py LIBCUDART MODE SECONDS

Loads the CUDA runtime LIBCUDART with ctypes and runs 10 steps a second
for SECONDS seconds (0: until killed), each waiting CUDA_STUB_SYNC_US per
synchronisation (the stand-in's GPU), then prints "done" and exits. MODE:

  storm    train_step reads the loss of each of its 100 micro-batches, the
           .item() of a PyTorch loop: 1 000 cudaStreamSynchronize calls a
           second from one line ("sync: item"), paced to a millisecond each.
  step     train_step syncs once, at the end of the step ("sync: step"),
           the rest of the step the host's own work (sleep): 10 calls a second.
  bound    train_step syncs once a step and does nothing else: with a long
           CUDA_STUB_SYNC_US the host waits on the GPU most of the time
           (GPU-bound), at most 10 calls a second.

The tests find the calling lines by their "sync:" comments.
"""
import ctypes
import sys
import time

MICRO_BATCHES = 100
STEPS_PER_SECOND = 10


def pace(deadline):
    """Sleeps until deadline (time.monotonic); returns the next one."""
    now = time.monotonic()
    if deadline > now:
        time.sleep(deadline - now)
    return deadline


def train_step(rt, stream, mode, start):
    loss = 0.0
    if mode == "storm":
        tick = 1.0 / (STEPS_PER_SECOND * MICRO_BATCHES)
        for i in range(MICRO_BATCHES):
            rc = rt.cudaStreamSynchronize(stream)  # sync: item
            if rc != 0:
                raise RuntimeError("cudaStreamSynchronize returned %d" % rc)
            loss += 1.0 / (i + 1)
            pace(start + (i + 1) * tick)
        return loss
    if mode == "step":
        pace(start + 1.0 / STEPS_PER_SECOND)
    rc = rt.cudaStreamSynchronize(stream)  # sync: step
    if rc != 0:
        raise RuntimeError("cudaStreamSynchronize returned %d" % rc)
    return loss


def main():
    rt = ctypes.CDLL(sys.argv[1])
    rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    mode, seconds = sys.argv[2], float(sys.argv[3])
    if mode not in ("storm", "step", "bound"):
        sys.exit("unknown mode %r: storm, step or bound" % mode)
    stream = ctypes.c_void_p(0)  # the legacy default stream
    end = time.monotonic() + seconds
    start = time.monotonic()
    while seconds == 0 or start < end:
        train_step(rt, stream, mode, start)
        if mode == "bound":
            start = time.monotonic()
        else:
            start = pace(start + 1.0 / STEPS_PER_SECOND)
    print("done", flush=True)


if __name__ == "__main__":
    main()
