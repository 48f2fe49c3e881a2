#!/usr/bin/python3
"""Writes tokenizers and their encodings of a real corpus, for tests/text/tokenizer_test.cpp.

OUT/corpus.txt   lines of real text: the Debian changelogs and licenses of this machine (every
                 line with a character outside ASCII, the rest sampled evenly), then lines made
                 to be hard (accents and combining marks, CJK, Turkish dotted I, emoji, every
                 kind of whitespace and control character, added tokens against words and
                 spaces, long words, long runs of digits), one per line (only '\\n' ends one).
OUT/<name>/tokenizer.json   a tokenizer trained on the corpus with Hugging Face's tokenizers
                 and written by transformers' save_pretrained:
    bert_uncased   BertWordPieceTokenizer's pipeline: BertNormalizer (lower case, accents
                   stripped), BertPreTokenizer, WordPiece, BertProcessing
    bert_cased     the same cased (no accent stripping) with TemplateProcessing as
                   bert-base-cased has, and added tokens: a normalized one of two words, one
                   single_word, one rstrip
    roberta        byte-level BPE as roberta-base: ByteLevel (no prefix space),
                   RobertaProcessing, <mask> with lstrip
    gpt2_prefix    byte-level BPE with add_prefix_space and NFD + Lowercase + StripAccents,
                   TemplateProcessing
OUT/<name>/expected-<L>.txt  for L in 0 (no truncation) and 24: for each line i, its encoding
                 (every third line i as a pair with line i + 1), as
                 "ids|type_ids|special_tokens_mask" of space-separated numbers. transformers'
                 tokenizer (truncation=True, max_length=L) and tokenizers' encode give the same;
                 this script checks that before it writes.

OUT/bert_uncased_model, OUT/roberta_model  transformers models of those tokenizers' vocabularies
                 and their logits on the first 16 samples of texts.csv (tests/text/hf_text_models.py).

OUT/t5, OUT/albert, OUT/deberta  SentencePiece models with transformers' tokenizer_config.json,
                 and their expected-<L>.txt likewise (tests/text/hf_sentencepiece.py).

OUT/texts.csv, OUT/texts.jsonl  48 samples (text, text_b, label) of the corpus, real and hard
                 lines, as Python's csv module (QUOTE_MINIMAL, "\r\n") and json.dumps write them;
                 labels "neg", "neutral", "pos" in turn (in the JSON Lines file, their indices
                 0, 1, 2 in sorted order).
OUT/<name>/batch-<pair>.txt  for bert_cased, roberta, albert and t5, transformers' tokenizer on the first 16
                 samples (pair 0: text alone, 1: with text_b), padding="longest",
                 truncation=True, max_length=24: per sample "ids|attention_mask|token_type_ids".

`encode DIR` (for tests/text/apt_corpus_test.cpp): the texts of DIR/test.csv (as
scripts/apt_corpus.py writes it) one per line into DIR/texts.txt, and their ids by
DIR/tokenizer.json (tokenizers' encode, no truncation) into DIR/expected.txt.

Usage: VENV/bin/python tests/text/hf_tokenizers.py OUT | encode DIR   (VENV from tests/hf/hf_venv.sh)
"""
import csv
import glob
import gzip
import json
import os
import random
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast
from transformers.utils import logging

import hf_sentencepiece
import hf_text_models

REAL_LINES = 12000
MAX_LENGTHS = (0, 24)


def real_lines():
    seen, lines = set(), []
    files = sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz")) + sorted(glob.glob("/usr/share/common-licenses/*"))
    for path in files:
        try:
            raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for line in text.split("\n"):
            line = line.strip("\r")
            if line.strip() and line not in seen:
                seen.add(line)
                lines.append(line)
    wide = [l for l in lines if any(ord(c) > 127 for c in l)]
    ascii_ = [l for l in lines if l not in set(wide)]
    want = max(0, REAL_LINES - len(wide))
    step = max(1, len(ascii_) // want) if want else len(ascii_) + 1
    picked = wide + ascii_[::step][:want]
    if len(picked) < 10000:
        sys.exit("hf_tokenizers.py: only %d distinct lines of changelogs and licenses here; 10000 needed" % len(picked))
    return picked


def hard_lines():
    rng = random.Random(33)
    pieces = ["café", "naïve", "Ångström", "e\u0301", "a\u0308\u0323", "İstanbul", "ΣΊΣΥΦΟΣ", "straße", "東京大学",
              "한국어", "日本語テキスト", "😀👍🏽", "ﬁne", "Ⅻ", "①②", "x\u200bz", "\u00ad", "\ufeffbom", "\ufffd", "\x00",
              "\x07", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u3000", "\u00a0", "\t", "  ", "'s", "'ll", "don't",
              "[CLS]", "[SEP]", "[MASK]", "<mask>", "<s>", "</s>", " <mask> ", "hello world", "Hello World",
              "debian", "debianutils", "debian-policy", "[SPECIAL]", "[SPECIAL]   x", "1234567890" * 5,
              "a" * 120, "supercalifragilisticexpialidocious", "--", "...", "#!/bin/sh", "$HOME", "C++17",
              "\U00011938", "\U0001F9D1\u200d\U0001F4BB", "ǅ", "ﬀ", "Ⓐ", "\u0345", "ℌ", "٣٤٥", "a\u0600b"]
    out = []
    for _ in range(1500):
        n = rng.randint(1, 8)
        out.append("".join(rng.choice(pieces) + rng.choice(["", " ", "", "-"]) for _ in range(n)))
    for c in range(0x80, 0x3000, 7):  # a walk through the first planes
        out.append("x" + chr(c) + "y " + chr(c))
    return [l for l in out if "\n" not in l and "\r" not in l]


def train(kind, corpus):
    if kind.startswith("bert"):
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=kind == "bert_uncased")
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        trainer = trainers.WordPieceTrainer(vocab_size=4000, special_tokens=specials)
        tok.train_from_iterator(corpus, trainer)
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        if kind == "bert_uncased":
            tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
        else:
            tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                               pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                               special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
            tok.add_tokens([AddedToken("hello world", normalized=True), AddedToken("debian", single_word=True),
                            AddedToken("[SPECIAL]", rstrip=True, normalized=False)])
        tok.decoder = decoders.WordPiece()
        return tok, dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                         mask_token="[MASK]")
    prefix = kind == "gpt2_prefix"
    tok = Tokenizer(models.BPE())
    if prefix:
        tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(), normalizers.StripAccents()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
    cls, sep = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    if prefix:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
                                                           special_tokens=[("<s>", cls), ("</s>", sep)])
    else:
        tok.post_processor = processors.RobertaProcessing(("</s>", sep), ("<s>", cls), add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok, dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
                     cls_token="<s>", sep_token="</s>")


def line(ids, types, special):
    return " ".join(map(str, ids)) + "|" + " ".join(map(str, types)) + "|" + " ".join(map(str, special))


def encode(d):
    with open(os.path.join(d, "test.csv"), encoding="utf-8", newline="") as f:
        texts = [row["text"] for row in csv.DictReader(f)]
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "texts.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(t + "\n" for t in texts))
    with open(os.path.join(d, "expected.txt"), "w") as f:
        f.write("".join(" ".join(map(str, tok.encode(t).ids)) + "\n" for t in texts))


def main():
    if sys.argv[1] == "encode":
        encode(sys.argv[2])
        return
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    corpus = real_lines() + hard_lines()
    with open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(corpus) + "\n")
    for kind in ("bert_uncased", "bert_cased", "roberta", "gpt2_prefix"):
        tok, specials = train(kind, corpus[:REAL_LINES])
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, **specials)
        d = os.path.join(out, kind)
        fast.save_pretrained(d)
        fast = PreTrainedTokenizerFast.from_pretrained(d)
        back = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        for max_length in MAX_LENGTHS:
            rows = []
            if max_length:
                back.enable_truncation(max_length)
            else:
                back.no_truncation()
            for i, text in enumerate(corpus):
                pair = corpus[i + 1] if i % 3 == 0 and i + 1 < len(corpus) else None
                e = back.encode(text, pair)
                kwargs = dict(truncation=True, max_length=max_length) if max_length else {}
                h = fast(text, pair, return_special_tokens_mask=True, return_token_type_ids=True, **kwargs)
                if h["input_ids"] != e.ids or h["token_type_ids"] != e.type_ids or h["special_tokens_mask"] != e.special_tokens_mask:
                    sys.exit("%s: transformers and tokenizers disagree on line %d: %r" % (kind, i, text))
                rows.append(line(e.ids, e.type_ids, e.special_tokens_mask))
            with open(os.path.join(d, "expected-%d.txt" % max_length), "w") as f:
                f.write("\n".join(rows) + "\n")
    logging.set_verbosity_error()  # the slow tokenizers warn on every pair they truncate
    hf_sentencepiece.write(out, corpus, REAL_LINES, MAX_LENGTHS, line)
    # Samples for the dataset "text": real lines and hard ones, none blank.
    picked = [l for l in corpus[:200] + corpus[REAL_LINES:REAL_LINES + 200] if l.strip()]
    texts = picked[0:96:4][:24] + picked[-96::4][:24]
    pairs = picked[1:97:4][:24] + picked[-95::4][:24]
    names = ["neg", "neutral", "pos"]
    with open(os.path.join(out, "texts.csv"), "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "text_b", "label"])
        for i, (a, b) in enumerate(zip(texts, pairs)):
            w.writerow([a, b, names[i % 3]])
    with open(os.path.join(out, "texts.jsonl"), "w", encoding="utf-8") as f:
        for i, (a, b) in enumerate(zip(texts, pairs)):
            f.write(json.dumps({"text": a, "text_b": b, "label": i % 3}) + "\n")
    for kind in ("bert_cased", "roberta", "albert", "t5"):
        d = os.path.join(out, kind)
        tok = hf_sentencepiece.load(kind, d) if kind in hf_sentencepiece.KINDS else PreTrainedTokenizerFast.from_pretrained(d)
        for pair in (0, 1):
            h = tok(texts[:16], pairs[:16] if pair else None, padding="longest", truncation=True, max_length=24,
                    return_token_type_ids=True)
            with open(os.path.join(out, kind, "batch-%d.txt" % pair), "w") as f:
                for ids, mask, types in zip(h["input_ids"], h["attention_mask"], h["token_type_ids"]):
                    f.write(line(ids, mask, types) + "\n")
    hf_text_models.write(out, texts[:16], pairs[:16])
    print("wrote", out, len(corpus), "lines")


if __name__ == "__main__":
    main()
