import os
import warnings

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """The compiled kernels only speed up the "cpu" backend: when they cannot be built
    (no compiler, no cffi headers), warn and install anyway; dynagraph then runs on
    numpy. DYNAGRAPH_WERROR=1 or DYNAGRAPH_REQUIRE_KERNELS=1 make a failure fatal."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - any build failure means "no kernels"
            self._skip(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            self._skip(e)

    def _skip(self, e: Exception) -> None:
        if any(os.environ.get(k, "") not in ("", "0") for k in ("DYNAGRAPH_WERROR", "DYNAGRAPH_REQUIRE_KERNELS")):
            raise e
        warnings.warn(f"dynagraph: compiled kernels not built ({type(e).__name__}: {e}); "
                      "the 'cpu' backend will fall back to numpy")


def bookkeeping_extension() -> Extension:
    """dynagraph._bookkeeping: recording and the executor's per-node bookkeeping in C
    (kernels/cpython/, CPython API). Optional like the kernels: without it the same
    work runs in its pure-Python twins."""
    strict = os.environ.get("DYNAGRAPH_WERROR", "") not in ("", "0")
    flags = [] if os.name == "nt" else ["-O2"] + (["-Wall", "-Wextra", "-Werror"] if strict else [])
    src = ["kernels/cpython/module.c", "kernels/cpython/recorder.c", "kernels/cpython/node_table.c", "kernels/cpython/columns.c", "kernels/cpython/expr_recorder.c",
           "kernels/cpython/leaves.c", "kernels/cpython/graph_leaves.c", "kernels/cpython/sig_cache.c",
           "kernels/cpython/executor.c", "kernels/cpython/run_tables.c", "kernels/cpython/run_reads.c",
           "kernels/cpython/batch_run.c", "kernels/cpython/replay.c", "kernels/cpython/batch_columns.c", "kernels/cpython/direct_batch.c", "kernels/cpython/direct_products.c", "kernels/cpython/direct_step.c", "kernels/cpython/direct_shaped.c", "kernels/cpython/backward_step.c", "kernels/cpython/backward_shaped.c", "kernels/cpython/direct_output.c",
           "kernels/cpython/block_pool.c",
           "kernels/cpython/column_gather.c",
           "kernels/cpython/backward_batch.c", "kernels/cpython/grad_scatter.c", "kernels/cpython/grad_rows.c",
           "kernels/cpython/backward_ops.c", "kernels/cpython/backward_products.c", "kernels/cpython/backward_operands.c",
           "kernels/cpython/schedule.c", "kernels/cpython/agenda.c", "kernels/cpython/sort_ids.c", "kernels/cpython/typewise.c",
           "kernels/cpython/typewise_graph.c", "kernels/cpython/typewise_chain.c", "kernels/cpython/batch_merge.c",
           "kernels/cpython/phase_split.c", "kernels/cpython/array_view.c"]
    return Extension("dynagraph._bookkeeping", src, depends=["kernels/cpython/bookkeeping.h", "kernels/cpython/recorder.h",
                                                                 "kernels/cpython/backward_batch.h", "kernels/cpython/batch_run.h", "kernels/cpython/row_layout.h",
                                                                 "kernels/cpython/typewise.h"],
                     include_dirs=["kernels/cpython"], extra_compile_args=flags)


def coarsen_extension() -> Extension:
    """dynagraph._coarsen: automatic coarsening's per-node pass in C (optional: its twin is
    dynagraph/coarsen/detect.py's instances_py)."""
    strict = os.environ.get("DYNAGRAPH_WERROR", "") not in ("", "0")
    flags = [] if os.name == "nt" else ["-O2"] + (["-Wall", "-Wextra", "-Werror"] if strict else [])
    return Extension("dynagraph._coarsen", ["kernels/cpython/coarsen.c", "kernels/cpython/coarsen_plan.c",
                                               "kernels/cpython/block_call.c"],
                     depends=["kernels/cpython/coarsen.h"], include_dirs=["kernels/cpython"], extra_compile_args=flags)


setup(
    name="dynagraph",
    version="0.1.0",
    description="Dynamic neural networks written per sample, batched automatically (DyNet-compatible API)",
    packages=find_packages(include=["dynagraph", "dynagraph.*"]),
    python_requires=">=3.9",
    install_requires=["numpy>=1.22", "tqdm>=4.0", "threadpoolctl>=3.0", "cffi>=1.15", "greenlet>=1.0"],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6"],
        "bench": ["dynet38", "torch==2.13.0"],
        "gpu": ["cupy-cuda12x"],
        "plot": ["matplotlib>=3.5"],
        "mpi": ["mpi4py>=3.1"],
        "dev": ["pytest>=7", "hypothesis>=6", "ruff"],
    },
    ext_modules=[bookkeeping_extension(), coarsen_extension()],
    cffi_modules=["dynagraph/backends/_cffi_build.py:ffibuilder"],
    cmdclass={"build_ext": OptionalBuildExt},
)
