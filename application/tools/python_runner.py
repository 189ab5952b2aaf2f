"""One call of a ``@turnlog.tool`` function, in a process of its own.

``python -m turnlog.application.tools.python_runner MODULE FUNCTION`` with the
arguments (JSON) in ``TURNLOG_TOOL_ARGUMENTS``: validates them against the
function's type hints, calls it, prints the result as JSON. A refusal or an
exception is one line on stderr and exit code 1.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
from typing import Any

from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from turnlog.application.tools.python import (
    ARGUMENTS_ENV,
    PRE_STATE_ENV,
    RESULT_MARK,
    arguments_model,
)


def _function(module: str, qualname: str) -> Any:
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def probe(module: str, qualname: str) -> int:
    """Run a tool's probe: ``probe(arguments, idempotency_key, pre_state)`` → its answer object."""
    function = _function(module, qualname)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            answer = function(
                json.loads(os.environ[ARGUMENTS_ENV]),
                os.environ.get("TURNLOG_IDEMPOTENCY_KEY", ""),
                json.loads(os.environ.get(PRE_STATE_ENV, "{}")),
            )
        text = json.dumps(to_jsonable_python(answer))
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(f"\n{RESULT_MARK}{text}")
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--probe":
        return probe(*argv[1:])
    module, qualname = argv
    function = _function(module, qualname)
    try:
        arguments = arguments_model(function).model_validate(json.loads(os.environ[ARGUMENTS_ENV]))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        print(f"invalid arguments: {problems}", file=sys.stderr)
        return 1
    try:
        values = {name: getattr(arguments, name) for name in type(arguments).model_fields}
        # What the function prints goes to stderr: stdout ends with the result alone.
        with contextlib.redirect_stdout(sys.stderr):
            result = function(**values)
        text = json.dumps(to_jsonable_python(result))
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(f"\n{RESULT_MARK}{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
