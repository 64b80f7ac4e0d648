"""The OpenAI request fields and answers clients rely on, through the `openai` client and plain
HTTP against one `dlrt serve` process, checked against `LLM` in this process: `n` choices
(seed i = seed + i, refused when greedy), `seed`, `stop` as a string or up to 4 strings,
`max_completion_tokens` over `max_tokens`, `models.retrieve`, FastAPI's own 404 / 405 / 422 in
the OpenAI error shape, and the fields clients send by default."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from test_server_conventions import error_of

from dlrt import LLM

MODEL = "tiny-openai"
MESSAGES = [{"role": "user", "content": "Name three colours."}]
SAMPLE = {"temperature": 1.0, "seed": 11}


@pytest.fixture(scope="module")
def llm(tiny_sdar) -> LLM:
    return LLM(tiny_sdar, dtype="float32")


@pytest.fixture(scope="module")
def server(start_server):
    return start_server("openai-fields", "--served-model-name", MODEL)


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


# --- n and seed ---------------------------------------------------------------------------

def test_n_choices_are_the_seeds_seed_plus_i(oai, llm):
    refs = [llm.generate(MESSAGES, max_new_tokens=8, temperature=1.0, seed=11 + i)
            for i in range(3)]
    out = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, n=3,
                                      **SAMPLE)
    assert [c.index for c in out.choices] == [0, 1, 2]
    texts = [c.message.content for c in out.choices]
    assert texts == [r.text for r in refs]
    assert len(set(texts)) == 3  # sampled: distinct
    assert [c.finish_reason for c in out.choices] == [r.finish_reason for r in refs]
    # usage: the prompt once, the new tokens of every choice
    assert out.usage.prompt_tokens == len(refs[0].prompt_token_ids)
    assert out.usage.completion_tokens == sum(len(r.token_ids) for r in refs)
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    again = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, n=3,
                                        **SAMPLE)
    assert [c.message.content for c in again.choices] == texts  # the same seed: the same n


def test_n_without_a_seed_samples_distinct_choices(oai):
    out = oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, n=2,
                                 temperature=1.0)
    assert [c.index for c in out.choices] == [0, 1]
    assert out.choices[0].text != out.choices[1].text


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_n_streamed_sends_each_choice_under_its_index(oai, chat):
    kw = dict(model=MODEL, max_tokens=8, n=2, **SAMPLE)
    if chat:
        whole = oai.chat.completions.create(messages=MESSAGES, **kw)
        chunks = list(oai.chat.completions.create(messages=MESSAGES, stream=True,
                                                  stream_options={"include_usage": True},
                                                  **kw))
        texts = [c.message.content for c in whole.choices]
    else:
        whole = oai.completions.create(prompt="Once upon a time", **kw)
        chunks = list(oai.completions.create(prompt="Once upon a time", stream=True,
                                             stream_options={"include_usage": True}, **kw))
        texts = [c.text for c in whole.choices]
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    got = {0: "", 1: ""}
    finish = {}
    order = []
    for c in body:
        (choice,) = c.choices
        order.append(choice.index)
        got[choice.index] += (choice.delta.content or "") if chat else choice.text
        if choice.finish_reason is not None:
            finish[choice.index] = choice.finish_reason
    assert [got[0], got[1]] == texts
    assert finish == {0: "length", 1: "length"}
    assert order == sorted(order)  # one choice after another
    if chat:
        roles = [c.choices[0].index for c in body if c.choices[0].delta.role == "assistant"]
        assert roles == [0, 1]


def test_n_with_greedy_decoding_is_a_400_naming_n(oai, client):
    """As vLLM: n > 1 needs sampling (greedy choices would all be the same)."""
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, n=2,
                                    temperature=0)
    assert e.value.body["param"] == "n" and "greedily" in e.value.body["message"]
    for n in (0, -1, 129, 1.5, "2"):
        err = error_of(client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4,
                                                            "n": n, "temperature": 1}), 400)
        assert err["param"] == "n", err
    # with the random remasking strategy, the seed changes the tokens even at temperature 0
    out = oai.completions.create(model=MODEL, prompt="hi", max_tokens=8, n=2, temperature=0,
                                 seed=3, extra_body={"remasking_strategy": "random"})
    assert len(out.choices) == 2


def test_seed_reproduces_a_sampled_answer(oai, llm):
    ref = llm.generate("Once upon a time", max_new_tokens=8, **SAMPLE)
    for _ in range(2):
        out = oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8,
                                     **SAMPLE)
        assert out.choices[0].text == ref.text


# --- stop, max_completion_tokens --------------------------------------------------------------

def test_stop_as_a_list_of_strings(oai, llm):
    ref = llm.generate(MESSAGES, max_new_tokens=16, temperature=0)
    cut = ref.text[len(ref.text) // 2:][:2]
    assert cut.strip()
    stops = ["never in this text \x00", cut]
    want = llm.generate(MESSAGES, max_new_tokens=16, temperature=0, stop=stops)
    assert want.finish_reason == "stop" and len(want.text) < len(ref.text)
    out = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16,
                                      temperature=0, stop=stops)
    assert out.choices[0].message.content == want.text
    assert out.choices[0].finish_reason == "stop"
    one = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16,
                                      temperature=0, stop=cut)
    assert one.choices[0].message.content == want.text


def test_more_than_four_stop_strings_is_a_400(client):
    for path, body in (("/v1/chat/completions", {"messages": MESSAGES}),
                       ("/v1/completions", {"prompt": "hi"})):
        err = error_of(client.post(path, json={**body, "max_tokens": 4,
                                               "stop": ["a", "b", "c", "d", "e"]}), 400)
        assert err["param"] == "stop" and "at most 4" in err["message"], err
        assert client.post(path, json={**body, "max_tokens": 4,
                                       "stop": ["a", "b", "c", "d"]}).status_code == 200


def test_max_completion_tokens_wins_over_max_tokens(oai, llm):
    ref = llm.generate(MESSAGES, max_new_tokens=4, temperature=0)
    out = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12,
                                      max_completion_tokens=4, temperature=0)
    assert out.choices[0].message.content == ref.text
    assert out.usage.completion_tokens == 4 and out.choices[0].finish_reason == "length"


# --- /v1/models/{id}, FastAPI's own errors ----------------------------------------------------

def test_models_retrieve(oai, client):
    model = oai.models.retrieve(MODEL)
    assert (model.id, model.object, model.owned_by) == (MODEL, "model", "dlrt")
    assert model.created == oai.models.list().data[0].created
    with pytest.raises(openai.NotFoundError) as e:
        oai.models.retrieve("gpt-4o")
    assert e.value.body["param"] == "model" and "gpt-4o" in e.value.body["message"]
    err = error_of(client.get("/v1/models/org/other-model"), 404)
    assert "org/other-model" in err["message"], err


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/nope", 404), ("POST", "/v1/nope", 404), ("GET", "/v1", 404),
    ("GET", "/v1/chat/completions", 405), ("DELETE", "/v1/models", 405),
    ("POST", "/health", 405), ("PUT", "/generate", 405)])
def test_unknown_paths_and_methods_answer_in_the_openai_shape(client, method, path, status):
    r = client.request(method, path)
    err = error_of(r, status)
    assert path in err["message"], err
    if status == 405:
        assert r.headers["allow"] and r.headers["allow"] in err["message"], err


def test_a_route_parameter_that_does_not_validate_is_a_422_in_the_openai_shape(llm):
    from fastapi.testclient import TestClient

    from dlrt.server.app import create_app
    from dlrt.server.worker import Worker

    app = create_app(llm, Worker(llm), "tiny")

    @app.get("/v1/typed/{count}")
    async def typed(count: int):  # a route with a typed parameter
        return {"count": count}

    with TestClient(app) as c:
        assert c.get("/v1/typed/3").json() == {"count": 3}
        err = error_of(c.get("/v1/typed/three"), 422)
        assert err["param"] == "count" and "integer" in err["message"], err


# --- what clients send by default -------------------------------------------------------------

def test_fields_clients_send_by_default_are_accepted(oai, llm):
    system = "Answer in one word."
    ref = llm.generate([{"role": "system", "content": system}, *MESSAGES], max_new_tokens=8,
                       temperature=0)
    out = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "developer", "content": system}, *MESSAGES],
        max_tokens=8, temperature=0, n=1, top_logprobs=None, logprobs=False, store=False,
        metadata={"job": "test"}, tool_choice="none", user="someone", parallel_tool_calls=True,
        response_format={"type": "text"}, presence_penalty=0, frequency_penalty=0.0)
    assert out.choices[0].message.content == ref.text  # developer is the system role


@pytest.mark.parametrize("field,value", [
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("tool_choice", "auto"), ("response_format", {"type": "json_object"}),
    ("logit_bias", {"11": 5}), ("presence_penalty", 0.5), ("frequency_penalty", -1),
    ("top_logprobs", 2)])
def test_fields_dlrt_cannot_honour_are_a_400_naming_them(client, field, value):
    body = {"messages": MESSAGES, "max_tokens": 4, field: value}
    err = error_of(client.post("/v1/chat/completions", json=body), 400)
    assert err["param"] == field and err["message"].startswith(field), err


def test_raw_stream_of_n_choices_ends_with_done(client):
    body = {"prompt": "hi", "max_tokens": 4, "n": 2, "temperature": 1, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    rows = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert {row["choices"][0]["index"] for row in rows} == {0, 1}
    assert all("usage" not in row for row in rows)
