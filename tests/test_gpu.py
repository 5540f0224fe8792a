"""Chapter 22's GPU paths: bf16 autocast on CUDA, NCCL with DDP, the per-epoch GPU report.

Skipped on machines without CUDA (like the book's CI); run them on a GPU machine with
`python -m pytest tests/test_gpu.py`.
"""

import os

import pytest
import torch
from tiny_training import synthetic_examples, tiny_setup

from the_annotated_transformer import (
    TrainState,
    device_report,
    free_port,
    multi30k_loader,
    train_epoch,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _losses(device: torch.device, dtype: torch.dtype | None) -> list[float]:
    model, optimizer, scheduler, criterion = tiny_setup(device)
    loader = multi30k_loader(synthetic_examples(64, 1), max_tokens=60, shuffle=False)
    losses = [
        train_epoch(model, loader, criterion, optimizer, scheduler, device=device,
                    train_state=TrainState(), autocast_dtype=dtype)[0]
        for _ in range(3)
    ]
    assert all(p.dtype == torch.float32 and p.device.type == device.type
               for p in model.parameters())
    return losses


def test_bf16_autocast_on_the_gpu_trains_like_float32_on_the_cpu():
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    cpu = _losses(torch.device("cpu"), None)
    gpu = _losses(torch.device("cuda", 0), torch.bfloat16)
    assert cpu[-1] < cpu[0] and gpu[-1] < gpu[0]
    for full, half in zip(cpu, gpu, strict=True):
        assert half == pytest.approx(full, rel=0.03)


def test_device_report_gives_peak_memory_and_utilization_of_the_gpu():
    device = torch.device("cuda", 0)
    torch.cuda.reset_peak_memory_stats(device)
    x = torch.randn(4096, 4096, device=device)
    for _ in range(20):
        x = torch.tanh(x @ x)
    torch.cuda.synchronize(device)
    report = device_report(device)
    assert report["max_memory_gib"] >= 3 * 4096 * 4096 * 4 / 2**30 * 0.9
    pytest.importorskip("pynvml")
    assert 0.0 <= report["utilization_percent"] <= 100.0


def _nccl_worker(rank: int, world_size: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    try:
        model, optimizer, scheduler, criterion = tiny_setup(device)
        model = DistributedDataParallel(model, device_ids=[rank])
        loader = multi30k_loader(synthetic_examples(64, 1), max_tokens=60, shuffle=True,
                                 num_replicas=world_size, rank=rank)
        train_epoch(model, loader, criterion, optimizer, scheduler, device=device,
                    accum_iter=2, train_state=TrainState())
        torch.save({k: v.cpu() for k, v in model.module.state_dict().items()},
                   f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_ddp_with_nccl_keeps_every_gpu_copy_identical(tmp_path):
    world_size = torch.cuda.device_count()  # one process per GPU; one GPU still runs NCCL
    torch.multiprocessing.spawn(_nccl_worker, args=(world_size, free_port(), str(tmp_path)),
                                nprocs=world_size)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world_size)]
    start = tiny_setup()[0].state_dict()
    assert any(not torch.equal(start[n], t) for n, t in ranks[0].items())  # it trained
    for other in ranks[1:]:
        for name, tensor in ranks[0].items():
            assert torch.equal(tensor, other[name]), name
