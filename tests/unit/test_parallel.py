"""Runtime decisions of fasttrain.parallel that need no GPU to check."""

import pytest
import torch

from fasttrain.parallel import Runtime, cudnn_benchmark

CUDA0 = torch.device("cuda", 0)


@pytest.mark.parametrize("rt", [
    Runtime("single", CUDA0),
    Runtime("dp", CUDA0, device_ids=[0]),  # one device: DataParallel calls the module itself, no threads
    Runtime("dp", torch.device("cpu")),
    Runtime("ddp", CUDA0, rank=1, local_rank=1, world_size=2),  # one process a GPU, no replica threads
], ids=["single", "dp-one-gpu", "dp-cpu", "ddp"])
def test_cudnn_benchmark_is_as_configured_where_no_replica_threads_run(rt):
    assert cudnn_benchmark(True, rt) is True
    assert cudnn_benchmark(False, rt) is False
    assert rt.warnings == []


def test_cudnn_benchmark_is_off_for_dataparallel_over_several_gpus_and_the_run_says_so():
    rt = Runtime("dp", CUDA0, device_ids=[2, 3, 5])
    assert cudnn_benchmark(True, rt) is False
    assert rt.warnings == ["train.cudnn_benchmark off: nn.DataParallel over 3 GPUs makes new threads every step, "
                           "and cuDNN keeps its benchmark results per thread"]
    assert cudnn_benchmark(False, rt) is False and len(rt.warnings) == 1  # off as asked: nothing to say
