"""aotid_export.llm.export_causal_lm refuses, with the reason and before
writing anything, what aotid would only refuse at load after a whole build:
a tokenizer that is not byte-level BPE or lacks its lists, one with more
tokens than the model's vocabulary (its ids would index the embedding out
of bounds and crash the runner), end and start tokens outside it, and a
max_prefill or a number of sequence slots under 1. A refused export leaves
the model as it was.

    llm_export_refusals_test.py
"""
import os
import tempfile

import torch

from aotid_export import llm

TOKENIZER = {"type": "byte_level_bpe", "pre_tokenizer": [llm.GPT2_PATTERN], "tokens": ["a", "b", "c", "ab"],
             "merges": ["a b"], "special": []}


def main():
    cfg = llm.LlamaConfig(vocab_size=4, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=32, max_seq_len=8)
    model = llm.Llama(cfg).eval()
    cases = [
        ({"tokenizer": {**TOKENIZER, "type": "sentencepiece"}}, "tokenizer type 'sentencepiece'"),
        ({"tokenizer": {k: v for k, v in TOKENIZER.items() if k != "merges"}}, "no 'merges' list"),
        ({"tokenizer": {**TOKENIZER, "tokens": TOKENIZER["tokens"] + ["x"]}},
         "the tokenizer has 5 tokens, the model's vocabulary only 4"),
        ({"eos_token_ids": [9]}, "eos_token_ids: 9 is not a token"),
        ({"bos_token_id": -1}, "bos_token_id: -1 is not a token"),
        ({"max_prefill": 0}, "max_prefill must be at least 1"),
        ({"max_sequences": 0}, "max_sequences must be a whole number of at least 1"),
        # Refused before the model's cache is resized to the slots asked for.
        ({"eos_token_ids": [9], "max_sequences": 2}, "eos_token_ids: 9 is not a token"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lm.pt2")
        for change, why in cases:
            args = {"tokenizer": TOKENIZER, "eos_token_ids": [2], **change}
            try:
                llm.export_causal_lm(model, path, **args)
                raise AssertionError(f"exported with {change}")
            except ValueError as e:
                assert why in str(e), (why, str(e))
            assert not os.path.exists(path), change
            assert model.config.max_sequences == 1 and model.layers[0].attention.k_cache.shape[0] == 1, change
        llm.export_causal_lm(model, path, tokenizer=TOKENIZER, eos_token_ids=[2], bos_token_id=0)
        assert os.path.getsize(path) > 0
    print(f"ok: {len(cases)} refusals, and the good export written")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
