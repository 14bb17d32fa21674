"""What the training examples share: their command-line options."""
from __future__ import annotations

import argparse


def parse_example_args(doc: str, argv=None, **defaults) -> argparse.Namespace:
    """An option per keyword (`batch_size=32` -> `--batch-size`, typed by its default), plus --quiet."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name, value in defaults.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(value), default=value,
                        help=f"(default {value})")
    ap.add_argument("--quiet", action="store_true", help="no progress output")
    return ap.parse_args(argv)
