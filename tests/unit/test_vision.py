"""fasttrain.vision: torchvision without torch._dynamo, and the plain import when a torchvision needs
more of it. Each case in a fresh interpreter, since an import happens once per process."""

import os
import subprocess
import sys
import textwrap


def python(code: str, path: str = "") -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_models_and_data_import_torchvision_without_dynamo():
    python("""
        import sys
        from fasttrain import data, models
        models.build_model("alexnet", 10)
        assert "torch._dynamo" not in sys.modules and "torch._dynamo.utils" not in sys.modules
        roi_align = sys.modules["torchvision.ops.roi_align"]  # the module (torchvision.ops.roi_align: its function)
        import torch._dynamo.utils as real  # the real module, imported as usual when asked for
        assert real.__file__.endswith("utils.py") and hasattr(real, "counters")
        # torchvision's reference still answers, through the real function
        assert roi_align.is_compile_supported("cpu") == real.is_compile_supported("cpu")
        assert roi_align.is_compile_supported("cuda") == real.is_compile_supported("cuda")
    """)


def test_a_torchvision_needing_more_of_dynamo_is_imported_the_plain_way(tmp_path):
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text("from torch._dynamo.utils import counters, is_compile_supported\n")
    python("""
        import sys
        from fasttrain.vision import torchvision
        assert torchvision.__file__.startswith(%r)
        assert torchvision.counters is sys.modules["torch._dynamo.utils"].counters
    """ % str(fake), path=str(tmp_path))


def test_dynamo_already_loaded_is_used_as_is():
    python("""
        import sys, torch._dynamo.utils as real
        from fasttrain.vision import torchvision
        roi_align = sys.modules["torchvision.ops.roi_align"]  # the module (torchvision.ops.roi_align: its function)
        assert roi_align.is_compile_supported is real.is_compile_supported
    """)
