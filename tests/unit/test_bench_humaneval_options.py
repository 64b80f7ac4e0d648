"""`dlrt bench humaneval` takes the LLaDA canvas decoder's request options (the approximate KV
caches with dInfer's vicinity, iteration smoothing and its values) as `dlrt generate` does:
its requests give the tokens of `LLM.generate` with them, and its record names them."""

import json

import pytest

from dlrt import LLM
from dlrt.entrypoints.cli import main


@pytest.mark.parametrize("flags,options", [
    (["--canvas-cache", "prefix"], {"canvas_cache": "prefix"}),
    (["--canvas-cache", "dual", "--vicinity-before", "2", "--vicinity-after", "3"],
     {"canvas_cache": "dual", "vicinity_before": 2, "vicinity_after": 3}),
    (["--smoothing", "--remasking-strategy", "threshold", "--cont-weight-init", "0.2",
      "--threshold-decay", "0.05"],
     {"smoothing": True, "remasking_strategy": "threshold", "cont_weight_init": 0.2,
      "threshold_decay": 0.05})])
def test_the_canvas_options_reach_the_requests(tiny_llada, tmp_path, monkeypatch, flags,
                                               options):
    seen = []
    generate = LLM.generate

    def spy(self, prompt, *args, **kw):
        seen.append(kw)
        return generate(self, prompt, *args, **kw)

    monkeypatch.setattr(LLM, "generate", spy)
    data = tmp_path / "he.jsonl"
    data.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():"}) + "\n")
    out = tmp_path / "runs"
    assert main(["bench", "humaneval", "--model", str(tiny_llada), "--data", str(data),
                 "--num-prompts", "1", "--max-new-tokens", "16", "--block-length", "8",
                 "--out", str(out), *flags]) == 0
    assert len(seen) == 2  # the warm-up and the timed request
    assert all(kw == dict(options, max_new_tokens=16, block_length=8) for kw in seen), seen
    (path,) = out.glob("humaneval-*.json")
    rec = json.loads(path.read_text())
    assert rec["options"] == dict(options, max_new_tokens=16, block_length=8)
    (row,) = rec["modes"]["eager"]["rows"]
    ids = list(range(1000, 1016))  # the request of a checkpoint without a tokenizer
    want = LLM(str(tiny_llada)).generate(ids, max_new_tokens=16, block_length=8, **options)
    assert row["token_ids"] == want.token_ids and row["rounds"] == sum(want.denoise_steps)
