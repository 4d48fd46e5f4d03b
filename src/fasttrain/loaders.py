"""Batches of CIFAR-style uint8 images for training and evaluation, two ways.

``gpu``: the whole uint8 set is moved to the device once; a batch is an index slice, and
conversion, resize and augmentation are batched tensor ops on the device (airbench style); on a
CUDA device one Triton kernel does them all at once (batch_kernel.py).
``torchvision``: the classic per-image PIL path (Dataset -> transforms -> DataLoader ->
DistributedSampler), kept as the reference the fast path is measured against.

Both loaders agree on what a rank sees, so every precision/parallel variant trains on the same
data:

* Training order is DistributedSampler's, reproduced exactly by the gpu loader: a permutation
  from ``torch.Generator().manual_seed(seed + epoch)`` (identical on every rank), padded by
  repeating its head up to ``ceil(N / world_size) * world_size`` positions, rank r taking
  ``perm[r::world_size]``. Every rank therefore has the same number of samples and steps (DDP
  would deadlock otherwise); at most ``world_size - 1`` images are seen twice per epoch. No
  batch is dropped: the last one may be short, as with DataLoader's ``drop_last=False``.
* Evaluation: rank r gets ``range(r, N, world_size)`` in order, no padding, so counts summed
  across ranks cover every image exactly once; batch counts may differ across ranks.
* Augmentation is the standard CIFAR one, done at the SOURCE resolution before the resize:
  zero-pad by ``CROP_PADDING_PX`` (4 px), random crop back to the source size, random horizontal
  flip (torchvision: ``RandomCrop(size, padding=4)`` with its default zero fill, then
  ``RandomHorizontalFlip``). Cropping 32 px images is cheaper than cropping 227 px ones and
  keeps the crop at the scale the recipe was tuned for.
* Output: float32 [B, 3, img_size, img_size] in [0, 1] (ToTensor scaling, no normalisation),
  int64 labels, both on ``device``; channels_last when asked. The gpu loader can round the images
  to the precision's autocast dtype instead (``dtype``): the values the first convolution would
  get from autocast anyway, without the float32 batch in between.
"""

from __future__ import annotations

import math
from typing import Iterator, Protocol

import torch
import torch.nn.functional as F

from fasttrain import batch_kernel
from fasttrain.config import LOADERS  # the loader names: config.py validates data.loader against them
from fasttrain.errors import FasttrainError

CROP_PADDING_PX = 4  # zero padding at the source resolution before the random crop (CIFAR standard)
CHUNK_BYTES = 256 * 2**20  # gpu loader: float32 output made at once (several batches when they are small)


def input_dtype(params, precision) -> torch.dtype:
    """The dtype batches reach the model in: the gpu loader rounds them to the autocast dtype
    (exactly what autocast would do to them), the torchvision loader gives float32."""
    return precision.compute_dtype if params.data.loader == "gpu" else torch.float32


def loader_args(params, precision, device: torch.device, rank: int = 0, world_size: int = 1, *,
                img_size: int | None = None, channels_last: bool | None = None) -> dict:
    """The arguments every loader of a run is made with, for train, evaluate and bench alike: the
    resolution and layout (a trained model's own, `img_size` and `channels_last`, else the train
    section's), the dtype batches reach the model in, this rank's shard, and the torchvision
    loader's workers and pinned memory (pinned only where a GPU copies from it). What differs per
    loader (the kind, the batch size, augmentation and its seed) is the caller's."""
    return dict(img_size=params.train.img_size if img_size is None else img_size, device=device, rank=rank,
                world_size=world_size, workers=params.data.workers,
                pin_memory=params.data.pin_memory and device.type == "cuda",
                channels_last=params.train.channels_last if channels_last is None else channels_last,
                dtype=input_dtype(params, precision))


class Loader(Protocol):
    num_samples: int  # images this rank sees per epoch (padding included for training)

    def set_epoch(self, epoch: int) -> None: ...
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...
    def iter_from(self, step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...
    def __len__(self) -> int: ...


def make_train_loader(kind: str, images: torch.Tensor, labels: torch.Tensor, *, batch_size: int,
                      img_size: int, device: torch.device, augment: bool, seed: int,
                      rank: int = 0, world_size: int = 1, workers: int = 0,
                      pin_memory: bool = False, channels_last: bool = False,
                      dtype: torch.dtype = torch.float32) -> Loader:
    """Shuffled, sharded training batches; call ``set_epoch`` before each epoch.

    ``dtype`` concerns the gpu loader alone; the torchvision loader always gives float32, as
    ToTensor does.
    """
    _check(kind, images, labels, batch_size, img_size, rank, world_size)
    if kind == "gpu":  # workers / pin_memory are meaningless: the data never leaves the device
        return GpuLoader(images, labels, batch_size=batch_size, img_size=img_size, device=device,
                         train=True, augment=augment, seed=seed, rank=rank,
                         world_size=world_size, channels_last=channels_last, dtype=dtype)
    return TorchvisionLoader(images, labels, batch_size=batch_size, img_size=img_size,
                             device=device, train=True, augment=augment, seed=seed, rank=rank,
                             world_size=world_size, workers=workers, pin_memory=pin_memory,
                             channels_last=channels_last)


def make_eval_loader(kind: str, images: torch.Tensor, labels: torch.Tensor, *, batch_size: int,
                     img_size: int, device: torch.device, rank: int = 0, world_size: int = 1,
                     workers: int = 0, pin_memory: bool = False,
                     channels_last: bool = False, dtype: torch.dtype = torch.float32) -> Loader:
    """In-order, unaugmented batches of ``range(rank, N, world_size)``."""
    _check(kind, images, labels, batch_size, img_size, rank, world_size)
    if kind == "gpu":
        return GpuLoader(images, labels, batch_size=batch_size, img_size=img_size, device=device,
                         train=False, augment=False, seed=0, rank=rank,
                         world_size=world_size, channels_last=channels_last, dtype=dtype)
    return TorchvisionLoader(images, labels, batch_size=batch_size, img_size=img_size,
                             device=device, train=False, augment=False, seed=0, rank=rank,
                             world_size=world_size, workers=workers, pin_memory=pin_memory,
                             channels_last=channels_last)


def _check(kind, images, labels, batch_size, img_size, rank, world_size) -> None:
    if kind not in LOADERS:
        raise FasttrainError(f"unknown data.loader '{kind}': choose {' or '.join(LOADERS)}")
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
        raise FasttrainError(f"images must be uint8 [N, 3, H, W], got {images.dtype} "
                             f"{list(images.shape)}")
    if labels.dim() != 1 or labels.shape[0] != images.shape[0]:
        raise FasttrainError(f"labels must be [N] with N = {images.shape[0]}, got "
                             f"{list(labels.shape)}")
    if batch_size < 1 or img_size < 1:
        raise FasttrainError(f"batch_size and img_size must be positive, got {batch_size} "
                             f"and {img_size}")
    if not 0 <= rank < world_size:
        raise FasttrainError(f"rank {rank} is outside world_size {world_size}")


def _epoch_order(n: int, world_size: int, seed: int, epoch: int,
                 augment: bool) -> torch.Tensor:
    """[1 or 4, total] int64 on CPU: DistributedSampler's padded permutation, and, when
    augmenting, a crop row offset, crop column offset and flip bit for every global position.

    Drawn from one CPU generator seeded with ``seed + epoch`` so the order is bit-identical to
    DistributedSampler's and to itself on any device; ranks get distinct augmentation because
    they take different positions of the same draw.
    """
    g = torch.Generator().manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g)  # first draw: must match DistributedSampler
    total = math.ceil(n / world_size) * world_size
    perm = perm.repeat(math.ceil(total / n))[:total]  # == indices + indices[:padding]
    if not augment:
        return perm[None]
    max_offset = 2 * CROP_PADDING_PX  # padded size minus crop size
    dy = torch.randint(0, max_offset + 1, (total,), generator=g)
    dx = torch.randint(0, max_offset + 1, (total,), generator=g)
    flip = torch.randint(0, 2, (total,), generator=g)
    return torch.stack([perm, dy, dx, flip])


def crop_flip(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor,
              flip: torch.Tensor) -> torch.Tensor:
    """Per-sample random crop of the zero-padded batch plus horizontal flip, as one gather.

    x: [B, C, H, W] (any dtype); dy, dx: [B] offsets in [0, 2 * CROP_PADDING_PX]; flip: [B]
    0/1. Equals ``RandomCrop((H, W), padding=CROP_PADDING_PX)`` then ``hflip`` where flip is 1.
    """
    b, c, h, w = x.shape
    p = CROP_PADDING_PX
    padded = F.pad(x, (p, p, p, p))  # zero fill, like torchvision RandomCrop's default
    ar_h = torch.arange(h, device=x.device)
    ar_w = torch.arange(w, device=x.device)
    rows = dy[:, None] + ar_h  # [B, H]
    # a flipped crop reads its columns right to left: fold the flip into the gather index
    cols = dx[:, None] + torch.where(flip[:, None].bool(), w - 1 - ar_w, ar_w)  # [B, W]
    bi = torch.arange(b, device=x.device)[:, None, None, None]
    ci = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[bi, ci, rows[:, None, :, None], cols[:, None, None, :]]


def to_float_resized(x: torch.Tensor, img_size: int, channels_last: bool = False,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [B, C, H, W] -> values in [0, 1] at img_size x img_size (bilinear, half-pixel),
    computed in float32 and rounded once to ``dtype``.

    Conversion and the memory-format change happen at the source resolution (50x fewer pixels
    than after the resize), so the resize writes its large output once, already in its layout.
    Rounding to the autocast dtype here gives the first convolution exactly the values autocast
    would have made from float32, without a float32 copy of the batch in between.
    """
    x = x.float().div_(255)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    if x.shape[-2:] != (img_size, img_size):
        x = F.interpolate(x, size=(img_size, img_size), mode="bilinear", align_corners=False,
                          antialias=False)
        if channels_last:  # interpolate keeps the input's layout; make sure of it for tiny inputs
            x = x.contiguous(memory_format=torch.channels_last)
    return x.to(dtype)


class GpuLoader:
    """The whole uint8 set on ``device``; batches are index slices, transforms batched ops."""

    def __init__(self, images, labels, *, batch_size, img_size, device, train, augment, seed,
                 rank, world_size, channels_last, dtype=torch.float32):
        self.device = torch.device(device)
        self.dtype = dtype
        self.images = images.to(self.device)  # once; ~150 MB for CIFAR-10 train
        self.labels = labels.to(self.device, torch.int64)
        self.batch_size, self.img_size = batch_size, img_size
        self.train, self.augment, self.seed = train, augment, seed
        self.rank, self.world_size = rank, world_size
        self.channels_last = channels_last
        self.fused = batch_kernel.enabled(self.images)
        n = images.shape[0]
        if train:
            self.num_samples = math.ceil(n / world_size)
            self.set_epoch(0)
        else:
            self._order = torch.arange(rank, n, world_size, device=self.device)[None]
            self.num_samples = self._order.shape[1]

    def set_img_size(self, img_size: int) -> None:
        """Resize to img_size from the next epoch on (progressive resizing)."""
        if img_size < 1:
            raise FasttrainError(f"img_size must be positive, got {img_size}")
        self.img_size = img_size

    def warm_up(self, sizes) -> None:
        """One chunk at each of `sizes`, then back to the current size: the kernel's first launch at
        a size (Triton's compile or cache load) and the chunk buffers' first allocation happen here,
        not in the first timed epoch at that size. It draws no random numbers: the batches stay."""
        current = self.img_size
        for size in sizes:
            self.set_img_size(size)
            next(iter(self), None)
        self.set_img_size(current)

    def set_epoch(self, epoch: int) -> None:
        if not self.train:
            return
        order = _epoch_order(self.images.shape[0], self.world_size, self.seed, epoch,
                             self.augment)
        # this rank's shard of every row, one host-to-device copy per epoch
        self._order = order[:, self.rank::self.world_size].to(self.device)

    def __len__(self) -> int:
        return math.ceil(self.num_samples / self.batch_size)

    def __iter__(self):
        return self.iter_from(0)

    def iter_from(self, step: int):
        """The epoch's batches from batch `step` (0-based) on: a run resumed mid-epoch gets the
        very batches the uninterrupted one did (same chunks, so the same values)."""
        order, b = self._order, self.batch_size
        # Several batches are gathered, augmented, converted and resized by one set of ops, then
        # handed out as views: at small batches the step is bound by kernel launches, and a loader
        # that launches half a dozen kernels per batch would cost a tenth of the throughput.
        per_chunk = max(1, CHUNK_BYTES // (b * self.images.shape[1] * 4 * self.img_size**2)) * b
        first = step * b
        for start in range(first - first % per_chunk, self.num_samples, per_chunk):
            part = order[:, start:start + per_chunk]  # views: no host work, no sync
            idx = part[0]
            if self.fused:  # one kernel, one write of the output (batch_kernel.py)
                x = batch_kernel.gather_crop_flip_resize(
                    self.images, idx, part[1:] if self.augment else None, self.img_size,
                    self.channels_last, self.dtype, CROP_PADDING_PX)
            else:
                x = self.images.index_select(0, idx)
                if self.augment:
                    x = crop_flip(x, part[1], part[2], part[3])
                x = to_float_resized(x, self.img_size, self.channels_last, self.dtype)
            y = self.labels.index_select(0, idx)
            for i in range(max(0, first - start), idx.shape[0], b):
                yield x[i:i + b], y[i:i + b]  # a slice along the batch keeps channels_last
            del x, y  # the next chunk may take this one's memory


class PILImages(torch.utils.data.Dataset):
    """The uint8 array as a classic torchvision dataset: (PIL image, int label) through
    ``transform``. Holds numpy arrays so it pickles cheaply into worker processes."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform):
        self.hwc = images.permute(0, 2, 3, 1).contiguous().numpy()
        self.labels = labels.to(torch.int64).numpy()
        self.transform = transform

    def __len__(self) -> int:
        return len(self.hwc)

    def __getitem__(self, i):
        from PIL import Image
        return self.transform(Image.fromarray(self.hwc[i])), int(self.labels[i])


class TorchvisionLoader:
    """Reference path: PIL per image, transforms.Compose, DataLoader, DistributedSampler."""

    def __init__(self, images, labels, *, batch_size, img_size, device, train, augment, seed,
                 rank, world_size, workers, pin_memory, channels_last):
        from torchvision import transforms

        h, w = images.shape[-2:]
        steps = []
        if augment:  # crop at the source resolution, before the resize (see module docstring)
            steps += [transforms.RandomCrop((h, w), padding=CROP_PADDING_PX),
                      transforms.RandomHorizontalFlip()]
        # (img_size, img_size) rather than img_size: identical for square CIFAR, and the
        # output shape is the contract even for non-square input
        steps += [transforms.Resize((img_size, img_size)), transforms.ToTensor()]
        dataset = PILImages(images.cpu(), labels.cpu(), transforms.Compose(steps))
        if train:
            self.sampler = torch.utils.data.DistributedSampler(
                dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        else:
            self.sampler = range(rank, len(dataset), world_size)
        self.num_samples = len(self.sampler)
        self.loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, sampler=self.sampler, num_workers=workers,
            pin_memory=pin_memory, persistent_workers=workers > 0,
            # seeds the workers' augmentation RNG; with workers=0 the global RNG is used
            generator=torch.Generator().manual_seed(seed * 1000 + rank))
        self.device = torch.device(device)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def set_epoch(self, epoch: int) -> None:
        if isinstance(self.sampler, torch.utils.data.DistributedSampler):
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        return self.iter_from(0)

    def iter_from(self, step: int):
        """From batch `step` on: the sampler's order from there, through a DataLoader made for it.
        Bit-identical to the uninterrupted epoch with workers: 0 (the augmentation draws from the
        global RNG, which the checkpoint restores); with workers, their seeds differ."""
        loader = self.loader
        if step:
            start = step * self.loader.batch_size
            loader = torch.utils.data.DataLoader(
                self.loader.dataset, batch_size=self.loader.batch_size, sampler=list(self.sampler)[start:],
                num_workers=self.loader.num_workers, pin_memory=self.loader.pin_memory)
        for x, y in loader:
            yield (x.to(self.device, non_blocking=True, memory_format=self.memory_format),
                   y.to(self.device, non_blocking=True))
