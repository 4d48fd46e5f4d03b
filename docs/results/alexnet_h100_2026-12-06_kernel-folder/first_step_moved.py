# The same first step, the process started in one folder and moved to another before (or after) CUDA started.
import os, sys, time
name, start, to, when = sys.argv[1:5]
os.chdir(start)
import torch, torchvision
torch.backends.cudnn.benchmark = True
if when == "before-init" and to != "-":
    os.chdir(to)
m = torchvision.models.alexnet(num_classes=10).cuda().to(memory_format=torch.channels_last)
x = torch.randn(512, 3, 227, 227, device="cuda").to(memory_format=torch.channels_last)
torch.cuda.synchronize()
if when == "after-init" and to != "-":
    os.chdir(to)
t1 = time.perf_counter()
with torch.autocast("cuda", torch.bfloat16):
    loss = m(x).float().sum()
loss.backward()
torch.cuda.synchronize()
print(f"{name}: started in {start}, step in {os.getcwd()} ({when}): first step {time.perf_counter()-t1:.2f} s", flush=True)
