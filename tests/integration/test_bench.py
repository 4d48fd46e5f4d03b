"""`fasttrain bench` on the CPU at a tiny size writes a well-formed metrics/bench.json."""

import json
import os

import pytest
import torch

from scratch import run

pytestmark = pytest.mark.slow


def test_bench_writes_every_path_and_ratio(tiny_repo):
    run(["fasttrain", "download"], tiny_repo)
    out = run(["fasttrain", "bench", "--case", "16:fp32", "--case", "16:bf16", "--warmup-steps", "1",
               "--min-steps", "2", "--min-seconds", "0", "--matmul-size", "64", "--rounds", "3"], tiny_repo)
    result = json.loads((tiny_repo / "metrics" / "bench.json").read_text())
    assert result["device"] == "CPU" and result["torch_version"] and result["world_size"] == 1
    assert result["bf16_matmul_peak_tflops"] > 0 and result["gflop_per_image_forward_backward"] > 0
    host = result["host"]  # a contended host shows: another job's CPU work slows the torchvision paths
    assert host["cpu_count"] == os.cpu_count()
    assert isinstance(host["load_average_1min_start"], float) and host["load_average_1min_start"] >= 0
    assert isinstance(host["load_average_1min_end"], float) and host["load_average_1min_end"] >= 0
    assert [(c["batch_size"], c["precision"]) for c in result["cases"]] == [(16, "fp32"), (16, "bf16")]
    for case in result["cases"]:
        assert case["pad_channels"] is False
        assert set(case["paths"]) == {"torchvision_workers_0", "gpu_loader", "compute_ceiling"}  # workers: 0
        for path in case["paths"].values():
            assert path["images_per_second"] > 0 and path["steps"] >= 3 * 2 and 0 < path["model_flop_utilisation"]
            assert len(path["each_round"]) == 3 and path["images_per_second"] == sorted(path["each_round"])[1]
        assert case["gpu_loader_kernel"] is torch.cuda.is_available()  # the CPU loader uses the tensor ops
        gpu = case["paths"]["gpu_loader"]["images_per_second"]
        assert case["gpu_loader_over_compute_ceiling"] == pytest.approx(
            gpu / case["paths"]["compute_ceiling"]["images_per_second"], rel=1e-2)
    assert "compute_ceiling" in out.stdout and (tiny_repo / "metrics" / "bench.md").is_file()


def test_bench_with_padded_channels(tiny_repo):
    """train.pad_channels: the gpu loader and the ceiling get 8 channels, the torchvision loader 3."""
    import yaml

    params = yaml.safe_load((tiny_repo / "params.yaml").read_text())
    params["train"]["pad_channels"] = True
    (tiny_repo / "params.yaml").write_text(yaml.safe_dump(params))
    run(["fasttrain", "download"], tiny_repo)
    run(["fasttrain", "bench", "--case", "16:bf16", "--warmup-steps", "1", "--min-steps", "2", "--min-seconds", "0",
         "--matmul-size", "64", "--rounds", "1"], tiny_repo)
    (case,) = json.loads((tiny_repo / "metrics" / "bench.json").read_text())["cases"]
    assert case["pad_channels"] is True
    assert set(case["paths"]) == {"torchvision_workers_0", "gpu_loader", "compute_ceiling"}
    assert all(p["images_per_second"] > 0 for p in case["paths"].values())


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
