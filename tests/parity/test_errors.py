"""`parity._errors` (issue 50): every error parity defines is a `ParityError`, keeping the
built-in class it had (a `KeyError` for an unknown class name), and the command line prints
any of them as one line with its exit code."""

from __future__ import annotations

import importlib
import inspect
import io
import pkgutil
from contextlib import redirect_stderr

import pytest

import parity
from parity._errors import ParityError


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(parity.__path__, "parity."):
        if info.name in ("parity.__main__", "parity.machinery._producer_runner"):
            continue  # the entry point, and a script run as a process of its own
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value) and issubclass(value, BaseException)
                and value.__module__ == info.name and not name.startswith("_")
            ):  # fmt: skip
                found[f"{info.name}.{name}"] = value
    return found


def test_every_error_parity_defines_is_a_parity_error() -> None:
    classes = _exception_classes()
    assert "parity.store._errors.GoldenCorruptError" in classes  # the walk reaches the store
    assert [name for name, cls in classes.items() if not issubclass(cls, ParityError)] == []
    # ... and keeps the built-in class it had, for callers that catch that
    from parity.judge._tolerance import UnknownClassError
    from parity.origin import LocaliseError

    assert issubclass(UnknownClassError, KeyError) and issubclass(LocaliseError, ValueError)
    assert parity.ParityError is ParityError


def test_the_command_line_prints_any_parity_error_as_one_line_with_its_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error no command converts (a `ParityError` raised deep in a run) reaches `main`'s
    one handler: one line on stderr, the error's exit code, no traceback."""
    from parity import _cli as cli
    from parity.commands import _show as show

    class Deep(ParityError):
        exit_code = 2

    def run(args: object, out: object) -> int:
        raise Deep("the golden file is\nbusy: wait for the repin")

    monkeypatch.setattr(show, "run", run)
    err = io.StringIO()
    with redirect_stderr(err):
        code = cli.main(["show", "goldens"])
    assert code == 2
    assert err.getvalue() == "parity: error: the golden file is busy: wait for the repin\n"


def test_a_parity_error_s_line_is_its_message_on_one_line() -> None:
    error = ParityError("the golden file\n  is busy:\twait")
    assert error.line == "the golden file is busy: wait" and ParityError.exit_code == 2
