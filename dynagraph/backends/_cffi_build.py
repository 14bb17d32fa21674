"""cffi builder for `dynagraph._kernels` (API mode), run by setup.py's `cffi_modules`.

The C API is declared once, in kernels/dg_kernels.h: cffi's cdef reads that file with
its preprocessor lines removed, so declarations and definitions cannot drift apart.

Environment:
    DYNAGRAPH_WERROR=1   compile with -Wall -Wextra -Werror (CI); a failed build is then fatal
    CC, CFLAGS           honoured by setuptools as usual

Standalone: `python dynagraph/backends/_cffi_build.py` builds the module in place.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
HEADER = KERNELS / "dg_kernels.h"
FAMILIES = ["rows", "elementwise", "reduce", "softmax", "gates", "optim", "fused", "rowmm"]

# -O3 vectorizes the kernels; -fno-trapping-math lets GCC turn their branch-free
# selects into blends (it will not otherwise); -ffp-contract=off keeps a*b+c as two
# roundings, like numpy's separate ufuncs, so both backends give the same numbers.
GCC_FLAGS = ["-std=c99", "-O3", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off"]
STRICT_FLAGS = ["-Wall", "-Wextra", "-Werror"]


def strict() -> bool:
    return os.environ.get("DYNAGRAPH_WERROR", "") not in ("", "0")


def cdef_source(header: Path = HEADER) -> str:
    """The header as cffi's cdef accepts it: no preprocessor lines."""
    text = header.read_text()
    return "\n".join(line for line in text.splitlines() if not re.match(r"\s*#", line))


def compile_args() -> list[str]:
    if sys.platform == "win32":
        return ["/O2"]
    return GCC_FLAGS + (STRICT_FLAGS if strict() else [])


def make_builder(absolute: bool = False) -> FFI:
    """setup.py runs from the project root and wants relative source paths; a build
    from elsewhere (ffi.compile changes directory) needs absolute ones."""
    def _rel(p: Path) -> str:
        return str(p) if absolute else os.path.relpath(p, ROOT)

    ffi = FFI()
    ffi.cdef(cdef_source())
    depends = sorted(KERNELS.glob("*.h")) + sorted(KERNELS.glob("*.inc"))
    ffi.set_source(
        "dynagraph._kernels",
        '#include "dg_kernels.h"',
        sources=[_rel(KERNELS / f"{name}.c") for name in FAMILIES],
        include_dirs=[_rel(KERNELS)],
        depends=[_rel(p) for p in depends],
        extra_compile_args=compile_args(),
        libraries=[] if sys.platform == "win32" else ["m"],
    )
    return ffi


ffibuilder = make_builder()

if __name__ == "__main__":
    # Builds build/cffi/dynagraph/_kernels*.so; `pip install -e .` is the normal route.
    print(make_builder(absolute=True).compile(tmpdir=str(ROOT / "build" / "cffi"), verbose=True))
