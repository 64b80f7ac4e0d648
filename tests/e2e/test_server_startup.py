"""`dlrt serve` refusing a bad setup before it serves: flag values argparse refuses (exit 2
naming the flag, no model loaded), a host that does not resolve (exit 2 naming it, no model
loaded), decoding defaults no request could use (exit 2 naming the flag, checked as
`LLM.generate` checks them: a default max_new_tokens past the context after a one-token prompt
too), a port in use (exit 3 naming the address, no model loaded; no "serving" line), and an
empty API key or served model name (exit 2 naming the flag or variable, no model loaded)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import uvicorn

import dlrt
from dlrt import LLM
from dlrt.entrypoints.cli import main as cli_main
from dlrt.errors import OptionError
from dlrt.server.serve import CannotListen, check_address, check_defaults, check_listen

pytestmark = pytest.mark.slow  # subprocesses: servers, torchrun, examples


@pytest.fixture(scope="module")
def llm(tiny_sdar) -> LLM:
    return LLM(tiny_sdar, dtype="float32")


@pytest.fixture(scope="module")
def short_llm(tiny_sdar) -> LLM:
    """Context 64: a one-token prompt leaves room for 63 new tokens (block 4)."""
    return LLM(tiny_sdar, dtype="float32", max_model_len=64)


def error_line(capsys, argv: list[str], code: int = 2) -> str:
    """Run the CLI in process: the exit code, and the one `error:` line on stderr."""
    try:
        rc = cli_main(argv)
    except SystemExit as e:
        rc = e.code
    assert rc == code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return next(ln for ln in err.splitlines() if "error:" in ln)


@pytest.mark.parametrize(("flag", "value"), [
    ("--port", "99999"), ("--port", "65536"), ("--port", "0"), ("--port", "-1"),
    ("--port", "http"), ("--max-queue", "-1"), ("--max-queue", "1.5"),
    ("--request-timeout", "-5"), ("--request-timeout", "0"), ("--request-timeout", "nan"),
    ("--max-body-bytes", "0"),
])
def test_bad_server_flags_refused_by_the_parser(capsys, monkeypatch, flag, value):
    monkeypatch.setattr(dlrt, "LLM", lambda *a, **k: pytest.fail("loaded a model"))
    line = error_line(capsys, ["serve", flag, value])
    assert flag in line and repr(value) in line, line


@pytest.mark.parametrize(("flag", "value"), [
    ("--max-new-tokens", "0"), ("--block-length", "0"), ("--denoising-steps", "-1"),
    ("--remasking-strategy", "nope"), ("--threshold", "1.5"), ("--eb-threshold", "0"),
    ("--temperature", "-1"), ("--top-k", "-1"), ("--top-p", "0"), ("--seed", "-1"),
    ("--stop", ""),
])
def test_bad_decoding_defaults_refused_at_startup(capsys, monkeypatch, llm, flag, value):
    monkeypatch.setattr(dlrt, "LLM", lambda *a, **k: llm)  # loaded once for all cases
    monkeypatch.setattr(uvicorn.Server, "run", lambda *a, **k: pytest.fail("served"))
    line = error_line(capsys, ["serve", flag, value])
    assert line.startswith(f"error: {flag}: {flag[2:].replace('-', '_')}"), line


@pytest.mark.parametrize(("flags", "head", "words"), [
    (["--max-new-tokens", "100"], "error: --max-new-tokens: max_new_tokens=100 does not fit",
     "set --max-new-tokens 63 or less"),
    (["--max-new-tokens", "64"], "error: --max-new-tokens: max_new_tokens=64 does not fit",
     "set --max-new-tokens 63 or less"),
    ([], "error: --max-new-tokens: the default max_new_tokens=128 does not fit",
     "set --max-new-tokens 63 or less"),
    (["--max-new-tokens", "8", "--block-length", "128"], "error: --block-length: ",
     "not even one new token fits"),
])
def test_default_max_new_tokens_past_the_context_refused_at_startup(
        capsys, monkeypatch, short_llm, flags, head, words):
    monkeypatch.setattr(dlrt, "LLM", lambda *a, **k: short_llm)
    monkeypatch.setattr(uvicorn.Server, "run", lambda *a, **k: pytest.fail("served"))
    line = error_line(capsys, ["serve", "--max-model-len", "64", *flags])
    assert line.startswith(head), line
    assert words in line and "context of 64" in line and "prompt (1 token)" in line, line


def test_default_max_new_tokens_that_fits_passes(short_llm):
    check_defaults(short_llm, {"max_new_tokens": 63})
    check_defaults(short_llm, {"max_new_tokens": 60, "block_length": 8})  # 61 -> 64


@pytest.mark.parametrize("host", ["999.1.1.1", "no-such-host.invalid", "a" * 300])
def test_unresolvable_host_refused_before_the_model_loads(capsys, monkeypatch, host):
    monkeypatch.setattr(dlrt, "LLM", lambda *a, **k: pytest.fail("loaded a model"))
    line = error_line(capsys, ["serve", "--host", host])
    assert line.startswith(f"error: --host: cannot resolve {host!r}"), line


def test_check_address():
    for host in ("127.0.0.1", "localhost", "0.0.0.0", ""):
        check_address(host, 18080)
    check_address("127.0.0.1", 0)
    for port in (-1, 65536, True):
        with pytest.raises(OptionError, match=rf"--port: {port!r}"):
            check_address("127.0.0.1", port)


def test_good_decoding_defaults_pass(llm):
    check_defaults(llm, {})
    check_defaults(llm, {"max_new_tokens": 8, "block_length": 4, "denoising_steps": 2,
                         "remasking_strategy": "threshold", "threshold": 0.5, "stop": ["\n"]})


def test_port_in_use_is_not_announced(tiny_sdar):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        out = subprocess.run([sys.executable, "-m", "dlrt", "serve", "--model", str(tiny_sdar),
                              "--dtype", "float32", "--port", str(port)],
                             capture_output=True, text=True, timeout=120, env=env,
                             stdin=subprocess.DEVNULL)
    log = out.stdout + out.stderr
    assert out.returncode == 3, log  # uvicorn's STARTUP_FAILURE
    assert "address already in use" in log and "serving" not in log, log
    assert "Traceback" not in log, log


def test_port_in_use_is_refused_before_the_model_loads(capsys, monkeypatch):
    """Exit 3 (the server cannot start), one line naming the address, no model loaded."""
    monkeypatch.setattr(dlrt, "LLM", lambda *a, **k: pytest.fail("loaded a model"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for host in ("127.0.0.1", "0.0.0.0"):
            line = error_line(capsys, ["serve", "--host", host, "--port", str(port)], code=3)
            assert line.startswith(f"error: --port: {host}:{port}: address already in use"), \
                line


def test_check_listen():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    check_listen("127.0.0.1", port)  # free (and left free)
    check_listen("127.0.0.1", port)
    check_listen("127.0.0.1", 0)
    with pytest.raises(CannotListen, match=r"--host/--port: cannot listen on 192\.0\.2\.1:"):
        check_listen("192.0.2.1", port)  # TEST-NET-1: never an address of this machine


@pytest.mark.parametrize(("argv", "variable", "head"), [
    (["--api-key", ""], None, "error: --api-key: the key is empty"),
    (["--api-key", "  "], None, "error: --api-key: the key is empty"),
    ([], "", "error: DLRT_API_KEY is set but empty"),
    ([], " ", "error: DLRT_API_KEY is set but empty"),
    (["--served-model-name", ""], None, "error: --served-model-name: '' is empty"),
])
def test_empty_api_key_or_served_name_refused_before_the_model_loads(
        capsys, monkeypatch, argv, variable, head):
    monkeypatch.setattr(dlrt, "LLM", lambda *a, **k: pytest.fail("loaded a model"))
    if variable is None:
        monkeypatch.delenv("DLRT_API_KEY", raising=False)
    else:
        monkeypatch.setenv("DLRT_API_KEY", variable)
    assert error_line(capsys, ["serve", *argv]).startswith(head)


def test_api_key_flag_wins_over_an_empty_variable(monkeypatch):
    """`--api-key KEY` is used without reading DLRT_API_KEY, even when that is empty."""
    from dlrt.server import serve

    seen = {}
    monkeypatch.setattr(serve, "serve", lambda *a, **kw: seen.update(kw) or 0)
    monkeypatch.setenv("DLRT_API_KEY", "")
    assert cli_main(["serve", "--api-key", "k1"]) == 0
    assert seen["api_key"] == "k1"


def test_create_app_refuses_an_empty_api_key(llm):
    from dlrt.server.app import create_app
    from dlrt.server.worker import Worker

    with pytest.raises(OptionError, match="api_key: the key is empty"):
        create_app(llm, Worker(llm), "tiny", api_key="")
