"""Causal language models for aotid's ``generate`` routes.

aotid runs the token loop itself, in C++ next to the model: it tokenizes the
prompt, calls the model once for the prompt (prefill) and once per new token
(decode), samples, and stops. The model it needs is *stateful*: it keeps a
key/value cache, updated in place, so a step passes only the new tokens and
their positions:

    logits = model(tokens[1, T] int64, input_pos[T] int64)   # -> [1, vocab] float32

The eager ``Llama`` keeps its cache as buffers. Its exported program takes
each layer's keys and values as *state inputs* after those (``k_cache_0,
v_cache_0, k_cache_1, ...``), which it writes in place: aotid makes them,
zeros, when it loads the model and passes the same tensors to every call, so
the package holds no cache (docs/GENERATE.md, "What travels in the package").

``logits`` are those of the last of the T positions. The positions come in
order, and attention reads the cache up to the last of them only: what lies
past it (an earlier, longer sequence's) is never read, so a new sequence
needs no reset: it starts again at position 0 and overwrites the cache as
it goes.

A model of several sequence slots (``LlamaConfig.max_sequences`` N above 1)
holds a cache for N sequences and steps several at once:

    logits = model(tokens[B, T] int64, input_pos[B, T] int64, slots[B] int64)   # -> [B, vocab]

Row b is T tokens of the sequence in cache slot ``slots[b]``, at positions
``input_pos[b]``, and attends to its own slot only (docs/GENERATE.md,
"Several sequences").

``Llama`` is such a model in plain PyTorch (the Llama architecture: RMSNorm,
rotary embeddings, grouped-query attention, SwiGLU), and
``export_causal_lm`` writes it, with its tokenizer and chat template, into
the exported-program package aotid builds and serves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from . import AOTID_EXTRA_FILE, _export_program, _package_options

__all__ = ["LlamaConfig", "Llama", "export_causal_lm", "chat_pieces", "TOKENIZER_EXTRA_FILE", "GPT2_PATTERN",
           "BUILD_OPTIONS", "Int8Linear", "Int8Embedding", "quantize_int8", "cache_size_line", "program_module"]

TOKENIZER_EXTRA_FILE = "aotid_tokenizer.json"

# What a language model is built with unless its exporter says otherwise. A
# decode step is one-row matrix products (a matrix times a vector) against
# every weight. ATen hands them to MKL's sgemv, which ran on one thread
# whatever the OpenMP count, leaving the other core spinning; AOTInductor's
# own C++ GEMM kernels (chosen by autotuning at build time, kept only where
# faster) split them across the threads: SmolLM2-135M decoded at 1.3x the
# tokens/s on one thread and 1.9x on two, on a 2-core AVX2 machine, for
# about twice the build time (docs/BENCHMARKS.md, "Generate").
BUILD_OPTIONS = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}

# GPT-2's pre-tokenizer: contractions, letters, numbers and other symbols each
# with at most one leading space, and whitespace runs.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@dataclasses.dataclass
class LlamaConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_dim: int
    max_seq_len: int = 2048
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    # Sequences the cache holds at once, one slot each. 1 is the batch-size-1
    # model; more adds a batch dim to every call and a slot per row.
    max_sequences: int = 1

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rope(x, cos, sin):
    """Rotates pairs (2i, 2i+1) of the last dim; x is [B, H, T, D], cos/sin [T, D/2]."""
    xr = x.reshape(*x.shape[:-1], -1, 2)
    a, b = xr[..., 0], xr[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class Attention(torch.nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.wq = torch.nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wk = torch.nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = torch.nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wo = torch.nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)
        shape = (c.max_sequences, c.n_kv_heads, c.max_seq_len, c.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x, cos, sin, input_pos, mask, n, slots=None, cache=None):
        """``cache``: this layer's (keys, values) to write and read, in place;
        the module's own buffers without."""
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k_cache, v_cache = (self.k_cache, self.v_cache) if cache is None else cache
        if slots is None:
            k_cache.index_copy_(2, input_pos, k)
            v_cache.index_copy_(2, input_pos, v)
            keys, values = k_cache[:, :, :n], v_cache[:, :, :n]
        else:
            keys, values = self._slotted(k_cache, v_cache, k, v, input_pos, n, slots)
        # Only the n positions in use are read, not the whole cache. Each
        # key/value head serves n_heads / n_kv_heads query heads, read as
        # it is (no copy of the cache repeated per query head every step).
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                           enable_gqa=self.n_heads != self.n_kv_heads)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))

    @staticmethod
    def _slotted(k_cache, v_cache, k, v, input_pos, n, slots):
        """Row b's keys and values written at its slot's positions, and the
        first n positions of each row's slot read back, [B, kv heads, n, D]."""
        # cache[slots[b], :, input_pos[b, t]] = k[b, :, t]: the two indices
        # broadcast to [B, T], so the value is laid out [B, T, heads, D].
        at = (slots.unsqueeze(1), slice(None), input_pos)
        k_cache[at] = k.transpose(1, 2)
        v_cache[at] = v.transpose(1, 2)
        # Each row's slot gathered into a batch for attention: a copy of
        # the bytes attention reads anyway, sliced first so that it holds
        # the n positions in use of the B slots in the call, not whole
        # slots. Positions past a row's own are masked.
        return k_cache[:, :, :n].index_select(0, slots), v_cache[:, :, :n].index_select(0, slots)


class FeedForward(torch.nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.w1 = torch.nn.Linear(c.dim, c.hidden_dim, bias=False)  # gate
        self.w3 = torch.nn.Linear(c.dim, c.hidden_dim, bias=False)  # up
        self.w2 = torch.nn.Linear(c.hidden_dim, c.dim, bias=False)  # down

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(torch.nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(c.dim, c.norm_eps)
        self.attention = Attention(c)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)
        self.feed_forward = FeedForward(c)

    def forward(self, x, cos, sin, input_pos, mask, n, slots=None, cache=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, input_pos, mask, n, slots, cache)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(torch.nn.Module):
    """``forward(tokens[1, T], input_pos[T]) -> logits[1, vocab]`` of the last
    position; with ``config.max_sequences`` N above 1, ``forward(tokens[B, T],
    input_pos[B, T], slots[B]) -> logits[B, vocab]``: row b is T tokens of the
    sequence in cache slot ``slots[b]`` (B <= N, slots distinct).

    ``caches``, when given, is the cache to use instead of the model's own
    buffers: ``[k_cache_0, v_cache_0, k_cache_1, ...]``, each of the shape of
    the layer's buffer (``[N, kv_heads, max_seq_len, head_dim]``), written in
    place (the exported program's state inputs)."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        if c.max_sequences < 1:
            raise ValueError(f"max_sequences must be at least 1, not {c.max_sequences}")
        self.config = c
        self.tok_embeddings = torch.nn.Embedding(c.vocab_size, c.dim)
        self.layers = torch.nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = torch.nn.Linear(c.dim, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        angles = torch.outer(torch.arange(c.max_seq_len, dtype=torch.float32), inv)
        self.register_buffer("rope_cos", angles.cos(), persistent=False)
        self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.register_buffer("positions", torch.arange(c.max_seq_len), persistent=False)

    def forward(self, tokens, input_pos, slots=None, caches=None):
        if (slots is None) != (self.config.max_sequences == 1):
            raise TypeError("Llama: a model of one sequence takes (tokens, input_pos), no slots"
                            if slots is not None else f"Llama: a model of {self.config.max_sequences} "
                            "sequence slots takes (tokens[B, T], input_pos[B, T], slots[B])")
        x = self.tok_embeddings(tokens)
        # Gathered with F.embedding: positions run 0..max_seq_len-1, which the
        # build records, so /infer refuses others before the model runs.
        cos, sin = F.embedding(input_pos, self.rope_cos), F.embedding(input_pos, self.rope_sin)
        if slots is not None:  # per row: [B, 1, T, D/2] against [B, heads, T, D/2]
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        # The positions in use: up to the last one written now (positions
        # come in order; with slots, the furthest row's). A query at
        # position p sees the keys at 0..p of its own sequence.
        n = (input_pos[-1] + 1 if slots is None else input_pos.max() + 1).item()
        torch._check(n >= 1)
        torch._check(n <= self.config.max_seq_len)
        # [T, n], or [B, 1, T, n]: one mask per row, shared by its heads.
        mask = self.positions[:n] <= input_pos.unsqueeze(-1)
        if slots is not None:
            mask = mask.unsqueeze(1)
        if caches is not None and len(caches) != 2 * len(self.layers):
            raise TypeError(f"Llama: caches holds {len(caches)} tensors, not keys and values of "
                            f"{len(self.layers)} layers")
        for i, layer in enumerate(self.layers):
            cache = None if caches is None else (caches[2 * i], caches[2 * i + 1])
            x = layer(x, cos, sin, input_pos, mask, n, slots, cache)
        return self.output(self.norm(x[:, -1, :]))

    def reset(self) -> None:
        for layer in self.layers:
            layer.attention.k_cache.zero_()
            layer.attention.v_cache.zero_()

    def set_max_sequences(self, n: int) -> "Llama":
        """Gives the model a cache of ``n`` sequence slots, in place (zeros:
        what the old cache held is dropped), and the signature that goes
        with it; returns the model."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"max_sequences must be a whole number of at least 1, not {n!r}")
        self.config = dataclasses.replace(self.config, max_sequences=n)
        for layer in self.layers:
            a = layer.attention
            shape = (n, *a.k_cache.shape[1:])
            a.k_cache = torch.zeros(shape, dtype=a.k_cache.dtype, device=a.k_cache.device)
            a.v_cache = torch.zeros(shape, dtype=a.v_cache.dtype, device=a.v_cache.device)
        return self

    def cache_bytes_per_sequence(self) -> int:
        """The key/value cache one sequence slot holds, in bytes."""
        return sum((a.k_cache.numel() + a.v_cache.numel()) * a.k_cache.element_size() // a.k_cache.shape[0]
                   for a in (layer.attention for layer in self.layers))


class Int8Linear(torch.nn.Module):
    """A bias-free ``Linear`` whose weight is int8 with one scale per output
    row (symmetric, weight-only): ``y = x @ (weight * scales[:, None]).T``.

    The product is ``torch._weight_int8pack_mm``, one op that AOTInductor
    keeps whole: on x86 with AVX2 or AVX-512 its autotuned C++ GEMM reads the
    int8 weight and converts it in registers, so a decode step reads a
    quarter of float32's bytes. The op takes bfloat16 activations there (the
    kernels it has), so ``x`` is rounded to bfloat16 on the way in and the
    result comes back in ``x``'s dtype; sums run in float32.
    """

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "Int8Linear":
        return cls(*_quantize_rows(weight))

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        y = torch._weight_int8pack_mm(rows, self.weight, self.scales)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.weight.shape[0])


class Int8Embedding(torch.nn.Module):
    """An ``Embedding`` read from int8 rows and their scales; with tied
    embeddings these are the output ``Int8Linear``'s own buffers (one copy)."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)

    def forward(self, tokens):
        # F.embedding, not indexing: ids run 0..vocab-1 (no Python-style
        # negatives), which the build records and /infer then checks.
        rows = F.embedding(tokens, self.weight).float()
        return rows * F.embedding(tokens, self.scales.unsqueeze(-1)).float()


def _quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8: the scale is the row's largest magnitude over
    127, stored in bfloat16, and the int8 values are taken against that
    stored scale (so dequantizing gives back the nearest the pair can)."""
    w = w.detach().float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
    q = torch.round(w / scales.float().unsqueeze(1)).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scales.contiguous()


@torch.no_grad()
def quantize_int8(model: Llama) -> Llama:
    """Weight-only int8, in place: every ``Linear`` of ``model`` becomes an
    ``Int8Linear`` and the token embedding an ``Int8Embedding`` (sharing the
    output's int8 rows when the embeddings are tied). The package is about a
    quarter of float32's size, and so are the bytes a decode step reads.

    Quantize after the weights are loaded: weights loaded into the int8
    buffers afterwards would be cast, not quantized.

    Answers change a little: greedy text stays close to float32's but is not
    the same token for token. The quantized module itself is the eager
    reference for what aotid builds from it."""
    if not isinstance(model, Llama):
        raise TypeError(f"quantize_int8 takes an aotid_export.llm.Llama, not {type(model).__name__}")
    if any(isinstance(m, (Int8Linear, Int8Embedding)) for m in model.modules()):
        raise ValueError("quantize_int8: the model is quantized already (its weights would be read as floats)")
    tied = model.config.tie_embeddings and model.output.weight is model.tok_embeddings.weight
    linears = [(f"{pname}.{name}" if pname else name, parent, name, child)
               for pname, parent in model.named_modules() for name, child in parent.named_children()
               if isinstance(child, torch.nn.Linear)]
    for path, _, _, child in linears:  # all checked before any is changed
        if child.bias is not None:
            raise ValueError(f"quantize_int8: {path} has a bias, which Int8Linear does not take")
        # torch's int8 product reads a row 8 values at a time: another width
        # crashes it (a segfault) on inputs of more than one row.
        if child.in_features % 8:
            raise ValueError(f"quantize_int8: {path} takes {child.in_features} inputs; int8 products need "
                             "a multiple of 8 (dim and hidden_dim)")
    for _, parent, name, child in linears:
        setattr(parent, name, Int8Linear.from_float(child.weight))
    if tied:
        model.tok_embeddings = Int8Embedding(model.output.weight, model.output.scales)
    else:
        model.tok_embeddings = Int8Embedding(*_quantize_rows(model.tok_embeddings.weight))
    return model


def greedy(model: Llama, prompt_ids: Sequence[int], max_tokens: int, eos_ids: Sequence[int] = ()) -> list[int]:
    """The eager greedy loop aotid's own must match: prefill, then one token a step."""
    out: list[int] = []
    with torch.no_grad():
        ids = torch.tensor([list(prompt_ids)], dtype=torch.int64)
        logits = model(ids, torch.arange(len(prompt_ids)))
        pos = len(prompt_ids)
        while len(out) < max_tokens:
            nxt = int(torch.argmax(logits[0]))
            out.append(nxt)
            if nxt in eos_ids or pos >= model.config.max_seq_len:
                break
            logits = model(torch.tensor([[nxt]]), torch.tensor([pos]))
            pos += 1
    return out


def chat_pieces(template: str, bos_token: str = "", eos_token: str = "") -> dict[str, Any]:
    """What aotid needs of a Jinja chat template, found by rendering it.

    aotid has no Jinja engine: it assembles a prompt from pieces. Rendering
    the template on marked messages finds them: the text before and after
    each role's content, what the template adds when the conversation does
    not start with a system message (a default system prompt), and the
    generation prompt. Templates of that shape (ChatML and its kind) are
    described exactly; a template whose output is not a concatenation of
    such pieces raises ValueError.
    """
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def fail(message):
        raise ValueError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = fail
    tmpl = env.from_string(template)

    def render(messages, gen=False):
        return tmpl.render(messages=messages, add_generation_prompt=gen, bos_token=bos_token, eos_token=eos_token)

    marks = {"system": "\x01S\x01", "user": "\x01U\x01", "assistant": "\x01A\x01"}
    msg = {r: {"role": r, "content": m} for r, m in marks.items()}

    def after(longer, shorter, what):
        if not longer.startswith(shorter):
            fail(f"{what} changes the text rendered before it")
        return longer[len(shorter):]

    def split(text, role):
        before, sep, rest = text.partition(marks[role])
        if not sep or marks[role] in rest:
            fail(f"the {role} message's content does not appear once in the rendered text")
        return {"prefix": before, "suffix": rest}

    s = render([msg["system"]])
    su = render([msg["system"], msg["user"]])
    sua = render([msg["system"], msg["user"], msg["assistant"]])
    out: dict[str, Any] = {
        "system": split(s, "system"),
        "user": split(after(su, s, "a user message"), "user"),
        "assistant": split(after(sua, su, "an assistant message"), "assistant"),
        "generation_prompt": after(render([msg["system"], msg["user"]], gen=True), su, "the generation prompt"),
    }

    def piece(role):
        return out[role]["prefix"] + marks[role] + out[role]["suffix"]

    # Without a system message the template may add its own first.
    user_first = render([msg["user"]])
    if not user_first.endswith(piece("user")):
        fail("a conversation without a system message does not end with the user's message")
    out["default_preamble"] = user_first[:-len(piece("user"))]
    # The pieces must rebuild what the template renders for a longer talk.
    talk = ["system", "user", "assistant", "user", "assistant", "user"]
    if render([msg[r] for r in talk]) != "".join(piece(r) for r in talk):
        fail("the pieces found do not rebuild a longer conversation")
    return out


def _check_tokenizer(tokenizer: Mapping[str, Any], vocab_size: int, eos_token_ids: Sequence[int],
                     bos_token_id: int | None) -> None:
    """What aotid would refuse at load, after a whole build, refused now."""
    kind = tokenizer.get("type") if isinstance(tokenizer, Mapping) else None
    if kind != "byte_level_bpe":
        raise ValueError(f"tokenizer type {kind!r}: aotid reads byte-level BPE tokenizers only "
                         "(\"type\": \"byte_level_bpe\"; docs/GENERATE.md)")
    for key in ("tokens", "merges", "pre_tokenizer"):
        if not isinstance(tokenizer.get(key), list):
            raise ValueError(f"the tokenizer has no {key!r} list")
    n = len(tokenizer["tokens"])
    if n > vocab_size:
        raise ValueError(f"the tokenizer has {n} tokens, the model's vocabulary only {vocab_size}: "
                         "ids past it would index the embedding out of bounds")
    for what, ids in (("eos_token_ids", list(eos_token_ids)),
                      ("bos_token_id", [] if bos_token_id is None else [bos_token_id])):
        for i in ids:
            if not 0 <= int(i) < n:
                raise ValueError(f"{what}: {i} is not a token of the tokenizer (0..{n - 1})")


def export_causal_lm(
    model: Llama,
    path: str,
    *,
    tokenizer: Mapping[str, Any],
    eos_token_ids: Sequence[int],
    bos_token_id: int | None = None,
    chat_template: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    max_prefill: int | None = None,
    inductor_configs: Mapping[str, Any] | None = None,
    max_sequences: int | None = None,
    _cache_as_buffers: bool = False,
) -> torch.export.ExportedProgram:
    """Exports a stateful causal LM with what aotid's ``generate`` needs.

    ``tokenizer`` is aotid's tokenizer description (see docs/GENERATE.md):
    ``{"type": "byte_level_bpe", "pre_tokenizer": [regex, ...], "tokens":
    [...], "merges": ["a b", ...], "special": [ids]}``. ``bos_token_id``, when
    given, starts every prompt. ``chat_template`` (Jinja, as the model ships
    it) becomes the chat form of ``generate``. ``max_prefill`` bounds the
    tokens one call takes (default: the whole context).
    ``inductor_configs`` are the options aotid builds the program with
    (default ``BUILD_OPTIONS``; ``{}`` for AOTInductor's own defaults).
    ``max_sequences`` (default: the model's own, ``config.max_sequences``)
    is the sequences its cache holds at once: the model's cache is resized
    to it in place (``Llama.set_max_sequences``), and above 1 the program
    takes a batch of rows and their slots (docs/GENERATE.md, "Several
    sequences"). The cache's size is printed to stderr.

    The program takes the cache as state inputs after the client's
    (``k_cache_0, v_cache_0, ...``, listed in aotid.json "state_inputs"):
    aotid makes them when it loads the model, so the package holds none.
    ``_cache_as_buffers`` exports the cache inside the program instead,
    zeros in the package, as packages were before state inputs (for the
    tests that check aotid still serves those).
    """
    _check_tokenizer(tokenizer, model.config.vocab_size, eos_token_ids, bos_token_id)
    if max_prefill is not None and max_prefill < 1:
        raise ValueError(f"max_prefill must be at least 1, not {max_prefill}")
    if max_sequences is not None and max_sequences != model.config.max_sequences:
        model.set_max_sequences(max_sequences)  # after the refusals: a refused export leaves the model as it was
    c = model.config
    most = min(max_prefill or c.max_seq_len, c.max_seq_len)
    seq = torch.export.Dim("seq", min=1, max=most)
    slotted = c.max_sequences > 1
    if slotted:
        batch = torch.export.Dim("batch", min=1, max=c.max_sequences)
        example = (torch.zeros(2, 4, dtype=torch.int64), torch.arange(4).repeat(2, 1), torch.arange(2))
        client, dims = ["tokens", "input_pos", "slots"], ({0: batch, 1: seq}, {0: batch, 1: seq}, {0: batch})
    else:
        example = (torch.zeros(1, 4, dtype=torch.int64), torch.arange(4))
        client, dims = ["tokens", "input_pos"], ({1: seq}, {0: seq})
    if _cache_as_buffers:
        ep, names = _export_program(model, example, client, ["logits"], False, dims, record_typical=False)
        state: list[dict[str, Any]] = []
    else:
        named = [(f"{kind}_cache_{i}", t) for i, layer in enumerate(model.layers)
                 for kind, t in (("k", layer.attention.k_cache), ("v", layer.attention.v_cache))]
        state = [{"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                 for name, t in named]
        # Zeros of the cache's shape, not the model's own buffers: the trace
        # writes into its example.
        example += tuple(torch.zeros_like(t) for _, t in named)
        with _cache_buffers_out(model):  # else exported as constants, unused but in the package
            ep, names = _export_program(_CacheAsInputs(model, slotted), example,
                                        client + [s["name"] for s in state], ["logits"], False,
                                        dims + (None,) * len(state), record_typical=False)
        names["input_names"] = client
        # The program keeps its example, which the package stores: the
        # state inputs' there are zeros of one element each, expanded to
        # their shape (the compile worker compiles with whole zeros).
        args, kwargs = ep.example_inputs
        ep.example_inputs = (args[:len(client)] + tuple(torch.zeros((), dtype=t.dtype).expand(t.shape)
                                                        for _, t in named), kwargs)
        if "input_dims" in names:
            names["input_dims"] = names["input_dims"][:len(client)]
    # Most calls are decode steps of one token, with every slot busy when
    # the model is: auto threads are timed there.
    for dims in names.get("input_dims") or []:
        for d in dims or []:
            if d is not None:
                d["typical"] = c.max_sequences if d.get("name") == "batch" else 1
    per_slot = model.cache_bytes_per_sequence()
    generate: dict[str, Any] = {
        "kind": "causal_lm",
        "tokens_input": "tokens",
        "positions_input": "input_pos",
        "logits_output": "logits",
        "max_seq_len": c.max_seq_len,
        "max_prefill": most,
        "max_sequences": c.max_sequences,
        "cache_bytes_per_sequence": per_slot,
        "eos_token_ids": [int(i) for i in eos_token_ids],
        "tokenizer": TOKENIZER_EXTRA_FILE,
    }
    if slotted:
        generate["slots_input"] = "slots"
    if bos_token_id is not None:
        generate["bos_token_id"] = int(bos_token_id)
    if chat_template:
        tokens = tokenizer["tokens"]
        bos = tokens[bos_token_id] if bos_token_id is not None else ""
        eos = tokens[eos_token_ids[0]] if eos_token_ids else ""
        generate["chat"] = chat_pieces(chat_template, bos, eos)
    # Format 2: the program takes state inputs past the client's, which an
    # aotid that predates them refuses at build (its input count differs).
    extra = {"format": 2 if state else 1, **names, **({"state_inputs": state} if state else {}),
             "metadata": dict(metadata or {}), "generate": generate,
             "inductor_options": _package_options(BUILD_OPTIONS if inductor_configs is None else inductor_configs)}
    torch.export.save(ep, path, extra_files={AOTID_EXTRA_FILE: json.dumps(extra),
                                             TOKENIZER_EXTRA_FILE: json.dumps(tokenizer)})
    where = "made by aotid when it loads the model" if state else "zeros in the package"
    print(f"aotid_export: {cache_size_line(model)}, {where}", file=sys.stderr)
    return ep


class _CacheAsInputs(torch.nn.Module):
    """``model`` with its cache given: ``forward(tokens, input_pos[, slots],
    k_cache_0, v_cache_0, ...)``, one tensor per layer's keys and values (one
    stacked tensor would have AOTInductor copy it whole every call)."""

    def __init__(self, model: Llama, slotted: bool):
        super().__init__()
        self.model, self.slotted = model, slotted

    def forward(self, tokens, input_pos, *rest):
        slots, caches = (rest[0], rest[1:]) if self.slotted else (None, rest)
        return self.model(tokens, input_pos, slots, caches=caches)


@contextlib.contextmanager
def _cache_buffers_out(model: Llama):
    """The model without its cache buffers for a while, given back after."""
    held = [(layer.attention, layer.attention.k_cache, layer.attention.v_cache) for layer in model.layers]
    try:
        for a, _, _ in held:
            a.k_cache = a.v_cache = None
        yield
    finally:
        for a, k, v in held:
            a.k_cache, a.v_cache = k, v


def program_module(path: str) -> torch.nn.Module:
    """The exported program of the causal LM package at ``path`` as a
    stateful module, the way aotid runs it: called with the client's inputs
    alone, it holds the state inputs its aotid.json lists, zeros at first.
    A package without state inputs gives its program's own ``module()``."""
    from torch.export.pt2_archive._package import load_pt2

    contents = load_pt2(path)
    text = contents.extra_files.get(AOTID_EXTRA_FILE) or "{}"
    state = json.loads(text.decode() if isinstance(text, bytes) else text).get("state_inputs") or []
    return _StatefulProgram(contents.exported_programs["model"].module(),
                            [torch.zeros(s["shape"], dtype=getattr(torch, s["dtype"])) for s in state])


class _StatefulProgram(torch.nn.Module):
    def __init__(self, program: torch.nn.Module, state: list[torch.Tensor]):
        super().__init__()
        self.program, self.state = program, state

    def forward(self, *inputs):
        return self.program(*inputs, *self.state)


def cache_size_line(model: Llama) -> str:
    """What the key/value cache costs, per sequence slot and in all."""
    c, per_slot = model.config, model.cache_bytes_per_sequence()
    dtype = str(model.layers[0].attention.k_cache.dtype).removeprefix("torch.")
    return (f"key/value cache {_mb(per_slot)} per sequence ({c.n_layers} layers x keys and values x "
            f"{c.n_kv_heads} heads x {c.max_seq_len} positions x {c.head_dim} {dtype}), "
            f"{c.max_sequences} sequence{'s' if c.max_sequences > 1 else ''}: {_mb(per_slot * c.max_sequences)}")


def _mb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"
