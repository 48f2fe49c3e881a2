"""Writes, beside the tokenizers of hf_tokenizers.py, small random transformers models whose
vocabularies are those tokenizers' (save_pretrained, dropout 0), and their logits on real text,
for tests/data/text_dataset_test.cpp:

OUT/<name>_model/  for bert_uncased (BertForSequenceClassification, 3 labels) and roberta
                   (RobertaForSequenceClassification, 3 labels): config.json, model.safetensors,
                   and io.pt: torch.save of {"input_ids", "logits"} for the first 16 samples of
                   OUT/texts.csv with their text_b, tokenized by OUT/<name> (padding="longest",
                   truncation=True, max_length=40), the logits in eval mode.
"""
import os

import torch
from transformers import (BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast, RobertaConfig,
                          RobertaForSequenceClassification)

SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)


def write(out, texts, pairs):
    for kind in ("bert_uncased", "roberta"):
        tok = PreTrainedTokenizerFast.from_pretrained(os.path.join(out, kind))
        torch.manual_seed(0)
        if kind == "roberta":
            model = RobertaForSequenceClassification(RobertaConfig(
                vocab_size=len(tok), max_position_embeddings=66, pad_token_id=tok.pad_token_id, type_vocab_size=1,
                layer_norm_eps=1e-5, **SIZES))
        else:
            model = BertForSequenceClassification(BertConfig(
                vocab_size=len(tok), max_position_embeddings=64, pad_token_id=tok.pad_token_id, **SIZES))
        d = os.path.join(out, kind + "_model")
        model.save_pretrained(d)
        enc = tok(texts, pairs, padding="longest", truncation=True, max_length=40, return_tensors="pt",
                  return_token_type_ids=True)
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                           token_type_ids=enc["token_type_ids"]).logits
        torch.save({"input_ids": enc["input_ids"], "logits": logits}, os.path.join(d, "io.pt"))
