"""The tiny DiffusionGemma preset (make-checkpoint's, with the embedded default model's
tokenizer) behind the front doors: the server in process (FastAPI's test client over the real
app and worker) answers /generate with one NDJSON line per canvas, /v1/chat/completions and
/v1/completions with the tokens `LLM.generate` gives for the same options; bad renoising
options and image input are 400s naming them; `dlrt generate` (a subprocess, as a user runs
it) prints the same tokens."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dlrt import LLM

pytest.importorskip("fastapi")

OPTIONS = dict(max_denoising_steps=5, entropy_bound=0.5, t_min=0.3, t_max=0.7, seed=2,
               ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_diffusion_gemma):
    return LLM(str(tiny_diffusion_gemma), device="cpu", max_model_len=512)


def client_of(llm: LLM):
    from fastapi.testclient import TestClient

    from dlrt.server.app import create_app
    from dlrt.server.worker import Worker

    return TestClient(create_app(llm, Worker(llm), "dg"))


def test_generate_streams_one_line_per_canvas(llm):
    want = llm.generate("def add(a, b):", max_new_tokens=40, **OPTIONS)
    with client_of(llm) as c, c.stream("POST", "/generate", json={
            "prompt": "def add(a, b):", "max_new_tokens": 40, **OPTIONS}) as s:
        assert s.status_code == 200
        rows = [json.loads(line) for line in s.iter_lines() if line]
    blocks, final = rows[:-1], rows[-1]
    assert [len(b["token_ids"]) for b in blocks] == [16, 16, 8]
    assert [t for b in blocks for t in b["token_ids"]] == want.token_ids
    assert "".join(b["text"] for b in blocks) == want.text
    assert final["type"] == "final" and final["finish_reason"] == "length"


def test_openai_endpoints_answer_with_the_same_tokens(llm):
    chat = [{"role": "user", "content": "Write a loop."}]
    want_chat = llm.generate(chat, max_new_tokens=20, **OPTIONS)
    want_text = llm.generate("for i in", max_new_tokens=20, **OPTIONS)
    with client_of(llm) as c:
        r = c.post("/v1/chat/completions", json={"model": "dg", "messages": chat,
                                                 "max_tokens": 20, **OPTIONS})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["message"]["content"] == want_chat.text
        assert body["usage"]["completion_tokens"] == 20
        assert body["choices"][0]["finish_reason"] == "length"
        r = c.post("/v1/completions", json={"prompt": "for i in", "max_tokens": 20, **OPTIONS})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want_text.text
        with c.stream("POST", "/v1/chat/completions", json={
                "messages": chat, "max_tokens": 20, "stream": True, **OPTIONS}) as s:
            chunks = [json.loads(line[6:]) for line in s.iter_lines()
                      if line.startswith("data: {")]
        text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks)
        assert text == want_chat.text


@pytest.mark.parametrize("path, body, param, words", [
    ("/generate", {"prompt": "x", "entropy_bound": -1}, "entropy_bound", "must be a number > 0"),
    ("/v1/completions", {"prompt": "x", "max_denoising_steps": 0}, "max_denoising_steps",
     "must be in [1, 1024]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "t_min": 0.9},
     "t_min", "must be < t_max=0.8"),
    ("/generate", {"input_ids": [5, 1, 6]}, "input_ids", "image input (image_token_id 1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, "messages",
     "only text content parts"),
])
def test_bad_requests_are_400s_naming_the_field(llm, path, body, param, words):
    with client_of(llm) as c:
        r = c.post(path, json={**body, "max_tokens" if path != "/generate" else
                               "max_new_tokens": 8})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and words in err["message"], err
        assert c.get("/health").json()["running"] == 0


@pytest.mark.slow
def test_the_cli_generates_the_same_tokens(llm, tiny_diffusion_gemma):
    argv = [sys.executable, "-m", "dlrt", "generate", "--model", str(tiny_diffusion_gemma),
            "--device", "cpu", "--prompt", "import sys", "--max-new-tokens", "24",
            "--max-denoising-steps", "5", "--entropy-bound", "0.5", "--t-min", "0.3",
            "--t-max", "0.7", "--seed", "2", "--ignore-eos", "--json", "--quiet"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    want = llm.generate("import sys", max_new_tokens=24, **OPTIONS)
    assert got["token_ids"] == want.token_ids and got["text"] == want.text
    assert got["denoise_steps"] == want.denoise_steps
