"""jax's compile logs reach the project's log, and why `disable_existing_loggers` is off."""

from __future__ import annotations

import logging
import logging.config
import uuid
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from decomp.logging_config import configure_logging, logging_dict


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def isolated_logging() -> Iterator[None]:
    """Put the root handlers, levels and disabled flags back, and compile logs off."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    loggers = {
        name: lg.disabled
        for name, lg in logging.Logger.manager.loggerDict.items()
        if isinstance(lg, logging.Logger)
    }
    try:
        yield
    finally:
        jax.config.update("jax_log_compiles", False)
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, disabled in loggers.items():
            logging.getLogger(name).disabled = disabled


def _compile_something_new() -> None:
    """A program no cache holds (a fresh constant), so jax lowers and compiles it."""
    const = float(uuid.uuid4().int % 1000) + 0.5
    jax.jit(lambda x: jnp.sin(x) * const)(jnp.ones(3)).block_until_ready()


def _compile_records(handler: _ListHandler) -> list[logging.LogRecord]:
    return [
        r
        for r in handler.records
        if r.name.startswith("jax")
        and ("Compiling" in r.getMessage() or "Finished" in r.getMessage())
    ]


@pytest.mark.usefixtures("isolated_logging")
def test_compile_logs_reach_the_project_handlers(tmp_path: Path) -> None:
    log_file = tmp_path / "run.log"
    configure_logging("INFO", log_file=log_file)
    capture = _ListHandler()
    logging.getLogger().addHandler(capture)
    jax.config.update("jax_log_compiles", True)
    _compile_something_new()
    records = _compile_records(capture)
    assert records, [r.getMessage() for r in capture.records]
    assert all(r.levelno == logging.WARNING for r in records)
    for h in logging.getLogger().handlers:
        h.flush()
    text = log_file.read_text()
    assert any(r.getMessage() in text for r in records), text[-2000:]


@pytest.mark.usefixtures("isolated_logging")
def test_disabling_existing_loggers_would_silence_them(tmp_path: Path) -> None:
    early = logging.getLogger(f"decomp.test.early_{uuid.uuid4().hex[:8]}")
    config = logging_dict("INFO", log_file=tmp_path / "run.log")
    assert config["disable_existing_loggers"] is False

    # The project's setting: the early logger and jax's compile logger still deliver.
    logging.config.dictConfig(config)
    capture = _ListHandler()
    logging.getLogger().addHandler(capture)
    early.warning("kept")
    jax.config.update("jax_log_compiles", True)
    _compile_something_new()
    assert [r.getMessage() for r in capture.records if r.name == early.name] == ["kept"]
    assert _compile_records(capture)

    # The dictConfig default: every logger that existed before the call is disabled.
    logging.config.dictConfig({**config, "disable_existing_loggers": True})
    capture = _ListHandler()
    logging.getLogger().addHandler(capture)
    early.warning("lost")
    _compile_something_new()
    assert early.disabled
    assert not [r for r in capture.records if r.name == early.name]
    assert not _compile_records(capture), [r.getMessage() for r in capture.records]
