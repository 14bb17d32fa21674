"""Model building blocks above the graph: RNN builders, trainers, saving and loading."""
from .cells import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from .trainers import *  # noqa: F401,F403
from .io import load, load_generator, register_saveable, save  # noqa: F401
