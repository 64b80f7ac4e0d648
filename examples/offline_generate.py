"""Generate with dlrt's Python API: a text prompt, chat messages, and a stream of blocks.

    python examples/offline_generate.py                                  # embedded default
    python examples/offline_generate.py --model path/to/SDAR-8B-Chat --max-new-tokens 256

Without --model this runs the embedded default: a 7.6M-parameter SDAR demonstration model
trained on the Python standard library (shipped in dlrt/data/sdar-stdlib-8m), so its text is
Python-looking code; its chat template turns a message into `# ` comment lines. Texts are
printed with repr() so whitespace and any odd character show.
"""

from __future__ import annotations

import argparse

from dlrt import LLM, GenerationResult


def show(result: GenerationResult) -> None:
    """Print what a finished request returns."""
    print(f"text: {result.text!r}")
    print(f"finish_reason: {result.finish_reason}")  # "stop" (an end token) or "length"
    print(f"tokens: {len(result.token_ids)}")
    print(f"TPS: {result.request_tps:.1f}")
    print(f"rounds per block: {result.denoise_steps}")  # denoising rounds each block took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None,
                        help="checkpoint folder (default: the embedded tiny SDAR model)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()

    llm = LLM(args.model)  # device and dtype: CUDA + bfloat16 when there is a GPU, else CPU

    # 1. A text prompt, continued as plain text. Sampling with a seed is reproducible.
    print("== text prompt ==")
    show(llm.generate("The capital of France is", max_new_tokens=args.max_new_tokens,
                      temperature=0.7, seed=0))

    # 2. Chat messages go through the checkpoint's chat template. Each block of
    #    `block_length` masked positions is denoised in at most `denoising_steps` rounds;
    #    low_confidence_dynamic commits every position whose confidence passes `threshold`
    #    (at least one per round), so easy blocks take fewer rounds. Greedy: temperature 0.
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    decoding = dict(max_new_tokens=args.max_new_tokens, block_length=4, denoising_steps=4,
                    remasking_strategy="low_confidence_dynamic", threshold=0.9,
                    temperature=0.0)
    print("== chat ==")
    show(llm.generate(messages, **decoding))

    # 3. The same request streamed: one BlockOutput per decided block, as soon as it is
    #    decided. Greedy decoding makes the blocks add up to the chat result above.
    print("== stream ==")
    for block in llm.stream(messages, **decoding):
        print(f"block {block.index}: {block.rounds} rounds, {len(block.token_ids)} tokens: "
              f"{block.text!r}", flush=True)
        if block.finish_reason is not None:  # set on the last block only
            print(f"finish_reason: {block.finish_reason}")


if __name__ == "__main__":
    main()
