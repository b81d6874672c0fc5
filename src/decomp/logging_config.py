"""Logging for training runs: one project handler on the root logger, jax's logs included.

jax logs compiles (`jax_log_compiles`, or `JAX_LOG_COMPILES=1`) through loggers under
`jax._src`, created when jax is imported. `logging.config.dictConfig` disables every
existing logger it does not name unless told otherwise, which would silence those records
before they reach any handler; hence `disable_existing_loggers: False`.
"""

from __future__ import annotations

import logging
import logging.config
from pathlib import Path
from typing import Any

#: The project's handler names, on the root logger.
CONSOLE_HANDLER = "decomp_console"
FILE_HANDLER = "decomp_file"

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def logging_dict(
    level: str | int = "INFO", *, log_file: str | Path | None = None
) -> dict[str, Any]:
    """The `dictConfig` dictionary `configure_logging` applies.

    **Arguments:**

    - `level`: the root logger's level (name or number).
    - `log_file`: also append records to this file (keyword-only).

    **Returns:** a `dictConfig` schema-1 dictionary with `disable_existing_loggers: False`.
    """
    handlers: dict[str, Any] = {
        CONSOLE_HANDLER: {
            "class": "logging.StreamHandler",
            "formatter": "decomp",
            "stream": "ext://sys.stderr",
        }
    }
    if log_file is not None:
        handlers[FILE_HANDLER] = {
            "class": "logging.FileHandler",
            "formatter": "decomp",
            "filename": str(log_file),
            "encoding": "utf-8",
        }
    return {
        "version": 1,
        # Loggers that exist already (jax's, created at import) must keep propagating.
        "disable_existing_loggers": False,
        "formatters": {"decomp": {"format": _FORMAT}},
        "handlers": handlers,
        "root": {"level": level, "handlers": list(handlers)},
    }


def configure_logging(level: str | int = "INFO", *, log_file: str | Path | None = None) -> None:
    """Send every logger's records, jax's compile logs included, to the project's handlers.

    Replaces the root logger's handlers with a stderr handler and, with `log_file`, a file
    handler; loggers created before the call (jax's) stay enabled.

    **Arguments:**

    - `level`: the root logger's level (name or number).
    - `log_file`: also append records to this file (keyword-only).
    """
    logging.config.dictConfig(logging_dict(level, log_file=log_file))
