#!/usr/bin/python3
"""trainer's model "bert" against Python transformers' BertForSequenceClassification, side by
side on this machine: the tokens/s of a training step, and loading a 110 M-parameter model.

Step: the same model directory (random weights written by save_pretrained), the same package
descriptions (data/apt, scripts/apt_corpus.py) tokenized by the same tokenizer.json and padded
to max_length (one shape every step), AdamW (lr 5e-4, weight decay 0.01), dropout on, in float32
and in bfloat16 autocast. trainer: `trainer bench` (its median step); Python: the loop a user
writes (forward with labels, backward, step, zero_grad(set_to_none=True)), the median of its
steps, with the same number of threads. Python runs twice: as users run it, and with the malloc
settings trainer makes at start (runtime.tune_malloc), so the difference is told apart.
    small: the recipe's encoder (hidden 128, 2 layers, 4 heads, FFN 512), batch 64 x 64 tokens
    base:  BERT-base (hidden 768, 12 layers, 12 heads, FFN 3072), batch 8 x 128 tokens

Load: BERT-base's directory into a float32 and a bfloat16 model, each in a fresh process:
trainer's bert_load_bench (build_model, as model.path loads it) against from_pretrained (with
torch_dtype for bf16), the time and how far resident memory rises (VmHWM after minus VmRSS
before, the peak reset first); the median of three processes each.

  build/tests/hf-venv/bin/python bench/text/bert_vs_transformers.py [--sizes small,base]
      [--precisions fp32,bf16] [--no-load] [--build build]
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"}
SIZES = {
    "small": dict(config=dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                              max_position_embeddings=64), batch=64, length=64, steps=20, warmup=3),
    "base": dict(config=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                             max_position_embeddings=512), batch=8, length=128, steps=6, warmup=2),
}


def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return float(line.split()[1])
    return 0.0


def worker_step(args):
    """One Python run: prints the median step time in ms."""
    import torch
    from transformers import BertForSequenceClassification, PreTrainedTokenizerFast

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with open(args.data, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    labels = sorted({r["label"] for r in rows})
    tok = PreTrainedTokenizerFast(tokenizer_file=args.tokenizer, pad_token="[PAD]")
    n = args.batch * (args.steps + args.warmup)
    enc = tok([r["text"] for r in rows[:n]], padding="max_length", truncation=True, max_length=args.length,
              return_tensors="pt")
    y = torch.tensor([labels.index(r["label"]) for r in rows[:n]])
    model = BertForSequenceClassification.from_pretrained(args.model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)
    times = []
    for i in range(args.steps + args.warmup):
        s = slice(i * args.batch, (i + 1) * args.batch)
        batch = {k: v[s] for k, v in enc.items()}
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(**batch, labels=y[s]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    print(json.dumps({"step_ms": statistics.median(times) * 1000}))


def worker_load(args):
    """from_pretrained in a fresh process: prints its time and the rise of resident memory."""
    import torch
    from transformers import BertForSequenceClassification

    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    before, anon_before = status_kb("VmRSS"), status_kb("RssAnon")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    if status_kb("VmHWM") - status_kb("VmRSS") >= 1024:
        sys.exit("/proc/self/clear_refs does not reset VmHWM here")
    start = time.perf_counter()
    model = BertForSequenceClassification.from_pretrained(args.model, torch_dtype=dtype)
    seconds = time.perf_counter() - start
    rise = (status_kb("VmHWM") - before) / 1024
    anon = (status_kb("RssAnon") - anon_before) / 1024
    mib = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers())) / 2**20
    print(json.dumps({"load_ms": seconds * 1000, "rss_rise_MiB": rise, "anon_MiB": anon, "model_MiB": mib}))


def write_model(size, d, num_labels, vocab):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab, num_labels=num_labels, **SIZES[size]["config"])
    BertForSequenceClassification(config).save_pretrained(d)  # model.safetensors


def trainer_step(args, size, precision, model_dir, data, tmp):
    s = SIZES[size]
    plugins = '["console", "mixed_precision"]' if precision == "bf16" else '["console"]'
    recipe = os.path.join(tmp, "recipe_%s_%s.toml" % (size, precision))
    with open(recipe, "w") as f:
        f.write(f"""[run]
name = "bert_vs_transformers"
seed = 0
dir = "{tmp}/runs"
[model]
name = "bert"
path = "{model_dir}"
trim_padding = false
[dataset]
name = "text"
train = "{data}"
tokenizer = "{args.tokenizer}"
max_length = {s["length"]}
padding = "max_length"
[training]
epochs = 1
batch_size = {s["batch"]}
[eval]
every_epochs = 0
at_end = false
[optim]
name = "adamw"
lr = 0.0005
weight_decay = 0.01
[runtime]
num_threads = {args.threads}
[plugins]
load = {plugins}
""" + ('[plugins.mixed_precision]\nprecision = "bf16"\n' if precision == "bf16" else ""))
    out = os.path.join(tmp, "bench.csv")
    run = subprocess.run([os.path.join(args.build, "core/cli/trainer"), "bench", "--recipe", recipe, "--grid",
                          "training.batch_size=%d" % s["batch"], "--steps", str(s["steps"]), "--warmup",
                          str(s["warmup"]), "--no-estimate", "--csv", out], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("trainer bench failed (%d):\n%s" % (run.returncode, run.stdout[-2000:] + run.stderr[-2000:]))
    with open(out) as f:
        row = next(csv.DictReader(f))
    if row["status"] != "ok":
        sys.exit("trainer bench: %s" % row)
    return float(row["step_ms_median"])


def python_step(args, size, precision, model_dir, data, tuned):
    s = SIZES[size]
    env = dict(os.environ, **(MALLOC if tuned else {}))
    return json.loads(worker([sys.executable, __file__, "--worker", "step", "--model", model_dir, "--data", data,
                              "--tokenizer", args.tokenizer, "--precision", precision, "--threads",
                              str(args.threads), "--batch", str(s["batch"]), "--length", str(s["length"]),
                              "--steps", str(s["steps"]), "--warmup", str(s["warmup"])], env))["step_ms"]


def worker(cmd, env=None):
    """The last line of a worker's output; its error output when it fails."""
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("%s failed (%d):\n%s" % (os.path.basename(cmd[0]), out.returncode, out.stderr[-3000:]))
    return out.stdout.strip().splitlines()[-1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="small,base")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--no-load", action="store_true")
    p.add_argument("--no-steps", action="store_true", help="only the load")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--tokenizer", default=os.path.join(ROOT, "data/apt/tokenizer.json"))
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--worker")
    for k in ("model", "data", "precision"):
        p.add_argument("--" + k)
    for k in ("batch", "length", "steps", "warmup"):
        p.add_argument("--" + k, type=int)
    args = p.parse_args()
    if args.worker == "step":
        return worker_step(args)
    if args.worker == "load":
        return worker_load(args)
    for k, allowed in (("sizes", SIZES), ("precisions", ("fp32", "bf16"))):
        for v in getattr(args, k).split(","):
            if v not in allowed:
                p.error("--%s: %r is not one of %s" % (k, v, ", ".join(allowed)))

    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(args.tokenizer).get_vocab_size()
    with tempfile.TemporaryDirectory() as tmp:
        # The first descriptions of the training split, enough for every step.
        data = os.path.join(tmp, "train.csv")
        with open(os.path.join(ROOT, "data/apt/train.csv"), encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))[:2048]
        with open(data, "w", encoding="utf-8", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
        labels = len({r["label"] for r in rows})
        print("size   precision  tokens/step  trainer ms  Python ms  Python ms (tuned malloc)  "
              "trainer tokens/s  ratio  ratio (tuned)")
        for size in args.sizes.split(","):
            d = os.path.join(tmp, size)
            write_model(size, d, labels, max(vocab, 30522) if size == "base" else vocab)
            tokens = SIZES[size]["batch"] * SIZES[size]["length"]
            for precision in ([] if args.no_steps else args.precisions.split(",")):
                t = trainer_step(args, size, precision, d, data, tmp)
                py = python_step(args, size, precision, d, data, False)
                tuned = python_step(args, size, precision, d, data, True)
                print("%-6s %-10s %11d %11.1f %10.1f %25.1f %17.0f %6.2f %14.2f" %
                      (size, precision, tokens, t, py, tuned, tokens / t * 1000, py / t, tuned / t), flush=True)
        if args.no_load or "base" not in args.sizes.split(","):
            return
        d = os.path.join(tmp, "base")
        print("\nload of BERT-base (%s): ms, peak resident rise MiB, anonymous memory after MiB\n"
              "into      trainer ms  rise  anon   from_pretrained ms  rise  anon   model MiB" % d)
        for precision in args.precisions.split(","):
            trainer_runs, python_runs = [], []
            for _ in range(3):  # each in a fresh process; the median of three
                out = subprocess.run([os.path.join(args.build, "bench/bert_load_bench"), "--benchmark_format=json",
                                      "--benchmark_filter=BM_BertLoad/bf16:%d" % (precision == "bf16")],
                                     env=dict(os.environ, TRAINER_BERT_DIR=d), check=True, capture_output=True,
                                     text=True)
                trainer_runs.append(json.loads(out.stdout)["benchmarks"][0])
                python_runs.append(json.loads(worker([sys.executable, __file__, "--worker", "load", "--model", d,
                                                      "--precision", precision, "--threads", str(args.threads)])))
            med = lambda runs, k: statistics.median(r[k] for r in runs)  # noqa: E731
            print("%-9s %10.0f %5.0f %5.0f %20.0f %5.0f %5.0f %11.0f" %
                  (precision, med(trainer_runs, "real_time"), med(trainer_runs, "rss_rise_MiB"),
                   med(trainer_runs, "anon_MiB"), med(python_runs, "load_ms"), med(python_runs, "rss_rise_MiB"),
                   med(python_runs, "anon_MiB"), trainer_runs[0]["model_MiB"]), flush=True)


if __name__ == "__main__":
    main()
