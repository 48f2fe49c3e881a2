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
from transfer_table import cost_cells, read_rows  # noqa: E402

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
    rows, failed = read_rows([root / d for d, _ in ROWS], "text_table",
                             lambda p: (last(p, "eval/top5_accuracy"), last(p, "eval/macro_f1"),
                                        last(p, "eval/perplexity")))
    what = {root / d: w for d, w in ROWS}
    for path, r, (top5, f1, ppl) in rows:
        extra = f"perplexity {ppl:.1f}" if ppl is not None else (f"{100.0 * top5:.1f} %" if top5 is not None else "")
        print(f"| {what[path]} | {100.0 * r['acc']:.1f} % | {extra} | {f'{f1:.3f}' if f1 is not None else ''} "
              f"| {cost_cells(r)} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
