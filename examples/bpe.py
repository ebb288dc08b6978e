"""The tokenizer: a byte-level BPE trained with `tokenizers` on the training text once, cached by
(data file version, vocab size) and reused; no hub downloads."""
from __future__ import annotations

import hashlib
import os
from typing import Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from textdata import file_fingerprint, iter_documents

EOS = "<|endoftext|>"


def _corpus(path: str, max_docs: int | None) -> Iterator[str]:
    for n, text in enumerate(iter_documents(path)):
        if max_docs is not None and n >= max_docs:
            return
        yield text


def train_bpe(data_path: str, vocab_size: int, max_docs: int | None = None) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(data_path, max_docs), trainer=trainer)
    return tok


def tokenizer_path(cache_root: str, data_path: str, vocab_size: int) -> str:
    key = hashlib.sha256(f"{file_fingerprint(data_path)}|bpe|{vocab_size}".encode()).hexdigest()[:16]
    return os.path.join(cache_root, f"bpe-{vocab_size}-{key}.json")


def load_or_train(cache_root: str, data_path: str, vocab_size: int) -> tuple[Tokenizer, str]:
    """The cached tokenizer for this data and vocab size (trained and saved atomically if
    absent). Returns it and its file."""
    path = tokenizer_path(cache_root, data_path, vocab_size)
    if not os.path.exists(path):
        tok = train_bpe(data_path, vocab_size)
        os.makedirs(cache_root, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        tok.save(tmp)
        os.replace(tmp, path)
    return Tokenizer.from_file(path), path


def tokenizer_id(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def as_hf(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """The transformers wrapper, so it saves and loads with the model (save_pretrained)."""
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS,
                                   pad_token=EOS)
