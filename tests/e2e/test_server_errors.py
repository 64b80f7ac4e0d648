"""Server answers to faults of the model and of the checkpoint, in process (FastAPI's test
client over the real app and worker): non-finite logits are a 500 in the OpenAI error shape and
the server keeps serving; a checkpoint without a tokenizer gets a 400 on the OpenAI endpoints
(their answers are text) that says to send token ids to /generate."""

from __future__ import annotations

import json

import pytest
import torch

from dlrt import LLM

pytest.importorskip("fastapi")


def client_of(llm: LLM, name: str):
    from fastapi.testclient import TestClient

    from dlrt.distributed.ranks import Ranks
    from dlrt.server.app import create_app
    from dlrt.server.worker import Worker

    return TestClient(create_app(llm, Worker(llm, Ranks()), name))


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
        assert c.get("/health").json()["running"] == 0
        r = c.post("/v1/completions", json=body)
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
