"""dvc/fast-dvc.jsonl from dvc/fast-experiments.json (`dvc exp show --json`): one row per `make fast` experiment,
its single-bf16 train and evaluate metrics and the recipe's params.  python3 extract.py > dvc/fast-dvc.jsonl"""
import json

KEYS = ("seed", "epochs", "train_seconds", "compile_seconds", "wall_seconds", "first_epoch_seconds",
        "epoch_seconds", "images_per_second", "peak_memory_mb", "device", "torch_version")
PARAMS = ("batch_size", "lr", "adam_beta2", "epochs", "progressive_epochs", "progressive_size",
          "pad_channels", "compile", "scheduler")
for baseline in json.load(open("dvc/fast-experiments.json")):
    for exp in baseline.get("experiments") or []:
        for rev in exp["revs"]:
            data = rev["data"]
            train = data["metrics"]["metrics/train/single-bf16.json"]["data"]
            test = data["metrics"]["metrics/eval/single-bf16.json"]["data"]
            p = data["params"]["params.yaml"]["data"]
            row = {"experiment": rev["name"], **{k: train[k] for k in KEYS},
                   "test_accuracy": test["test_accuracy"], "final_train_loss": train["final_train_loss"],
                   "params": {**{k: p["train"][k] for k in PARAMS}, "augment": p["data"]["augment"],
                              "flip_tta": p["evaluate"]["flip_tta"]}}
            print(json.dumps(row))
