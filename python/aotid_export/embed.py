"""Sentence encoders for aotid's embeddings.

An embedding package holds one program that turns token ids into one
vector per sentence, the whole of what a sentence-transformers model does
after its tokenizer:

    embedding = model(input_ids[B, T] int64, attention_mask[B, T] int64)   # -> [B, dim] float32

The encoder, its pooling and the L2 normalisation are inside the graph, so
aotid's C++ only tokenizes, pads a batch to its longest sentence (mask 0
past each one's end) and sends the rows back. Pooling is one of:

* ``mean``: the mean of the token vectors where the mask is 1;
* ``cls``: the first token's vector ([CLS]);
* ``last_token``: the vector of the last token where the mask is 1
  (padding on the right, as aotid pads).

Batch and seq are dynamic: batch 1..256, seq 1..the model's positions. The
package carries the Hugging Face ``tokenizer.json`` as it is (aotid reads
WordPiece ones in C++, text/tokenizer.h), its special tokens, and an
``embed`` section in aotid.json:

    {"kind": "sentence_embedding", "input_ids": "input_ids",
     "attention_mask": "attention_mask", "output": "embedding",
     "dim": 384, "pooling": "mean", "normalize": true, "max_seq_len": 256,
     "truncatable_dims": false, "tokenizer": "aotid_embed_tokenizer.json",
     "special_tokens": {"cls": 101, "sep": 102, "pad": 0, "unk": 100}}

``max_seq_len`` is where aotid truncates a text's tokens (the model's own
limit, sentence-transformers' ``max_seq_length``). ``truncatable_dims``
says whether a request may ask for fewer ``dimensions`` (the first ones,
renormalised): true only for models trained for it (Matryoshka), which the
exporter is told, never guesses.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from . import AOTID_EXTRA_FILE, _checked, _export_program, _package_options

__all__ = ["POOLINGS", "EMBED_TOKENIZER_FILE", "SentenceEncoder", "export_sentence_encoder", "special_tokens_of"]

POOLINGS = ("mean", "cls", "last_token")
EMBED_TOKENIZER_FILE = "aotid_embed_tokenizer.json"
MAX_BATCH = 256
# The example the program is traced with, recorded as the typical sizes.
EXAMPLE_BATCH, EXAMPLE_SEQ = 1, 16


class SentenceEncoder(torch.nn.Module):
    """``forward(input_ids[B, T], attention_mask[B, T]) -> embedding[B, dim]``:
    ``encoder``'s token vectors (its first output, or ``last_hidden_state``)
    pooled as ``pooling`` says and, with ``normalize``, scaled to unit L2
    length. ``encoder`` is called with ``input_ids`` and ``attention_mask``
    (and all-zero ``token_type_ids`` where it takes them, as a tokenizer of
    one sentence gives)."""

    def __init__(self, encoder: torch.nn.Module, pooling: str = "mean", normalize: bool = True):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r}: aotid pools by {', '.join(POOLINGS)}")
        self.encoder = encoder
        self.pooling = pooling
        self.normalize = normalize
        import inspect

        try:
            params = inspect.signature(encoder.forward).parameters
        except (TypeError, ValueError):
            params = {}
        self._token_types = "token_type_ids" in params

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self._token_types:
            kwargs["token_type_ids"] = torch.zeros_like(input_ids)
        out = self.encoder(**kwargs)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        hidden = hidden.float()
        if self.pooling == "mean":
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        elif self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            # Right padding: the last token in use is at (tokens in use - 1).
            last = (attention_mask.sum(1) - 1).clamp(min=0)
            index = last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])
            pooled = hidden.gather(1, index).squeeze(1)
        if self.normalize:
            pooled = F.normalize(pooled, p=2.0, dim=1)
        return pooled


def special_tokens_of(tokenizer: Mapping[str, Any]) -> dict[str, int]:
    """The ids of a WordPiece tokenizer.json's [CLS], [SEP], [PAD] and
    [UNK] (those it has), by role; ValueError when it is not WordPiece."""
    model = tokenizer.get("model") if isinstance(tokenizer, Mapping) else None
    if not isinstance(model, Mapping) or model.get("type") != "WordPiece":
        kind = model.get("type") if isinstance(model, Mapping) else None
        raise ValueError(f"the tokenizer's model is {kind!r}; aotid tokenizes sentence encoders' text with "
                         "WordPiece tokenizers only (a Hugging Face tokenizer.json with a WordPiece model)")
    vocab = model.get("vocab") or {}
    ids = {str(k): int(v) for k, v in vocab.items()}
    for a in tokenizer.get("added_tokens") or []:
        ids[a["content"]] = int(a["id"])
    post = tokenizer.get("post_processor") or {}
    names: dict[str, str | None] = {"cls": None, "sep": None}
    if post.get("type") == "BertProcessing":  # {"cls": ["[CLS]", 101], "sep": ["[SEP]", 102]}
        names = {r: (post.get(r) or [None])[0] for r in ("cls", "sep")}
    elif post.get("type") == "TemplateProcessing":
        # The special tokens before the sentence ("A") and after it.
        single = post.get("single") or []
        at = next((i for i, p in enumerate(single) if "Sequence" in p), len(single))
        before = [p["SpecialToken"]["id"] for p in single[:at] if "SpecialToken" in p]
        after = [p["SpecialToken"]["id"] for p in single[at:] if "SpecialToken" in p]
        names = {"cls": before[0] if before else None, "sep": after[-1] if after else None}
    names["pad"] = (tokenizer.get("padding") or {}).get("pad_token") or "[PAD]"
    names["unk"] = model.get("unk_token") or "[UNK]"
    found: dict[str, int] = {}
    for role, text in names.items():
        if text is not None and text in ids:
            found[role] = ids[text]
    return found


def export_sentence_encoder(
    encoder: torch.nn.Module,
    path: str,
    *,
    tokenizer: str | Mapping[str, Any],
    max_seq_len: int,
    pooling: str = "mean",
    normalize: bool = True,
    truncatable_dims: bool = False,
    vocab_size: int | None = None,
    max_positions: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    inductor_configs: Mapping[str, Any] | None = None,
) -> torch.export.ExportedProgram:
    """Exports ``encoder`` (a transformers encoder such as ``BertModel``,
    or any module taking ``input_ids`` and ``attention_mask`` and returning
    token vectors first) as an embedding package at ``path``.

    ``tokenizer`` is the model's Hugging Face tokenizer.json (its text or
    the parsed object); it must be WordPiece, the kind aotid runs for
    encoders. ``max_seq_len`` is where aotid truncates a text's tokens
    ([CLS] and [SEP] included). ``truncatable_dims`` only for a model
    trained to be cut to its first dimensions (Matryoshka).
    ``vocab_size`` and ``max_positions`` default to the encoder's config
    (``vocab_size``, ``max_position_embeddings``); the traced seq runs up
    to ``max_positions``. ``inductor_configs`` are the options aotid builds
    the program with (default AOTInductor's own).
    Returns the exported program (what the built model runs, eagerly).
    """
    if pooling not in POOLINGS:
        raise ValueError(f"pooling {pooling!r}: aotid pools by {', '.join(POOLINGS)}")
    text = tokenizer if isinstance(tokenizer, str) else json.dumps(tokenizer)
    try:
        parsed = json.loads(text) if isinstance(tokenizer, str) else dict(tokenizer)
    except ValueError as e:
        raise ValueError(f"the tokenizer is not JSON: {e}") from None
    special = special_tokens_of(parsed)
    for role in ("cls", "sep"):
        if role not in special:
            raise ValueError(f"the tokenizer has no {role.upper()} token its post-processor puts around a text; "
                             "aotid's sentence encoders take [CLS] text [SEP]")
    config = getattr(encoder, "config", None)
    vocab_size = vocab_size or getattr(config, "vocab_size", None)
    max_positions = max_positions or getattr(config, "max_position_embeddings", None)
    if not vocab_size or not max_positions:
        raise ValueError("vocab_size and max_positions are needed (the encoder has no config that says them)")
    n_tokens = max(max(special.values()), *(int(v) for v in (parsed["model"].get("vocab") or {}).values()),
                   *(int(a["id"]) for a in parsed.get("added_tokens") or [])) + 1
    if n_tokens > vocab_size:
        raise ValueError(f"the tokenizer has ids up to {n_tokens - 1}, the encoder's vocabulary only {vocab_size}: "
                         "those ids would index its embedding out of bounds")
    if not 2 < max_seq_len <= max_positions:
        raise ValueError(f"max_seq_len {max_seq_len}: it must hold [CLS], a token and [SEP], and fit the "
                         f"encoder's {max_positions} positions")

    model = SentenceEncoder(encoder, pooling, normalize).eval()
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    seq = torch.export.Dim("seq", min=1, max=int(max_positions))
    g = torch.Generator().manual_seed(0)
    example = {"input_ids": torch.randint(0, int(vocab_size), (EXAMPLE_BATCH, EXAMPLE_SEQ), generator=g),
               "attention_mask": torch.ones(EXAMPLE_BATCH, EXAMPLE_SEQ, dtype=torch.int64)}
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    ep, names = _export_program(model, example, None, ["embedding"], False, shapes)
    with torch.no_grad():
        dim = int(ep.module()(example["input_ids"], example["attention_mask"]).shape[-1])
    embed: dict[str, Any] = {
        "kind": "sentence_embedding",
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "output": "embedding",
        "dim": dim,
        "pooling": pooling,
        "normalize": bool(normalize),
        "max_seq_len": int(max_seq_len),
        "truncatable_dims": bool(truncatable_dims),
        "tokenizer": EMBED_TOKENIZER_FILE,
        "special_tokens": special,
    }
    extra: dict[str, Any] = {"format": 1, **names, "metadata": dict(metadata or {}), "embed": embed}
    if inductor_configs:
        extra["inductor_options"] = _package_options(inductor_configs)
    torch.export.save(ep, path, extra_files={AOTID_EXTRA_FILE: json.dumps(extra), EMBED_TOKENIZER_FILE: text})
    _checked(path, ["model"])
    return ep
