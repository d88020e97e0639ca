"""A real PyTorch training loop on a GPU, with and without a .item() per
step, for scripts/gpu-check.sh's gpu_sync_storm check.

Usage: python3 torchsync.py MODE SECONDS

Trains a small MLP on random batches made on the device for SECONDS
seconds. MODE item reads the loss with .item() every step ("sync: item"):
a cudaStreamSynchronize per step, hundreds a second, the GPU idle while
the host waits for each; MODE device keeps the running loss on the device
and reads it once every 200 steps ("sync: every 200 steps"). Prints the
steps per second and "done".
"""
import sys
import time

import torch


def train(mode, seconds):
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    running = torch.zeros((), device=dev)
    total, steps = 0.0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        x = torch.randn(64, 256, device=dev)
        y = torch.randn(64, 1, device=dev)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if mode == "item":
            total += loss.item()  # sync: item
        else:
            running += loss.detach()
            if steps % 200 == 199:
                total = running.item()  # sync: every 200 steps
        steps += 1
    torch.cuda.synchronize()
    return steps, total


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    if mode not in ("item", "device"):
        sys.exit("unknown mode %r: item or device" % mode)
    steps, _ = train(mode, seconds)
    print(f"{mode}: {steps / seconds:.0f} steps/s", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
