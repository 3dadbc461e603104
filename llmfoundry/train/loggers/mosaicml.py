"""mosaicml logger: refused with a one-line error. It reports run metadata to the MosaicML platform (mcli) for
runs that platform launched; there is no such platform here."""

from __future__ import annotations

from llmfoundry.train.loggers.settings import MosaicMLSettings


def build_mosaicml(settings: MosaicMLSettings, run_name: str):
    raise AssertionError("validation refuses this logger before it is built")
