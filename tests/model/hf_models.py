#!/usr/bin/python3
"""Writes Hugging Face model directories with transformers (save_pretrained), for
tests/model/bert_test.cpp. Small random models (seeded), dropout 0 so that a training step's
gradients are deterministic:

  bert/               BertForSequenceClassification, 3 labels (config.json, model.safetensors)
  bert_bin/           the same model saved with safe_serialization=False (pytorch_model.bin)
  roberta/            RobertaForSequenceClassification, 3 labels
  roberta_model/      RobertaModel (bare names and a pooler) with roberta/'s encoder
  bert_pretraining/   BertForPreTraining (bert.*, cls.predictions.*, cls.seq_relationship.*)
  bert_mlm/           BertForMaskedLM (bert.* without a pooler, cls.predictions.* without the tied decoder)
  roberta_mlm/        RobertaForMaskedLM (roberta.*, lm_head.*)
  bad_deberta/        a config.json of model_type deberta-v2
  bad_missing/        bert/ less one tensor of layer 1
  bad_layers/         bert/'s weights with a config.json of 3 layers
  bad_shape/          bert/ with layer 0's intermediate weight cut to half its rows

and in each good directory io.pt: torch.save of a dict with a batch (input_ids, attention_mask,
token_type_ids [4, 12], right-padded to lengths 12, 9, 5, 3; labels [4]), the logits in eval
mode, and the gradients (name -> tensor) of the mean cross-entropy in train mode; for
bert_pretraining the pooler's output and the masked-LM logits ("mlm_logits") instead of logits
and gradients; for the *_mlm models labels [4, 12] (the token ids at 9 positions, -100
elsewhere), the logits [4, 12, 1000], transformers' masked-LM loss and its gradients. The
masked-LM and pre-training models have their biases and LayerNorms moved off their initial
values (0 and 1), so that a head tensor trainer failed to load would show in the logits.

`check MODEL_DIR IO_DIR OUT`: loads MODEL_DIR (what a run exported) with transformers'
AutoModelForSequenceClassification.from_pretrained (AutoModelForMaskedLM when its config.json
says *ForMaskedLM) and writes its eval-mode logits on IO_DIR's io.pt batch to OUT, one number
per line, row by row.

Usage: VENV/bin/python tests/model/hf_models.py write OUT_DIR | check MODEL_DIR IO_DIR OUT
(VENV from tests/hf/hf_venv.sh)
"""
import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForMaskedLM, AutoModelForSequenceClassification, BertConfig, BertForMaskedLM,
                          BertForPreTraining, BertForSequenceClassification, RobertaConfig, RobertaForMaskedLM,
                          RobertaForSequenceClassification, RobertaModel)

SIZES = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)


def batch(pad, types):
    torch.manual_seed(1)
    ids = torch.randint(5, 1000, (4, 12))
    mask = torch.zeros(4, 12, dtype=torch.long)
    for row, n in enumerate((12, 9, 5, 3)):
        mask[row, :n] = 1
    ids[mask == 0] = pad
    tt = torch.zeros(4, 12, dtype=torch.long)
    if types:
        tt[:, 6:] = 1
        tt[mask == 0] = 0
    return ids, mask, tt, torch.tensor([0, 2, 1, 2])


def perturbed(model):
    """`model` with every bias and LayerNorm parameter moved off its initial 0 or 1: a head tensor
    that failed to load (and kept trainer's initial value) then changes the logits."""
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
                p.add_(0.05 * torch.randn_like(p))
    return model


def mlm_labels(ids):
    """The ids at 9 attended positions (rows of 12, 9, 5, 3 tokens), -100 elsewhere."""
    labels = torch.full_like(ids, -100)
    for row, col in ((0, 0), (0, 5), (0, 11), (1, 2), (1, 8), (2, 1), (2, 3), (2, 4), (3, 1)):
        labels[row, col] = ids[row, col]
    return labels


def write_io(model, out, pad, types, pooled=False, mlm=False):
    ids, mask, tt, labels = batch(pad, types)
    if mlm:
        labels = mlm_labels(ids)
    io = {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt, "labels": labels}
    model.eval()
    with torch.no_grad():
        if pooled:
            io["pooled"] = model.bert(input_ids=ids, attention_mask=mask, token_type_ids=tt).pooler_output
            io["mlm_logits"] = model(input_ids=ids, attention_mask=mask, token_type_ids=tt).prediction_logits
        else:
            io["logits"] = model(input_ids=ids, attention_mask=mask, token_type_ids=tt).logits
    if mlm:
        model.train()
        model.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, token_type_ids=tt, labels=labels).loss
        loss.backward()
        io["loss"] = loss.detach()
        for name, p in model.named_parameters():
            io["grad." + name] = p.grad.clone()
    elif not pooled:
        model.train()
        model.zero_grad()
        loss = F.cross_entropy(model(input_ids=ids, attention_mask=mask, token_type_ids=tt).logits, labels)
        loss.backward()
        io["loss"] = loss.detach()
        for name, p in model.named_parameters():
            io["grad." + name] = p.grad.clone()
    torch.save(io, os.path.join(out, "io.pt"))


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    bert = BertForSequenceClassification(BertConfig(max_position_embeddings=64, **SIZES))
    bert.save_pretrained(os.path.join(out, "bert"))
    bert.save_pretrained(os.path.join(out, "bert_bin"), safe_serialization=False)
    write_io(bert, os.path.join(out, "bert"), 0, True)
    write_io(bert, os.path.join(out, "bert_bin"), 0, True)

    torch.manual_seed(0)
    roberta = RobertaForSequenceClassification(
        RobertaConfig(max_position_embeddings=66, pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5, **SIZES))
    roberta.save_pretrained(os.path.join(out, "roberta"))
    write_io(roberta, os.path.join(out, "roberta"), 1, False)
    # RobertaModel (bare names, with a pooler) holding the classifier's encoder.
    base = RobertaModel(roberta.config)
    base.load_state_dict(roberta.roberta.state_dict(), strict=False)
    base.save_pretrained(os.path.join(out, "roberta_model"))

    torch.manual_seed(0)
    pre = perturbed(BertForPreTraining(BertConfig(max_position_embeddings=64, **SIZES)))
    pre.save_pretrained(os.path.join(out, "bert_pretraining"))
    write_io(pre, os.path.join(out, "bert_pretraining"), 0, True, pooled=True)

    torch.manual_seed(0)
    mlm = perturbed(BertForMaskedLM(BertConfig(max_position_embeddings=64, **SIZES)))
    mlm.save_pretrained(os.path.join(out, "bert_mlm"))
    write_io(mlm, os.path.join(out, "bert_mlm"), 0, True, mlm=True)
    torch.manual_seed(0)
    mlm = perturbed(RobertaForMaskedLM(
        RobertaConfig(max_position_embeddings=66, pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5, **SIZES)))
    mlm.save_pretrained(os.path.join(out, "roberta_mlm"))
    write_io(mlm, os.path.join(out, "roberta_mlm"), 1, False, mlm=True)

    bad = os.path.join(out, "bad_deberta")
    os.makedirs(bad, exist_ok=True)
    with open(os.path.join(bad, "config.json"), "w") as f:
        json.dump({"model_type": "deberta-v2", "vocab_size": 1000, "hidden_size": 64}, f)
    bad = os.path.join(out, "bad_missing")
    shutil.copytree(os.path.join(out, "bert"), bad, dirs_exist_ok=True)
    state = load_file(os.path.join(bad, "model.safetensors"))
    del state["bert.encoder.layer.1.output.dense.weight"]
    save_file(state, os.path.join(bad, "model.safetensors"), metadata={"format": "pt"})
    bad = os.path.join(out, "bad_layers")
    shutil.copytree(os.path.join(out, "bert"), bad, dirs_exist_ok=True)
    with open(os.path.join(bad, "config.json")) as f:
        config = json.load(f)
    config["num_hidden_layers"] = 3
    with open(os.path.join(bad, "config.json"), "w") as f:
        json.dump(config, f)
    bad = os.path.join(out, "bad_shape")
    shutil.copytree(os.path.join(out, "bert"), bad, dirs_exist_ok=True)
    state = load_file(os.path.join(bad, "model.safetensors"))
    key = "bert.encoder.layer.0.intermediate.dense.weight"
    state[key] = state[key][: state[key].shape[0] // 2].contiguous()
    save_file(state, os.path.join(bad, "model.safetensors"), metadata={"format": "pt"})
    print("hf_models: wrote", out)


def check(model_dir, io_dir, out):
    with open(os.path.join(model_dir, "config.json")) as f:
        masked_lm = json.load(f)["architectures"][0].endswith("ForMaskedLM")
    model = (AutoModelForMaskedLM if masked_lm else AutoModelForSequenceClassification).from_pretrained(model_dir)
    model.eval()
    io = torch.load(os.path.join(io_dir, "io.pt"))
    with torch.no_grad():
        logits = model(input_ids=io["input_ids"], attention_mask=io["attention_mask"],
                       token_type_ids=io["token_type_ids"]).logits
    with open(out, "w") as f:
        f.write("".join(f"{v!r}\n" for v in logits.flatten().tolist()))
    print("hf_models check:", type(model).__name__, tuple(logits.shape))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        main(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "check":
        check(*sys.argv[2:])
    else:
        sys.exit(__doc__)
