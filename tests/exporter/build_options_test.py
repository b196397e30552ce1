"""The AOTInductor options a package carries (aotid.json "inductor_options").

An exported program may ask for the options that choose kernels; aotid's
compile worker builds with them, under the machine owner's own settings
(`aotid set NAME inductor.X=...`) and over aotid's defaults. Options that
run programs or name paths (cpp.cxx, ...) are the owner's alone: a package
asking for one fails its build with the reason, and the exporter refuses to
write it. A language model exported with aotid_export.llm asks for
autotuned GEMM kernels (aotid_export.llm.BUILD_OPTIONS).

    build_options_test.py
"""
import json
import os
import sys
import tempfile
import zipfile

import torch

import aotid_export
from aotid_export import llm
from aotid_worker.compile import BuildError, inductor_configs, load_program


def refused(package, text=""):
    try:
        inductor_configs(text, package)
    except BuildError as e:
        return str(e)
    return None


def main():
    # Merged: defaults, then the package, then the owner's.
    assert inductor_configs("", None) == {"cpp.dynamic_threads": True}
    got = inductor_configs('{"max_autotune": false}', {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"})
    assert got == {"cpp.dynamic_threads": True, "max_autotune": False, "max_autotune_gemm_backends": "CPP,ATEN"}, got
    # The owner may set what a package may not.
    assert inductor_configs('{"cpp.cxx": "g++"}', None)["cpp.cxx"] == "g++"
    why = refused({"cpp.cxx": "touch /tmp/owned; g++"})
    assert why and "'cpp.cxx'" in why and "export it again without it" in why, why
    why = refused({"max_autotune_gemm_backends": "CPP;touch /tmp/owned"})
    assert why and "not a comma-separated list" in why, why
    # Folding weights at build time, at any size, is the owner's call too.
    why = refused({"freezing": True})
    assert why and "'freezing'" in why and "a package may not set" in why, why
    # So is autotuning past the owner's max_autotune=false.
    why = refused({"max_autotune_gemm": True})
    assert why and "'max_autotune_gemm'" in why, why
    # Backends in torch's spelling, once each.
    got = inductor_configs("", {"max_autotune_gemm_backends": " cpp, aten,CPP"})
    assert got["max_autotune_gemm_backends"] == "CPP,ATEN", got
    why = refused({"max_autotune_gemm_backends": "CPP," * 1000})
    assert why and "not a comma-separated list" in why, why
    why = refused({"max_autotune": "yes"})
    assert why and "takes true or false, not \"yes\"" in why, why
    why = refused(["max_autotune"])
    assert why and "is not an object" in why, why

    with tempfile.TemporaryDirectory() as tmp:
        # The exporter writes what it is given, and refuses what a build would.
        path = os.path.join(tmp, "mlp.pt2")
        aotid_export.export(torch.nn.Linear(4, 2).eval(), (torch.randn(2, 4),), path,
                            inductor_configs={"max_autotune": True})
        _, names, _, _ = load_program(path, "model")
        assert names["inductor_options"] == {"max_autotune": True}, names
        try:
            aotid_export.export(torch.nn.Linear(4, 2).eval(), (torch.randn(2, 4),), path,
                                inductor_configs={"cpp.cxx": "g++"})
            raise AssertionError("the exporter wrote a package asking for cpp.cxx")
        except ValueError as e:
            assert "'cpp.cxx'" in str(e), e
        try:
            aotid_export.export(torch.nn.Linear(4, 2).eval(), (torch.randn(2, 4),), path,
                                inductor_configs=["max_autotune"])
            raise AssertionError("the exporter took a list for inductor_configs")
        except ValueError as e:
            assert "mapping of option names" in str(e), e

        # A language model asks for autotuned GEMMs unless told otherwise.
        cfg = llm.LlamaConfig(vocab_size=64, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, hidden_dim=64,
                              max_seq_len=16)
        tokenizer = {"type": "byte_level_bpe", "pre_tokenizer": [llm.GPT2_PATTERN],
                     "tokens": [chr(0x100 + i) for i in range(64)], "merges": [], "special": []}
        for configs, want in ((None, llm.BUILD_OPTIONS), ({}, {})):
            lm = os.path.join(tmp, "lm.pt2")
            llm.export_causal_lm(llm.Llama(cfg).eval(), lm, tokenizer=tokenizer, eos_token_ids=[0],
                                 inductor_configs=configs)
            _, names, _, generate = load_program(lm, "model")
            assert generate is not None
            assert names["inductor_options"] == want, names
            assert inductor_configs("", names["inductor_options"]) == {"cpp.dynamic_threads": True, **want}
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
