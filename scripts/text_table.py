#!/usr/bin/env python3
"""Prints the table of the text experiment (docs/text-models.md) from its run directories:
test accuracy (masked tokens for the pre-training), top-5 accuracy and macro-F1, trainable
parameters, step time, peak memory and wall time, read as scripts/transfer_table.py reads them.

    python3 scripts/text_table.py [runs/text]

Standard library only.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transfer_table import RunError, ms, read_run  # noqa: E402

ROWS = [  # (run directory, what it is)
    ("pretrain", "pre-training, masked language modelling (accuracy: of the hidden tokens)"),
    ("scratch", "from scratch (`text_classification.toml`)"),
    ("probe", "linear probe of the pre-trained encoder (cached features)"),
    ("lora", "LoRA of the pre-trained encoder, query and value, rank 8 (`lora_bert.toml`)"),
    ("finetune", "full fine-tuning of the pre-trained encoder"),
]


def last(d, name):
    value = None
    for line in (d / "metrics.jsonl").read_text().splitlines():
        point = json.loads(line)
        if point["name"] == name:
            value = point["value"]
    return value


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/text")
    print("| run | test accuracy | top-5 (pre-training: perplexity) | macro-F1 | trainable parameters | step time "
          "| peak memory while training (above its start) | run time |")
    print("|---|---|---|---|---|---|---|---|")
    failed = False
    for d, what in ROWS:
        path = root / d
        if not path.exists():
            continue
        try:
            r = read_run(path)
            top5, f1, ppl = last(path, "eval/top5_accuracy"), last(path, "eval/macro_f1"), last(path, "eval/perplexity")
        except (RunError, OSError, ValueError, KeyError, AttributeError, IndexError) as e:
            print(f"text_table: {e}", file=sys.stderr)
            failed = True
            continue
        total, trainable = r["params"]
        share = f" ({100.0 * trainable / total:.3g} %)" if trainable < total else ""
        extra = f"perplexity {ppl:.1f}" if ppl is not None else (f"{100.0 * top5:.1f} %" if top5 is not None else "")
        print(f"| {what} | {100.0 * r['acc']:.1f} % | {extra} | {f'{f1:.3f}' if f1 is not None else ''} "
              f"| {trainable:,}{share} | {ms(r['step_ms'])} ms | {r['peak'][0]:.0f} MiB ({r['peak'][1]:.0f} MiB) "
              f"| {r['wall']:.0f} s |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
