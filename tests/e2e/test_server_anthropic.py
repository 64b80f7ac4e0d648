"""Anthropic's `POST /v1/messages` over plain HTTP against one `dlrt serve` process with an API
key, checked against `LLM` in this process: the whole message, the streamed events in order,
`system` and content as strings or text blocks, `stop_sequences` and the stop reasons, the key
as `x-api-key` or Bearer, and errors in Anthropic's shape."""

from __future__ import annotations

import json

import httpx
import pytest

from dlrt import LLM

MODEL = "tiny-anthropic"
KEY = "sk-ant-test-5b1e"
SYSTEM = "Answer in one word."
USER = "Name three colours."
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
BODY = {"model": MODEL, "max_tokens": 8, "temperature": 0, "system": SYSTEM,
        "messages": [{"role": "user", "content": USER}]}


@pytest.fixture(scope="module")
def llm(tiny_sdar) -> LLM:
    return LLM(tiny_sdar, dtype="float32")


@pytest.fixture(scope="module")
def server(start_server):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DLRT_API_KEY", KEY)
        return start_server("anthropic", "--served-model-name", MODEL)


@pytest.fixture(scope="module")
def client(server):
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as c:
        yield c


def anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    """The message of an Anthropic error body of a response with `status` and error `kind`."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind, body
    assert body["error"]["message"], body
    return body["error"]["message"]


def events_of(client: httpx.Client, body: dict) -> list[tuple[str, dict]]:
    """(event name, data) of every server-sent event of a streamed /v1/messages."""
    with client.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    out = []
    for chunk in text.strip().split("\n\n"):
        name, data = chunk.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), chunk
        out.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return out


def test_a_whole_message(client, llm):
    ref = llm.generate(CHAT, max_new_tokens=8, temperature=0)
    r = client.post("/v1/messages", json=BODY)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"].startswith("msg_") and out["type"] == "message"
    assert (out["role"], out["model"]) == ("assistant", MODEL)
    assert out["content"] == [{"type": "text", "text": ref.text}]
    assert (out["stop_reason"], out["stop_sequence"]) == ("max_tokens", None)
    assert out["usage"] == {"input_tokens": len(ref.prompt_token_ids), "output_tokens": 8}


def test_system_and_content_as_text_blocks(client):
    whole = client.post("/v1/messages", json=BODY).json()
    blocks = {**BODY, "system": [{"type": "text", "text": SYSTEM[:6]},
                                 {"type": "text", "text": SYSTEM[6:],
                                  "cache_control": {"type": "ephemeral"}}],
              "messages": [{"role": "user", "content": [{"type": "text", "text": USER}]}]}
    out = client.post("/v1/messages", json=blocks).json()
    assert out["content"] == whole["content"] and out["usage"] == whole["usage"]


def test_a_conversation_with_sampling_options(client, llm):
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": USER}]
    ref = llm.generate(turns, max_new_tokens=8, temperature=0.7, top_p=0.9, top_k=20, seed=3)
    out = client.post("/v1/messages", json={
        "model": MODEL, "max_tokens": 8, "messages": turns, "temperature": 0.7, "top_p": 0.9,
        "top_k": 20, "seed": 3, "metadata": {"user_id": "u-1"}}).json()
    assert out["content"][0]["text"] == ref.text


def test_the_streamed_events_in_order(client, llm):
    ref = llm.generate(CHAT, max_new_tokens=8, temperature=0, block_length=4)
    blocks = [b.text for b in llm.stream(CHAT, max_new_tokens=8, temperature=0,
                                         block_length=4) if b.text]
    assert len(blocks) >= 2
    events = events_of(client, {**BODY, "block_length": 4})
    names = [name for name, _ in events]
    assert names == ["message_start", "content_block_start",
                     *["content_block_delta"] * len(blocks), "content_block_stop",
                     "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["content"] == []
    assert (start["role"], start["model"], start["stop_reason"]) == ("assistant", MODEL, None)
    assert start["usage"] == {"input_tokens": len(ref.prompt_token_ids), "output_tokens": 0}
    assert events[1][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}
    deltas = [data for name, data in events if name == "content_block_delta"]
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in deltas)
    assert [d["delta"]["text"] for d in deltas] == blocks  # a delta per decided block
    assert "".join(blocks) == ref.text
    assert events[-3][1] == {"type": "content_block_stop", "index": 0}
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 8
    assert events[-1][1] == {"type": "message_stop"}


def test_stop_sequences(client, llm):
    ref = llm.generate(CHAT, max_new_tokens=16, temperature=0)
    cut = ref.text[len(ref.text) // 2:][:2]
    assert cut.strip()
    want = llm.generate(CHAT, max_new_tokens=16, temperature=0, stop=["zz\x00", cut])
    assert want.finish_reason == "stop" and want.stop_reason == cut
    body = {**BODY, "max_tokens": 16, "stop_sequences": ["zz\x00", cut]}
    out = client.post("/v1/messages", json=body).json()
    assert out["content"][0]["text"] == want.text
    assert (out["stop_reason"], out["stop_sequence"]) == ("stop_sequence", cut)
    delta = events_of(client, body)[-2][1]["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": cut}


@pytest.mark.parametrize("final,expect", [
    ({"finish_reason": "stop", "stop_reason": 151645}, ("end_turn", None)),
    ({"finish_reason": "stop", "stop_reason": "###"}, ("stop_sequence", "###")),
    ({"finish_reason": "length", "stop_reason": None}, ("max_tokens", None)),
    ({"finish_reason": "timeout", "stop_reason": None}, ("timeout", None))])
def test_the_stop_reason_of_each_end(final, expect):
    from dlrt.server.routes.anthropic import _stop

    got = _stop(final)
    assert (got["stop_reason"], got["stop_sequence"]) == expect


# --- the API key ----------------------------------------------------------------------------

def test_the_key_as_x_api_key_or_bearer(server):
    body = {**BODY, "max_tokens": 2}
    for headers in ({"x-api-key": KEY}, {"Authorization": f"Bearer {KEY}"}):
        assert httpx.post(server.url + "/v1/messages", json=body, headers=headers,
                          timeout=60).status_code == 200
    # x-api-key serves the OpenAI endpoints too
    r = httpx.get(server.url + "/v1/models", headers={"x-api-key": KEY})
    assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL
    for headers in ({}, {"x-api-key": "wrong"}, {"x-api-key": KEY + "x"},
                    {"Authorization": KEY}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(server.url + "/v1/messages", json=body, headers=headers, timeout=60)
        assert "x-api-key" in anthropic_error(r, 401, "authentication_error")
    r = httpx.get(server.url + "/v1/models", headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == 401  # the OpenAI shape


# --- errors in Anthropic's shape ------------------------------------------------------------

@pytest.mark.parametrize("change,status,kind,needle", [
    ({"max_tokens": None}, 400, "invalid_request_error", "max_tokens"),
    ({"max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
    ({"model": None}, 400, "invalid_request_error", "model"),
    ({"model": "claude-sonnet-4-5"}, 404, "not_found_error", "claude-sonnet-4-5"),
    ({"messages": []}, 400, "invalid_request_error", "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, 400, "invalid_request_error",
     "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "invalid_request_error", "only text blocks"),
    ({"system": [{"type": "image"}]}, 400, "invalid_request_error", "system.0"),
    ({"tools": [{"name": "f", "input_schema": {}}]}, 400, "invalid_request_error", "tools"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, 400, "invalid_request_error",
     "thinking"),
    ({"stop_sequences": "x"}, 400, "invalid_request_error", "stop_sequences"),
    ({"temperature": -1}, 400, "invalid_request_error", "temperature"),
    ({"unknown": 1}, 400, "invalid_request_error", "unknown")])
def test_bad_requests_are_anthropic_errors(client, change, status, kind, needle):
    body = {k: v for k, v in {**BODY, **change}.items() if v is not None}
    assert needle in anthropic_error(client.post("/v1/messages", json=body), status, kind)


def test_not_json_unknown_paths_and_methods_are_anthropic_errors(client):
    r = client.post("/v1/messages", content=b"{not json",
                    headers={"content-type": "application/json"})
    assert "not valid JSON" in anthropic_error(r, 400, "invalid_request_error")
    anthropic_error(client.get("/v1/messages"), 405, "invalid_request_error")
    anthropic_error(client.post("/v1/messages/count_tokens", json=BODY), 404, "not_found_error")


def test_no_tokenizer_is_an_anthropic_400(tiny_llada):
    from fastapi.testclient import TestClient

    from dlrt.server.app import create_app
    from dlrt.server.worker import Worker

    llm = LLM(tiny_llada, dtype="float32")
    with TestClient(create_app(llm, Worker(llm), "llada")) as c:
        r = c.post("/v1/messages", json={**BODY, "model": "llada"})
        assert "no tokenizer" in anthropic_error(r, 400, "invalid_request_error")
