"""Mistakes a first-time author makes with aotid_export, refused at export
with what to change, not served broken: an example key that forward's
**kwargs swallowed and the graph never reads (a misspelling); a Hugging
Face folder asked for a task whose head it lacks.

    export_mistakes_test.py
"""
import os
import tempfile

import torch

import aotid_export


class Kwargs(torch.nn.Module):
    """forward as transformers writes it: named parameters, then **kwargs."""

    def forward(self, input_ids, attention_mask=None, unused=None, **kwargs):
        out = input_ids.float()
        if attention_mask is not None:
            out = out * attention_mask
        if "bias" in kwargs:
            out = out + kwargs["bias"]
        return out


def refused(error, texts, *args, **kwargs):
    try:
        aotid_export.export(*args, **kwargs)
    except error as e:
        for text in texts:
            assert text in str(e), (text, str(e))
        return
    raise AssertionError(f"exported; expected {error.__name__} with {texts!r}")


def hf_folder_without_the_head(work):
    from transformers import BertConfig, BertModel

    from aotid_export import hf

    folder = os.path.join(work, "bert")
    config = BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=20,
                        vocab_size=50, max_position_embeddings=32)
    BertModel(config).save_pretrained(folder)
    out = os.path.join(work, "mlm.pt2")
    try:
        hf.main([folder, "--task", "fill-mask", "-o", out])
    except SystemExit as e:
        said = str(e.code)
    else:
        raise AssertionError("a BertModel folder exported for fill-mask with a random head")
    for text in ("newly initialized", "cls.predictions.", "BertForMaskedLM", "--task feature-extraction",
                 "--allow-new-weights"):
        assert text in said, (text, said)
    assert not os.path.exists(out)
    # Forced, the head is made (at random) as transformers does.
    model = hf.load_folder(folder, "fill-mask", allow_new_weights=True)
    assert type(model).__name__ == "BertForMaskedLM"
    print("a folder without the task's head is refused, its own task suggested")


def main():
    work = tempfile.mkdtemp()
    ids, mask = torch.ones(2, 5, dtype=torch.int64), torch.ones(2, 5)
    out = os.path.join(work, "x.pt2")

    # A misspelled key goes to **kwargs and is never read: refused, named,
    # with the parameter it was likely meant for.
    refused(TypeError, ["'atention_mask'", "never reads it", "did you mean 'attention_mask'",
                        "input_ids, attention_mask, unused"],
            Kwargs(), {"input_ids": ids, "atention_mask": mask}, out)
    assert not os.path.exists(out)
    # A named parameter left unused, and a **kwargs key the graph reads, stay.
    aotid_export.export(Kwargs(), {"input_ids": ids, "unused": mask}, out)
    aotid_export.export(Kwargs(), {"input_ids": ids, "bias": mask}, out)
    print("a **kwargs key the graph never reads is refused; an unused named parameter is not")

    hf_folder_without_the_head(work)
    print("ok")


if __name__ == "__main__":
    main()
