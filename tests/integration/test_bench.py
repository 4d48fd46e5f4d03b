"""`fasttrain bench` on the CPU at a tiny size writes a well-formed metrics/bench.json."""

import json
import os

import pytest
import torch

from scratch import TINY, run

pytestmark = pytest.mark.slow


def test_bench_writes_every_path_and_ratio(tiny_repo):
    run(["fasttrain", "download"], tiny_repo)
    # --matmul-size 512, the CPU's cap: a real peak, which the model's FLOP/s stay well under (MFU
    # 0.04-0.05 on a 2-core machine; against a 64^3 product's far lower rate, 0.65-0.75: this bound
    # catches a wrong formula, and test_ratios_and_mfu_by_hand the cap)
    out = run(["fasttrain", "bench", "--case", "16:fp32", "--case", "16:bf16", "--warmup-steps", "1",
               "--min-steps", "2", "--min-seconds", "0", "--matmul-size", "512", "--rounds", "3"], tiny_repo)
    result = json.loads((tiny_repo / "metrics" / "bench.json").read_text())
    assert result["device"] == "CPU" and result["torch_version"] and result["world_size"] == 1
    assert result["bf16_matmul_peak_tflops"] > 0 and result["gflop_per_image_forward_backward"] > 0
    host = result["host"]  # a contended host shows: another job's CPU work slows the torchvision paths
    assert host["cpu_count"] == os.cpu_count()
    assert isinstance(host["load_average_1min_start"], float) and host["load_average_1min_start"] >= 0
    assert isinstance(host["load_average_1min_end"], float) and host["load_average_1min_end"] >= 0
    assert [(c["batch_size"], c["precision"]) for c in result["cases"]] == [(16, "fp32"), (16, "bf16")]
    for case in result["cases"]:
        assert case["space_to_depth"] is False
        assert set(case["paths"]) == {"torchvision_workers_0", "gpu_loader", "compute_ceiling"}  # workers: 0
        for path in case["paths"].values():
            assert path["images_per_second"] > 0 and path["steps"] >= 3 * 2 and 0 < path["model_flop_utilisation"] <= 1
            assert len(path["each_round"]) == 3 and path["images_per_second"] == sorted(path["each_round"])[1]
        assert case["gpu_loader_kernel"] is torch.cuda.is_available()  # the CPU loader uses the tensor ops
        assert case["gpu_loader_over_compute_ceiling"] > 0  # its value: test_ratios_and_mfu_by_hand
    assert "compute_ceiling" in out.stdout and (tiny_repo / "metrics" / "bench.md").is_file()


def _bench_fixture(tmp_path, **train):
    from fasttrain import config
    from fasttrain.data import make_synthetic, save_dataset
    from fasttrain.layout import Layout

    layout = Layout(tmp_path)
    save_dataset(make_synthetic(32, 10, 32, 0), layout.dataset)
    return config.from_dict({**TINY, "train": {**TINY["train"], "device": "cpu", **train}}), layout


def test_ratios_and_mfu_by_hand(tmp_path, monkeypatch):
    """Hand-made timings: each path's rounds, a 2 TFLOP/s peak, 4 GFLOP an image. Medians: torchvision
    100, gpu loader 300, ceiling 400 images/s; so gpu/torchvision 3.0, gpu/ceiling 0.75, and MFU
    100 x 4e9 / 2e12 = 0.2, 0.6 and 0.8."""
    from fasttrain import bench

    rounds = {"torchvision_workers_0": [90.0, 100.0, 300.0], "gpu_loader": [300.0, 900.0, 30.0],
              "compute_ceiling": [400.0, 400.0, 1.0]}

    def which(batches) -> str:  # the ceiling repeats one batch; the gpu loader hands bf16, torchvision float32
        (a, _), (b, _) = next(batches), next(batches)
        if a is b:
            return "compute_ceiling"
        return "gpu_loader" if a.dtype == torch.bfloat16 else "torchvision_workers_0"

    def time_steps(step, batches, *args):
        return {"images_per_second": rounds[which(batches)].pop(0), "steps": 2, "seconds": 1.0}

    monkeypatch.setattr(bench, "time_steps", time_steps)
    peak_sizes = []
    # a CPU without native bf16 multiplies fp32 faster: utilisation is of the faster of the two
    peaks = {torch.bfloat16: 1.0, torch.float32: 2.0}
    monkeypatch.setattr(bench, "matmul_peak_tflops", lambda device, size, dtype=torch.bfloat16: (
        peak_sizes.append((size, dtype)), peaks[dtype])[1])
    monkeypatch.setattr(bench, "flops_per_image", lambda name, size, classes: 4e9)
    params, layout = _bench_fixture(tmp_path)
    result = bench.bench(params, [bench.parse_case("16:bf16")], layout, rounds=3, log=lambda msg: None)
    assert result["bf16_matmul_peak_tflops"] == 1.0 and result["matmul_peak_tflops"] == 2.0
    (case,) = result["cases"]
    assert {name: (p["images_per_second"], p["model_flop_utilisation"]) for name, p in case["paths"].items()} == {
        "torchvision_workers_0": (100.0, 0.2), "gpu_loader": (300.0, 0.6), "compute_ceiling": (400.0, 0.8)}
    assert case["gpu_loader_over_torchvision_workers_0"] == 3.0 and case["gpu_loader_over_compute_ceiling"] == 0.75
    assert all(r == [] for r in rounds.values())  # every round of every path timed
    assert peak_sizes == [(512, torch.bfloat16), (512, torch.float32)]  # the default 8192, capped on the CPU


@pytest.mark.parametrize("case", ["64:fp8", "64:amp:compile=reduce-overhead", "64:amp:jit"])
def test_bad_case_is_a_one_line_error(tiny_repo, case):
    proc = run(["fasttrain", "bench", "--case", case], tiny_repo, check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        f"fasttrain: error: bad bench case '{case}': use BATCH:PRECISION[:compile[=MODE]], precision one of "
        "fp32, autocast, amp, bf16, MODE one of default, max-autotune-no-cudagraphs, "
        "e.g. 64:amp or 512:bf16:compile"]
    assert not (tiny_repo / "metrics" / "bench.json").exists()


def test_case_names_the_compile_mode():
    from fasttrain.bench import parse_case

    assert parse_case("64:amp").name == "batch 64, amp"
    assert parse_case("512:bf16:compile").name == "batch 512, bf16, compiled"
    mode = parse_case("512:bf16:compile=max-autotune-no-cudagraphs")
    assert mode.compile_mode == "max-autotune-no-cudagraphs"
    assert mode.name == "batch 512, bf16, compiled (max-autotune-no-cudagraphs)"
