"""A real PyTorch loop on a real GPU that leaks device memory from one
line, for scripts/gpu-check.sh (run where a GPU is lent).

Usage: python3 torchleak.py SECONDS

Each step multiplies two matrices on the GPU and reads the result back
(.item(), a host wait on the GPU); every step, cache_activations keeps a
new 64 MiB tensor (at most 160 of them, 10 GiB): a leak through PyTorch's
caching allocator, which asks cudaMalloc for each new block. The check
finds the leaking line by its "alloc: leak" comment.
"""
import sys
import time

import torch


def cache_activations(kept):
    kept.append(torch.empty(16 << 20, dtype=torch.float32, device="cuda"))  # alloc: leak


def step(x):
    return (x @ x).sum().item()


def main():
    seconds = float(sys.argv[1])
    x = torch.randn(2048, 2048, device="cuda")
    kept = []
    print("ready", flush=True)
    end = time.time() + seconds
    while time.time() < end:
        step(x)
        if len(kept) < 160:
            cache_activations(kept)
        time.sleep(0.2)
    print("done", len(kept), flush=True)


if __name__ == "__main__":
    main()
