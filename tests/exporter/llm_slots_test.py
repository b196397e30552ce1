"""aotid_export.llm.Llama with a cache of several sequence slots
(max_sequences), in eager PyTorch: sequences prefilled one at a time into
their slots, in chunks, then decoded together, one row each per call, get
each the greedy tokens the batch-size-1 model gives the sequence alone.
Sequences join while others run, wait for a slot when all are taken, leave,
and a later one reuses a freed slot over a longer sequence's stale cache.
float32: the same tokens, logits within float rounding; int8: every token
is the greedy choice of the model alone within two bfloat16 steps, as the
int8 tests allow (tests/llm/int8_test.py). The program export_causal_lm
writes, run eagerly, equals the eager module, and its package says the
slots and what each costs. The cache is not in the package: the program
takes it as state inputs, which the package lists apart from the client's
inputs and the compile worker's spec keeps apart too.

    llm_slots_test.py
"""
import contextlib
import copy
import io
import json
import os
import tempfile
import zipfile

import torch

from aotid_export import llm
from aotid_worker.compile import BuildError, generate_section, load_program, model_spec

CONFIG = llm.LlamaConfig(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128,
                         max_seq_len=64)
SLOTS = 4
CHUNK = 8  # prompt tokens per prefill call
TOKENIZER = {"type": "byte_level_bpe", "pre_tokenizer": [llm.GPT2_PATTERN],
             "tokens": [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(CONFIG.vocab_size)],
             "merges": [], "special": []}
# (prompt length, new tokens, the step it arrives at). Six sequences for
# four slots: the fourth to arrive waits for the second to end and takes
# its slot, over the 24 positions that one left; the sixth waits too.
SEQUENCES = ((7, 12, 0), (19, 5, 0), (5, 6, 1), (3, 9, 2), (11, 15, 3), (2, 8, 4))
# Two bfloat16 steps of the largest logit (tests/llm/int8_test.py).
NEAR = 2.0 ** -6


def prompts():
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, CONFIG.vocab_size, (n,), generator=g).tolist() for n, _, _ in SEQUENCES]


def alone(model, prompt, forced=None, count=0):
    """The batch-size-1 model's greedy tokens and each step's logits: the
    prompt in one call, then a token a call (``forced`` tokens if given)."""
    tokens, rows = [], []
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), torch.arange(len(prompt)))[0]
        for i in range(len(forced) if forced is not None else count):
            rows.append(logits)
            tokens.append(int(torch.argmax(logits)) if forced is None else forced[i])
            logits = model(torch.tensor([[tokens[-1]]]), torch.tensor([len(prompt) + i]))[0]
    return tokens, rows


def slotted(model, prompts_):
    """What a scheduler does with a model of SLOTS slots: each step, the
    sequences that arrived take free slots (prefill, CHUNK tokens a call),
    every running sequence gets its greedy token, and those still running
    decode together in one call (rows in an order that changes each step).
    A sequence that has its tokens frees its slot for the next. Returns each
    sequence's tokens, its logits per token, and the slots it had."""
    waiting, free, running = list(range(len(SEQUENCES))), list(range(SLOTS)), {}
    tokens = [[] for _ in SEQUENCES]
    rows = [[] for _ in SEQUENCES]
    used, sizes, step = [None] * len(SEQUENCES), set(), 0
    with torch.no_grad():
        while waiting or running:
            while waiting and SEQUENCES[waiting[0]][2] <= step and free:
                i, slot = waiting.pop(0), free.pop()
                p = prompts_[i]
                for at in range(0, len(p), CHUNK):
                    piece = p[at:at + CHUNK]
                    logits = model(torch.tensor([piece]), torch.arange(at, at + len(piece)).unsqueeze(0),
                                   torch.tensor([slot]))[0]
                running[i], used[i] = [slot, len(p), logits], slot
            batch = []
            for i in sorted(running):
                slot, pos, logits = running[i]
                rows[i].append(logits)
                tokens[i].append(int(torch.argmax(logits)))
                if len(tokens[i]) == SEQUENCES[i][1]:
                    del running[i]
                    free.append(slot)
                else:
                    batch.append(i)
            if batch:
                batch = batch[step % len(batch):] + batch[:step % len(batch)]
                sizes.add(len(batch))
                out = model(torch.tensor([[tokens[i][-1]] for i in batch]),
                            torch.tensor([[running[i][1]] for i in batch]),
                            torch.tensor([running[i][0] for i in batch]))
                for row, i in enumerate(batch):
                    running[i][1] += 1
                    running[i][2] = out[row]
            step += 1
    assert sizes == set(range(1, SLOTS + 1)), f"decode steps of {sorted(sizes)} rows, not 1..{SLOTS}"
    return tokens, rows, used


def worst(a, b):
    return max(float((x - y).abs().max()) for xs, ys in zip(a, b) for x, y in zip(xs, ys))


def check_float32(one, many, ps):
    tokens, rows, used = slotted(many, ps)
    # The schedule did what it is for: a slot taken over by a later sequence.
    assert used[4] == used[1] and used[5] == used[2], used
    for i, p in enumerate(ps):
        want, want_rows = alone(one, p, count=SEQUENCES[i][1])
        assert tokens[i] == want, f"sequence {i}: {tokens[i]} slotted, {want} alone"
        rows_gap = worst([rows[i]], [want_rows])
        assert rows_gap < 1e-4, f"sequence {i}: logits {rows_gap} off the model alone's"
    return tokens, rows


def check_int8(one, many, ps):
    tokens, rows, _ = slotted(many, ps)
    exact = total = 0
    for i, p in enumerate(ps):
        _, forced = alone(one, p, forced=tokens[i])
        for t, (token, logits) in enumerate(zip(tokens[i], forced)):
            top = logits.max()
            gap = float((top - logits[token]) / top.abs())
            assert gap <= NEAR, f"sequence {i} token {t} ({token}) is {gap:.4f} below the greedy choice alone"
            exact += gap == 0
            total += 1
    assert exact >= 0.9 * total, f"only {exact} of {total} int8 tokens are the greedy choice alone"
    return tokens, rows, exact, total


def export(model, path, **kwargs):
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        ep = llm.export_causal_lm(model, path, tokenizer=TOKENIZER, eos_token_ids=[2], inductor_configs={},
                                  **kwargs)
    return ep, said.getvalue()


def package_json(path):
    with zipfile.ZipFile(path) as z:
        return json.loads(z.read(next(n for n in z.namelist() if n.endswith("extra/aotid.json"))))


def check_package(path, said, model):
    extra = package_json(path)
    gen = extra["generate"]
    c = model.config
    per_slot = c.n_layers * 2 * c.n_kv_heads * c.max_seq_len * c.head_dim * 4
    assert gen["max_sequences"] == SLOTS and gen["slots_input"] == "slots", gen
    assert gen["cache_bytes_per_sequence"] == per_slot, (gen, per_slot)
    assert extra["input_names"] == ["tokens", "input_pos", "slots"], extra["input_names"]
    # Auto threads are timed on a decode step of every slot.
    assert [[d and (d["name"], d["typical"]) for d in dims] for dims in extra["input_dims"]] == \
        [[("batch", SLOTS), ("seq", 1)], [("batch", SLOTS), ("seq", 1)], [("batch", SLOTS)]], extra["input_dims"]
    line = f"{per_slot / 1e3:.1f} kB per sequence"
    assert line in said and f"{SLOTS} sequences: {per_slot * SLOTS / 1e3:.1f} kB" in said, said
    assert "made by aotid when it loads the model" in said, said
    # The cache: a state input per layer's keys and values, listed apart,
    # and no tensor of its shape in the package.
    shape = [SLOTS, c.n_kv_heads, c.max_seq_len, c.head_dim]
    assert extra["format"] == 2, extra["format"]
    assert extra["state_inputs"] == [{"name": f"{kind}_cache_{i}", "dtype": "float32", "shape": shape}
                                     for i in range(c.n_layers) for kind in "kv"], extra["state_inputs"]
    ep = torch.export.load(path)
    held = {k: list(t.shape) for k, t in {**ep.state_dict, **ep.constants}.items()}
    assert shape not in held.values(), held
    # Nor as the example the package keeps (one element each): its tensors
    # are smaller by the whole cache than those of a package that holds it.
    assert all(t.untyped_storage().nbytes() == 4 for t in ep.example_inputs[0][3:]), ep.example_inputs
    with tempfile.TemporaryDirectory() as tmp:
        inside = os.path.join(tmp, "inside.pt2")
        export(copy.deepcopy(model), inside, max_sequences=SLOTS, _cache_as_buffers=True)
        data = [sum(i.file_size for i in zipfile.ZipFile(p).infolist() if "/data/" in i.filename)
                for p in (inside, path)]
        assert data[0] - data[1] >= per_slot * SLOTS, (data, per_slot * SLOTS)
    assert list(ep.graph_signature.user_inputs) == extra["input_names"] + [s["name"] for s in extra["state_inputs"]]
    spec = model_spec(*load_program(path, "model")[:2])
    assert [i["name"] for i in spec["inputs"]] == extra["input_names"], spec["inputs"]
    assert spec["state_inputs"] == [{"name": s["name"], "datatype": "FP32", "shape": shape}
                                    for s in extra["state_inputs"]], spec["state_inputs"]
    # A list that is not the program's, or a later format, is refused.
    for change, why in (({"state_inputs": extra["state_inputs"][:-1]}, "names 3 inputs, the program takes 4"),
                        ({"state_inputs": [{**s, "shape": [1, *shape[1:]]} for s in extra["state_inputs"]]},
                         "a state input's shape is fixed"),
                        ({"format": 3}, "written by a newer aotid_export")):
        try:
            model_spec(ep, {**extra, **change})
            raise AssertionError(f"the worker took {change}")
        except BuildError as e:
            assert why in str(e), (why, e)
    # The compile worker reads the section, slots included, and refuses a
    # section whose slots are not an input of the program.
    _, names, _, built = load_program(path, "model")
    assert built["slots_input"] == "slots" and built["tokenizer"] == TOKENIZER, built
    for bad in ({**gen, "slots_input": "slot"}, {k: v for k, v in gen.items() if k != "slots_input"}):
        try:
            generate_section(bad, {llm.TOKENIZER_EXTRA_FILE: json.dumps(TOKENIZER)}, names)
            raise AssertionError(f"the worker took slots_input {bad.get('slots_input')!r}")
        except BuildError as e:
            assert "slots_input" in str(e), e


def main():
    torch.manual_seed(7)
    torch.set_num_threads(2)
    one = llm.Llama(CONFIG).eval()
    with torch.no_grad():
        for p in one.parameters():
            p.normal_(0.0, 0.5)  # large weights: the greedy choice is never a near tie
    many = copy.deepcopy(one).set_max_sequences(SLOTS)
    assert one.config.max_sequences == 1 and many.layers[0].attention.k_cache.shape[0] == SLOTS
    # Each takes its own signature, and says which when called with the other.
    x = torch.tensor([[1, 2]])
    for model, args, why in ((many, (x, torch.arange(2)), "takes (tokens[B, T], input_pos[B, T], slots[B])"),
                             (one, (x, torch.arange(2), torch.tensor([0])), "no slots")):
        try:
            model(*args)
            raise AssertionError(f"{why}: called with {len(args)} inputs")
        except TypeError as e:
            assert why in str(e), e
    for bad in (0, 2.0, True):
        try:
            copy.deepcopy(one).set_max_sequences(bad)
            raise AssertionError(f"set_max_sequences({bad!r})")
        except ValueError as e:
            assert "at least 1" in str(e), e
    ps = prompts()
    tokens, rows = check_float32(one, many, ps)
    one_i8, many_i8 = llm.quantize_int8(copy.deepcopy(one)), llm.quantize_int8(copy.deepcopy(many))
    tokens_i8, rows_i8, exact, total = check_int8(one_i8, many_i8, ps)

    with tempfile.TemporaryDirectory() as tmp:
        for name, model, want_tokens, want_rows in (("f32", many, tokens, rows),
                                                    ("int8", many_i8, tokens_i8, rows_i8)):
            path = os.path.join(tmp, f"{name}.pt2")
            ep, said = export(model, path, max_sequences=SLOTS)
            if name == "f32":
                check_package(path, said, model)
            got_tokens, got_rows, _ = slotted(llm.program_module(path), ps)
            assert got_tokens == want_tokens, f"{name}: the exported program's tokens differ from eager's"
            gap = worst(got_rows, want_rows)
            assert gap < 1e-5, f"{name}: the exported program's logits are {gap} off eager's"
        # One sequence keeps today's signature, the one aotid serves.
        path = os.path.join(tmp, "one.pt2")
        ep, said = export(copy.deepcopy(one), path)
        extra = package_json(path)
        assert extra["input_names"] == ["tokens", "input_pos"], extra["input_names"]
        assert list(ep.graph_signature.user_inputs)[:2] == ["tokens", "input_pos"], ep.graph_signature.user_inputs
        assert extra["generate"]["max_sequences"] == 1 and "slots_input" not in extra["generate"], extra
        assert "1 sequence: " in said, said
    print(f"ok: {len(SEQUENCES)} sequences in {SLOTS} slots give each its tokens alone (float32 exactly, int8 "
          f"{exact} of {total} exactly, the rest within {NEAR:.4f}); the exported program equals eager")


if __name__ == "__main__":
    main()
