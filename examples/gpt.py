"""GPT-2 models by preset name, randomly initialised through transformers (GPT2Config,
GPT2LMHeadModel); any size field can be overridden."""
from __future__ import annotations

from transformers import GPT2Config, GPT2LMHeadModel

# gpt2-62m: the reference size (about 61M parameters with the 32768-token vocabulary, tied
# embeddings). tiny: trains on 2 CPU cores in minutes.
PRESETS = {
    "gpt2-62m": dict(n_layer=8, n_embd=640, n_head=10, n_positions=1024, vocab_size=32768),
    "tiny": dict(n_layer=2, n_embd=64, n_head=2, n_positions=256, vocab_size=2048),
}


def make_config(preset: str, **overrides) -> GPT2Config:
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset '{preset}', expected one of {', '.join(PRESETS)}")
    fields = dict(PRESETS[preset])
    fields.update({k: v for k, v in overrides.items() if v is not None})
    if fields["n_embd"] % fields["n_head"]:
        raise ValueError(f"n_embd {fields['n_embd']} is not a multiple of n_head {fields['n_head']}")
    return GPT2Config(**fields, bos_token_id=0, eos_token_id=0)


def make_model(config: GPT2Config) -> GPT2LMHeadModel:
    model = GPT2LMHeadModel(config)
    # transformers picks a model's loss by matching its class name against "...ForCausalLM";
    # "GPT2LMHeadModel" does not match, so every forward with labels warned that loss_type is
    # None before using the causal-LM loss anyway. Naming it says the same thing, silently.
    model.loss_type = "ForCausalLM"
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())
