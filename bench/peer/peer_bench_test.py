#!/usr/bin/python3
"""Unit tests of peer_bench.py's parsing and checks (ctest: bench.peer_bench.unit).

Usage: /usr/bin/python3 bench/peer/peer_bench_test.py
"""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_bench  # noqa: E402


def metrics_file(records):
    f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
    for step, name, value, t in records:
        f.write(json.dumps({"step": step, "name": name, "value": value, "time": t}) + "\n")
    f.close()
    return f.name


class TrainerResult(unittest.TestCase):
    def test_windows_with_a_short_last_batch_give_total_samples_over_total_time(self):
        # 1000 samples, batch 128: 8 steps per epoch, the last of 104 samples. Logged every 3
        # steps and at each epoch's end, two epochs, evaluation after each.
        windows = [  # step, train/epoch, samples/s
            (3, 3 / 8, 384 / 2.0), (6, 6 / 8, 384 / 1.0), (8, 1.0, 232 / 0.5),
            (11, 1 + 3 / 8, 384 / 4.0), (14, 1 + 6 / 8, 384 / 1.0), (16, 2.0, 232 / 1.5),
        ]
        records = []
        for step, epoch, rate in windows:
            records += [(step, "train/epoch", epoch, 100.0 + step), (step, "train/samples_per_s", rate, 100.0 + step)]
        records += [(8, "eval/accuracy", 0.85, 120.0), (8, "eval/loss", 0.4, 120.0),
                    (16, "eval/accuracy", 0.91, 150.0), (16, "eval/loss", 0.3, 150.0)]
        path = metrics_file(records)
        try:
            evals, end = peer_bench.trainer_result(path, 128, 1000)
        finally:
            os.unlink(path)
        self.assertEqual(end["train_samples"], 2000)
        self.assertAlmostEqual(end["train_seconds"], 2.0 + 1.0 + 0.5 + 4.0 + 1.0 + 1.5)
        self.assertAlmostEqual(end["samples_per_s"], 2000 / 10.0)
        self.assertEqual([(e["epoch"], e["step"], e["accuracy"], e["time"]) for e in evals],
                         [(1, 8, 0.85, 120.0), (2, 16, 0.91, 150.0)])

    def test_a_zero_rate_is_an_error_not_a_division_by_zero(self):
        path = metrics_file([(1, "train/epoch", 1.0, 1.0), (1, "train/samples_per_s", 0.0, 1.0)])
        try:
            with self.assertRaises(ValueError):
                peer_bench.trainer_result(path, 10, 10)
        finally:
            os.unlink(path)


def default_config():
    return {
        "model": {"name": "cnn", "channels": [32, 64], "hidden": 128, "dropout": 0.25, "batch_norm": True,
                  "dtype": "float32", "weights": ""},
        "dataset": {"name": "fashion_mnist", "limit": 0},
        "optim": {"name": "adamw", "betas": [0.9, 0.999], "eps": 1e-8},
        "sched": {"name": "cosine", "min_lr_ratio": 0.0},
        "training": {"grad_clip_norm": 0.0, "drop_last": False, "shuffle": True, "max_steps": 0,
                     "batch_size": 128, "micro_batch_size": 128},
        "eval": {"every_epochs": 1},
        "runtime": {"device": "cpu", "tune_malloc": True},
        "checkpoint": {"every_epochs": 1, "every_steps": 0, "keep_last": 2},
        "metrics": {"jsonl": True},
        "plugins": {"load": ["console", "mixed_precision"]},
    }


class CheckSameJob(unittest.TestCase):
    def test_the_default_recipe_is_the_job(self):
        self.assertEqual(peer_bench.check_same_job(default_config()), [])
        c = default_config()
        c["training"]["micro_batch_size"] = 0  # 0 means the whole batch
        self.assertEqual(peer_bench.check_same_job(c), [])

    def test_each_difference_is_named(self):
        c = default_config()
        c["model"]["hidden"] = 256
        c["training"]["micro_batch_size"] = 64
        c["plugins"]["load"] = ["console", "oom_backoff"]
        c["runtime"]["tune_malloc"] = False
        wrong = "\n".join(peer_bench.check_same_job(c))
        for what in ("model.hidden = 256", "micro_batch_size", "['oom_backoff']", "lacks mixed_precision",
                     "runtime.tune_malloc = False"):
            self.assertIn(what, wrong)

    def test_the_device_is_the_one_asked_for(self):
        c = default_config()
        c["runtime"]["device"] = "cuda:0"
        self.assertEqual(peer_bench.check_same_job(c, "cuda:0"), [])
        self.assertIn("runtime.device = 'cuda:0'", "\n".join(peer_bench.check_same_job(c)))

    def test_train_size_follows_the_limit(self):
        c = default_config()
        self.assertEqual(peer_bench.train_size(c), 60000)
        c["dataset"]["limit"] = 4096
        self.assertEqual(peer_bench.train_size(c), 4096)
        c["dataset"]["limit"] = 100000
        self.assertEqual(peer_bench.train_size(c), 60000)


class DatasetRoot(unittest.TestCase):
    def test_a_debian_root_moves_under_trainer_datasets_dir_and_others_stay(self):
        old = os.environ.get("TRAINER_DATASETS_DIR")
        try:
            os.environ.pop("TRAINER_DATASETS_DIR", None)
            self.assertEqual(peer_bench.dataset_root("/usr/share/datasets/fashion-mnist"),
                             "/usr/share/datasets/fashion-mnist")
            os.environ["TRAINER_DATASETS_DIR"] = "/tmp/prefix/usr/share/datasets"
            self.assertEqual(peer_bench.dataset_root("/usr/share/datasets/fashion-mnist"),
                             "/tmp/prefix/usr/share/datasets/fashion-mnist")
            self.assertEqual(peer_bench.dataset_root("/data/fashion-mnist"), "/data/fashion-mnist")
            self.assertEqual(peer_bench.dataset_root("/usr/share/datasets-other/x"), "/usr/share/datasets-other/x")
        finally:
            if old is None:
                os.environ.pop("TRAINER_DATASETS_DIR", None)
            else:
                os.environ["TRAINER_DATASETS_DIR"] = old


if __name__ == "__main__":
    unittest.main()
