import sys

from harness.cli import console

sys.exit(console())
