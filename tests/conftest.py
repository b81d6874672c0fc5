"""Shared fixtures. Nothing here may import jax at module level: the parity plugin must set
the simulated device count before jax starts."""

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


@pytest.fixture(scope="session")
def git() -> Callable[..., str]:
    """`git(repo, *args) -> stdout`, with a fixed identity, for throwaway repositories."""
    return _git
