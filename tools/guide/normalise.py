"""What differs between two walks of the same code, replaced (`normalise`).

Applied to every command's output before it is shown or compared, it replaces what differs
between two runs on the same code and nothing else: the temporary folder (`~`, so the
project reads `~/tinymlp`); commit SHAs (each commit of the project gets a stand-in derived
from its subject, the same at every length git prints, so a SHA in the bisect's answer
matches the one in `git log`); any other hex string of 7+ characters with a letter and a
digit (`<hex>`); git's dates (`<date>`, in `git revert`'s summary); timings (`1.9s`,
`12.3 s`, `40ms`: `<t>`); local ports (`localhost:<port>`); and the host's list of XLA ISA
caps in calibrate's header (`host ISA caps <this host's>`) and the processor a cached
baseline was built on (`parity baseline list`: `GenuineIntel family 6 model 167` reads
`<processor>`), what depends on the machine rather than the run; and the plugin's count
of compiles and cache loads (`compiled <n> ... loaded <n>`), which depends on what the
machine's compilation cache already held. Numbers, keys, verdicts and words are compared as printed;
lines lose trailing whitespace. jaxlib's "[Gloo] Rank 0 is connected to N peer ranks" lines
are not normalised away: the multi-process launcher echoes worker 0's output as it comes,
and with jaxlib 0.10.2 it carries none.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["normalise", "stand_in"]


def stand_in(subject: str) -> str:
    """The 40-hex-digit SHA shown for a commit with this subject (stable across runs)."""
    return hashlib.sha1(subject.encode()).hexdigest()


_HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
_TIMING = re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|s)\b")
_PORT = re.compile(r"\b(localhost|127\.0\.0\.1):\d+\b")
_COMPILES = re.compile(r"XLA compiled \d+ programs? and loaded \d+")
_HOST_CAPS = re.compile(r"host ISA caps [A-Z0-9_]+(?:, [A-Z0-9_]+)*")
# provenance's processor (`cpu_signature`): vendor, family and model
_PROCESSOR = re.compile(r"\b[A-Za-z]+ family \d+ model \d+\b")
# git's default date format, as `git revert` prints it ("Date: Wed Dec 2 06:12:14 2026 +0000")
_DATE = re.compile(
    r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
    r"+\d{1,2} \d\d:\d\d:\d\d \d{4} [+-]\d{4}\b"
)


def normalise(text: str, *, root: str | Path, shas: Mapping[str, str]) -> str:
    """What a run printed, with what differs between two runs of the same code replaced.

    **Arguments:**

    - `text`: the output.
    - `root`: the temporary folder of the walk; it reads `~` (its resolved form too).
    - `shas`: each commit's full SHA to its stand-in; every prefix of 7+ hex digits of a
      SHA becomes the stand-in's prefix of the same length.

    **Returns:** the text with the temporary folder, SHAs, other hex strings of 7+ characters
    that hold a letter and a digit, dates, timings, local ports, the host's ISA cap list and
    processor replaced (see the module docstring), and trailing whitespace removed from every line.
    """
    for path in sorted({str(root), os.path.realpath(root)}, key=len, reverse=True):
        text = text.replace(path, "~")

    def sha(m: re.Match[str]) -> str:
        found = m[0]
        for real, shown in shas.items():
            if real.startswith(found):
                return shown[: len(found)]
        if re.search("[a-f]", found) and re.search("[0-9]", found):
            return "<hex>"
        return found

    text = _HEX.sub(sha, text)
    text = _DATE.sub("<date>", text)
    text = _TIMING.sub("<t>", text)
    text = _PORT.sub(r"\1:<port>", text)
    text = _COMPILES.sub("XLA compiled <n> programs and loaded <n>", text)
    text = _HOST_CAPS.sub("host ISA caps <this host's>", text)
    text = _PROCESSOR.sub("<processor>", text)
    return "\n".join(line.rstrip() for line in text.split("\n"))
