"""DyNet's process-level API: command-line flags, DynetParams/init, vecInput/matInput, forward(list).

DyNet reads its flags (`--dynet-seed 5`, `--dynet-autobatch 1`, ...) from sys.argv when it is
imported, each flag followed by its value as the next argument, and leaves sys.argv as it was
(only `--dynet-viz` is removed, by dynet.py). dynagraph does the same at import: the seed and
the autobatch strategy are honoured; the flags about DyNet's own memory pool, devices,
profiling and weight decay have no counterpart here and are reported once.
"""
from __future__ import annotations

import sys
import warnings
from typing import Iterable, Sequence

import numpy as np

from . import config as _config
from .batched import BatchedExpression, samples_of
from .errors import DynagraphError, user_line
from .expressions import inputTensor
from .expression import Expression

__all__ = ["DynetParams", "init", "init_from_params", "vecInput", "matInput", "forward", "zeroes", "npvalues",
           "values"]

# DyNet's flag -> our DynetParams field; DyNet also accepts the underscore spelling.
_VALUED = {"mem": "mem", "seed": "random_seed", "autobatch": "autobatch", "profiling": "profiling",
           "weight-decay": "weight_decay", "devices": "devices", "gpus": "requested_gpus",
           "gpu-mask": "gpu_mask"}
_SWITCHES = {"gpu": "requested_gpus"}  # --dynet-gpu takes no value: one GPU
_HONOURED = ("random_seed", "autobatch")
_warned: set = set()


def parse_argv(argv: Sequence[str]) -> dict:
    """DyNet's flags in argv as {field: value}. Raises ValueError, naming the flag, for a flag
    whose value is missing or not a number where DyNet needs one (DyNet aborts there)."""
    out: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not (arg.startswith("--dynet-") or arg.startswith("--dynet_")):
            i += 1
            continue
        name = arg[len("--dynet-"):].replace("_", "-")
        if name in _SWITCHES:
            out[_SWITCHES[name]] = 1
            i += 1
            continue
        if name not in _VALUED:  # DyNet leaves flags it does not know alone
            i += 1
            continue
        if i + 1 >= len(argv):
            raise ValueError(f"{arg} expects an argument")
        value = argv[i + 1]
        field = _VALUED[name]
        if field in ("random_seed", "autobatch", "profiling", "requested_gpus"):
            try:
                value = int(value)
            except ValueError:
                raise ValueError(f"{arg} expects an integer, got {value!r}") from None
        elif field == "weight_decay":
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"{arg} expects a number, got {value!r}") from None
        out[field] = value
        i += 2
    return out


class DynetParams:
    """DyNet's DynetParams: collect settings (from sys.argv or by hand), then init()."""

    def __init__(self) -> None:
        self.settings: dict = {}

    def from_args(self, shared_parameters=None) -> None:
        self.settings.update(parse_argv(sys.argv))
        if shared_parameters is not None:
            self.settings["shared_parameters"] = shared_parameters

    def from_config(self, conf: dict) -> None:
        """dynet_config.get()'s dict: keys mem, seed, autobatch, profiling, requested_gpus, ..."""
        names = {"seed": "random_seed", "random_seed": "random_seed"}
        for k, v in dict(conf).items():
            if v is not None:
                self.settings[names.get(k, k)] = v

    def set_mem(self, mem) -> None:
        self.settings["mem"] = mem

    def set_random_seed(self, seed: int) -> None:
        self.settings["random_seed"] = int(seed)

    def set_autobatch(self, autobatch: int) -> None:
        self.settings["autobatch"] = int(autobatch)

    def set_weight_decay(self, weight_decay: float) -> None:
        self.settings["weight_decay"] = float(weight_decay)

    def set_shared_parameters(self, shared_parameters: bool) -> None:
        self.settings["shared_parameters"] = shared_parameters

    def set_requested_gpus(self, requested_gpus: int) -> None:
        self.settings["requested_gpus"] = int(requested_gpus)

    def set_gpu_mask(self, gpu_mask) -> None:
        self.settings["gpu_mask"] = gpu_mask

    def set_profiling(self, profiling: int) -> None:
        self.settings["profiling"] = int(profiling)

    def set_cpu_mode(self, cpu_mode: bool) -> None:
        self.settings["cpu_mode"] = cpu_mode

    def init(self) -> None:
        apply(self.settings)


def apply(settings: dict) -> None:
    """Honour the seed and autobatch settings; say once which of the rest are ignored."""
    if "random_seed" in settings:
        seed = int(settings["random_seed"])
        # DyNet: seed 0 asks for a seed drawn from the clock
        _config.reset_random_seed(seed if seed != 0 else int(np.random.SeedSequence().entropy % 2 ** 31))
    if "autobatch" in settings:
        ab = int(settings["autobatch"])
        if ab not in _config.AUTOBATCH_SCHEDULERS:
            _warn_once(f"autobatch={ab}", f"dynagraph: DyNet autobatch strategy {ab} has no counterpart here; "
                                          f"using 1 (agenda)")
            ab = 1
        _config.set(autobatch=ab)
    ignored = sorted(k for k, v in settings.items() if k not in _HONOURED and v not in (None, False, 0))
    if ignored and tuple(ignored) not in _warned:
        _warn_once(tuple(ignored), f"dynagraph: DyNet settings {', '.join(ignored)} are accepted and ignored "
                                   f"(dynagraph allocates memory as needed and runs on the backend set with "
                                   f"dy.config.set(backend=...))")


def _warn_once(key, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def init(shared_parameters=None) -> None:
    """DyNet's dy.init(): (re)read the command-line flags in sys.argv."""
    params = DynetParams()
    params.from_args(shared_parameters)
    params.init()


def init_from_params(params: DynetParams) -> None:
    params.init()


def read_flags_at_import() -> None:
    """Called once by `import dynagraph`, as `import dynet` calls init()."""
    if "--dynet-viz" in sys.argv:  # dynet.py removes this one (and switches to its graphviz printer)
        sys.argv.remove("--dynet-viz")
    try:
        settings = parse_argv(sys.argv)
    except ValueError as e:  # DyNet aborts the process; a Python exception says why
        raise DynagraphError(f"command line: {e}") from None
    if settings:
        apply(settings)


# --------------------------------------------------------------- DyNet's reusable inputs
def vecInput(dim: int, device: str = "") -> Expression:
    """DyNet's vecInput(dim): a vector input of zeros, filled later with .set(list)."""
    return inputTensor(np.zeros(_positive(dim, "vecInput")))


def matInput(d1: int, d2: int) -> Expression:
    """DyNet's matInput(d1, d2): a matrix input of zeros; .set() takes the d1*d2 values in
    DyNet's column-major order. (dynet38 removed it in favour of inputTensor; older DyNet
    programs still call it.)"""
    return inputTensor(np.zeros((_positive(d1, "matInput"), _positive(d2, "matInput"))))


def _positive(n, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise DynagraphError(f"{what}: dimension must be a positive int, got {n!r}\n  at {user_line()}")
    return int(n)


def forward(exps: Iterable, recalculate: bool = False) -> None:
    """DyNet's dy.forward([e1, e2, ...]): evaluate all of them as one scheduled chunk, so the
    nodes of every expression batch together."""
    exprs: list = []
    for e in exps:
        exprs.extend(samples_of(e) if type(e) is BatchedExpression else [e])
    for e in exprs:
        if not isinstance(e, Expression):
            raise TypeError(f"forward() needs expressions, got {type(e).__name__} (at {user_line()})")
    graphs = {id(e.cg): e.cg for e in exprs}
    for cg in graphs.values():
        if recalculate:
            cg.invalidate()
        cg.forward_to(max(e.i for e in exprs if e.cg is cg))


def npvalues(exps: Iterable) -> list:
    """DyNet's dy.npvalues([e1, e2]): evaluated together (one forward), as numpy arrays."""
    exps = list(exps)
    forward(exps)
    return [e.npvalue() for e in exps]


def values(exps: Iterable) -> list:
    """DyNet's dy.values([e1, e2]): evaluated together, each as e.value() gives it."""
    exps = list(exps)
    forward(exps)
    return [e.value() for e in exps]


def zeroes(dim, batch_size: int = 1):
    """DyNet's older spelling of zeros."""
    from .expressions import zeros
    return zeros(dim, batch_size)
