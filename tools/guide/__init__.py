"""docs/adopting.md as an executable document, in parts (the command: tools/adopting_guide.py).

- `parse`: the guide's markers read into blocks (`parse`, `Block`, `GuideError`).
- `normalise`: what differs between two walks of the same code, replaced (`normalise`,
  `stand_in`).
- `walk`: the blocks run in order on a fresh project, in a fresh user's environment
  (`walk`, `Walk`, `Step`, `environment`, `apply_edit`).
- `render`: the guide rewritten from a walk, its prose's figures filled from the output,
  and compared with the committed one, with or without its numbers (`render`,
  `fill_figures`, `difference`, the host marker).
- `install`: the install section held to pyproject.toml and README.md
  (`install_problems`).

Each imports only those above it in this list (`install` only `parse`); `render.this_host`
and `install` import parity, the rest nothing of it.
"""

from guide.install import install_problems
from guide.normalise import normalise, stand_in
from guide.parse import GUIDE, PROJECT, PROMPT, ROOT, Block, GuideError, parse
from guide.render import (
    FIGURE,
    HOST_MARKER,
    difference,
    fill_figures,
    masked,
    render,
    this_host,
    with_host,
    write_atomically,
    written_on,
)
from guide.walk import COMMAND_TIMEOUT_S, Step, Walk, apply_edit, environment, walk

__all__ = [
    "COMMAND_TIMEOUT_S",
    "FIGURE",
    "GUIDE",
    "HOST_MARKER",
    "PROJECT",
    "PROMPT",
    "ROOT",
    "Block",
    "GuideError",
    "Step",
    "Walk",
    "apply_edit",
    "difference",
    "environment",
    "fill_figures",
    "install_problems",
    "masked",
    "normalise",
    "parse",
    "render",
    "stand_in",
    "this_host",
    "walk",
    "with_host",
    "write_atomically",
    "written_on",
]
