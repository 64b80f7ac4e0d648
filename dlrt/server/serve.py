"""`dlrt serve`: check the flags and the address, load the model and serve it over HTTP
(uvicorn). Under torchrun `LLM(...)` returns only on rank 0, which serves; the other ranks run
its requests with it (with data parallelism, each request on one group: `Worker`).

Stopping: the first SIGINT or SIGTERM stops taking connections and drains (the running request
and the queued ones finish); a second SIGINT answers the queued ones with 503 and cancels the
running one at its next block; a third stops at once (status 130, waiting for nothing).
Otherwise the generation thread has stopped before the LLM closes. Once the model can run no
more requests (under torchrun: a rank stopped), the server says why in one line and stops with
exit status 1 (`LOST`); `/health` answers 503."""

from __future__ import annotations

import errno
import logging
import socket

from dlrt.errors import OptionError, PromptError
from dlrt.server.worker import Worker

log = logging.getLogger("dlrt.server")
LOST = 1  # the exit status once the model can run no more requests


class CannotListen(OptionError):
    """The server cannot listen on its address (a port in use, an address not of this
    machine): exit code 3, as uvicorn's startup failure."""

    exit_code = 3


def check_defaults(llm, defaults: dict) -> None:
    """Refuse bad decoding flags at startup, as `LLM.generate` would refuse them (the options
    resolved against the model's defaults), and a default max_new_tokens (the flag's or the
    model's) that does not fit the context even after a one-token prompt, so that every request
    leaving it unset would be refused; the message names the flag.

    Raises:
        OptionError: "--max-new-tokens: max_new_tokens=0 must be >= 1", "--max-new-tokens:
            max_new_tokens=5000 does not fit the context even for a one-token prompt: ...".
    """
    from dlrt.decoding.options import DecodingOptions, as_flag_error

    try:
        params = llm.resolve(DecodingOptions.from_kwargs(defaults))
        llm.check([0], **defaults)  # the context check of every request, at its smallest
    except OptionError as e:
        raise as_flag_error(e) from e
    except PromptError as e:
        fit = llm.max_new_tokens_fit(1, **defaults)
        if fit >= 1:
            given = "" if "max_new_tokens" in defaults else "the default "
            raise OptionError(
                f"--max-new-tokens: {given}max_new_tokens={params.max_new_tokens} does not fit "
                f"the context even for a one-token prompt: {e}; set --max-new-tokens {fit} or "
                "less") from e
        flag = "--block-length" if "block_length" in defaults else "--max-model-len"
        raise OptionError(f"{flag}: not even one new token fits the context after a one-token "
                          f"prompt: {e}") from e


def check_address(host: str, port: int) -> None:
    """Refuse a host that does not resolve to an address (before uvicorn, whose error does
    not name it) and a port outside 0..65535.

    Raises:
        OptionError: "--host: cannot resolve '999.1.1.1' to an address to listen on (...)".
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise OptionError(f"--port: {port!r} is not a port number in [0, 65535]")
    try:  # "" listens on every interface, as socket.bind takes it (AI_PASSIVE with None)
        socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                           flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError, ValueError) as e:
        raise OptionError(f"--host: cannot resolve {host!r} to an address to listen on "
                          f"({e})") from e


def check_listen(host: str, port: int) -> None:
    """Refuse an address the server could not listen on, before the model loads (uvicorn finds
    it only after): bind every address `host` resolves to, as uvicorn's listener does
    (SO_REUSEADDR, IPv6 only on IPv6 sockets), and let go. Port 0 (any free port) passes.

    Raises:
        CannotListen: "--port: 127.0.0.1:18080: address already in use (...)".
    """
    if port == 0:
        return
    for family, kind, proto, _, address in socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:  # a family this machine lacks: the listener skips it too
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as e:
                where = f"{address[0]}:{address[1]}"
                if e.errno == errno.EADDRINUSE:
                    raise CannotListen(f"--port: {where}: address already in use (another "
                                       "process listens there): stop it or choose another "
                                       "--port") from e
                raise CannotListen(f"--host/--port: cannot listen on {where}: "
                                   f"{e.strerror or e}") from e


def check_served_name(name: str | None) -> None:
    """Refuse an empty (or blank) `--served-model-name` (None: the default name).

    Raises:
        OptionError: "--served-model-name: empty: ...".
    """
    if name is not None and not name.strip():
        raise OptionError(f"--served-model-name: {name!r} is empty: give the name clients "
                          "send as `model`, or leave the flag out to serve the --model "
                          "folder's name")


def check_api_key(key: str | None) -> None:
    """Refuse an empty (or blank) `--api-key`: it would ask for nothing (None: no key).

    Raises:
        OptionError: "--api-key: empty: ...".
    """
    if key is not None and not key.strip():
        raise OptionError("--api-key: the key is empty: give a key, or leave --api-key out "
                          "(and DLRT_API_KEY unset) to serve without one")


def check_server_packages() -> None:
    """OptionError naming the install command when FastAPI or uvicorn is missing (the
    `serve` extras)."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise OptionError(f"dlrt serve needs {' and '.join(missing)}: install the server "
                          "extras, pip install 'dlrt[serve]' (from a checkout: "
                          "pip install -e '.[serve]')")


def served_name(model) -> str:
    """The name a model is served under by default: the last part of its path (its folder's
    name; `name` of a hub repo id `org/name`), or "dlrt-default" for the embedded default."""
    return str(model).rstrip("/").split("/")[-1] if model else "dlrt-default"


def serve(llm_kwargs: dict, defaults: dict, host: str, port: int, max_queue: int,
          request_timeout: float, max_body_bytes: int, served_model_name: str | None = None,
          api_key: str | None = None) -> int:
    """Load `LLM(**llm_kwargs)` and serve it (blocks until shutdown) as `served_model_name`
    (default: `served_name`), asking for `api_key` when set. Under torchrun the model loads on
    every rank and only rank 0 gets here past the load (`LLM`). Returns the process exit code:
    0, 128 + the signal that stopped it (130: SIGINT), 3: the server could not start,
    `LOST` (1): it stopped because the model can run no more requests.

    Raises:
        OptionError: an empty name or key, a host that does not resolve or a port out of
            range (before the model loads), decoding defaults no request could use
            (`check_defaults`).
        CannotListen: an address the server cannot listen on (before the model loads).
    """
    from dlrt import LLM

    check_server_packages()  # before the model loads
    check_served_name(served_model_name)
    check_api_key(api_key)
    check_address(host, port)  # on every rank, before the model loads: all of them stop
    check_listen(host, port)
    llm = LLM(**llm_kwargs)
    model = llm_kwargs.get("model")
    check_defaults(llm, defaults)
    from dlrt.server.app import create_app
    from dlrt.server.http_server import HTTPServer

    name = served_model_name or served_name(model)
    worker = Worker(llm, max_queue=max_queue, timeout_s=request_timeout)
    app = create_app(llm, worker, name, defaults, max_body_bytes, api_key=api_key)
    groups = llm.data_parallel_size
    server = HTTPServer(app, worker, host, port, started=lambda: log.info(
        "serving %s on http://%s:%d (%d rank(s)%s%s)", name, host, port, llm.world_size,
        f", {groups} data-parallel groups" if groups > 1 else "",
        ", API key required" if api_key else ""))
    try:
        server.run()
    finally:
        worker.close_now()  # the generation thread has stopped (it has, unless run failed)
        llm.close()  # under torchrun: the other ranks close with it and end
    if server.lost is not None:
        return LOST
    if server.signals:
        return 128 + server.signals[0]
    return 0 if server.started else 3  # uvicorn's STARTUP_FAILURE
