"""A real PyTorch out-of-memory on a real GPU, for scripts/gpu-check.sh's
memory snapshot check (run where a GPU is lent).

Usage: python3 torchoom.py [GIB_PER_TENSOR]

load_weights keeps 8 tensors of GIB_PER_TENSOR GiB (default 1), then
grow_cache keeps one more at a time until torch raises OutOfMemoryError:
each new block is a cudaMalloc of the caching allocator, the last one
fails. Nothing is freed before, so what the allocator held at the failure
(torch.cuda.memory_reserved) is what the hooks saw live. Prints
torch.cuda.memory_summary() and, on a line of its own, "OOM " and a JSON
object: the bytes each function allocated, the allocator's allocated and
reserved bytes and the size that failed; then keeps its memory 5 s more,
so that the agent polls it alive after the failure.
"""
import json
import sys
import time

import torch


def load_weights(kept, size):
    kept.append(torch.empty(size // 4, dtype=torch.float32, device="cuda"))  # alloc: weights


def grow_cache(kept, size):
    kept.append(torch.empty(size // 4, dtype=torch.float32, device="cuda"))  # alloc: cache


def main():
    size = int(float(sys.argv[1]) * (1 << 30)) if len(sys.argv) > 1 else 1 << 30
    kept = []
    by_function = {"load_weights": 0, "grow_cache": 0}
    for _ in range(8):
        load_weights(kept, size)
        by_function["load_weights"] += size
    failed = None
    while failed is None:
        try:
            grow_cache(kept, size)
            by_function["grow_cache"] += size
        except torch.cuda.OutOfMemoryError:
            failed = size
    torch.cuda.synchronize()
    print(torch.cuda.memory_summary(), flush=True)
    print("OOM " + json.dumps({
        "by_function": by_function,
        "allocated_bytes": torch.cuda.memory_allocated(),
        "reserved_bytes": torch.cuda.memory_reserved(),
        "failed_size_bytes": failed,
        "tensors": len(kept),
    }), flush=True)
    time.sleep(5)
    print("done", flush=True)


if __name__ == "__main__":
    main()
