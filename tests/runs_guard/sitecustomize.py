"""Run at the start of every Python process the test suite starts (this folder is on PYTHONPATH): the guard that
reports a touch of the checkout's `runs/` (checkout_runs.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import checkout_runs
finally:
    del sys.path[0]
checkout_runs.install_from_environment()
