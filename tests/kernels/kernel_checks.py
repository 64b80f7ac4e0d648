"""Checks shared by the kernel tests: a captured graph's replay against eager calls (GPU),
sm_90 PTX compiled on the CPU in a subprocess without TRITON_INTERPRET (Triton reads that
variable at import, so the test process itself may run the interpreter), and what a CUBIN
holds (its architecture and kernels, read from its ELF header and symbol table)."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def assert_replay_matches_eager(run: Callable[[torch.Tensor], torch.Tensor],
                                shape: tuple[int, ...], seeds: int = 3) -> None:
    """Capture run(static_x) (bf16 `shape` on CUDA; compiled once outside the capture), then
    for `seeds` fresh inputs copied into static_x the replay equals run(x) bit for bit."""
    static_x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run(static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static_y = run(static_x)
    for seed in range(seeds):
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16,
                        generator=torch.Generator("cuda").manual_seed(seed))
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, run(x))


def compile_sm90(fn, sig: dict[str, str], consts: dict, **options) -> str:
    """PTX of the @triton.jit `fn` for sm_90: `sig` types the runtime arguments ("*bf16",
    "i32", ...), `consts` fixes every other one; pointers are 16-byte aligned, as Triton
    specialises real launches. `options`: num_warps, num_stages."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {a: sig.get(a, "constexpr") for a in fn.arg_names}
    assert set(signature) - set(sig) == set(consts), fn.arg_names  # every argument set
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
               if sig.get(a, "").startswith("*")}
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def ptx_folder(tmp_path_factory, script: str, name: str) -> Path:
    """Run `python script OUT` (the test module's `__main__`, which writes .ptx files into OUT)
    without TRITON_INTERPRET and with its own Triton cache; OUT."""
    out = tmp_path_factory.mktemp(name)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(out / "cache")
    proc = subprocess.run([sys.executable, script, str(out)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def body(ptx: str) -> list[str]:
    """Instruction lines without predicates ('@%p1 ld.global...' -> 'ld.global...')."""
    lines = (re.sub(r"^@!?%p\d+\s+", "", ln.strip()) for ln in ptx.splitlines())
    return [ln for ln in lines if ln and not ln.startswith("//")]


def global_loads(lines: list[str]) -> list[int]:
    """Indices of the global loads (plain, cp.async, TMA) among `body` lines."""
    return [i for i, ln in enumerate(lines)
            if re.match(r"ld\.global|cp\.async\.(ca|cg)|cp\.async\.bulk\.tensor", ln)]


EM_CUDA = 190


def cubin_kernels(cubin: bytes) -> tuple[int, set[str]]:
    """(SM version, names of the defined global functions) of a CUBIN: a little-endian ELF64
    image for EM_CUDA, whose e_flags hold the SM version (bits 8-15 from ELF ABI version 8,
    CUDA 13; bits 0-7 before)."""
    assert cubin[:4] == b"\x7fELF" and cubin[4] == 2 and cubin[5] == 1, cubin[:16]
    machine, flags = struct.unpack_from("<H", cubin, 18)[0], struct.unpack_from("<I", cubin, 48)[0]
    assert machine == EM_CUDA, machine
    sm = (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF
    shoff = struct.unpack_from("<Q", cubin, 40)[0]
    shentsize, shnum = struct.unpack_from("<HH", cubin, 58)
    # each section: name, type, flags, addr, offset, size, link, info, addralign, entsize
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize)
                for i in range(shnum)]
    names = set()
    for sec in sections:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sec[6]]
        for off in range(sec[4], sec[4] + sec[5], 24):
            st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", cubin, off)
            if st_info >> 4 == 1 and st_info & 0xF == 2 and st_shndx != 0:  # global, func, defined
                start = strtab[4] + st_name
                names.add(cubin[start:cubin.index(b"\0", start)].decode())
    return sm, names
