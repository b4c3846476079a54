"""pytest configuration of the Python tests: puts python/ on sys.path.

Run from the repository root: /usr/bin/python3 -m pytest test/Python -q
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(ROOT, "python")
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)
