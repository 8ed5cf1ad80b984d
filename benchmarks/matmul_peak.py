"""The fp32 matmul peak of the cores a benchmark runs on: the denominator of its MFU, measured in the same run."""

from __future__ import annotations

import time


def peak_flops(threads: int, n: int = 4096, repeats: int = 5) -> float:
    """FLOP/s of the best of `repeats` n × n fp32 matrix products on `threads` threads (restored after)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    torch.set_num_threads(before)
    return 2 * n**3 / best
