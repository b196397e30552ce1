"""OpenAI's own Python client, unchanged, against one daemon serving the
fixture's tiny_llm through /v1: sync and async, streamed and not.

What it proves: chat and completions give /generate's greedy tokens for the
same request (and those are the eager model's own greedy choices); the
stream is what the client parses (the role first, the finish reason, the
include_usage chunk before [DONE]); stop strings cut; a seed repeats a
sampled answer; logprobs are the model's log-softmax; each parameter aotid
does not do raises BadRequestError naming it; an unknown model raises
NotFoundError; a client that hangs up mid-stream stops its sequence and
frees the model.

    openai_test.py AOTID TESTDATA
"""

import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
import urllib.request

import openai
import torch

from aotid_export import llm
from harness import Served, greedy_gaps, post

MODEL = "tiny_llm"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]


def finished(port, reason):
    """The daemon's count of generate requests that ended with `reason`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    key = f'aotid_generate_requests_total{{model="{MODEL}",version="1",finish_reason="{reason}"}} '
    at = text.find(key)
    return 0 if at < 0 else int(float(text[at + len(key):].split()[0]))


def poll_until(what, within_s=60):
    deadline = time.monotonic() + within_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def refused(call, param):
    try:
        call()
    except openai.BadRequestError as e:
        assert e.param == param and param in e.message, (param, e.param, e.message)
        return
    raise AssertionError(f"{param}: not refused")


def check_models(client):
    models = {m.id: m for m in client.models.list()}
    assert set(models) == {MODEL, f"{MODEL}:1"}, models
    assert models[MODEL].owned_by == "aotid" and models[MODEL].object == "model" and models[MODEL].created > 0
    assert client.models.retrieve(MODEL).id == MODEL
    try:
        client.models.retrieve("nope")
        raise AssertionError("an unknown model was found")
    except openai.NotFoundError:
        pass


def check_chat(client, port, eager):
    ref = post(port, f"/v2/models/{MODEL}/generate", {"messages": MESSAGES, "parameters": {
        "temperature": 0, "max_tokens": 12, "return_token_ids": True}})
    # /generate's greedy tokens are the eager model's own choices.
    gaps = greedy_gaps(eager, ref["prompt_token_ids"], ref["token_ids"])
    assert max(gaps) == 0, (gaps, ref)
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12)
    choice = chat.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == ref["text_output"], (chat, ref)
    assert choice.finish_reason == ref["finish_reason"]
    assert chat.usage.prompt_tokens == len(ref["prompt_token_ids"])
    assert chat.usage.completion_tokens == len(ref["token_ids"])
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-") and chat.model == MODEL
    assert chat.system_fingerprint.startswith("fp_") and len(chat.system_fingerprint) == 15
    # name:version is the same model.
    again = client.chat.completions.create(model=f"{MODEL}:1", messages=MESSAGES, temperature=0, max_tokens=12)
    assert again.choices[0].message.content == ref["text_output"]
    assert again.system_fingerprint == chat.system_fingerprint

    # Streamed, with the usage chunk.
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref["text_output"], (text, ref)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [ref["finish_reason"]], reasons
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref["token_ids"]), chunks[-1]
    assert all(c.usage is None for c in chunks[:-1])
    # Without include_usage: every chunk has its choice.
    plain = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12,
                                                stream=True))
    assert all(c.choices for c in plain) and len(plain) == len(chunks) - 1

    # A stop string: the answer ends before it.
    stop = ref["text_output"][4:7]
    cut = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12, stop=[stop])
    assert cut.choices[0].message.content == ref["text_output"][:ref["text_output"].find(stop)], (stop, cut)
    assert cut.choices[0].finish_reason == "stop"

    # Logprobs: the greedy token is the likeliest, at the eager model's log-softmax.
    lp = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12,
                                        logprobs=True, top_logprobs=3).choices[0].logprobs.content
    assert len(lp) == len(ref["token_ids"])
    assert b"".join(bytes(t.bytes) for t in lp).decode() == ref["text_output"]
    for t in lp:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob == t.logprob >= t.top_logprobs[1].logprob
    with torch.no_grad():
        ids = ref["prompt_token_ids"]
        first = torch.log_softmax(eager(torch.tensor([ids]), torch.arange(len(ids)))[0].double(), -1)
    assert abs(lp[0].logprob - float(first[ref["token_ids"][0]])) < 1e-3, (lp[0].logprob, float(first.max()))

    # The stop string's tokens are cut with it: the logprobs are those of the
    # tokens that start before it, whole and streamed.
    shown = len(cut.choices[0].message.content.encode())
    starts = itertools.accumulate((len(bytes(t.bytes)) for t in lp), initial=0)
    want = [t.token for t, start in zip(lp, starts) if start < shown]
    for stream in (False, True):
        answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12,
                                                stop=[stop], logprobs=True, stream=stream)
        if stream:
            got = [t.token for c in answer if c.choices and c.choices[0].logprobs
                   for t in c.choices[0].logprobs.content]
        else:
            got = [t.token for t in answer.choices[0].logprobs.content]
        assert got == want, (stream, stop, got, want)
    return ref


def check_sampling(client):
    def sample(seed, **kw):
        return client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=1.5, max_tokens=10,
                                              seed=seed, **kw).choices[0].message.content
    assert sample(7) == sample(7)
    # ... and the seed is what repeats it: other seeds answer otherwise.
    assert len({sample(s) for s in range(1, 6)}) > 1
    # top_k and min_p as extensions: top_k 1 is greedy whatever the temperature.
    greedy = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=10)
    assert sample(3, extra_body={"top_k": 1}) == greedy.choices[0].message.content
    assert sample(3, extra_body={"min_p": 1.0}) == greedy.choices[0].message.content


def check_completions(client, port, case):
    ref = post(port, f"/v2/models/{MODEL}/generate", {"input_ids": case["ids"], "parameters": {
        "temperature": 0, "max_tokens": 20, "return_token_ids": True}})
    assert ref["token_ids"] == case["greedy"][:-1] and ref["finish_reason"] == "stop", (ref, case)  # the end token
    got = client.completions.create(model=MODEL, prompt=case["ids"], temperature=0, max_tokens=20)
    assert got.object == "text_completion" and got.id.startswith("cmpl-")
    assert got.choices[0].text == ref["text_output"] and got.choices[0].finish_reason == "stop"
    assert got.usage.prompt_tokens == len(case["ids"]) and got.usage.completion_tokens == len(ref["token_ids"])
    text = client.completions.create(model=MODEL, prompt=case["text"], temperature=0, max_tokens=20)
    assert text.choices[0].text == ref["text_output"]
    # 16 tokens unless told.
    hello = client.completions.create(model=MODEL, prompt="Hello", temperature=0)
    assert hello.usage.completion_tokens == 16 and hello.choices[0].finish_reason == "length"
    # The penalties change a greedy answer that repeats itself ("Hello" does).
    plain = client.completions.create(model=MODEL, prompt="Hello", temperature=0, max_tokens=4)
    penalized = client.completions.create(model=MODEL, prompt="Hello", temperature=0, max_tokens=4,
                                          frequency_penalty=2.0, presence_penalty=2.0)
    assert plain.choices[0].text != penalized.choices[0].text, plain


def check_refusals(client):
    def chat(**kw):
        return lambda: client.chat.completions.create(model=MODEL, messages=kw.pop("messages", MESSAGES), **kw)
    refused(chat(n=2), "n")
    refused(chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), "tools")
    refused(chat(response_format={"type": "json_object"}), "response_format")
    refused(chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]), "messages[0].content[1]")
    refused(chat(extra_body={"mirostat": 2}), "mirostat")
    refused(lambda: client.completions.create(model=MODEL, prompt="x", echo=True), "echo")
    try:
        client.chat.completions.create(model="no_such_model", messages=MESSAGES)
        raise AssertionError("an unknown model answered")
    except openai.NotFoundError as e:
        assert e.code == "model_not_found" and e.param == "model", e.body


async def check_async(base, ref, case):
    client = openai.AsyncOpenAI(base_url=base, api_key="anything", max_retries=0)
    chat = await client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12)
    assert chat.choices[0].message.content == ref["text_output"]
    stream = await client.completions.create(model=MODEL, prompt=case["ids"], temperature=0, max_tokens=20,
                                             stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == \
        (await client.completions.create(model=MODEL, prompt=case["ids"], temperature=0,
                                         max_tokens=20)).choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(case["ids"])
    await client.close()


def check_hang_up(client, port):
    before = finished(port, "cancelled")
    stream = client.completions.create(model=MODEL, prompt=[1], temperature=0, max_tokens=94, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    # Its sequence ends as cancelled, and the model answers the next request.
    poll_until(lambda: finished(port, "cancelled") == before + 1)
    after = client.completions.create(model=MODEL, prompt="Hello", temperature=0, max_tokens=3)
    assert after.usage.completion_tokens == 3


def main(aotid, testdata):
    with open(os.path.join(testdata, "cases.json")) as f:
        cases = json.load(f)[MODEL]
    pt2 = os.path.join(testdata, f"{MODEL}.pt2")
    eager = llm.program_module(pt2)  # its cache as aotid holds it
    with tempfile.TemporaryDirectory() as tmp, Served(aotid, {MODEL: pt2}, tmp) as port:
        base = f"http://127.0.0.1:{port}/v1"
        # A key the daemon does not ask for: the client insists on one.
        client = openai.OpenAI(base_url=base, api_key="anything", max_retries=0)
        check_models(client)
        ref = check_chat(client, port, eager)
        check_sampling(client)
        check_completions(client, port, cases["prompts"][0])
        check_refusals(client)
        asyncio.run(check_async(base, ref, cases["prompts"][0]))
        check_hang_up(client, port)
    print("ok: /v1 chat and completions equal /generate's greedy tokens through the openai client")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main(sys.argv[1], sys.argv[2])
