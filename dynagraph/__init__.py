"""dynagraph: per-sample dynamic networks, batched automatically.

`import dynagraph as dy` is a drop-in for the common DyNet API.
"""
from . import config  # noqa: F401
from .config import reset_random_seed  # noqa: F401
from .errors import CheckpointError, DynagraphError, DynagraphIndexError, NonFiniteError, ShapeError, StaleExpressionError  # noqa: F401
from .parameters import (  # noqa: F401
    ConstInitializer, GlorotInitializer, IdentityInitializer, LookupParameters, Model, NormalInitializer,
    NumpyInitializer, ParameterCollection, Parameters, SaxeInitializer, UniformInitializer,
)
from .expression import Expression  # noqa: F401
from .graph import ComputationGraph, cg, cg_checkpoint, cg_revert, cg_version, renew_cg  # noqa: F401
from .batched import BatchedExpression  # noqa: F401  (DyNet's minibatch dimension)
from . import engine  # noqa: F401  (installs evaluation into the graph layer)
from .backends import get_backend  # noqa: F401
from . import schedulers  # noqa: F401
from .subgraph import Block, block  # noqa: F401
from . import coarsen as _coarsen  # noqa: F401  (installs automatic coarsening into the engine)
from . import cavs  # noqa: F401  (dy.cavs: Cavs vertex functions)
from . import fsm  # noqa: F401  (dy.fsm: ED-Batch's learned batching policy)
from . import viz  # noqa: F401  (dy.viz: pictures of the recorded graph and its schedule)
from . import distributed  # noqa: F401  (dy.distributed: data parallelism on MPI; mpi4py imported lazily)
from .concurrent import autobatch_map, phase  # noqa: F401  (ACROBAT: data-dependent control flow batched)
from .ghosts import ghost  # noqa: F401  (ACROBAT: both arms of a branch keep the schedule aligned)
from .expressions import *  # noqa: F401,F403


__version__ = "0.1.0"
from .nn import *  # noqa: F401,F403
from .nn import load, load_generator, register_saveable, save  # noqa: F401
from .dynet_api import (  # noqa: F401
    DynetParams, forward, init, init_from_params, matInput, npvalues, values, vecInput, zeroes,
)
from .dynet_api import read_flags_at_import as _read_flags

from .composites import *  # noqa: F401,F403  (DyNet functions built from existing ops)

_read_flags()  # DyNet's --dynet-seed, --dynet-autobatch, ... (dynagraph/dynet_api.py)
