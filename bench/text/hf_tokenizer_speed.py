#!/usr/bin/python3
"""Hugging Face tokenizers' throughput on the corpus bench/text/tokenizer_bench.cpp encodes:
the same tokenizer.json files and lines, one thread, each line alone and as a pair with the
next, by Tokenizer.encode one line at a time (as trainer encodes) and by encode_batch (the
whole corpus in one call, Rust's loop). Prints the median of 5 runs of each. Then the
SentencePiece models (albert, t5) by transformers' Python tokenizers, median of 3 runs.

  RAYON_NUM_THREADS=1 VENV/bin/python bench/text/hf_tokenizer_speed.py CORPUS_DIR
(VENV from tests/hf/hf_venv.sh; CORPUS_DIR: build/tests/hf_tokenizers)
"""
import os
import statistics
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402


def main():
    d = sys.argv[1]
    with open(os.path.join(d, "corpus.txt"), encoding="utf-8", newline="\n") as f:
        lines = f.read().split("\n")[:-1]
    for name in ("bert_uncased", "roberta"):
        tok = Tokenizer.from_file(os.path.join(d, name, "tokenizer.json"))
        for pairs in (False, True):
            items = [(lines[i], lines[i + 1]) if pairs and i + 1 < len(lines) else lines[i] for i in range(len(lines))]
            for how in ("encode", "encode_batch"):
                times, tokens = [], 0
                for _ in range(5):
                    start = time.perf_counter()
                    if how == "encode":
                        out = [tok.encode(*x) if isinstance(x, tuple) else tok.encode(x) for x in items]
                    else:
                        out = tok.encode_batch(items)
                    times.append(time.perf_counter() - start)
                    tokens = sum(len(e.ids) for e in out)
                t = statistics.median(times)
                print("%-22s %-12s %8.1f ms  %10.0f lines/s  %10.0f tokens/s" %
                      (name + (" pairs" if pairs else ""), how, t * 1000, len(lines) / t, tokens / t))
    # The SentencePiece models, by transformers' Python tokenizers of their class (what reads a
    # spiece.model), one line at a time; single texts.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "text"))
    import hf_sentencepiece  # noqa: E402

    for name in ("albert", "t5"):
        tok = hf_sentencepiece.load(name, os.path.join(d, name))
        times, tokens = [], 0
        for _ in range(3):
            start = time.perf_counter()
            out = [tok(x)["input_ids"] for x in lines]
            times.append(time.perf_counter() - start)
            tokens = sum(len(e) for e in out)
        t = statistics.median(times)
        print("%-22s %-12s %8.1f ms  %10.0f lines/s  %10.0f tokens/s" %
              (name, "transformers", t * 1000, len(lines) / t, tokens / t))


if __name__ == "__main__":
    main()
