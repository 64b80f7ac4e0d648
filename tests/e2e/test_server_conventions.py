"""The server conventions a vLLM or SGLang user expects, through the `openai` client and plain
HTTP against one `dlrt serve` process started with `--served-model-name` and `DLRT_API_KEY`:
the model name (404 for another), the API key (401 without it, /health open), the usage chunk
of `stream_options.include_usage`, `/tokenize` and `/detokenize`, and Prometheus `/metrics`.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dlrt import LLM

MODEL = "tiny-sdar-served"
KEY = "sk-test-3f9c2d7e41"
AUTH = {"Authorization": f"Bearer {KEY}"}
MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def llm(tiny_sdar) -> LLM:
    return LLM(tiny_sdar, dtype="float32")


@pytest.fixture(scope="module")
def server(start_server):
    with pytest.MonkeyPatch.context() as mp:  # the key from the environment, not argv
        mp.setenv("DLRT_API_KEY", KEY)
        return start_server("conventions", "--served-model-name", MODEL)


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        yield c


def error_of(r: httpx.Response, status: int) -> dict:
    """The OpenAI error body of a response with `status`."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    assert err["code"] == status and err["type"] == "invalid_request_error", err
    return err


# --- the served model name ------------------------------------------------------------------

def test_models_lists_the_served_name(oai):
    assert [m.id for m in oai.models.list()] == [MODEL]


def test_another_model_name_is_404(oai, client):
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=4)
    assert "gpt-4o" in e.value.body["message"] and e.value.body["param"] == "model"
    for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 4}),
                       ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4}),
                       ("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        err = error_of(client.post(path, json={"model": "other", **body}), 404)
        assert err["param"] == "model" and MODEL in err["message"], err
        assert client.post(path, json={"model": MODEL, **body}).status_code == 200


def test_served_name_answers_as_the_model(oai, llm):
    out = oai.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0)
    assert out.model == MODEL
    assert out.choices[0].text == llm.generate("Hello", max_new_tokens=8, temperature=0).text


# --- the API key ------------------------------------------------------------------------------

@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": KEY},  # no "Bearer "
                                     {"Authorization": f"Bearer {KEY}x"},
                                     {"Authorization": f"Basic {KEY}"}],
                         ids=["none", "wrong", "bare", "longer", "basic"])
def test_every_endpoint_but_health_needs_the_key(server, headers):
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as c:
        assert c.get("/health").status_code == 200
        for method, path, body in (
                ("GET", "/v1/models", None), ("GET", "/metrics", None), ("GET", "/nope", None),
                ("POST", "/generate", {"prompt": "hi", "max_new_tokens": 4}),
                ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 4}),
                ("POST", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4}),
                ("POST", "/tokenize", {"prompt": "hi"}), ("POST", "/detokenize", {"tokens": [1]})):
            r = c.request(method, path, json=body)
            error_of(r, 401)
            assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_scheme_of_the_key_is_case_insensitive(server, scheme):
    """RFC 7235: the authentication scheme is case-insensitive (the key itself is not)."""
    ok = httpx.get(server.url + "/v1/models", headers={"Authorization": f"{scheme} {KEY}"})
    assert ok.status_code == 200, ok.text
    error_of(httpx.get(server.url + "/v1/models",
                       headers={"Authorization": f"{scheme} {KEY.upper()}x"}), 401)


def test_wrong_key_through_the_openai_client(server):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.status_code == 401


def test_the_key_is_never_logged(server, oai):
    oai.completions.create(model=MODEL, prompt="hi", max_tokens=4)
    httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer wrong"})
    log = server.log()
    assert "API key required" in log and KEY not in log


# --- stream_options.include_usage -----------------------------------------------------------

def test_include_usage_sends_a_last_usage_chunk(oai, llm):
    ref = llm.generate(MESSAGES, max_new_tokens=12, temperature=0)
    chunks = list(oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12,
                                              temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    *body, last = chunks
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (
        len(ref.prompt_token_ids), 12, len(ref.prompt_token_ids) + 12)
    assert all(c.usage is None for c in body)
    assert body[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in body) == ref.text

    ref = llm.generate("Once upon a time", max_new_tokens=8, temperature=0)
    chunks = list(oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8,
                                         temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 8
    assert last.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert "".join(c.choices[0].text for c in body) == ref.text


def test_without_include_usage_every_chunk_has_a_choice(oai):
    chunks = list(oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8,
                                              stream=True))
    assert all(len(c.choices) == 1 for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})])
def test_without_include_usage_no_chunk_has_usage(client, path, body):
    with client.stream("POST", path, json={**body, "max_tokens": 4, "stream": True}) as r:
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    rows = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert rows and all("usage" not in row for row in rows)
    assert rows[-1]["choices"][0]["finish_reason"] == "length"


def test_include_usage_raw_stream_ends_with_usage_then_done(client):
    body = {"prompt": "hi", "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=body) as r:
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert '"choices": []' in events[-2] and '"total_tokens"' in events[-2]


@pytest.mark.parametrize("body,param", [
    ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
    ({"stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
    ({"stream": True, "stream_options": {"other": 1}}, "stream_options.other")])
def test_bad_stream_options_are_400(client, body, param):
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, **body})
    assert error_of(r, 400)["param"] == param


# --- /tokenize and /detokenize ----------------------------------------------------------------

def test_tokenize_detokenize_round_trip(client, llm):
    text = "The capital of France is Paris."
    out = client.post("/tokenize", json={"prompt": text}).json()
    assert out == {"tokens": llm.encode(text), "count": len(llm.encode(text)),
                   "max_model_len": llm.max_model_len}
    assert client.post("/detokenize", json={"tokens": out["tokens"]}).json() == {"prompt": text}
    chat = client.post("/tokenize", json={"messages": MESSAGES}).json()
    assert chat["tokens"] == llm.encode(MESSAGES) and chat["count"] == len(chat["tokens"])
    assert client.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize("path,body,param", [
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ("/detokenize", {"tokens": ["1"]}, "tokens.0"),
    ("/detokenize", {"tokens": [1.0]}, "tokens.0"),
    ("/detokenize", {}, "tokens"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "hi", "messages": MESSAGES}, "prompt"),
    ("/tokenize", {"prompt": ""}, "prompt"),
    ("/tokenize", {"messages": [{"role": "nope", "content": "x"}]}, "messages"),
    ("/tokenize", {"prompt": 5}, "prompt")])
def test_bad_tokenize_requests_are_400(client, path, body, param):
    assert error_of(client.post(path, json=body), 400)["param"] == param


def test_no_tokenizer_is_400(tiny_llada):
    from fastapi.testclient import TestClient

    from dlrt.server.app import create_app
    from dlrt.server.worker import Worker

    llm = LLM(tiny_llada, dtype="float32")
    with TestClient(create_app(llm, Worker(llm), "llada")) as c:
        for path, body, field in (("/tokenize", {"prompt": "hi"}, "prompt"),
                                  ("/tokenize", {"messages": MESSAGES}, "messages"),
                                  ("/detokenize", {"tokens": [1, 2]}, "tokens")):
            err = error_of(c.post(path, json=body), 400)
            assert err["param"] == field and "no tokenizer" in err["message"], err


# --- /metrics -------------------------------------------------------------------------------

def scrape(client) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of GET /metrics."""
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_metrics_count_requests_and_blocks(server, client, oai, llm):
    ref = llm.generate("Hello", max_new_tokens=12, temperature=0, block_length=4)
    before = scrape(client)
    out = oai.completions.create(model=MODEL, prompt="Hello", max_tokens=12, temperature=0,
                                 extra_body={"block_length": 4})
    assert out.choices[0].text == ref.text
    httpx.get(server.url + "/v1/models")  # a 401
    client.post("/v1/completions", json={"model": "other", "prompt": "hi"})  # a 404
    after = scrape(client)

    def grew(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert grew("dlrt_requests_total", endpoint="/v1/completions", code="200") == 1
    assert grew("dlrt_requests_total", endpoint="/v1/completions", code="404") == 1
    assert grew("dlrt_requests_total", endpoint="/v1/models", code="401") == 1
    assert grew("dlrt_time_to_first_block_seconds_count") == 1
    assert grew("dlrt_request_tps_count") == 1 and grew("dlrt_request_tps_sum") > 0
    assert grew("dlrt_rounds_per_block_count") == len(ref.denoise_steps) > 1
    assert grew("dlrt_rounds_per_block_sum") == sum(ref.denoise_steps)
    assert grew("dlrt_generation_tokens_total") == out.usage.completion_tokens
    assert grew("dlrt_prompt_tokens_total") == out.usage.prompt_tokens
    assert after[("dlrt_queue_waiting", ())] == 0 and after[("dlrt_requests_running", ())] == 0
