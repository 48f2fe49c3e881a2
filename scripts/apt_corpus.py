#!/usr/bin/python3
"""Builds a labelled text corpus from the package lists apt has downloaded: each package's
one-line description, labelled with its section (libs, python, games, ...). Every Debian
machine has it after `apt-get update`; nothing else is needed (Python's standard library).

  scripts/apt_corpus.py OUT_DIR [--packages FILE] [--min-per-class N] [--vocab N]

Reads `apt-cache dumpavail` (every package record of the lists, decompressed by apt), or the
Packages-format FILE. Writes into OUT_DIR:

  train.csv, test.csv   columns package, text, label (Python's csv module). Descriptions are
                        deduplicated: text that several packages share is kept once when they
                        agree on the section (under the first package name), left out when they
                        do not. The split is fixed by the package name: the first byte of its
                        SHA-256 below 26 (about 10 %) is the test split. Sections lose their
                        component ("contrib/net" is "net"); sections with fewer than
                        --min-per-class (default 100) training texts are left out.
  tokenizer.json        a BERT WordPiece tokenizer for them (lower case, accents stripped,
                        [PAD] [UNK] [CLS] [SEP] [MASK], BertProcessing): every character seen
                        as a word start and as a ## continuation, then the --vocab (default
                        8000) most frequent words of the training split.
  corpus.json           the counts: packages read, texts kept, left out and why, per class.
"""
import argparse
import collections
import csv
import hashlib
import json
import os
import subprocess
import sys
import unicodedata

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def records(text):
    """The fields of each record of a Packages-format text."""
    for block in text.split("\n\n"):
        fields = {}
        key = None
        for line in block.split("\n"):
            if not line:
                continue
            if line[0] in " \t":
                if key:
                    fields[key] += "\n" + line
                continue
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        if "Package" in fields:
            yield fields


def words(text):
    """The BERT pre-tokenizer's words of `text` lowercased with accents stripped, close to the
    tokenizer's own normalizer (the vocabulary only has to be a good one, not the same)."""
    text = unicodedata.normalize("NFD", text.lower())
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    out, cur = [], ""
    for c in text:
        if c.isspace():
            if cur:
                out.append(cur)
            cur = ""
        elif unicodedata.category(c).startswith("P") or (c.isascii() and not c.isalnum()):
            if cur:
                out.append(cur)
            out.append(c)
            cur = ""
        else:
            cur += c
    if cur:
        out.append(cur)
    return out


def tokenizer_json(texts, size):
    counts = collections.Counter(w for t in texts for w in words(t))
    chars = sorted({c for w in counts for c in w})
    vocab = list(SPECIALS)
    seen = set(vocab)
    for piece in chars + ["##" + c for c in chars] + [w for w, _ in counts.most_common(size)]:
        if piece not in seen:
            seen.add(piece)
            vocab.append(piece)
    ids = {t: i for i, t in enumerate(vocab)}
    added = [dict(id=i, content=t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
             for i, t in enumerate(SPECIALS)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", ids["[SEP]"]], "cls": ["[CLS]", ids["[CLS]"]]},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": ids},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--packages", help="a Packages-format file instead of apt-cache dumpavail")
    ap.add_argument("--min-per-class", type=int, default=100)
    ap.add_argument("--vocab", type=int, default=8000)
    a = ap.parse_args()
    if a.packages:
        with open(a.packages, encoding="utf-8") as f:
            text = f.read()
    else:
        try:
            text = subprocess.run(["apt-cache", "dumpavail"], check=True, capture_output=True).stdout.decode("utf-8")
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit("apt_corpus.py: apt-cache dumpavail failed (%s); is this Debian?" % e)
    by_text = collections.defaultdict(dict)  # description -> {package: section}
    read = 0
    for r in records(text):
        read += 1
        desc = r.get("Description", "").split("\n")[0].strip()
        section = r.get("Section", "").split("/")[-1].strip()
        if desc and section:
            by_text[desc][r["Package"]] = section
    if read == 0:
        sys.exit("apt_corpus.py: no package records (run apt-get update first, or give --packages)")
    kept, conflicting = [], 0
    for desc, owners in by_text.items():
        if len(set(owners.values())) > 1:
            conflicting += 1
            continue
        package = min(owners)
        kept.append((package, desc, owners[package]))
    kept.sort()
    test = [k for k in kept if hashlib.sha256(k[0].encode()).digest()[0] < 26]
    train = [k for k in kept if hashlib.sha256(k[0].encode()).digest()[0] >= 26]
    per_class = collections.Counter(k[2] for k in train)
    classes = sorted(c for c, n in per_class.items() if n >= a.min_per_class)
    keep = set(classes)
    small = sum(1 for k in kept if k[2] not in keep)
    train = [k for k in train if k[2] in keep]
    test = [k for k in test if k[2] in keep]
    os.makedirs(a.out, exist_ok=True)
    for name, rows in (("train.csv", train), ("test.csv", test)):
        with open(os.path.join(a.out, name), "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(["package", "text", "label"])
            w.writerows(rows)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json([k[1] for k in train], a.vocab), f, ensure_ascii=False)
    summary = dict(packages_read=read, distinct_descriptions=len(by_text), conflicting_sections_left_out=conflicting,
                   small_classes_left_out=small, train=len(train), test=len(test), classes=classes,
                   train_per_class={c: per_class[c] for c in classes})
    with open(os.path.join(a.out, "corpus.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("apt_corpus.py: %d packages, %d texts (%d train, %d test), %d classes -> %s" %
          (read, len(train) + len(test), len(train), len(test), len(classes), a.out))


if __name__ == "__main__":
    main()
