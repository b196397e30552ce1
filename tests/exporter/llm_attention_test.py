"""aotid_export.llm's attention reads only the cache positions in use.

A step's attention slices the key/value cache to the positions written so
far instead of masking the whole cache. This checks, in eager PyTorch, that
it gives what attention over the whole cache under the causal mask gives:
a prompt in two prefill pieces, then decode steps, and then a shorter
sequence run on the same model without a reset (a longer sequence's cache
is left past its end, and must not be read).

    llm_attention_test.py
"""
import sys

import torch
import torch.nn.functional as F

from aotid_export import llm


class WholeCacheAttention(llm.Attention):
    """The reference: every cache position, masked past the query's own."""

    def forward(self, x, cos, sin, input_pos, mask, n, slots=None, cache=None):
        assert slots is None and cache is None, "the reference holds one sequence, in its buffers"
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = llm._rope(q, cos, sin), llm._rope(k, cos, sin)
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        whole = torch.arange(self.k_cache.shape[2]).unsqueeze(0) <= input_pos.unsqueeze(1)
        y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=whole, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


def main():
    torch.manual_seed(7)
    cfg = llm.LlamaConfig(vocab_size=97, dim=48, n_layers=2, n_heads=6, n_kv_heads=2, hidden_dim=96,
                          max_seq_len=64)
    model = llm.Llama(cfg).eval()
    ref = llm.Llama(cfg).eval()
    ref.load_state_dict(model.state_dict())
    for layer in ref.layers:
        whole = WholeCacheAttention(cfg)
        whole.load_state_dict(layer.attention.state_dict(), strict=False)
        layer.attention = whole
    worst = 0.0
    with torch.no_grad():
        for length, pieces in ((40, (25, 15)), (9, (9,))):  # the second without a reset
            ids = torch.randint(0, cfg.vocab_size, (1, length))
            at = 0
            for n in pieces:
                a = model(ids[:, at:at + n], torch.arange(at, at + n))
                b = ref(ids[:, at:at + n], torch.arange(at, at + n))
                worst = max(worst, float((a - b).abs().max()))
                at += n
            for step in range(12):
                token = torch.argmax(b, dim=-1, keepdim=True)
                a = model(token, torch.tensor([at]))
                b = ref(token, torch.tensor([at]))
                worst = max(worst, float((a - b).abs().max()))
                if int(torch.argmax(a)) != int(torch.argmax(b)):
                    sys.exit(f"greedy token differs at position {at} (length {length})")
                at += 1
    if worst > 1e-4:
        sys.exit(f"logits differ from attention over the whole cache by {worst}")
    print(f"ok: logits within {worst:.2e} of attention over the whole cache")


if __name__ == "__main__":
    main()
