"""Reading a request body: at most a size limit, UTF-8 JSON, an object, validated strictly by
a `protocol` model; every failure an `HTTPError` (413, or 400 naming the field as sent)."""

from __future__ import annotations

import json
import sys
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from dlrt.server.errors import HTTPError


def _sent_path(err: dict[str, Any], data: Any) -> list[str | int]:
    """The part of a pydantic error location that exists in the body the client sent (plus a
    missing field's name): the tags pydantic adds for the members of a union
    (`stop.int`, `stop.list[union[int,str]].0.str`) are left out."""
    loc = err["loc"]
    path: list[str | int] = [loc[0]]
    node = data.get(loc[0]) if isinstance(data, dict) else None
    for i, part in enumerate(loc[1:], 1):
        if isinstance(node, dict) and isinstance(part, str) and (
                part in node or (err["type"] == "missing" and i == len(loc) - 1)):
            node = node.get(part)
        elif (isinstance(node, list) and isinstance(part, int) and not isinstance(part, bool)
              and 0 <= part < len(node)):
            node = node[part]
        else:
            break
        path.append(part)
    return path


def _invalid(e: ValidationError, data: Any) -> HTTPError:
    """A 400 naming the field the client sent, for the first validation error."""
    errors = e.errors()
    path = _sent_path(errors[0], data)
    param = ".".join(str(x) for x in path)
    n = len(path)
    # a union: one error per member type, each under its tag (the part after the field)
    tags = list(dict.fromkeys(str(err["loc"][n]) for err in errors
                              if len(err["loc"]) > n and list(err["loc"][:n]) == path))
    if len(tags) > 1:
        return HTTPError(400, f"{param}: expected one of {', '.join(tags)}", param=param)
    return HTTPError(400, f"{param}: {errors[0]['msg']}", param=param)


async def read_body(request: Request, model: type[BaseModel], limit: int) -> BaseModel:
    """Read, decode and validate a JSON body of at most `limit` bytes as `model`.

    Raises:
        HTTPError: 413 (larger than `limit`), 400 (the client left mid-body, not UTF-8, not
            JSON, not an object, or invalid: `param` names the field as sent).
    """
    size = request.headers.get("content-length")
    if size is not None and (not size.isdigit() or int(size) > limit):
        raise HTTPError(413, f"request body larger than {limit} bytes")
    raw = b""
    try:
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise HTTPError(413, f"request body larger than {limit} bytes")
    except ClientDisconnect as e:  # the client left mid-body: nobody reads the answer
        raise HTTPError(400, "the client disconnected before sending the whole body") from e
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise HTTPError(400, f"request body is not valid UTF-8: {e}") from e
    except json.JSONDecodeError as e:
        raise HTTPError(400, f"request body is not valid JSON: {e}") from e
    except RecursionError as e:
        raise HTTPError(400, "request body is not valid JSON: nested too deeply") from e
    except ValueError as e:  # an integer past Python's int-string conversion limit
        why = (f"an integer has more than {sys.get_int_max_str_digits()} digits"
               if "integer string conversion" in str(e) else str(e))
        raise HTTPError(400, f"request body is not valid JSON: {why}") from e
    if not isinstance(data, dict):
        raise HTTPError(400, "request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _invalid(e, data) from e
