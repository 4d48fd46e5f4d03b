"""Loaders on CPU tensors: sharding, ordering, transforms, and gpu vs torchvision agreement.

Samples are identified by their label: labels = arange(N).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from fasttrain.errors import FasttrainError
from fasttrain.loaders import (CROP_PADDING_PX, LOADERS, crop_flip, make_eval_loader,
                               make_train_loader)

CPU = torch.device("cpu")


def _data(n=37, size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g), torch.arange(n)


def _train(kind="gpu", n=37, size=8, **kw):
    images, labels = _data(n, size)
    args = dict(batch_size=8, img_size=size, device=CPU, augment=False, seed=0)
    args.update(kw)
    return make_train_loader(kind, images, labels, **args)


def _labels(loader):
    return torch.cat([y for _, y in loader]).tolist()


def test_loaders_names():
    assert LOADERS == ("gpu", "torchvision")


@pytest.mark.parametrize("make", [make_train_loader, make_eval_loader])
def test_unknown_kind_raises(make):
    images, labels = _data()
    kw = dict(batch_size=8, img_size=8, device=CPU)
    if make is make_train_loader:
        kw.update(augment=False, seed=0)
    with pytest.raises(FasttrainError, match=r"^unknown data.loader 'dali': choose gpu or torchvision$"):
        make("dali", images, labels, **kw)


def test_bad_images_raise():
    images, labels = _data()
    with pytest.raises(FasttrainError, match="uint8"):
        make_eval_loader("gpu", images.float(), labels, batch_size=8, img_size=8, device=CPU)


def test_gpu_train_every_sample_once_per_epoch():
    loader = _train(n=37, batch_size=8)
    assert len(loader) == 5 and loader.num_samples == 37
    for epoch in range(3):
        loader.set_epoch(epoch)
        batches = [y.tolist() for _, y in loader]
        assert [len(b) for b in batches] == [8, 8, 8, 8, 5]
        assert sorted(sum(batches, [])) == list(range(37))


def test_gpu_train_order_changes_across_epochs_and_repeats_within_one():
    loader = _train()
    loader.set_epoch(0)
    first = _labels(loader)
    assert _labels(loader) == first  # no set_epoch: same order, like DistributedSampler
    loader.set_epoch(1)
    assert _labels(loader) != first
    loader.set_epoch(0)
    assert _labels(loader) == first


@pytest.mark.parametrize("world_size", [2, 3])
def test_gpu_train_shards_disjoint_complete_equal_steps(world_size):
    n = 37  # divisible by neither
    per_rank = math.ceil(n / world_size)
    loaders = [_train(n=n, batch_size=4, rank=r, world_size=world_size, augment=True)
               for r in range(world_size)]
    for loader in loaders:
        loader.set_epoch(5)
    shards = [_labels(loader) for loader in loaders]
    assert {len(loader) for loader in loaders} == {math.ceil(per_rank / 4)}  # DDP: same steps
    assert all(len(s) == loader.num_samples == per_rank for s, loader in zip(shards, loaders))
    seen = sum(shards, [])
    assert set(seen) == set(range(n))
    # documented padding: DistributedSampler-style, per_rank * world_size - n repeats, no more
    assert len(seen) - len(set(seen)) == per_rank * world_size - n < world_size
    # and it is DistributedSampler's exact order
    for r, shard in enumerate(shards):
        sampler = torch.utils.data.DistributedSampler(range(n), num_replicas=world_size, rank=r,
                                                      shuffle=True, seed=0)
        sampler.set_epoch(5)
        assert shard == list(sampler)


@pytest.mark.parametrize("kind", LOADERS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_eval_shards_exactly_complete(kind, world_size):
    n = 37
    images, labels = _data(n)
    shards = []
    for r in range(world_size):
        loader = make_eval_loader(kind, images, labels, batch_size=5, img_size=8, device=CPU,
                                  rank=r, world_size=world_size)
        shard = _labels(loader)
        assert shard == list(range(r, n, world_size))
        assert loader.num_samples == len(shard) and len(loader) == math.ceil(len(shard) / 5)
        shards.append(shard)
    assert sorted(sum(shards, [])) == list(range(n))


def test_gpu_augmented_batch_shape_dtype_range():
    loader = _train(n=20, size=8, img_size=12, batch_size=8, augment=True)
    batches = list(loader)
    assert len(batches) == 3
    x, y = batches[0]
    assert x.shape == (8, 3, 12, 12) and x.dtype == torch.float32
    assert y.shape == (8,) and y.dtype == torch.int64
    for x, _ in batches:
        assert x.min() >= 0 and x.max() <= 1


def test_gpu_augmentation_is_a_padded_crop_and_a_flip():
    """img_size == source size, so every output must be some crop of the zero-padded image,
    maybe mirrored; search all offsets, and check both flips and several offsets occur."""
    images, labels = _data(n=48, size=8)
    loader = make_train_loader("gpu", images, labels, batch_size=16, img_size=8, device=CPU,
                               augment=True, seed=3)
    p = CROP_PADDING_PX
    padded = F.pad(images, (p, p, p, p)).float() / 255
    flips, offsets = [], set()
    for x, y in loader:
        for xi, i in zip(x, y.tolist()):
            matches = [(dy, dx, flip) for dy in range(2 * p + 1) for dx in range(2 * p + 1)
                       for flip in (0, 1)
                       if torch.equal(xi, (lambda c: c.flip(-1) if flip else c)(
                           padded[i, :, dy:dy + 8, dx:dx + 8]))]
            assert len(matches) == 1, (i, matches)
            flips.append(matches[0][2])
            offsets.add(matches[0][:2])
    assert 0 < sum(flips) < len(flips)  # some flipped, some not
    assert len(offsets) > 5


def test_crop_flip_centre_offsets_is_flip_only():
    images, _ = _data(n=10)
    centre = torch.full((10,), CROP_PADDING_PX)
    mask = torch.tensor([0, 1] * 5)
    out = crop_flip(images, centre, centre, mask)
    expected = torch.where(mask.bool()[:, None, None, None], images.flip(-1), images)
    assert torch.equal(out, expected)


def test_gpu_same_seed_same_batches():
    a, b, c = (_train(augment=True, seed=s, img_size=12) for s in (7, 7, 8))
    for loader in (a, b, c):
        loader.set_epoch(2)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert _labels(a) != _labels(c)


@pytest.mark.parametrize("chunk_images", [1, 3, 16])
def test_gpu_batches_do_not_depend_on_how_many_are_made_at_once(monkeypatch, chunk_images):
    """The loader makes several batches per set of ops; how many must not change a single value."""
    import fasttrain.loaders as loaders

    def batches(chunk_bytes):
        monkeypatch.setattr(loaders, "CHUNK_BYTES", chunk_bytes)
        loader = _train(n=37, batch_size=4, img_size=10, augment=True, channels_last=True)
        loader.set_epoch(3)
        return list(loader)

    whole = batches(2**30)
    chunked = batches(chunk_images * 4 * 3 * 4 * 10**2)  # chunk_images batches of 4 per chunk
    assert [y.shape[0] for _, y in chunked] == [4] * 9 + [1]
    for (x, y), (ref_x, ref_y) in zip(chunked, whole, strict=True):
        assert torch.equal(x, ref_x) and torch.equal(y, ref_y)
        assert x.is_contiguous(memory_format=torch.channels_last)


def test_gpu_set_img_size_changes_the_size_from_the_next_batch_on():
    images, labels = _data(40)
    loader = make_train_loader("gpu", images, labels, batch_size=16, img_size=24, device="cpu",
                               augment=False, seed=0)
    assert {x.shape[-1] for x, _ in loader} == {24}
    first = [y for _, y in loader]
    loader.set_img_size(40)
    shapes = [tuple(x.shape) for x, _ in loader]
    assert shapes == [(16, 3, 40, 40), (16, 3, 40, 40), (8, 3, 40, 40)]
    assert all(torch.equal(a, b) for a, b in zip(first, (y for _, y in loader), strict=True))  # same order
    with pytest.raises(FasttrainError, match="img_size must be positive, got 0"):
        loader.set_img_size(0)


def test_gpu_warm_up_makes_a_chunk_at_each_size_and_changes_no_batch(monkeypatch):
    """Training warms the loader up at every training resolution before its first timed epoch (the
    kernel's first launch at a size, the chunk buffers' first allocation): one chunk per size is
    made, and the epoch's batches, their size and order are those of a loader never warmed up."""
    import fasttrain.loaders as loaders

    made = []
    real = loaders.to_float_resized
    monkeypatch.setattr(loaders, "to_float_resized", lambda x, size, *a: made.append(size) or real(x, size, *a))
    warmed, cold = (_train(n=37, batch_size=8, img_size=12, augment=True) for _ in range(2))
    for loader in (warmed, cold):
        loader.set_epoch(1)
    warmed.warm_up([10, 12, 14])
    assert made == [10, 12, 14] and warmed.img_size == 12
    made.clear()
    for (x, y), (ref_x, ref_y) in zip(warmed, cold, strict=True):
        assert torch.equal(x, ref_x) and torch.equal(y, ref_y) and x.shape[-1] == 12


def test_gpu_resize_matches_interpolate_exactly():
    images, labels = _data(n=20, size=8)
    loader = make_eval_loader("gpu", images, labels, batch_size=6, img_size=20, device=CPU)
    x = torch.cat([x for x, _ in loader])
    expected = F.interpolate(images.float() / 255, size=(20, 20), mode="bilinear",
                             align_corners=False, antialias=False)
    assert torch.equal(x, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_gpu_dtype_is_the_float32_batch_rounded_once(dtype, channels_last):
    """What the first convolution gets from autocast: float32 values rounded to its dtype."""
    images, labels = _data(n=10, size=8)
    kw = dict(batch_size=4, img_size=13, device=CPU, channels_last=channels_last)
    low = make_eval_loader("gpu", images, labels, dtype=dtype, **kw)
    ref = make_eval_loader("gpu", images, labels, **kw)
    for (x, _), (r, _) in zip(low, ref, strict=True):
        assert x.dtype == dtype and r.dtype == torch.float32
        assert torch.equal(x, r.to(dtype))
        assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def test_torchvision_loader_stays_float32_whatever_dtype_is_asked():
    images, labels = _data(n=8, size=8)
    loader = make_eval_loader("torchvision", images, labels, batch_size=4, img_size=8, device=CPU,
                              dtype=torch.bfloat16)
    assert all(x.dtype == torch.float32 for x, _ in loader)


@pytest.mark.parametrize("kind", LOADERS)
@pytest.mark.parametrize("train", [True, False])
def test_channels_last_honoured(kind, train):
    images, labels = _data(n=12, size=8)
    kw = dict(batch_size=4, img_size=12, device=CPU)

    def make(channels_last):
        if train:
            return make_train_loader(kind, images, labels, augment=False, seed=0,
                                     channels_last=channels_last, **kw)
        return make_eval_loader(kind, images, labels, channels_last=channels_last, **kw)

    for (x, _), (ref, _) in zip(make(True), make(False)):
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert not x.is_contiguous()
        assert ref.is_contiguous()
        assert torch.equal(x, ref)


def test_torchvision_train_shapes_dtype_range():
    loader = _train("torchvision", n=20, size=8, img_size=16, batch_size=8, augment=True,
                    workers=0)
    loader.set_epoch(1)
    batches = list(loader)
    assert len(loader) == len(batches) == 3 and loader.num_samples == 20
    for x, y in batches:
        assert x.shape[1:] == (3, 16, 16) and x.dtype == torch.float32
        assert y.dtype == torch.int64
        assert x.min() >= 0 and x.max() <= 1
    assert sorted(sum((y.tolist() for _, y in batches), [])) == list(range(20))


def test_torchvision_output_close_to_gpu():
    images, labels = _data(n=16, size=32)
    kw = dict(batch_size=8, img_size=40, device=CPU)
    gpu = torch.cat([x for x, _ in make_eval_loader("gpu", images, labels, **kw)])
    ref = torch.cat([x for x, _ in make_eval_loader("torchvision", images, labels, **kw)])
    # PIL bilinear rounds to uint8 before ToTensor; interpolate stays float
    assert (gpu - ref).abs().mean() < 0.01
    assert (gpu - ref).abs().max() < 0.02


@pytest.mark.parametrize("world_size", [1, 2])
def test_train_order_identical_across_kinds(world_size):
    """Same seed/epoch/rank -> the two loaders visit the same images in the same batches."""
    for rank in range(world_size):
        gpu, tv = (_train(kind, n=21, size=8, img_size=8, batch_size=4, seed=11, rank=rank,
                          world_size=world_size) for kind in LOADERS)
        gpu.set_epoch(4)
        tv.set_epoch(4)
        assert len(gpu) == len(tv) and gpu.num_samples == tv.num_samples
        for (xg, yg), (xt, yt) in zip(gpu, tv, strict=True):
            assert torch.equal(yg, yt)
            assert torch.equal(xg, xt)  # no resize, no augmentation: bit-identical


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_loader_on_cuda_matches_cpu():
    images, labels = _data(n=50, size=32)
    kw = dict(batch_size=16, img_size=64, augment=True, seed=1, rank=1, world_size=2,
              channels_last=True)
    cuda = make_train_loader("gpu", images, labels, device=torch.device("cuda"), **kw)
    cpu = make_train_loader("gpu", images, labels, device=CPU, **kw)
    assert cuda.images.is_cuda
    for loader in (cuda, cpu):
        loader.set_epoch(3)
    for (xc, yc), (xr, yr) in zip(cuda, cpu, strict=True):
        assert xc.is_cuda and yc.is_cuda
        assert xc.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(yc.cpu(), yr)
        torch.testing.assert_close(xc.cpu(), xr, atol=1e-5, rtol=0)


def test_torchvision_workers_same_order_as_in_process():
    kw = dict(n=24, size=8, batch_size=8, seed=2)
    in_process, workers = _train("torchvision", **kw), _train("torchvision", workers=2, **kw)
    for loader in (in_process, workers):
        loader.set_epoch(1)
    assert _labels(in_process) == _labels(workers)







# --- loader_args: the one place a run's loaders get their arguments -------------------------------

def test_loader_args_pin_only_for_a_gpu_and_take_the_precision_dtype_for_the_gpu_loader():
    from fasttrain import config
    from fasttrain.loaders import loader_args
    from fasttrain.precision import PRECISIONS

    params = config.from_dict({"data": {"loader": "gpu", "pin_memory": True, "workers": 3},
                               "train": {"img_size": 64, "channels_last": True}})
    cpu = loader_args(params, PRECISIONS["bf16"], CPU, rank=1, world_size=2)
    assert cpu == dict(img_size=64, device=CPU, rank=1, world_size=2, workers=3, pin_memory=False,
                       channels_last=True, dtype=torch.bfloat16)
    assert loader_args(params, PRECISIONS["bf16"], torch.device("cuda"))["pin_memory"] is True
    unpinned = config.from_dict({"data": {"loader": "torchvision", "pin_memory": False}})
    args = loader_args(unpinned, PRECISIONS["bf16"], torch.device("cuda"), img_size=96, channels_last=False)
    assert (args["pin_memory"], args["dtype"], args["img_size"], args["channels_last"]) == (False, torch.float32, 96, False)


def test_every_loader_the_product_makes_gets_its_arguments_from_loader_args():
    """train, evaluate and bench: each make_*_loader call spreads loader_args(...) (or a name bound to
    it) and names none of its keys itself, so the three cannot drift apart again."""
    import ast
    import inspect
    from pathlib import Path

    import fasttrain
    from fasttrain import config, loaders
    from fasttrain.precision import PRECISIONS

    keys = set(loaders.loader_args(config.from_dict({}), PRECISIONS["fp32"], CPU))
    calls = []
    for path in sorted(Path(inspect.getfile(fasttrain)).parent.glob("*.py")):
        if path.name == "loaders.py":
            continue
        tree = ast.parse(path.read_text())
        bound = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                 and getattr(node.value.func, "id", None) == "loader_args" for t in node.targets}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("make_train_loader", "make_eval_loader"):
                spread = [k.value for k in node.keywords if k.arg is None]
                named = {k.arg for k in node.keywords if k.arg is not None}
                uses = any(getattr(s, "id", None) in bound or "loader_args(" in ast.unparse(s) for s in spread)
                calls.append((path.name, node.lineno, uses, sorted(named & keys)))
    assert {name for name, *_ in calls} == {"train.py", "evaluate.py", "bench.py"}
    assert [c for c in calls if not c[2] or c[3]] == []
