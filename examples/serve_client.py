"""Talk to a running `dlrt serve`: NDJSON streaming with httpx, then the OpenAI client.

Start a server first (without --model it serves the embedded default: a 7.6M-parameter SDAR
demonstration model trained on the Python standard library, so its text is Python-looking code),
then run this client against it:

    dlrt serve --host 127.0.0.1 --port 18080          # add --model DIR for a real checkpoint
    python examples/serve_client.py --base-url http://127.0.0.1:18080

Texts are printed with repr() so whitespace and any odd character show.
"""

from __future__ import annotations

import argparse
import json

import httpx
from openai import OpenAI

MESSAGES = [{"role": "user", "content": "Write a haiku about the sea."}]
# dlrt's own decoding options (any `LLM.generate` option) ride along as extra fields.
DLRT_OPTIONS = {"remasking_strategy": "threshold", "threshold": 0.9}


def ndjson(base: str, max_new_tokens: int) -> None:
    """POST /generate: one JSON line per decided block, then a final line with the totals."""
    print("== /generate (NDJSON) ==")
    body = {"messages": MESSAGES, "max_new_tokens": max_new_tokens, "temperature": 0,
            **DLRT_OPTIONS}
    with httpx.Client(timeout=120) as http, \
            http.stream("POST", f"{base}/generate", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line:
                continue
            row = json.loads(line)
            if row["type"] == "block":
                print(f"block {row['index']}: {row['rounds']} rounds, "
                      f"{len(row['token_ids'])} tokens: {row['text']!r}", flush=True)
            elif row["type"] == "final":
                print(f"finish_reason: {row['finish_reason']}")
                print(f"completion_tokens: {row['completion_tokens']}")
                print(f"TPS: {row['request_tps']:.1f}")
            else:  # {"type": "error", "message": ...}: the generation failed on the server
                raise RuntimeError(row["message"])


def openai_chat(base: str, max_new_tokens: int) -> None:
    """The official OpenAI client against /v1: a chat completion, whole and streamed."""
    client = OpenAI(base_url=f"{base}/v1", api_key="unused")
    model = client.models.list().data[0].id  # GET /v1/models: the one model served

    print("== chat completion ==")
    response = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=max_new_tokens, temperature=0,
        extra_body=DLRT_OPTIONS)
    choice = response.choices[0]
    print(f"content: {choice.message.content!r}")
    print(f"finish_reason: {choice.finish_reason}")
    print(f"completion_tokens: {response.usage.completion_tokens}")

    print("== chat completion, streamed ==")
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=max_new_tokens, temperature=0,
        extra_body=DLRT_OPTIONS, stream=True)
    for chunk in stream:  # one chunk per decided block, then one with the finish_reason
        delta = chunk.choices[0].delta.content
        if delta:
            print(f"delta: {delta!r}", flush=True)
        if chunk.choices[0].finish_reason is not None:
            print(f"finish_reason: {chunk.choices[0].finish_reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:18080")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    base = args.base_url.rstrip("/")
    ndjson(base, args.max_new_tokens)
    openai_chat(base, args.max_new_tokens)


if __name__ == "__main__":
    main()
