"""SentencePiece tokenizers for tests/text/tokenizer_test.cpp, written by hf_tokenizers.py.

For each kind, a SentencePiece model trained on the corpus with the sentencepiece library, given
to transformers' tokenizer class of that kind and written by its save_pretrained (the model file
and tokenizer_config.json):
    t5       T5Tokenizer (legacy), unigram model as t5-base's spiece.model: <pad> 0, </s> 1,
             <unk> 2, and the 100 <extra_id_N> added tokens after the vocabulary
    albert   AlbertTokenizer: unigram, <pad> 0, <unk> 1, [CLS] 2, [SEP] 3, [MASK] 4 as
             albert-base-v2's, lower case, accents removed, the digit-comma split
    deberta  DebertaV2Tokenizer: a BPE model as deberta-v3's spm.model: [PAD] 0, [CLS] 1,
             [SEP] 2, [UNK] 3, [MASK] added after the vocabulary
OUT/<kind>/expected-<L>.txt as for the tokenizer.json kinds, from the Python tokenizer
(truncation=True, max_length=L when L > 0). T5Tokenizer adds no </s> to a text whose ids end
with one but still counts it in its type ids and special-token mask, which are then one longer
than the ids: those two fields are "-" on such lines (the ids are compared).
"""
import io
import os

import sentencepiece as spm
from transformers import AlbertTokenizer, DebertaV2Tokenizer, T5Tokenizer

KINDS = ("t5", "albert", "deberta")


def train(kind, corpus):
    model = io.BytesIO()
    common = dict(sentence_iterator=iter(corpus), model_writer=model, vocab_size=4000, num_threads=2,
                  character_coverage=0.9995, bos_id=-1, minloglevel=2)
    if kind == "t5":
        spm.SentencePieceTrainer.train(model_type="unigram", pad_id=0, eos_id=1, unk_id=2, **common)
    elif kind == "albert":
        spm.SentencePieceTrainer.train(model_type="unigram", pad_id=0, unk_id=1, eos_id=-1,
                                       control_symbols=["[CLS]", "[SEP]", "[MASK]"], **common)
    else:
        spm.SentencePieceTrainer.train(model_type="bpe", pad_id=0, pad_piece="[PAD]", unk_id=3, unk_piece="[UNK]", eos_id=-1,
                                       control_symbols=["[CLS]", "[SEP]"], **common)
    return model.getvalue()


CLASSES = {"t5": T5Tokenizer, "albert": AlbertTokenizer, "deberta": DebertaV2Tokenizer}


def load(kind, d):
    """transformers' tokenizer of that kind, as save_pretrained wrote it into d."""
    return CLASSES[kind].from_pretrained(d)


def write(out, corpus, real_lines, max_lengths, line):
    for kind in KINDS:
        d = os.path.join(out, kind)
        os.makedirs(d, exist_ok=True)
        model_file = os.path.join(out, kind + ".model")
        with open(model_file, "wb") as f:
            f.write(train(kind, corpus[:real_lines]))
        kwargs = dict(legacy=True) if kind == "t5" else {}
        CLASSES[kind](model_file, **kwargs).save_pretrained(d)
        os.remove(model_file)
        tok = load(kind, d)
        for max_length in max_lengths:
            rows = []
            for i, text in enumerate(corpus):
                pair = corpus[i + 1] if i % 3 == 0 and i + 1 < len(corpus) else None
                kw = dict(truncation=True, max_length=max_length) if max_length else {}
                h = tok(text, pair, return_special_tokens_mask=True, return_token_type_ids=True, **kw)
                ids, types, special = h["input_ids"], h["token_type_ids"], h["special_tokens_mask"]
                if len(types) != len(ids) or len(special) != len(ids):
                    if kind != "t5" or ids[-1] != tok.eos_token_id:
                        raise SystemExit("%s: line %d: type ids or mask of another length than the ids" % (kind, i))
                    rows.append(" ".join(map(str, ids)) + "|-|-")
                else:
                    rows.append(line(ids, types, special))
            with open(os.path.join(d, "expected-%d.txt" % max_length), "w") as f:
                f.write("\n".join(rows) + "\n")
