from pathlib import Path

import pytest
import yaml

from fasttrain import config
from fasttrain.errors import FasttrainError


def test_defaults_are_the_classic_recipe(tmp_path):
    p = config.load("params.yaml")
    assert (p.model.name, p.train.img_size, p.train.batch_size, p.train.lr, p.train.epochs) == ("alexnet", 227, 64, 1e-4, 20)
    assert p == config.Params()  # params.yaml and the dataclass defaults say the same thing


def test_ints_are_accepted_where_floats_are_expected():
    p = config.from_dict({"train": {"lr": 1, "weight_decay": 0}})
    assert isinstance(p.train.lr, float) and p.train.lr == 1.0


@pytest.mark.parametrize("raw, fragment", [
    ({"train": {"lr": 0}}, "train.lr"),
    ({"train": {"lr": -1e-3}}, "train.lr"),
    ({"train": {"batch_size": 0}}, "train.batch_size"),
    ({"train": {"epochs": 0}}, "train.epochs"),
    ({"train": {"epochs": 2.5}}, "train.epochs must be an integer"),
    ({"train": {"epochs": True}}, "train.epochs must be an integer"),
    ({"train": {"lr": "fast"}}, "train.lr must be a number"),
    ({"train": {"scheduler": "cosine"}}, "plateau, onecycle, none"),
    ({"train": {"nproc": 0}}, "train.nproc"),
    ({"train": {"device": "tpu"}}, "auto, cpu, cuda"),
    ({"train": {"lrr": 1e-3}}, "unknown key 'train.lrr' in params (did you mean 'lr'?); valid keys: epochs, "),
    ({"train": {"learning_rate": 1e-3}}, "unknown key 'train.learning_rate' in params (did you mean 'lr'?)"),
    ({"train": {"zzz": 1}}, "unknown key 'train.zzz' in params; valid keys: "),  # nothing near: no guess
    ({"trian": {}}, "unknown params section 'trian' (did you mean 'train'?); valid sections: data, model, "),
    ({"data": {"loader": "dali"}}, "gpu, torchvision"),
    ({"data": {"md5": "xyz"}}, "data.md5"),
    ({"data": {"workers": -1}}, "data.workers"),
    ({"data": "cifar10"}, "must be a mapping"),
    ({"evaluate": {"batch_size": 0}}, "evaluate.batch_size"),
])
def test_bad_params_are_one_line_errors(raw, fragment):
    with pytest.raises(FasttrainError) as e:
        config.from_dict(raw)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text, written", [("6e-4", "6.0e-4"), ("1E3", "1.0e+3"), ("2.5e-3", None), ("7.0e-4", None)])
def test_a_number_yaml_reads_as_a_string_is_an_error_that_says_how_to_write_it(tmp_path, text, written):
    """YAML 1.1 (PyYAML, as DVC reads params.yaml too) needs a dot and a signed exponent: 6e-4 is a
    string. The error names the spelling that YAML reads as the number, checked by reading it back."""
    path = tmp_path / "params.yaml"
    path.write_text(f"train:\n  lr: {text}\n")
    if written is None:  # already a float to YAML
        assert config.load(path).train.lr == float(text)
        return
    with pytest.raises(FasttrainError) as e:
        config.load(path)
    assert str(e.value) == f"params train.lr must be a number, got '{text}' (YAML reads {text} as a string: write {written})"
    path.write_text(f"train:\n  lr: {written}\n")
    assert config.load(path).train.lr == float(text)


def test_load_reports_missing_and_malformed_files(tmp_path):
    with pytest.raises(FasttrainError, match="params file not found"):
        config.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(FasttrainError, match="not valid YAML"):
        config.load(bad)


def test_config_hash_is_stable_and_sensitive():
    a = config.to_dict(config.Params())
    b = yaml.safe_load(yaml.safe_dump(a))
    assert config.config_hash(a) == config.config_hash(b)
    b["train"]["lr"] = 2e-4
    assert config.config_hash(a) != config.config_hash(b)


def test_the_fast_recipe_is_valid_params_that_train_accepts():
    """recipes/fast.yaml laid over params.yaml as `make fast` lays it (scripts/overlay.py: each section
    updated key by key): every key known, every value valid, and the train checks (space_to_depth and
    fused pools on AlexNet, progressive epochs fewer than epochs, the sizes AlexNet takes) pass
    before any run."""
    from fasttrain.train import check_train

    raw = yaml.safe_load(open("params.yaml"))
    recipe = yaml.safe_load(open("recipes/fast.yaml"))
    for section, values in recipe.items():
        raw[section].update(values)
    p = config.from_dict(raw)
    assert (p.data.loader, p.train.batch_size, p.train.compile) == ("gpu", 512, True)
    assert (p.train.space_to_depth, p.train.fused_max_pool) == (True, True)
    assert 0 < p.train.progressive_epochs < p.train.epochs
    check_train(p, world_size=1)


def test_the_run_section_changes_no_checkpoints_key_and_a_result_key_does():
    """A checkpoint resumes across a change of how the run is watched, checkpointed or restarted, and
    is refused across a change of what it computes (config_hash of train.resolved_config)."""
    from fasttrain.train import resolved_config

    def digest(raw):
        return config.config_hash(resolved_config(config.from_dict(raw), "single", "fp32", 1))

    base = digest({})
    assert digest({"run": {"log_every_steps": 1, "checkpoint_every": 1, "max_restarts": 3}}) == base
    assert digest({"train": {"lr": 3e-4}}) != base
    assert "run" not in resolved_config(config.from_dict({}), "single", "fp32", 1)


@pytest.mark.parametrize("key", sorted(config.REMOVED))
def test_a_switch_that_was_removed_says_why_and_where_its_evidence_is(key):
    section, name = key.split(".")
    with pytest.raises(FasttrainError, match=rf"^params key '{key}' was removed: .* \(docs/[a-z-]+\.md\); delete it$"):
        config.from_dict({section: {name: True}})
    doc = config.REMOVED[key].rsplit("(", 1)[1].rstrip(")")
    assert (Path(__file__).parents[2] / doc).is_file(), doc


def test_a_key_that_moved_to_the_run_section_says_where():
    with pytest.raises(FasttrainError, match=r"^params key 'train.log_every_steps' is now 'run.log_every_steps'"):
        config.from_dict({"train": {"log_every_steps": 5}})
