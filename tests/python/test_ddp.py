"""torch.nn.parallel.DistributedDataParallel with customconv layers: two
processes, each on its half of a batch, end up with the gradients of one
process on the whole batch (gloo on the CPU; NCCL on two GPUs)."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import customconv

WORLD_SIZE = 2
BATCH = 6  # split evenly: each process gets BATCH // WORLD_SIZE images


class Net(torch.nn.Module):
    """Every forward op of the library, each with parameters to train."""

    def __init__(self):
        super().__init__()
        self.conv = customconv.nn.Conv2d(3, 8, 3, padding=1)
        self.depthwise = customconv.nn.DepthwiseConv2d(8, 16, 3, stride=2, padding=1)
        self.blur = customconv.nn.Filter2d(torch.randn(3, 3), "reflect", requires_grad=True)
        self.points = customconv.nn.Conv2d(16, 3, 1)
        self.interpolate = customconv.nn.TrilinearInterpolation()

    def forward(self, x):
        y = self.blur(torch.relu(self.depthwise(torch.relu(self.conv(x)))))  # (N, 16, 5, 5)
        points = torch.tanh(self.points(y).mean((2, 3)))  # (N, 3)
        feats = y[:, :8].flatten(2)  # (N, 8, 25): 8 corners, 25 features each
        return self.interpolate(feats, points)


def make_model_and_data(device):
    """The same model and batch in every process (float64, fixed seed)."""
    torch.manual_seed(1234)
    model = Net().to(device, torch.float64)
    x = torch.randn(BATCH, 3, 10, 10, dtype=torch.float64).to(device)
    target = torch.randn(BATCH, 25, dtype=torch.float64).to(device)
    return model, x, target


def loss_fn(out, target):
    # A mean over the images: DDP averages the processes' gradients, so the
    # average of the halves' means is the whole batch's mean.
    return ((out - target) ** 2).mean()


def gradients(model):
    return {name: p.grad.detach().cpu() for name, p in model.named_parameters()}


def train_step_in_process(rank, backend, device_type, store_path, out_dir):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                            world_size=WORLD_SIZE)
    try:
        model, x, target = make_model_and_data(device)
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[rank] if device_type == "cuda" else None)
        shard = slice(rank * BATCH // WORLD_SIZE, (rank + 1) * BATCH // WORLD_SIZE)
        loss_fn(ddp(x[shard]), target[shard]).backward()
        torch.save(gradients(model), os.path.join(out_dir, f"grads{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend, device_type", [
    pytest.param("gloo", "cpu", id="gloo-cpu"),
    pytest.param("nccl", "cuda", id="nccl-cuda", marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2 or not dist.is_nccl_available(),
        reason="needs 2 CUDA devices and NCCL")),
])
def test_ddp_on_two_processes_gives_the_gradients_of_the_whole_batch(backend, device_type,
                                                                     tmp_path):
    mp.spawn(train_step_in_process,
             args=(backend, device_type, str(tmp_path / "store"), str(tmp_path)),
             nprocs=WORLD_SIZE, join=True)

    model, x, target = make_model_and_data(device_type)
    loss_fn(model(x), target).backward()
    want = gradients(model)
    for rank in range(WORLD_SIZE):
        got = torch.load(tmp_path / f"grads{rank}.pt")
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12,
                                       msg=lambda m: f"rank {rank}, grad of {name}: {m}")
