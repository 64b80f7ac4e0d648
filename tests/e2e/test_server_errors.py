"""Server answers to faults of the model and of the checkpoint, in process (FastAPI's test
client over the real app and worker): non-finite logits are a 500 in the OpenAI error shape and
the server keeps serving; a checkpoint without a tokenizer gets a 400 on the OpenAI endpoints
(their answers are text) that says to send token ids to /generate; a request without max tokens
whose prompt leaves too little room for the server's default gets a 400 naming the max tokens
field, the default and how many fit."""

from __future__ import annotations

import json
import time

import pytest
import torch

from dlrt import LLM

pytest.importorskip("fastapi")


def client_of(llm: LLM, name: str, defaults: dict | None = None):
    from fastapi.testclient import TestClient

    from dlrt.server.app import create_app
    from dlrt.server.worker import Worker

    return TestClient(create_app(llm, Worker(llm), name, defaults))


def test_non_finite_logits_are_a_500_and_the_server_keeps_serving(tiny_sdar):
    llm = LLM(tiny_sdar, dtype="float32")
    body = {"prompt": "Hello", "max_tokens": 8, "temperature": 0}
    with client_of(llm, "sdar") as c:
        head = llm.model.lm_head.weight
        with torch.no_grad():
            keep = head[11, 0].clone()
            head[11, 0] = float("nan")
            try:
                r = c.post("/v1/completions", json=body)
                assert r.status_code == 500, r.text
                err = r.json()["error"]
                assert err["type"] == "server_error" and "NumericalError" in err["message"]
                with c.stream("POST", "/generate", json={"prompt": "Hello",
                                                        "max_new_tokens": 8}) as s:
                    rows = [json.loads(line) for line in s.iter_lines() if line]
                assert rows[-1]["type"] == "error" and "non-finite" in rows[-1]["message"]
            finally:
                head[11, 0] = keep
        # NOTE: the failed request's thread ends (logging the error) after its last event
        deadline = time.monotonic() + 10
        while c.get("/health").json()["running"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.get("/health").json()["running"] == 0
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


def test_a_temperature_past_fp32_is_a_400_naming_it_and_the_server_keeps_serving(tiny_sdar):
    """1e39 is finite in Python but infinite in the device's fp32: refused before it runs."""
    llm = LLM(tiny_sdar, dtype="float32")
    with client_of(llm, "sdar") as c:
        for path, body in (("/v1/completions", {"prompt": "Hello", "max_tokens": 4}),
                           ("/generate", {"prompt": "Hello", "max_new_tokens": 4})):
            r = c.post(path, json={**body, "temperature": 1e39})
            assert r.status_code == 400, (path, r.text)
            err = r.json()["error"]
            assert err["param"] == "temperature" and "temperature=1e+39" in err["message"], err
        assert c.get("/health").json()["running"] == 0
        r = c.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


def test_no_tokenizer_openai_endpoints_are_400_that_say_to_send_token_ids(tiny_llada):
    llm = LLM(tiny_llada, dtype="float32")
    with client_of(llm, "llada") as c:
        for path, body, field in (
                ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4}, "prompt"),
                ("/v1/completions", {"prompt": "hi", "max_tokens": 4}, "prompt"),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                          "max_tokens": 4}, "messages")):
            r = c.post(path, json=body)
            assert r.status_code == 400, (path, r.text)
            err = r.json()["error"]
            assert err["param"] == field, err
            assert "no tokenizer" in err["message"] and "input_ids" in err["message"], err
        with c.stream("POST", "/generate", json={"input_ids": [1, 2, 3],
                                                "max_new_tokens": 4}) as s:
            rows = [json.loads(line) for line in s.iter_lines() if line]
        assert rows[-1]["type"] == "final" and len(rows[0]["token_ids"]) == 4


def test_default_max_tokens_past_the_context_is_a_400_naming_max_tokens(tiny_sdar):
    llm = LLM(tiny_sdar, dtype="float32", max_model_len=64)
    ids = list(range(1, 31))  # 30 tokens: with block 4, at most 34 new tokens fit (64)
    chat = [{"role": "user", "content": "word " * 40}]
    chat_fit = 64 - len(llm.encode(chat))  # 64 is a multiple of the block (4): no padding
    assert chat_fit >= 1
    with client_of(llm, "sdar", {"max_new_tokens": 40}) as c:
        for path, body, field, fit in (
                ("/v1/completions", {"prompt": ids}, "max_tokens", 34),
                ("/v1/chat/completions", {"messages": chat}, "max_tokens", chat_fit),
                ("/generate", {"input_ids": ids}, "max_new_tokens", 34)):
            r = c.post(path, json=body)
            assert r.status_code == 400, (path, r.text)
            err = r.json()["error"]
            assert err["param"] == field, err
            msg = err["message"]
            assert msg.startswith(f"{field} is not set and the server's default (40) "), msg
            assert "prompt (" in msg and "context of 64" in msg, msg
            assert f"at most {fit} new tokens fit" in msg, msg
        # the client's own max_tokens: named as before, without the default's words
        r = c.post("/v1/completions", json={"prompt": ids, "max_tokens": 40})
        err = r.json()["error"]
        assert err["param"] == "max_tokens" and "default" not in err["message"], err
        # the prompt alone fills the context: the prompt
        r = c.post("/v1/completions", json={"prompt": list(range(1, 65))})
        assert r.json()["error"]["param"] == "prompt", r.text
        # as many as the message says fit
        r = c.post("/v1/completions", json={"prompt": ids, "max_tokens": 34,
                                            "ignore_eos": True, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 34


def test_a_client_gone_mid_body_is_a_400_not_a_traceback():
    """The body reader turns starlette's ClientDisconnect into the 400 every bad body gets."""
    import asyncio

    from starlette.requests import Request

    from dlrt.server.body import read_body
    from dlrt.server.errors import HTTPError

    messages = [{"type": "http.request", "body": b'{"prom', "more_body": True},
                {"type": "http.disconnect"}]

    async def receive():
        return messages.pop(0)

    request = Request({"type": "http", "method": "POST", "headers": [(b"content-length",
                                                                        b"100")]}, receive)
    with pytest.raises(HTTPError) as e:
        asyncio.run(read_body(request, None, 1000))
    assert e.value.status == 400 and "disconnected" in str(e.value)


def test_serve_names_the_missing_server_packages(monkeypatch):
    import importlib.util

    from dlrt.errors import OptionError
    from dlrt.server.serve import check_server_packages

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "uvicorn" else real(name, *a))
    with pytest.raises(OptionError, match=r"needs uvicorn: .*pip install -e '\.\[serve\]'"):
        check_server_packages()


def test_options_without_effect_are_one_log_line_per_request(tiny_sdar, caplog):
    """What the client sets without effect is named, once per request (the request still
    runs); the server's defaults (its flags) never are, whatever the request."""
    import logging

    llm = LLM(tiny_sdar, dtype="float32")
    requests = [({"temperature": 0, "top_k": 3}, "top_k=3"),
                ({"temperature": 0.5}, None),
                ({"temperature": 0, "remasking_strategy": "sequential"}, None),
                ({"remasking_strategy": "sequential", "threshold": 0.5}, "threshold=0.5")]
    with client_of(llm, "sdar", {"top_p": 0.9, "threshold": 0.9}) as c, \
            caplog.at_level(logging.WARNING, logger="dlrt.decoding.ignored"):
        for options, named in requests:
            caplog.clear()
            r = c.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4, **options})
            assert r.status_code == 200, r.text
            lines = [r.getMessage() for r in caplog.records
                     if r.name == "dlrt.decoding.ignored"]
            assert len(lines) == (named is not None), (options, lines)
            if named:
                assert named in lines[0] and "top_p" not in lines[0], lines
                assert "seed" not in lines[0] and "=0.9" not in lines[0], lines


class LosesItsRanks:
    """A loaded LLM whose ranks are lost at the first request (as when a rank stops under
    torchrun): that request and every later one raise, and `lost` says why."""

    def __init__(self, llm: LLM):
        self._llm, self.lost = llm, None

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def stream(self, prompt, **options):
        from dlrt.distributed.calls import OutOfStep

        self.lost = "the control channel failed: RuntimeError: Connection closed by peer"
        raise OutOfStep(f"rank 0: {self.lost}; another rank has stopped")
        yield  # (a generator, as LLM.stream)


def test_health_is_a_503_naming_the_reason_once_the_model_is_lost(tiny_sdar, caplog):
    llm = LosesItsRanks(LLM(tiny_sdar, dtype="float32"))
    with client_of(llm, "sdar") as c:
        assert c.get("/health").json()["status"] == "ok"
        with c.stream("POST", "/generate", json={"prompt": "Hello", "max_new_tokens": 4}) as s:
            rows = [json.loads(line) for line in s.iter_lines() if line]
        assert rows[-1]["type"] == "error" and "OutOfStep" in rows[-1]["message"], rows
        deadline = time.monotonic() + 10  # the failed request's thread ends after its event
        while c.get("/health").json()["running"] and time.monotonic() < deadline:
            time.sleep(0.01)
        r = c.get("/health")
        assert r.status_code == 503, r.text
        assert r.json() == {"status": "error", "running": 0, "waiting": 0, "reason": (
            "the model can run no more requests: the control channel failed: RuntimeError: "
            "Connection closed by peer")}
    assert not any(r.exc_info for r in caplog.records), "a traceback was logged"


def test_serve_stops_with_status_1_and_one_line_once_the_model_is_lost(
        tiny_sdar, monkeypatch, caplog):
    import logging
    import os
    import signal
    import threading

    import httpx
    from conftest import free_port

    import dlrt
    from dlrt.entrypoints.cli import main

    llm = LosesItsRanks(LLM(tiny_sdar, dtype="float32"))
    monkeypatch.setattr(dlrt, "LLM", lambda *a, **k: llm)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    answers: list = []

    def client():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(url + "/health", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        answers.append(httpx.post(url + "/generate", json={"prompt": "Hello"}, timeout=30))

    t = threading.Thread(target=client, daemon=True)
    t.start()
    # a server that goes on serving is stopped after 30 s (status 143)
    watchdog = threading.Timer(30, os.kill, (os.getpid(), signal.SIGTERM))
    watchdog.start()
    try:
        with caplog.at_level(logging.INFO, logger="dlrt"):
            status = main(["serve", "--model", str(tiny_sdar), "--port", str(port), "--quiet"])
    finally:
        watchdog.cancel()
    t.join(30)
    assert status == 1
    assert answers and '"type": "error"' in answers[0].text.replace('":"', '": "'), answers
    stopping = [r.getMessage() for r in caplog.records if "stopping" in r.getMessage()]
    assert stopping == ["stopping: the model can run no more requests: the control channel "
                        "failed: RuntimeError: Connection closed by peer"], stopping
    assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
