"""Exports a Hugging Face model folder (``config.json`` and its weights, as
``save_pretrained`` writes it) as a package aotid serves:

    aotid-export hf ./bert-folder --task feature-extraction -o bert.pt2
    aotid-export hf ./vit-folder --task image-classification -o vit.pt2
    aotid-export hf ./llama-folder --task text-generation -o llama.pt2

Nothing is fetched: the folder is read with ``local_files_only``, and a
folder that names weights it does not hold is an error, and so is one that
lacks weights the task needs (a plain ``BertModel`` folder asked for
``fill-mask`` has no head: transformers would make one at random; the error
names the task the folder's architecture suggests, and
``--allow-new-weights`` exports it anyway). transformers is an
optional extra (``pip install 'aotid-export[hf]'``); the device that serves
the package needs none of it.

The task picks the class (``AutoModel``, ``AutoModelFor...``), and the
model's main input picks the example inputs, their typical sizes and which
dims are dynamic:

* text (``input_ids``): ``input_ids`` and ``attention_mask`` (and
  ``token_type_ids`` where the model has token types), int64, batch 1 and
  16 tokens; batch and seq dynamic, seq up to the model's positions. An
  encoder-decoder adds ``decoder_input_ids`` (its own ``decoder_seq``).
* images (``pixel_values``): batch 1 at the config's image size and
  channels; batch dynamic.
* speech as samples (``input_values``, wav2vec2 and its kind): one second
  at 16 kHz; batch and samples dynamic, samples from the fewest that give
  the encoder two frames.
* speech as features (``input_features``, Whisper): the fixed window the
  encoder takes; batch dynamic.

``--dynamic`` chooses among those dims (``--dynamic batch`` fixes seq at
the example's size). Outputs are named from the model's output fields
(``last_hidden_state``, ``logits`` ...). The served model has no key/value
cache (``use_cache`` off): each request is whole.

``text-generation`` with a Llama-family folder (Llama, Mistral, Phi-3)
writes a ``generate`` package instead, as ``examples/smollm2`` does: the
weights go into ``aotid_export.llm.Llama`` (its cache made by aotid when it
loads the model), with the byte-level BPE tokenizer from ``tokenizer.json``,
the end tokens and the chat template; ``--max-sequences N`` gives its cache
N sequence slots (default 4). A folder it cannot take that way (Qwen2's attention biases,
Phi-2's layout, scaled rotary embeddings, a SentencePiece tokenizer) is
refused with the reason; ``--no-generate`` exports the forward pass alone.
Other causal models (GPT-2 ...) export their forward pass: logits for every
position.

``feature-extraction`` or ``sentence-similarity`` with a sentence-transformers
folder (a ``modules.json``: Transformer, Pooling, and Normalize or not)
writes an embedding package (``aotid_export.embed``): the encoder with its
pooling (``1_Pooling/config.json``: mean, CLS or last token) and
normalisation in the graph, its WordPiece ``tokenizer.json`` and its
``max_seq_length``; ``--matryoshka`` for a model trained to be cut to its
first dimensions. ``--no-embed`` exports the encoder's forward pass alone.

aotid runs a tokenizer for the ``generate`` routes (byte-level BPE) and for
embedding packages (WordPiece): other packages take token ids, and the
command says so.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from typing import Any

import torch

__all__ = ["TASKS", "load_folder", "example_inputs", "export_folder", "llama_from_hf", "tokenizer_from_folder",
           "main"]

INSTALL_HINT = "pip install 'aotid-export[hf]'"  # quoted: zsh would read [hf] as a glob

# Task -> the transformers Auto class that loads it.
TASKS = {
    "feature-extraction": "AutoModel",
    "sentence-similarity": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "fill-mask": "AutoModelForMaskedLM",
    "question-answering": "AutoModelForQuestionAnswering",
    "text-generation": "AutoModelForCausalLM",
    "text2text-generation": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
    "audio-classification": "AutoModelForAudioClassification",
    "automatic-speech-recognition": "AutoModelForSpeechSeq2Seq",
}

# Families whose text-generation folder becomes a generate package.
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "phi3", "phi")

MAX_BATCH = 256
TEXT_BATCH, TEXT_SEQ, DECODER_SEQ = 1, 16, 4
SAMPLE_RATE = 16000


class HfExportError(Exception):
    """The folder cannot be exported as asked; the message says why."""


def _transformers():
    try:
        import transformers
    except ImportError:
        raise HfExportError("exporting a Hugging Face folder needs transformers, an optional extra: "
                            f"{INSTALL_HINT}") from None
    return transformers


def _task_of(transformers, config) -> str | None:
    """The task whose Auto class loads the folder's own architecture
    (``config.architectures``), if one does."""
    for arch in getattr(config, "architectures", None) or []:
        for task, auto_name in TASKS.items():
            try:
                if getattr(transformers, auto_name)._model_mapping[type(config)].__name__ == arch:
                    return task
            except (AttributeError, KeyError, ValueError):
                continue
    return None


def model_folder(path: str) -> str:
    """The model folder ``path`` names: the folder itself, or the folder of
    its config.json when given that file; else HfExportError saying what to
    pass."""
    if os.path.isfile(path):
        if os.path.basename(path) == "config.json":
            return os.path.dirname(os.path.abspath(path))
        raise HfExportError(f"{path}: a file; give the model folder, the one that holds config.json and the "
                            f"weights (as save_pretrained writes it)")
    if not os.path.isdir(path):
        raise HfExportError(f"{path}: no such folder; give the model folder, the one that holds config.json and "
                            "the weights")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise HfExportError(f"{path}: no config.json; give the model folder, the one that holds config.json and "
                            "the weights (as save_pretrained writes it)")
    return path


def load_folder(path: str, task: str, allow_new_weights: bool = False) -> torch.nn.Module:
    """The folder's model for ``task``, in eval mode, read from the folder
    alone (``local_files_only``). Weights the task's class needs that the
    folder lacks (a head transformers would initialize at random) are
    refused unless ``allow_new_weights``."""
    if task not in TASKS:
        raise HfExportError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")
    path = model_folder(path)
    transformers = _transformers()
    auto = getattr(transformers, TASKS[task])
    try:
        model, info = auto.from_pretrained(path, local_files_only=True, dtype=torch.float32,
                                           output_loading_info=True)
    except (OSError, ValueError, KeyError) as e:
        raise HfExportError(f"{path}: transformers cannot load it for {task} ({TASKS[task]}): {e}") from None
    new = sorted(set(info.get("missing_keys") or ()) | {k[0] if isinstance(k, tuple) else k
                                                         for k in info.get("mismatched_keys") or ()})
    if new and not allow_new_weights:
        suggested = _task_of(transformers, model.config)
        archs = ", ".join(getattr(model.config, "architectures", None) or []) or "not named in config.json"
        hint = (f"; the folder's architecture ({archs}) suggests --task {suggested}" if suggested and
                suggested != task else f"; the folder's architecture is {archs}")
        raise HfExportError(f"{path}: {len(new)} weights {type(model).__name__} needs for {task} are not in the "
                            f"folder and would be newly initialized at random ({', '.join(new[:4])}"
                            f"{', ...' if len(new) > 4 else ''}){hint}; --allow-new-weights exports them anyway")
    return model.eval()


def _config_get(config, *names, default=None):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def _params(model) -> list[str]:
    return list(inspect.signature(model.forward).parameters)


# Families whose positions count from padding_idx + 1: their table holds
# that many fewer tokens than max_position_embeddings says.
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "data2vec-text")


def _max_positions(config) -> int | None:
    most = _config_get(config, "max_position_embeddings", "n_positions", "max_target_positions")
    if most and getattr(config, "model_type", "") in _OFFSET_POSITIONS:
        most -= int(getattr(config, "pad_token_id", 1) or 0) + 1
    return most


def _image_size(config, folder: str | None) -> tuple[int, int]:
    size = _config_get(config, "image_size")
    if size is None and folder:
        try:
            with open(os.path.join(folder, "preprocessor_config.json")) as f:
                pre = json.load(f)
            size = pre.get("crop_size") or pre.get("size")
        except (OSError, ValueError):
            pass
    if isinstance(size, dict):
        size = (size.get("height") or size.get("shortest_edge"), size.get("width") or size.get("shortest_edge"))
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    return (int(size), int(size)) if size else (224, 224)


def _fewest_samples(config) -> int:
    """The fewest samples for which the conv feature encoder gives two
    frames: one frame specializes the attention that follows."""
    kernels, strides = _config_get(config, "conv_kernel"), _config_get(config, "conv_stride")
    if not kernels or not strides:
        return 400
    n = 1
    while True:
        frames = n
        for k, s in zip(kernels, strides):
            frames = (frames - k) // s + 1 if frames >= k else 0
        if frames >= 2:
            return n
        n += 1


def example_inputs(model: torch.nn.Module, dynamic: list[str] | None = None, folder: str | None = None):
    """``(inputs, dynamic_shapes, dims)`` for ``model``: keyword example
    inputs (typical sizes), torch.export's dynamic shapes by input name, and
    the names of the dims made dynamic. ``dynamic`` names the dims to make
    dynamic (default: all the input kind has)."""
    from torch.export import Dim

    config = model.config
    main = getattr(model, "main_input_name", "input_ids")
    params = _params(model)
    g = torch.Generator().manual_seed(0)
    inputs: dict[str, torch.Tensor] = {}
    shape_dims: dict[str, dict[int, str]] = {}
    ranges: dict[str, tuple[int, int]] = {"batch": (1, MAX_BATCH)}
    if main == "input_ids":
        vocab = int(config.vocab_size)
        most = _max_positions(config) or 512
        seq = min(TEXT_SEQ, most)
        ranges["seq"] = (1, most)
        inputs["input_ids"] = torch.randint(0, vocab, (TEXT_BATCH, seq), generator=g)
        shape_dims["input_ids"] = {0: "batch", 1: "seq"}
        if "attention_mask" in params:
            inputs["attention_mask"] = torch.ones(TEXT_BATCH, seq, dtype=torch.int64)
            shape_dims["attention_mask"] = {0: "batch", 1: "seq"}
        if "token_type_ids" in params and (_config_get(config, "type_vocab_size", default=0) or 0) > 1:
            inputs["token_type_ids"] = torch.zeros(TEXT_BATCH, seq, dtype=torch.int64)
            shape_dims["token_type_ids"] = {0: "batch", 1: "seq"}
        if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
            ranges["decoder_seq"] = (1, _config_get(config, "max_target_positions", default=most))
            inputs["decoder_input_ids"] = torch.randint(0, vocab, (TEXT_BATCH, DECODER_SEQ), generator=g)
            shape_dims["decoder_input_ids"] = {0: "batch", 1: "decoder_seq"}
    elif main == "pixel_values":
        h, w = _image_size(config, folder)
        channels = int(_config_get(config, "num_channels", default=3))
        inputs["pixel_values"] = torch.randn(1, channels, h, w, generator=g)
        shape_dims["pixel_values"] = {0: "batch"}
    elif main == "input_values":
        ranges["samples"] = (_fewest_samples(config), 30 * SAMPLE_RATE)
        inputs["input_values"] = torch.randn(1, SAMPLE_RATE, generator=g)
        shape_dims["input_values"] = {0: "batch", 1: "samples"}
    elif main == "input_features":
        bins = int(_config_get(config, "num_mel_bins", default=80))
        frames = 2 * int(_config_get(config, "max_source_positions", default=1500))
        inputs["input_features"] = torch.randn(1, bins, frames, generator=g)
        shape_dims["input_features"] = {0: "batch"}
        if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
            ranges["decoder_seq"] = (1, int(_config_get(config, "max_target_positions", default=448)))
            inputs["decoder_input_ids"] = torch.randint(0, int(config.vocab_size), (1, DECODER_SEQ), generator=g)
            shape_dims["decoder_input_ids"] = {0: "batch", 1: "decoder_seq"}
    else:
        raise HfExportError(f"{type(model).__name__} takes {main!r} first, an input this command does not "
                            "know how to make; export the module with aotid_export.export and your own example")
    has = sorted({d for dims in shape_dims.values() for d in dims.values()}, key=list(ranges).index)
    if dynamic is None:
        chosen = has
    else:
        # decoder_seq follows seq: asking for seq asks for both.
        chosen = [d for d in has if d in dynamic or (d == "decoder_seq" and "seq" in dynamic)]
        unknown = [d for d in dynamic if d not in has]
        if unknown:
            raise HfExportError(f"--dynamic {','.join(dynamic)}: {type(model).__name__}'s inputs have the dims "
                                f"{', '.join(has)}, not {', '.join(unknown)}")
    dims = {d: Dim(d, min=ranges[d][0], max=ranges[d][1]) for d in chosen}
    dynamic_shapes = {name: {i: dims[d] for i, d in per.items() if d in dims} or None
                      for name, per in shape_dims.items()}
    return inputs, dynamic_shapes, chosen


def export_folder(path: str, task: str, out: str, *, dynamic: list[str] | None = None, generate: bool = True,
                  max_seq_len: int | None = None, format: str = "exported_program", say=print,
                  allow_new_weights: bool = False, embed: bool = True, matryoshka: bool = False,
                  max_sequences: int | None = None) -> None:
    """``aotid-export hf``: the folder's model for ``task`` written to
    ``out``; what it chose and left out goes to ``say``. ``max_seq_len``:
    a generate package's context (default 2048), an embedding package's
    truncation (default the folder's ``max_seq_length``).
    ``max_sequences``: the sequences a generate package's cache holds at
    once (default 4). ``path`` may be the folder's config.json."""
    path = model_folder(path)
    if max_sequences is not None and max_sequences < 1:
        raise HfExportError(f"--max-sequences {max_sequences}: a generate package holds at least 1 sequence")
    if max_sequences is not None and not (task == "text-generation" and generate):
        raise HfExportError("--max-sequences is for generate packages (--task text-generation)")
    if task in EMBED_TASKS and embed:
        layout = sentence_transformers_layout(path)
        if layout is not None:
            _export_embedding(path, layout, out, max_seq_len, matryoshka, allow_new_weights, say)
            return
        if task == "sentence-similarity":
            raise HfExportError(f"{path}: no modules.json, so not a sentence-transformers folder: its pooling "
                                "is not known; export it with aotid_export.embed.export_sentence_encoder, "
                                "naming the pooling, or use --task feature-extraction for the token vectors")
    if matryoshka:
        raise HfExportError("--matryoshka is for embedding packages (a sentence-transformers folder)")
    model = load_folder(path, task, allow_new_weights)
    config = model.config
    family = getattr(config, "model_type", "")
    if task == "text-generation" and generate:
        if family in LLAMA_FAMILY:
            _export_generate(model, path, out, max_seq_len or 2048, max_sequences or 4, say)
            return
        if max_sequences is not None:
            raise HfExportError(f"--max-sequences: {family} is exported as its forward pass, which has no cache")
        say(f"{family}: aotid's generate routes take Llama-family models (llama, mistral, phi3); this package "
            "is the forward pass alone: logits for every position, no cache")
    inputs, dynamic_shapes, chosen = example_inputs(model, dynamic, path)
    # A cache is state across calls that a served forward pass does not keep.
    if "use_cache" in _params(model):
        inputs["use_cache"] = False  # traced as a constant, not an input
    elif hasattr(config, "use_cache"):
        config.use_cache = False
    from . import export

    metadata = {"source": "huggingface", "task": task, "model_type": family,
                "architecture": type(model).__name__}
    export(model, inputs, out, dynamic_shapes=dynamic_shapes, metadata=metadata, format=format)
    sizes = ", ".join(f"{n} {list(t.shape)}" for n, t in inputs.items() if isinstance(t, torch.Tensor))
    say(f"exported {type(model).__name__} for {task}: inputs {sizes}; dynamic: {', '.join(chosen) or 'none'}")
    say(_tokenizer_note(path))


def _tokenizer_note(path: str) -> str:
    kind = _tokenizer_kind(path)
    if kind is None:
        return "tokenizer: none in the folder"
    if kind == "wordpiece":
        return ("tokenizer not packed: aotid runs WordPiece for embedding packages only (a sentence-transformers "
                "folder, --task sentence-similarity); requests send token ids")
    return f"tokenizer not packed: aotid runs tokenizers for generate models only; requests send token ids ({kind})"


# The embedding package: a sentence-transformers folder's modules.

EMBED_TASKS = ("feature-extraction", "sentence-similarity")
_ST_POOLING = {"mean": "mean", "mean_tokens": "mean", "cls": "cls", "cls_token": "cls", "lasttoken": "last_token"}


def _read_json(file: str, what: str):
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except OSError:
        return None
    except ValueError as e:
        raise HfExportError(f"{file}: {what} is not JSON: {e}") from None


def sentence_transformers_layout(path: str) -> dict | None:
    """What a sentence-transformers folder's ``modules.json`` says, or None
    when it has none: ``{"transformer": folder, "pooling": "mean" | "cls" |
    "last_token", "normalize": bool, "max_seq_len": int | None}``.
    HfExportError for modules aotid does not run (Dense, max pooling ...)."""
    modules = _read_json(os.path.join(path, "modules.json"), "modules.json")
    if modules is None:
        return None
    if not isinstance(modules, list):
        raise HfExportError(f"{path}/modules.json is not a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise HfExportError(f"{path}: the modules are {', '.join(kinds)}; aotid exports Transformer, Pooling and "
                            "(optionally) Normalize, in that order")
    transformer = os.path.join(path, modules[0].get("path") or "")
    pool_dir = os.path.join(path, modules[1].get("path") or "")
    pool = _read_json(os.path.join(pool_dir, "config.json"), "the pooling config")
    if pool is None:
        raise HfExportError(f"{pool_dir}: no config.json, so the pooling is not known")
    if "pooling_mode" in pool:
        modes = [str(pool["pooling_mode"])]
    else:
        modes = [k[len("pooling_mode_"):] for k, v in pool.items() if k.startswith("pooling_mode_") and v is True]
    if len(modes) != 1 or modes[0] not in _ST_POOLING:
        raise HfExportError(f"{pool_dir}/config.json pools by {' + '.join(modes) or 'nothing'}; aotid pools by "
                            "the mean, the CLS token or the last token, one of them")
    bert = _read_json(os.path.join(transformer, "sentence_bert_config.json"), "sentence_bert_config.json") or {}
    most = bert.get("max_seq_length")
    return {"transformer": transformer, "pooling": _ST_POOLING[modes[0]], "normalize": "Normalize" in kinds,
            "max_seq_len": int(most) if most else None, "lower_case": bool(bert.get("do_lower_case"))}


def _export_embedding(path: str, layout: dict, out: str, max_seq_len: int | None, matryoshka: bool,
                      allow_new_weights: bool, say) -> None:
    from .embed import export_sentence_encoder

    folder = layout["transformer"]
    model = load_folder(folder, "feature-extraction", allow_new_weights)
    try:
        with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
            tokenizer = f.read()
    except OSError:
        raise HfExportError(f"{folder}: no tokenizer.json; an embedding package needs the tokenizer") from None
    normalizer = json.loads(tokenizer).get("normalizer") or {}
    if layout["lower_case"] and not normalizer.get("lowercase"):
        raise HfExportError(f"{folder}: sentence_bert_config.json lower-cases the text before the tokenizer, "
                            "which aotid's tokenizer does not (its normalizer does not lower-case)")
    positions = _max_positions(model.config)
    most = max_seq_len or layout["max_seq_len"] or positions
    if positions and most > positions:
        if max_seq_len:
            raise HfExportError(f"--max-seq-len {max_seq_len}: the encoder has {positions} positions")
        most = positions
    metadata = {"source": "huggingface", "task": "sentence-similarity", "model_type": model.config.model_type,
                "architecture": type(model).__name__}
    try:
        export_sentence_encoder(model, out, tokenizer=tokenizer, max_seq_len=most, pooling=layout["pooling"],
                                normalize=layout["normalize"], truncatable_dims=matryoshka,
                                max_positions=positions, metadata=metadata)
    except ValueError as e:
        if type(e) is not ValueError:
            raise
        raise HfExportError(str(e)) from None
    say(f"exported {type(model).__name__} as an embedding package: {layout['pooling']} pooling, "
        f"{'normalized' if layout['normalize'] else 'not normalized'}, up to {most} tokens, WordPiece tokenizer"
        + (", dimensions truncatable (Matryoshka)" if matryoshka else ""))


def _tokenizer_kind(path: str) -> str | None:
    try:
        with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
            tok = json.load(f)
    except OSError:
        return "wordpiece" if os.path.exists(os.path.join(path, "vocab.txt")) else None
    except ValueError:
        return "an unreadable tokenizer.json"
    kind = str((tok.get("model") or {}).get("type", "unknown"))
    return "wordpiece" if kind == "WordPiece" else kind


# The generate package: the folder's weights in aotid_export.llm.Llama.

def _llama_config(config, max_seq_len: int):
    from .llm import LlamaConfig

    family = config.model_type
    why = []
    if family in ("qwen2",):
        why.append("its attention projections have biases, which aotid_export.llm.Llama has not")
    if family == "phi":
        why.append("Phi-1/2 use LayerNorm, a GELU MLP, partial rotary embeddings and biases, "
                   "not the Llama layout aotid_export.llm.Llama has")
    if why:
        raise HfExportError(f"{family}: no generate package: " + "; ".join(why))
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        why.append("its projections have biases")
    if getattr(config, "hidden_act", "silu") != "silu":
        why.append(f"its MLP uses {config.hidden_act}, not SwiGLU (silu)")
    dim, heads = int(config.hidden_size), int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or dim // heads
    if head_dim * heads != dim:
        why.append(f"its heads are {head_dim} wide, not hidden_size / heads = {dim // heads}")
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        why.append(f"its rotary embeddings are scaled ({rope_type!r}); aotid_export.llm.Llama has plain RoPE")
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    if partial != 1.0:
        why.append(f"its rotary embeddings cover {partial} of each head, not all of it")
    if why:
        raise HfExportError(f"{family}: no generate package: " + "; ".join(why))
    most = min(max_seq_len, int(config.max_position_embeddings))
    window = getattr(config, "sliding_window", None)
    if window:  # within the window, sliding-window attention is full attention
        most = min(most, int(window))
    theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return LlamaConfig(vocab_size=int(config.vocab_size), dim=dim, n_layers=int(config.num_hidden_layers),
                       n_heads=heads, n_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
                       hidden_dim=int(config.intermediate_size), max_seq_len=most,
                       norm_eps=float(config.rms_norm_eps), rope_theta=float(theta),
                       tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)))


def _interleave(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a query or key projection reordered from transformers' rotary
    layout (each head's first half, then its second) to llm.Llama's pairs
    (2i, 2i+1)."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


@torch.no_grad()
def llama_from_hf(model: torch.nn.Module, max_seq_len: int = 2048):
    """An ``aotid_export.llm.Llama`` holding a transformers Llama, Mistral or
    Phi-3 causal LM's weights (HfExportError when the family's layout is not
    Llama's)."""
    from .llm import Llama

    c = _llama_config(model.config, max_seq_len)
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    hd, kv = c.head_dim, c.n_kv_heads * c.head_dim
    out = {"tok_embeddings.weight": state.pop("model.embed_tokens.weight"),
           "norm.weight": state.pop("model.norm.weight")}
    head = state.pop("lm_head.weight", None)
    if not c.tie_embeddings:
        out["output.weight"] = head
    for i in range(c.n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        if p + "self_attn.qkv_proj.weight" in state:  # Phi-3: fused
            wq, wk, wv = state.pop(p + "self_attn.qkv_proj.weight").split([c.n_heads * hd, kv, kv])
        else:
            wq, wk, wv = (state.pop(p + f"self_attn.{n}_proj.weight") for n in "qkv")
        if p + "mlp.gate_up_proj.weight" in state:
            gate, up = state.pop(p + "mlp.gate_up_proj.weight").chunk(2)
        else:
            gate, up = state.pop(p + "mlp.gate_proj.weight"), state.pop(p + "mlp.up_proj.weight")
        out.update({
            q + "attention.wq.weight": _interleave(wq, c.n_heads),
            q + "attention.wk.weight": _interleave(wk, c.n_kv_heads),
            q + "attention.wv.weight": wv,
            q + "attention.wo.weight": state.pop(p + "self_attn.o_proj.weight"),
            q + "feed_forward.w1.weight": gate,
            q + "feed_forward.w3.weight": up,
            q + "feed_forward.w2.weight": state.pop(p + "mlp.down_proj.weight"),
            q + "attention_norm.weight": state.pop(p + "input_layernorm.weight"),
            q + "ffn_norm.weight": state.pop(p + "post_attention_layernorm.weight"),
        })
    left = [k for k in state if not k.endswith("rotary_emb.inv_freq")]
    if left:
        raise HfExportError(f"{model.config.model_type}: weights aotid_export.llm.Llama has no place for: "
                            f"{', '.join(left[:5])}")
    llama = Llama(c)
    missing, unexpected = llama.load_state_dict(out, strict=False)
    missing = [m for m in missing if not (c.tie_embeddings and m == "output.weight")]
    if missing or unexpected:
        raise HfExportError(f"weights do not fit aotid_export.llm.Llama: missing {missing}, unexpected {unexpected}")
    return llama.eval()


def _pattern(pre: dict | None) -> list[str]:
    """aotid's pre-tokenizer patterns for a tokenizer.json pre_tokenizer."""
    from .llm import GPT2_PATTERN

    if pre is None:
        return []
    kind = pre.get("type")
    if kind == "Sequence":
        return [p for step in pre.get("pretokenizers", []) for p in _pattern(step)]
    if kind == "ByteLevel":
        if pre.get("add_prefix_space"):
            raise HfExportError("the tokenizer adds a space before the text (ByteLevel add_prefix_space), "
                                "which aotid's tokenizer does not")
        return [GPT2_PATTERN] if pre.get("use_regex", True) else []
    if kind == "Digits":
        return [r"\p{N}" if pre.get("individual_digits") else r"\p{N}+"]
    if kind == "Split" and pre.get("behavior") == "Isolated" and not pre.get("invert"):
        regex = (pre.get("pattern") or {}).get("Regex")
        if isinstance(regex, str):
            return [regex]
    raise HfExportError(f"the tokenizer's pre-tokenizer {kind!r} ({json.dumps(pre)[:120]}) is not one aotid's "
                        "tokenizer runs (byte-level BPE: ByteLevel, Digits, Split by a regex)")


def tokenizer_from_folder(path: str) -> dict:
    """aotid's tokenizer description from the folder's tokenizer.json, or
    HfExportError saying why aotid cannot run it."""
    file = os.path.join(path, "tokenizer.json")
    try:
        with open(file, encoding="utf-8") as f:
            tok = json.load(f)
    except OSError:
        raise HfExportError(f"{path}: no tokenizer.json; a generate package needs the tokenizer") from None
    model = tok.get("model") or {}
    kind = model.get("type")
    if kind != "BPE":
        raise HfExportError(f"the tokenizer is {kind}; aotid runs byte-level BPE tokenizers only")
    if model.get("byte_fallback") or tok.get("normalizer") is not None:
        raise HfExportError("the tokenizer is SentencePiece-style BPE (a normalizer, or byte fallback), not "
                            "byte-level BPE, which is the one aotid runs")
    decoder = json.dumps(tok.get("decoder"))
    if '"ByteLevel"' not in decoder:
        raise HfExportError("the tokenizer's decoder is not ByteLevel: not byte-level BPE, the one aotid runs")
    patterns = _pattern(tok.get("pre_tokenizer"))
    by_id = {int(i): t for t, i in model.get("vocab", {}).items()}
    added = tok.get("added_tokens") or []
    for a in added:
        by_id[int(a["id"])] = a["content"]
    n = max(by_id) + 1 if by_id else 0
    if len(by_id) != n:
        raise HfExportError(f"the tokenizer's ids are not 0..{n - 1} without gaps")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return {"type": "byte_level_bpe", "pre_tokenizer": patterns, "tokens": [by_id[i] for i in range(n)],
            "merges": merges, "special": sorted(int(a["id"]) for a in added)}


def _export_generate(model, path: str, out: str, max_seq_len: int, max_sequences: int, say) -> None:
    from .llm import chat_pieces, export_causal_lm

    transformers = _transformers()
    llama = llama_from_hf(model, max_seq_len)
    tok = tokenizer_from_folder(path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    eos = set()
    gen = getattr(model, "generation_config", None)
    for ids in (getattr(gen, "eos_token_id", None), model.config.eos_token_id, hf_tok.eos_token_id):
        eos.update([ids] if isinstance(ids, int) else (ids or []))
    bos = hf_tok.bos_token_id
    first = hf_tok("a")["input_ids"]
    bos = bos if bos is not None and first and first[0] == bos else None
    template = hf_tok.chat_template if isinstance(hf_tok.chat_template, str) else None
    if template:
        try:
            chat_pieces(template, tok["tokens"][bos] if bos is not None else "",
                        tok["tokens"][min(eos)] if eos else "")
        except ValueError as e:
            say(f"chat template not packed ({e}); generate takes text_input and input_ids, not messages")
            template = None
    metadata = {"source": "huggingface", "task": "text-generation", "model_type": model.config.model_type,
                "architecture": type(model).__name__}
    export_causal_lm(llama, out, tokenizer=tok, eos_token_ids=sorted(eos), bos_token_id=bos,
                     chat_template=template, metadata=metadata, max_sequences=max_sequences)
    say(f"exported {type(model).__name__} as a generate package: context {llama.config.max_seq_len}, "
        f"byte-level BPE tokenizer of {len(tok['tokens'])} tokens, end tokens {sorted(eos)}"
        + (", chat template" if template else "")
        + f"; a cache for {max_sequences} sequence{'s' if max_sequences > 1 else ''} at once")


def main(argv: list[str] | None = None) -> int:
    from . import ExportError, _out_folder_problem

    p = argparse.ArgumentParser(prog="aotid-export hf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="a local model folder (config.json and weights), or its config.json")
    p.add_argument("--task", required=True, choices=list(TASKS))
    p.add_argument("--dynamic", default=None, metavar="DIMS",
                   help="the dims to make dynamic, comma-separated (batch, seq, samples); default all the "
                        "task's; 'none' for none")
    p.add_argument("--no-generate", action="store_true",
                   help="text-generation: export the forward pass alone, not a generate package")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="a generate package's context (its cache is sized for it; default 2048), or where an "
                        "embedding package truncates a text's tokens (default the folder's max_seq_length)")
    p.add_argument("--max-sequences", type=int, default=None,
                   help="a generate package: the sequences its cache holds at once, one slot each "
                        "(default 4; docs/GENERATE.md, \"Several sequences\")")
    p.add_argument("--no-embed", action="store_true",
                   help="feature-extraction on a sentence-transformers folder: export the encoder's token "
                        "vectors, not an embedding package")
    p.add_argument("--matryoshka", action="store_true",
                   help="an embedding package whose model was trained to be cut to its first dimensions: "
                        "requests may ask for fewer dimensions")
    p.add_argument("--format", default="exported_program", choices=("exported_program", "aoti", "aoti_source"))
    p.add_argument("--allow-new-weights", action="store_true",
                   help="export even when weights the task needs are not in the folder (they would be random)")
    p.add_argument("-o", "--out", required=True)
    args = p.parse_args(argv)
    problem = _out_folder_problem(args.out)
    if problem:
        raise SystemExit(f"aotid-export hf: {problem}")
    dynamic = None
    if args.dynamic is not None:
        dynamic = [] if args.dynamic == "none" else [d.strip() for d in args.dynamic.split(",") if d.strip()]

    def say(line):
        print(line, file=sys.stderr)

    try:
        export_folder(args.path, args.task, args.out, dynamic=dynamic, generate=not args.no_generate,
                      max_seq_len=args.max_seq_len, format=args.format, say=say,
                      allow_new_weights=args.allow_new_weights, embed=not args.no_embed,
                      matryoshka=args.matryoshka, max_sequences=args.max_sequences)
    except HfExportError as e:
        raise SystemExit(f"aotid-export hf: {e}") from None
    except ExportError as e:  # the worker could not load what was written: said, no traceback
        raise SystemExit(f"aotid-export hf: {e}") from None
    say(f"wrote {args.out}")
    return 0
