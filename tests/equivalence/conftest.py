"""The equivalence suite: producers run on the current code, checked against goldens/."""

import sys
from pathlib import Path

# The producers live beside the tests; repin runs the same file in a subprocess.
sys.path.insert(0, str(Path(__file__).parent))
