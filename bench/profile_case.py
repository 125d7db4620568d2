"""A few representative launches for profiling under Nsight Compute on a GPU machine:

    ncu --kernel-name regex:plane python3 bench/profile_case.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python_stub"))
import customconv  # noqa: E402

x = torch.randn(32, 96, 112, 112, device="cuda", requires_grad=True)
w = torch.randn(96, 1, 3, 3, device="cuda", requires_grad=True)
img = torch.randn(4096, 4096, device="cuda")
k = torch.randn(3, 3, device="cuda")
for _ in range(2):
    customconv.depthwise_conv2d(x, w, None, 1, 1).sum().backward()
    customconv.filter2d(img, k, "zeros")
torch.cuda.synchronize()
