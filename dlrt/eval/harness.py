"""The lm-evaluation-harness model `dlrt` (`lm_eval --model dlrt` once this module is imported:
`dlrt eval ...` and `import dlrt.eval.harness` do so; lm-eval 0.4 finds no model outside its
tree by itself).

- generate_until: `LLM.generate` on the context's token ids; the request's `until` strings are
  stop strings (beside the model arguments' `stop`), `max_gen_toks` is `max_new_tokens`
  (default: the model arguments' `max_new_tokens`, else 256, the harness's default),
  `do_sample: false` is greedy (temperature 0), and any other generation key must be a
  decoding option (`temperature`, `top_p`, `top_k`, `block_length`, ...). A context too long
  for the model keeps its last tokens (as the harness's Hugging Face model does).
- loglikelihood: `dlrt.eval.likelihood` (the Monte-Carlo estimator of LLaDA's paper); a
  context too long keeps its last tokens.
- loglikelihood_rolling (perplexity tasks): refused by name.
- chat templates (`--apply_chat_template`): the checkpoint tokenizer's, applied as the
  harness's Hugging Face model applies them.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from typing import Any

import jinja2
import lm_eval.models  # noqa: F401  (the harness's own models stay registered beside ours)
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from dlrt import progress
from dlrt.decoding.options import DecodingOptions, check_ranges
from dlrt.errors import OptionError, PromptError
from dlrt.eval.likelihood import LikelihoodEstimator
from dlrt.eval.model_args import parse_model_args
from dlrt.llm import LLM

log = logging.getLogger(__name__)

MAX_GEN_TOKS = 256  # new tokens of a request that sets no max_gen_toks (the harness's default)


@register_model("dlrt")
class DlrtLM(TemplateLM):
    """A dlrt `LLM` as a harness model; `**model_args` as `dlrt.eval.model_args` describes.

    Raises:
        OptionError: a bad model argument (before the model is loaded).
        CheckpointError, ConfigError: as `LLM(...)`; a checkpoint without a tokenizer (the
            harness sends text).
    """

    def __init__(self, **model_args: Any):
        super().__init__()
        args = parse_model_args(model_args)
        engine = dict(args.engine)
        device = str(engine.get("device", "auto"))
        if device.startswith("cuda") and not torch.cuda.is_available():
            log.warning("device %r: no CUDA device here, using the CPU (pass --device cpu)",
                        device)
            engine["device"] = "cpu"
        self.args = args
        self.llm = LLM(**engine)
        if self.llm.tokenizer is None:
            raise OptionError(f"{self.llm.folder.path} has no tokenizer: the harness sends "
                              "text, so the dlrt model needs a checkpoint with one")
        self.tokenizer = self.llm.tokenizer
        self._device = self.llm.device
        self._estimator: LikelihoodEstimator | None = None
        self.stats = {"generate_until": dict(requests=0, new_tokens=0, seconds=0.0),
                      "loglikelihood": dict(requests=0, forwards=0, seconds=0.0)}

    # -- tokens ----------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        return eos if eos is not None else self.llm.eos_token_ids[0]

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self.llm.max_model_len

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   **kwargs: Any) -> list[int]:
        """Token ids as `LLM.generate` encodes a text prompt (the tokenizer's special tokens
        unless `add_special_tokens` is False)."""
        flag = True if add_special_tokens is None else add_special_tokens
        return list(self.tokenizer.encode(string, add_special_tokens=flag))

    def tok_decode(self, tokens: list[int], **kwargs: Any) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    # -- chat templates --------------------------------------------------------------------
    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        """The chat history through the tokenizer's chat template, as text (system messages
        left out when the template refuses them).

        Raises:
            PromptError: the tokenizer has no chat template.
        """
        if not getattr(self.tokenizer, "chat_template", None):
            raise PromptError("the checkpoint's tokenizer has no chat template; leave out "
                              "--apply_chat_template")
        kw = dict(tokenize=False, add_generation_prompt=add_generation_prompt,
                  continue_final_message=not add_generation_prompt)
        try:
            return self.tokenizer.apply_chat_template(chat_history, **kw)
        except jinja2.exceptions.TemplateError:
            log.warning("the chat template refused the history: applying it without the "
                        "system messages")
            rest = [m for m in chat_history if m["role"] != "system"]
            return self.tokenizer.apply_chat_template(rest, **kw)

    # -- generate_until --------------------------------------------------------------------
    def request_options(self, gen_kwargs: dict[str, Any]) -> dict[str, Any]:
        """The `LLM.generate` options of one request: the model arguments' decoding options
        updated by its generation keys (see the module docstring).

        Raises:
            OptionError: a generation key that is not a decoding option, or a bad value.
        """
        kw = dict(gen_kwargs)
        until = kw.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_gen = kw.pop("max_gen_toks", None)
        if kw.pop("do_sample", None) is False:
            kw["temperature"] = 0.0
        names = {f.name for f in dataclasses.fields(DecodingOptions)}
        unknown = sorted(set(kw) - names)
        if unknown:
            raise OptionError(f"generation key(s) {unknown} of the task are not dlrt decoding "
                              f"options; known: until, max_gen_toks, do_sample, "
                              f"{', '.join(sorted(names))}")
        options = {**self.args.decoding, **kw}
        stop = options.get("stop", ())
        stop = [stop] if isinstance(stop, (str, int)) else list(stop)
        options["stop"] = [*stop, *(s for s in until if s not in stop)]
        options["max_new_tokens"] = max_gen if max_gen is not None else \
            options.get("max_new_tokens", MAX_GEN_TOKS)
        check_ranges(DecodingOptions.from_kwargs(options))
        return options

    def prompt_ids(self, context: str, options: dict[str, Any]) -> list[int]:
        """The context's token ids (as `LLM.generate` encodes it), cut from the left to fit
        the model's context with the request's new tokens."""
        ids = self.llm.encode(context)
        state = random.getstate()  # NOTE: resolving draws a seed; the request draws its own
        try:
            params = self.llm.resolve(DecodingOptions.from_kwargs(options))
        finally:
            random.setstate(state)
        limit = self.llm.max_model_len
        keep = _longest_fit(len(ids), lambda n: n < limit and
                            self.llm.decoder.max_positions(n, params) <= limit)
        if keep < len(ids):
            log.warning("a context of %d tokens keeps its last %d to fit the model's %d with "
                        "%d new tokens", len(ids), keep, self.llm.max_model_len,
                        options["max_new_tokens"])
            ids = ids[len(ids) - keep:]
        return ids

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """The generated text of each request (`Instance.args`: (context, generation keys))."""
        out = []
        stats = self.stats["generate_until"]
        with progress.bar(len(requests), "generate_until", unit="request",
                          show=not disable_tqdm) as bar:
            for req in requests:
                context, gen_kwargs = req.args
                options = self.request_options(gen_kwargs)
                t0 = time.perf_counter()
                result = self.llm.generate(self.prompt_ids(context, options), **options)
                stats["seconds"] += time.perf_counter() - t0
                stats["requests"] += 1
                stats["new_tokens"] += len(result.token_ids)
                out.append(result.text)
                self.cache_hook.add_partial("generate_until", req.args, result.text)
                bar.update(1)
        return out

    # -- loglikelihood ---------------------------------------------------------------------
    @property
    def estimator(self) -> LikelihoodEstimator:
        """The log-likelihood estimator (made on first use: its refusals, a family without a
        mask token or tensor parallelism, concern loglikelihood tasks only)."""
        if self._estimator is None:
            a = self.args
            self._estimator = LikelihoodEstimator(self.llm, a.mc_num, a.seed, a.check_greedy)
        return self._estimator

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False
                              ) -> list[tuple[float, bool]]:
        estimator = self.estimator
        stats = self.stats["loglikelihood"]
        out = []
        with progress.bar(len(requests), "loglikelihood", unit="request",
                          show=not disable_tqdm) as bar:
            for key, context, continuation in requests:
                room = self.llm.max_model_len - len(continuation)
                if room < 1:
                    raise PromptError(f"a continuation of {len(continuation)} tokens does not "
                                      f"fit the model's context of {self.llm.max_model_len}")
                if len(context) > room:
                    log.warning("a context of %d tokens keeps its last %d", len(context), room)
                    context = context[len(context) - room:]
                t0 = time.perf_counter()
                before = estimator.forwards
                answer = estimator.loglikelihood(context, continuation)
                stats["seconds"] += time.perf_counter() - t0
                stats["forwards"] += estimator.forwards - before
                stats["requests"] += 1
                out.append(answer)
                self.cache_hook.add_partial("loglikelihood", key, answer)
                bar.update(1)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Refused: a diffusion model has no left-to-right factorisation to roll over.

        Raises:
            OptionError: always (naming the request type).
        """
        raise OptionError("loglikelihood_rolling (perplexity tasks such as wikitext) is not "
                          "supported by the dlrt model: a masked diffusion model gives a bound "
                          "on a continuation's likelihood (loglikelihood), not a rolling "
                          "left-to-right one")

    # -- the record ------------------------------------------------------------------------
    def get_model_info(self) -> dict[str, Any]:
        """What the harness's results record of the model: the resolved engine options, the
        estimator's settings, and the time spent per request type."""
        cfg = self.llm.engine_config
        gen = dict(self.stats["generate_until"])
        gen["tokens_per_s"] = gen["new_tokens"] / gen["seconds"] if gen["seconds"] else 0.0
        return {"dlrt": {
            "model": str(self.llm.folder.path), "family": self.llm.config.family,
            "decoder": self.llm.decoder_name, "device": str(self.llm.device),
            "dtype": str(self.llm.dtype).removeprefix("torch."),
            "execution_mode": cfg.execution_mode, "attention_backend": cfg.attention_backend,
            "decoding": self.args.decoding, "mc_num": self.args.mc_num,
            "seed": self.args.seed, "check_greedy": self.args.check_greedy,
            "generate_until": gen, "loglikelihood": dict(self.stats["loglikelihood"])}}


def _longest_fit(n: int, fits) -> int:
    """The largest k <= n with fits(k) (fits is monotone: true up to some length), at least 1."""
    if fits(n):
        return n
    lo, hi = 1, n  # NOTE: hi does not fit; lo is returned even if it does not (check refuses)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
