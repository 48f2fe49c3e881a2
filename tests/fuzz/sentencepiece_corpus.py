#!/usr/bin/env python3
"""Writes the seed corpus of the SentencePiece fuzz target (tests/fuzz/sentencepiece_fuzz.cpp):
small SentencePiece models trained by the sentencepiece package (the version pinned in
tests/hf/hf_venv.sh), each with a tokenizer_config.json of a class transformers 4.39 writes
(T5Tokenizer, AlbertTokenizer, DebertaV2Tokenizer). A seed is the config's length (2 bytes,
little-endian), the config, then the model's bytes; each under 8 KB.

Usage: build/tests/hf-venv/bin/python tests/fuzz/sentencepiece_corpus.py tests/fuzz/corpus_sentencepiece
"""
import io
import json
import os
import struct
import sys
import tempfile

import sentencepiece as spm

TEXT = """The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
A library for reading, writing and converting files: 1,234 of them, 5,6 and 7.
Überprüfung der Straße; café, naïve, résumé. ``Quoted'' text and ''more''.
Tokenizers split words into pieces; pieces into ids; ids into embeddings.
东京 and 北京 are cities. Ｆｕｌｌｗｉｄｔｈ letters and ① circled digits.
""".splitlines()


def train(**options):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT * 4), model_writer=model, hard_vocab_limit=False,
                                   character_coverage=1.0, minloglevel=2, num_threads=1, **options)
    return model.getvalue()


def token(content, special=True, **flags):
    entry = {"content": content, "lstrip": False, "normalized": not special, "rstrip": False, "single_word": False,
             "special": special}
    entry.update(flags)
    return entry


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)

    def seed(name, config, model):
        text = json.dumps(config, indent=2, ensure_ascii=False).encode()
        data = struct.pack("<H", len(text)) + text + model
        assert len(data) < 8192, (name, len(data))
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)

    # T5: a unigram model without normalization tables, pad/eos/unk at 0/1/2 and sentinels added
    # after the pieces.
    t5 = train(vocab_size=100, model_type="unigram", normalization_rule_name="identity", pad_id=0, eos_id=1, unk_id=2,
               bos_id=-1)
    pieces = spm.SentencePieceProcessor(model_proto=t5).get_piece_size()
    seed("t5_unigram_identity", {
        "tokenizer_class": "T5Tokenizer", "legacy": True, "extra_ids": 2, "eos_token": "</s>", "pad_token": "<pad>",
        "unk_token": "<unk>", "additional_special_tokens": ["<extra_id_0>", "<extra_id_1>"],
        "added_tokens_decoder": {"0": token("<pad>"), "1": token("</s>"), "2": token("<unk>"),
                                 str(pieces): token("<extra_id_1>"), str(pieces + 1): token("<extra_id_0>")},
    }, t5)

    # ALBERT: normalization tables of a few rules (a precompiled charsmap: a Darts trie and the
    # replacements), lower case, [CLS]/[SEP]/[MASK] as user-defined pieces.
    # The model keeps the rules' path: a fixed relative one keeps the seed the same on every machine.
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as rules_dir:
        os.chdir(rules_dir)
        try:
            with open("rules.tsv", "w") as rules:
                rules.write("41\t61\n42\t62\nFF26\t46\n2460\t31\n")  # A->a, B->b, fullwidth F->F, circled 1->1
            albert = train(vocab_size=110, model_type="unigram", normalization_rule_tsv="rules.tsv", pad_id=0,
                           unk_id=1, bos_id=2, eos_id=3, user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"])
        finally:
            os.chdir(here)
    sp = spm.SentencePieceProcessor(model_proto=albert)
    ids = {p: sp.piece_to_id(p) for p in ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]}
    seed("albert_unigram_rules", {
        "tokenizer_class": "AlbertTokenizer", "do_lower_case": True, "remove_space": True, "keep_accents": False,
        "bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "<unk>", "sep_token": "[SEP]", "pad_token": "<pad>",
        "cls_token": "[CLS]", "mask_token": "[MASK]",
        "added_tokens_decoder": {str(ids["<pad>"]): token("<pad>"), str(ids["<unk>"]): token("<unk>"),
                                 str(ids["[CLS]"]): token("[CLS]"), str(ids["[SEP]"]): token("[SEP]"),
                                 str(ids["[MASK]"]): token("[MASK]", lstrip=True)},
    }, albert)

    # DeBERTa-v2: a BPE model with byte fallback, an added token that is not special (matched
    # after lower-casing, a single word) beside the special ones.
    deberta = train(vocab_size=340, model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
                    pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]",
                    unk_piece="[UNK]", user_defined_symbols=["[MASK]"])
    sp = spm.SentencePieceProcessor(model_proto=deberta)
    pieces = sp.get_piece_size()
    seed("deberta_bpe_byte_fallback", {
        "tokenizer_class": "DebertaV2Tokenizer", "do_lower_case": True, "split_by_punct": False,
        "bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
        "cls_token": "[CLS]", "mask_token": "[MASK]",
        "added_tokens_decoder": {"0": token("[PAD]"), "1": token("[CLS]"), "2": token("[SEP]"), "3": token("[UNK]"),
                                 str(sp.piece_to_id("[MASK]")): token("[MASK]"),
                                 str(pieces): token("fox", special=False, single_word=True)},
    }, deberta)


if __name__ == "__main__":
    main()
