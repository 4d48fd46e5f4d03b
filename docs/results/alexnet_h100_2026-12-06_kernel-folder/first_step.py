# The first bf16 training step of AlexNet (batch 512, 227 px, cudnn.benchmark on) in a given folder: its seconds.
import os, sys, time
t0 = time.perf_counter()
import torch, torchvision
torch.backends.cudnn.benchmark = True
m = torchvision.models.alexnet(num_classes=10).cuda().to(memory_format=torch.channels_last)
x = torch.randn(512, 3, 227, 227, device="cuda").to(memory_format=torch.channels_last)
torch.cuda.synchronize()
t1 = time.perf_counter()
with torch.autocast("cuda", torch.bfloat16):
    loss = m(x).float().sum()
loss.backward()
torch.cuda.synchronize()
t2 = time.perf_counter()
with torch.autocast("cuda", torch.bfloat16):
    loss = m(x).float().sum()
loss.backward()
torch.cuda.synchronize()
t3 = time.perf_counter()
print(f"{sys.argv[1]}: cwd {os.getcwd()} PWD {os.environ.get('PWD')} script {__file__}: setup {t1-t0:.2f} first {t2-t1:.2f} second {t3-t2:.2f}", flush=True)
