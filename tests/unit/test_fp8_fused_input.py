"""FP8 W8A8 layers take their input quantised by the op that makes it: the RMSNorm before
qkv and a dense MLP's gate-up, and SiLU-and-mul before down (`LinearMethod.takes_fp8`,
`dlrt.ops.Fp8Activation`). On the CPU, with the reference ops and with the Triton ops under
the interpreter: those layers (and only those) receive an `Fp8Activation`, and the logits
equal, bit for bit, those of the layers quantising a tensor input themselves."""

from __future__ import annotations

import pytest
import torch

from dlrt import LLM
from dlrt.checkpoint.make import make_checkpoint
from dlrt.layers.quant.fp8 import Fp8Linear
from dlrt.ops import Fp8Activation

PROMPT = torch.tensor([5, 17, 300, 4096, 77, 12, 9, 1000, 3, 44, 8, 250])
# layers whose input comes from a norm or from SiLU-and-mul (a dense MLP's, or LLaDA2's shared
# expert's down); the attention output projections and the MoE blocks take tensors
FED = ("qkv_proj", "qkv", "query_key_value", "mlp.gate_up_proj", "ff_gate_up", "down_proj",
       "ff_out")
SHARED_GATE_UP = "shared_experts.gate_up_proj"  # its input is the MoE block's, a tensor


def _fed(name: str) -> bool:
    return name.endswith(FED) and not name.endswith(SHARED_GATE_UP)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    cache: dict[str, str] = {}

    def get(preset: str):
        if preset not in cache:
            out = tmp_path_factory.mktemp(preset) / "ckpt"
            cache[preset] = make_checkpoint(preset, out, quantization="fp8")
        return cache[preset]
    return get


def _logits_and_inputs(llm: LLM) -> tuple[torch.Tensor, dict[str, type]]:
    """The prompt's logits, and the type of each FP8 layer's input (the last call's)."""
    seen: dict[str, type] = {}
    handles = []
    for name, module in llm.engine.model.named_modules():
        if isinstance(getattr(module, "method", None), Fp8Linear):
            def hook(mod, args, name=name):
                seen[name] = type(args[0])
            handles.append(module.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            logits = llm.runner.forward_at(PROMPT, 0, chunk_block=4)
    finally:
        for h in handles:
            h.remove()
    return logits, seen


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("preset", ["tiny-sdar", "tiny-llada", "tiny-llada2", "tiny-sdar-moe"])
def test_fused_input_equals_own_quantisation(checkpoints, preset, kernels, monkeypatch):
    llm = LLM(checkpoints(preset), kernels=kernels)
    fused, seen = _logits_and_inputs(llm)
    fed = {n for n in seen if _fed(n)}
    assert fed, "no layer is fed by a norm or SiLU-and-mul"
    assert {n for n, t in seen.items() if t is Fp8Activation} == fed
    with monkeypatch.context() as m:
        m.setattr(Fp8Linear, "takes_fp8", lambda self, rows: False)
        own, seen_own = _logits_and_inputs(llm)
    assert all(t is torch.Tensor for t in seen_own.values())
    assert torch.equal(fused, own)


def test_weight_only_layers_take_tensors(checkpoints):
    llm = LLM(checkpoints("tiny-sdar"), fp8_activations="weight_only")
    _, seen = _logits_and_inputs(llm)
    assert seen and all(t is torch.Tensor for t in seen.values())


def test_load_time_check_turns_fused_input_off(checkpoints, caplog):
    """A producer whose codes differ from the plain op's, or that raises, switches every W8A8
    layer back to quantising a tensor input, with a warning; the reference ops pass."""
    import dataclasses

    from dlrt.layers.quant.fp8 import check_fused_input

    llm = LLM(checkpoints("tiny-sdar"))
    model, ops = llm.engine.model, llm.engine.ops
    methods = [m.method for m in model.modules() if isinstance(getattr(m, "method", None),
                                                               Fp8Linear)]
    assert check_fused_input(model, ops, torch.float32, torch.device("cpu"))
    assert all(m.fused_input for m in methods)

    def off_by_one(gate_up):
        a = ops.silu_and_mul_fp8(gate_up)
        return Fp8Activation(a.q, a.scale * 2, a.dtype)

    def broken(*args):
        raise RuntimeError("no kernel")

    for bad in (dict(silu_and_mul_fp8=off_by_one), dict(add_rms_norm_fp8=broken)):
        for m in methods:
            m.fused_input = True
        caplog.clear()
        assert not check_fused_input(model, dataclasses.replace(ops, **bad), torch.float32,
                                     torch.device("cpu"))
        assert not any(m.fused_input for m in methods)
        assert not any(m.takes_fp8(4) for m in methods)
        assert "quantises its input itself" in caplog.text
