"""Tiny randomly initialised HF models (built from configs: nothing is downloaded) whose special
ids match the project tokenizer (pad 0, eos 1, bos 2), one per model layout of the loader tests."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

VOCAB = 8000  # data/tokenizer.json with its added tokens
PAD, EOS, BOS = 0, 1, 2
_WEIGHTS: dict[str, dict[str, torch.Tensor]] = {}


def config(kind: str):
    import transformers as hf

    common = {"vocab_size": VOCAB, "pad_token_id": PAD, "eos_token_id": EOS, "bos_token_id": BOS}
    if kind == "gpt2":
        return hf.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=512, **common)
    if kind == "llama":
        return hf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=512, **common)
    if kind == "bert":
        return hf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             max_position_embeddings=512, vocab_size=VOCAB, pad_token_id=PAD)
    if kind == "t5":  # T5 starts the decoder with pad
        return hf.T5Config(d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, decoder_start_token_id=PAD,
                           **common)
    if kind == "bart":  # BART starts the decoder with eos (fairseq's convention)
        return hf.BartConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                             decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                             max_position_embeddings=512, decoder_start_token_id=EOS, forced_eos_token_id=EOS,
                             **common)
    raise ValueError(kind)


MODEL_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "bert": "BertForMaskedLM",
                 "t5": "T5ForConditionalGeneration", "bart": "BartForConditionalGeneration"}


#: Dropout fields of the configs: off, so that train mode is deterministic (flex attention refuses
#: attention dropout anyway).
NO_DROPOUT = {"gpt2": {"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}, "llama": {"attention_dropout": 0.0}}


def tiny_model(kind: str, attn_implementation: str = "eager", *, dropout: bool = True):
    """The model ``kind`` with ``attn_implementation``; every implementation of a kind has the same
    weights. ``dropout=False``: its config's dropout probabilities are 0 (train mode is exact)."""
    import transformers as hf

    cls = getattr(hf, MODEL_CLASSES[kind])
    torch.manual_seed(0)
    cfg = config(kind)
    if not dropout:
        for name, value in NO_DROPOUT.get(kind, {}).items():
            setattr(cfg, name, value)
    model = cls._from_config(cfg, attn_implementation=attn_implementation)
    if kind not in _WEIGHTS:
        _WEIGHTS[kind] = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(_WEIGHTS[kind])
    return model.eval()
