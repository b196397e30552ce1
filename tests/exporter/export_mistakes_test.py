"""Mistakes a first-time author makes with aotid_export, refused at export
with what to change, not served broken: an example key that forward's
**kwargs swallowed and the graph never reads (a misspelling); a Hugging
Face folder asked for a task whose head it lacks. And verify with the
example the export took (use_cache=False), its constants kept from the
server. A model that returns only None. A sequence dim declared longer
than a transformers model's positions. Install lines that a shell takes
as written (quoted extras). An -o whose folder does not exist, said before any work.

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


class NoneOut(torch.nn.Module):
    def forward(self, x):
        return {"b": None}


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
    # The folder, or its config.json (read as its folder): the same refusal.
    for given in (folder, os.path.join(folder, "config.json")):
        try:
            hf.main([given, "--task", "fill-mask", "-o", out])
        except SystemExit as e:
            said = str(e.code)
        else:
            raise AssertionError("a BertModel folder exported for fill-mask with a random head")
        for text in ("newly initialized", "cls.predictions.", "BertForMaskedLM", "--task feature-extraction",
                     "--allow-new-weights"):
            assert text in said, (given, text, said)
    # Another file of the folder: what to give instead.
    try:
        hf.main([os.path.join(folder, "model.safetensors"), "--task", "fill-mask", "-o", out])
    except SystemExit as e:
        assert "model.safetensors: a file; give the model folder, the one that holds config.json" in str(e.code), e
    else:
        raise AssertionError("a weights file taken as a model folder")
    assert not os.path.exists(out)
    # Forced, the head is made (at random) as transformers does.
    model = hf.load_folder(folder, "fill-mask", allow_new_weights=True)
    assert type(model).__name__ == "BertForMaskedLM"
    print("a folder without the task's head is refused, its own task suggested")


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=64,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


class ProgramClient:
    """The daemon's part of verify, played by the exported program: its
    metadata and its answers, refusing inputs it does not take."""

    def __init__(self, path):
        from aotid_worker.compile import load_program

        self.ep, self.names, _, _ = load_program(path, "model")

    def metadata(self, name, version=None):
        return {"inputs": [{"name": n} for n in self.names["input_names"]],
                "outputs": [{"name": n} for n in self.names["output_names"]]}

    def infer(self, name, inputs, version=None):
        unknown = set(inputs) - set(self.names["input_names"])
        assert not unknown, f"sent {sorted(unknown)}, which the model does not take"
        out = self.ep.module()(*[torch.as_tensor(inputs[n]) for n in self.names["input_names"]])
        out = out if isinstance(out, tuple) else (out,)
        return {n: t.detach().numpy() for n, t in zip(self.names["output_names"], out)}


def verify_keeps_constants_from_the_server(gpt2, work):
    from aotid_export.client import verify

    path = os.path.join(work, "gpt2.pt2")
    ids = torch.randint(0, 50, (1, 6))
    example = {"input_ids": ids, "attention_mask": torch.ones(1, 6, dtype=torch.int64), "use_cache": False}
    aotid_export.export(gpt2, example, path)
    result = verify(gpt2, "gpt2", example, client=ProgramClient(path), quiet=True)
    assert result.ok and [o.name for c in result.cases for o in c.outputs] == ["logits"], result
    print("verify with use_cache=False: the constant goes to eager only, logits equal")


def out_folder_checked_first(work):
    from aotid_export import hf
    from aotid_export.__main__ import main as cli

    missing = os.path.join(work, "nonexistdir", "x.pt2")
    # The folder and the factory are never read: the -o is refused first.
    for run, argv in [(hf.main, [os.path.join(work, "no-folder"), "--task", "fill-mask", "-o", missing]),
                      (cli, ["no_such_module:make", "--input", "x=float32[1,4]", "-o", missing])]:
        try:
            run(argv)
        except SystemExit as e:
            said = str(e.code)
        else:
            raise AssertionError(f"{argv}: no exit")
        assert said.endswith(f"-o {missing}: the folder {os.path.dirname(missing)} does not exist"), said
    print("an -o in a missing folder is said first, in one line")


def seq_beyond_positions(gpt2, work):
    ids, mask = torch.randint(0, 50, (1, 6)), torch.ones(1, 6, dtype=torch.int64)
    seq = torch.export.Dim("seq", max=100)
    refused(ValueError, ["'seq' (dim 1 of input_ids) has max 100", "GPT2LMHeadModel has 64 positions"],
            gpt2, {"input_ids": ids, "attention_mask": mask, "use_cache": False}, os.path.join(work, "long.pt2"),
            dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}})
    print("a sequence dim past the model's positions is refused, both numbers named")


def install_lines_quoted():
    import contextlib
    import io
    import re

    from aotid_export import hf

    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.suppress(SystemExit):
        hf.main(["--help"])
    assert "pip install 'aotid-export[hf]'" in said.getvalue(), said.getvalue()
    assert hf.INSTALL_HINT == "pip install 'aotid-export[hf]'", hf.INSTALL_HINT
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    # An unquoted extra is a glob to zsh ("no matches found").
    bare = re.findall(r"pip install [^'\s`]*\[[a-z]+\]", readme)
    assert not bare, bare
    print("pip install lines with extras are quoted (hf --help, README)")


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
    refused(ValueError, ["the model returns no tensors (all its outputs are None)"], NoneOut(), (ids,), out)
    print("a **kwargs key the graph never reads is refused, an unused named parameter is not; "
          "a model returning only None is refused")

    hf_folder_without_the_head(work)
    gpt2 = tiny_gpt2()
    verify_keeps_constants_from_the_server(gpt2, work)
    out_folder_checked_first(work)
    seq_beyond_positions(gpt2, work)
    install_lines_quoted()
    print("ok")


if __name__ == "__main__":
    main()
