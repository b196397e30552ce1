"""aotid_export.llm.quantize_int8, in eager PyTorch: every Linear becomes
int8 rows with a bfloat16 scale each, a row dequantizes to within half a
step of the float weight, tied embeddings keep one copy, and the quantized
model's logits stay close to the float model's.

    llm_int8_test.py
"""
import copy

import torch

from aotid_export import llm


def main():
    torch.manual_seed(3)
    cfg = llm.LlamaConfig(vocab_size=211, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128,
                          max_seq_len=32)
    model = llm.Llama(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    floats = {n: m.weight.detach().clone() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    reference = copy.deepcopy(model)
    assert llm.quantize_int8(model) is model

    # Every Linear is now int8 with a bfloat16 scale per output row.
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    for name, w in floats.items():
        q = model.get_submodule(name)
        assert isinstance(q, llm.Int8Linear), name
        assert q.weight.dtype == torch.int8 and q.weight.shape == w.shape, name
        assert q.scales.dtype == torch.bfloat16 and q.scales.shape == (w.shape[0],), name
        assert int(q.weight.abs().max()) <= 127, name
        # Each row's largest magnitude uses (nearly) the whole int8 range.
        assert int(q.weight.abs().amax(dim=1).min()) >= 126, name
        step = q.scales.float().unsqueeze(1)
        err = (q.weight.float() * step - w).abs()
        assert bool((err <= step / 2 + 1e-6).all()), f"{name}: {float((err / step).max())} steps off"

    # Tied: the embedding reads the output's own int8 rows and scales.
    emb = model.tok_embeddings
    assert isinstance(emb, llm.Int8Embedding)
    assert emb.weight.data_ptr() == model.output.weight.data_ptr()
    assert emb.scales.data_ptr() == model.output.scales.data_ptr()
    tokens = torch.tensor([[5, 0, 210, 17]])
    want = model.output.weight[tokens[0]].float() * model.output.scales[tokens[0]].float().unsqueeze(1)
    assert torch.equal(emb(tokens)[0], want)
    kept = dict(model.named_buffers())  # one name for a tensor held twice
    assert ("tok_embeddings.weight" in kept) != ("output.weight" in kept), sorted(kept)

    # Int8Linear keeps the leading dims and the input's dtype.
    x = torch.randn(1, 3, 64)
    y = model.layers[0].attention.wq(x)
    assert y.shape == (1, 3, 64) and y.dtype == torch.float32

    # The logits of a prompt and of a decode step stay close to float32's.
    prompt = torch.tensor([[3, 141, 59, 26, 5, 35]])
    with torch.no_grad():
        for m in (model, reference):
            m.reset()
        a, b = model(prompt, torch.arange(6)), reference(prompt, torch.arange(6))
        rel = float((a - b).norm() / b.norm())
        assert rel < 0.05, f"prefill logits {rel:.4f} off float32's"
        a, b = model(torch.tensor([[7]]), torch.tensor([6])), reference(torch.tensor([[7]]), torch.tensor([6]))
        rel = float((a - b).norm() / b.norm())
        assert rel < 0.05, f"decode logits {rel:.4f} off float32's"

    # Untied embeddings get rows of their own.
    untied = llm.Llama(llm.LlamaConfig(**{**cfg.__dict__, "tie_embeddings": False})).eval()
    llm.quantize_int8(untied)
    assert untied.tok_embeddings.weight.data_ptr() != untied.output.weight.data_ptr()
    assert untied.tok_embeddings.weight.dtype == torch.int8

    # What it refuses, with the reason.
    for bad, why in ((torch.nn.Linear(4, 4), "takes an aotid_export.llm.Llama"),):
        try:
            llm.quantize_int8(bad)
            raise AssertionError("quantize_int8 took a " + type(bad).__name__)
        except TypeError as e:
            assert why in str(e), e
    biased = llm.Llama(cfg).eval()
    biased.layers[0].attention.wq = torch.nn.Linear(64, 64, bias=True)
    try:
        llm.quantize_int8(biased)
        raise AssertionError("quantize_int8 took a Linear with a bias")
    except ValueError as e:
        assert "has a bias" in str(e), e
    # ... and nothing was changed before it refused.
    assert isinstance(biased.layers[0].attention.wk, torch.nn.Linear)
    assert isinstance(biased.output, torch.nn.Linear)
    # A width torch's int8 product cannot read (it crashed on two rows or more).
    odd = llm.Llama(llm.LlamaConfig(**{**cfg.__dict__, "hidden_dim": 100})).eval()
    try:
        llm.quantize_int8(odd)
        raise AssertionError("quantize_int8 took a layer 100 inputs wide")
    except ValueError as e:
        assert "layers.0.feed_forward.w2 takes 100 inputs" in str(e) and "multiple of 8" in str(e), e
    assert isinstance(odd.layers[0].attention.wq, torch.nn.Linear)
    # Twice: the second would read int8 weights as floats.
    try:
        llm.quantize_int8(untied)
        raise AssertionError("quantize_int8 quantized a quantized model again")
    except ValueError as e:
        assert "quantized already" in str(e), e
    print(f"ok: {len(floats)} products int8, logits within 5% of float32's")


if __name__ == "__main__":
    main()
