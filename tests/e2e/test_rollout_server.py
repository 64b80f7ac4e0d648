"""Step maps and logprobs behind the front doors, in process (FastAPI's test client over the real
app and worker): `/generate`'s block and final lines, and the OpenAI endpoints' `logprobs` in
the OpenAI API's shapes through the official `openai` client (chat: `logprobs.content`;
completions: tokens, token_logprobs, top_logprobs, text_offset), whole and streamed, equal to
`LLM.generate`'s; bad values are 400s naming the field as sent."""

from __future__ import annotations

import json

import pytest

from dlrt import LLM

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

GREEDY = dict(temperature=0, ignore_eos=True)
CHAT = [{"role": "user", "content": "Write a loop."}]


@pytest.fixture(scope="module")
def llm(tiny_sdar):
    return LLM(tiny_sdar, dtype="float32")


@pytest.fixture(scope="module")
def client(llm):
    from fastapi.testclient import TestClient

    from dlrt.server.app import create_app
    from dlrt.server.worker import Worker

    with TestClient(create_app(llm, Worker(llm), "tiny")) as c:
        yield c


@pytest.fixture(scope="module")
def oai(client):
    return openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key="none",
                         http_client=client, max_retries=0)


def _text(llm, token_id: int) -> str:
    return llm.tokenizer.decode([token_id])


def test_generate_lines_carry_step_map_and_logprobs(llm, client):
    want = llm.generate("def f(x):", max_new_tokens=10, logprobs=True, top_logprobs=2, **GREEDY)
    with client.stream("POST", "/generate", json={
            "prompt": "def f(x):", "max_new_tokens": 10, "logprobs": True, "top_logprobs": 2,
            **GREEDY}) as s:
        assert s.status_code == 200
        rows = [json.loads(line) for line in s.iter_lines() if line]
    blocks, final = rows[:-1], rows[-1]
    assert [x for b in blocks for x in b["step_map"]] == want.step_map == final["step_map"]
    assert all(len(b["step_map"]) == len(b["logprobs"]) == len(b["token_ids"]) for b in blocks)
    rows = [x for b in blocks for x in b["logprobs"]]
    assert rows == final["logprobs"]
    assert rows == [{"token_id": x.token_id, "logprob": x.logprob, "top_logprobs": [
        {"token_id": t.token_id, "logprob": t.logprob} for t in x.top_logprobs]}
        for x in want.logprobs]
    plain = [json.loads(line) for line in client.post("/generate", json={
        "prompt": "def f(x):", "max_new_tokens": 4, **GREEDY}).text.splitlines()]
    assert "logprobs" not in plain[0] and "logprobs" not in plain[-1]
    assert plain[-1]["step_map"] == want.step_map[:4]


def test_chat_logprobs_in_the_openai_shape(llm, oai):
    want = llm.generate(CHAT, max_new_tokens=12, logprobs=True, top_logprobs=3, **GREEDY)
    r = oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, logprobs=True,
                                    top_logprobs=3, temperature=0, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert [c.token for c in content] == [_text(llm, t) for t in want.token_ids]
    assert [c.logprob for c in content] == [x.logprob for x in want.logprobs]
    for c, x in zip(content, want.logprobs, strict=True):
        assert [t.logprob for t in c.top_logprobs] == [t.logprob for t in x.top_logprobs]
        assert [t.token for t in c.top_logprobs] == [_text(llm, t.token_id)
                                                     for t in x.top_logprobs]
        assert len(c.top_logprobs) == 3
        assert c.top_logprobs[0].token == c.token  # greedy: the chosen is the most likely
    # the tokens' exact bytes (byte-level BPE) join into the answer's text
    assert bytes(b for c in content for b in c.bytes).decode() == r.choices[0].message.content
    stream = oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12,
                                         logprobs=True, top_logprobs=3, temperature=0,
                                         stream=True, extra_body={"ignore_eos": True})
    chunks = [c for ch in stream for c in (ch.choices[0].logprobs.content
                                            if ch.choices and ch.choices[0].logprobs else [])]
    assert [c.model_dump() for c in chunks] == [c.model_dump() for c in content]
    plain = oai.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4,
                                        temperature=0)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_in_the_legacy_shape(llm, oai):
    want = llm.generate("import os", max_new_tokens=12, logprobs=True, top_logprobs=2, **GREEDY)
    r = oai.completions.create(model="tiny", prompt="import os", max_tokens=12, logprobs=2,
                               temperature=0, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    tokens = [_text(llm, t) for t in want.token_ids]
    assert lp.tokens == tokens
    assert lp.token_logprobs == [x.logprob for x in want.logprobs]
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert lp.text_offset == offsets
    for top, x in zip(lp.top_logprobs, want.logprobs, strict=True):
        expect = {_text(llm, t.token_id): t.logprob for t in x.top_logprobs}
        expect[_text(llm, x.token_id)] = x.logprob  # the sampled token is always there
        assert top == expect and 2 <= len(top) <= 3
    stream = oai.completions.create(model="tiny", prompt="import os", max_tokens=12,
                                    logprobs=2, temperature=0, stream=True,
                                    extra_body={"ignore_eos": True})
    parts = [ch.choices[0].logprobs for ch in stream if ch.choices and ch.choices[0].logprobs]
    assert len(parts) > 1  # one chunk per block
    joined = {k: [v for p in parts for v in getattr(p, k)]
              for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    assert joined == {"tokens": lp.tokens, "token_logprobs": lp.token_logprobs,
                      "top_logprobs": lp.top_logprobs, "text_offset": lp.text_offset}
    none = oai.completions.create(model="tiny", prompt="import os", max_tokens=4, temperature=0,
                                  logprobs=0)
    assert all(len(t) == 1 for t in none.choices[0].logprobs.top_logprobs)
    assert oai.completions.create(model="tiny", prompt="import os",
                                  max_tokens=4).choices[0].logprobs is None


@pytest.mark.parametrize("path,body,param,words", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs",
     "top_logprobs=21 must be in [0, 20]"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs",
     "top_logprobs=-1 must be in [0, 20]"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", "needs logprobs=True"),
    ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 2}, "top_logprobs",
     "needs logprobs=True"),
    ("/v1/chat/completions", {"logprobs": 1}, "logprobs", "valid boolean"),
    ("/v1/completions", {"logprobs": 21}, "logprobs", "logprobs=21 must be in [0, 20]"),
    ("/v1/completions", {"logprobs": -1}, "logprobs", "logprobs=-1 must be in [0, 20]"),
    ("/v1/completions", {"logprobs": True}, "logprobs", "valid integer"),
    ("/v1/completions", {"top_logprobs": 2}, "top_logprobs", "Extra inputs"),
    ("/generate", {"logprobs": True, "top_logprobs": 21}, "top_logprobs",
     "top_logprobs=21 must be in [0, 20]"),
    ("/generate", {"top_logprobs": 1}, "top_logprobs", "needs logprobs=True"),
])
def test_bad_logprob_fields_are_400s_naming_them(client, path, body, param, words):
    base = ({"messages": CHAT} if "chat" in path else {"prompt": "x"})
    limit = {"max_new_tokens" if path == "/generate" else "max_tokens": 4}
    r = client.post(path, json={**base, **limit, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
