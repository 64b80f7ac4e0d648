"""The Hugging Face folder of a trained model: `config.json` (`model_type: sdar`),
`generation_config.json`, `model.safetensors` (SDAR tensor names), the tokenizer files and
`training_record.json`; and a check that dlrt's own SDAR loader reproduces the logits."""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from dlrt.train.model import SDARTrainModel, Shape
from dlrt.train.objective import block_causal_mask
from dlrt.train.tokenizer import save_tokenizer

RECORD_NAME = "training_record.json"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def sdar_config(shape: Shape, special: dict[str, int], block_size: int, max_positions: int,
                dtype: str) -> dict[str, Any]:
    """config.json of an SDAR dense model with the trained tokenizer's special ids."""
    return {
        "architectures": ["SDARForCausalLM"], "model_type": "sdar", **shape.as_config(),
        "max_position_embeddings": max_positions, "hidden_act": "silu",
        "attention_bias": False, "use_sliding_window": False, "rope_scaling": None,
        "block_size": block_size, "mask_token_id": special["mask"],
        "bos_token_id": special["eos"], "eos_token_id": special["eos"],
        "pad_token_id": special["pad"], "torch_dtype": dtype,
    }


def write_folder(out: str | Path, model: SDARTrainModel, tokenizer, special: dict[str, int],
                 block_size: int, max_positions: int, record: dict[str, Any],
                 dtype: str = "bfloat16", overwrite: bool = False) -> Path:
    """Write the folder (through a temporary sibling, renamed into place) and return it.

    Raises:
        FileExistsError: `out` exists and `overwrite` is False.
    """
    from safetensors.torch import save_file

    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists (pass overwrite to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tensors = {k: v.detach().to("cpu", DTYPES[dtype]).contiguous()
                   for k, v in model.checkpoint_tensors().items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = sdar_config(model.shape, special, block_size, max_positions, dtype)
        generation = {"eos_token_id": [special["eos"]], "pad_token_id": special["pad"]}
        for name, data in (("config.json", config), ("generation_config.json", generation)):
            (tmp / name).write_text(json.dumps(data, indent=2) + "\n")
        write_record(tmp, record)
        save_tokenizer(tokenizer, tmp, model_max_length=max_positions)
        _plain_modes(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def _plain_modes(folder: Path) -> None:
    """Give `folder` and its files the modes a plain mkdir / open give under the process's
    umask: mkdtemp makes the folder 700 and safetensors writes its file 600."""
    umask = os.umask(0o022)  # NOTE: the umask can only be read by setting it
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


def write_record(folder: Path, record: dict[str, Any]) -> None:
    (Path(folder) / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n")


def saved_copy(model: SDARTrainModel, dtype: str) -> SDARTrainModel:
    """An fp32 CPU copy of the model with its weights rounded to the saved dtype."""
    cpu = copy.deepcopy(model).to("cpu", torch.float32).eval()
    with torch.no_grad():
        for p in cpu.parameters():
            p.copy_(p.to(DTYPES[dtype]).float())
    return cpu


def dlrt_logits_error(folder: str | Path, model: SDARTrainModel, ids: torch.Tensor,
                      block: int, dtype: str = "bfloat16") -> float:
    """Relative L2 error between dlrt's logits (`LLM(folder)` on the CPU in fp32, one
    block-causal forward over `ids` [N]) and the training model's with the saved weights."""
    from dlrt.llm import LLM

    llm = LLM(str(folder), device="cpu", dtype="float32")
    ref = saved_copy(model, dtype)
    with torch.no_grad():
        ours = llm.runner.forward_at(ids, 0, chunk_block=block).double()
        n = ids.shape[0]
        hidden = ref(ids[None], torch.arange(n), block_causal_mask(n, block))[0]
        want = ref.logits(hidden).double()
    return ((ours - want).norm() / want.norm()).item()
