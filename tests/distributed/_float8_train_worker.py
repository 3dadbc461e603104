"""`llmfoundry train` with precision amp_fp8 on CPU ranks: the float8 hardware check is patched (torchao's float8
casts and matmuls run on CPU; only the speed needs a GPU), everything else is the real command."""

import sys

from llmfoundry.core import precision
from tests.helpers import make_torchao_importable

make_torchao_importable()

precision.float8_supported = lambda device: True  # noqa: E731 - the one thing a CPU lacks for amp_fp8

if __name__ == "__main__":
    from llmfoundry.cli import main

    sys.exit(main(["train", *sys.argv[1:]]))
