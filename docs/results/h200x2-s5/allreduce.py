# torchrun --nproc-per-node N .run/allreduce.py : NCCL all-reduce time of AlexNet's gradients (fp32, as DDP reduces them)
import os, time, torch, torch.distributed as dist, torchvision
rank = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(rank); dist.init_process_group("nccl")
n = sum(p.numel() for p in torchvision.models.alexnet(num_classes=10).parameters())
for numel, name in ((n, "all AlexNet grads"), (25 * 2**20 // 4, "one 25 MiB DDP bucket")):
    x = torch.ones(numel, device="cuda")
    for _ in range(5): dist.all_reduce(x)
    torch.cuda.synchronize(); t = time.perf_counter(); k = 20
    for _ in range(k): dist.all_reduce(x)
    torch.cuda.synchronize(); s = (time.perf_counter() - t) / k
    ws = dist.get_world_size(); bus = 2 * (ws - 1) / ws * numel * 4 / s / 1e9
    if rank == 0: print(f"ALLREDUCE {name}: {numel*4/1e6:.1f} MB in {s*1e3:.3f} ms, bus bandwidth {bus:.0f} GB/s, world {ws}")
dist.destroy_process_group()
