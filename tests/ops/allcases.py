"""Every op case, from every family."""
from cases_cells import CASES as CELLS
from cases_conv import CASES as CONV
from cases_elementwise import CASES as ELEMENTWISE
from cases_inputs import CASES as INPUTS
from cases_linalg import CASES as LINALG
from cases_loss import CASES as LOSS
from cases_shape import CASES as SHAPE

ALL = ELEMENTWISE + LINALG + SHAPE + LOSS + INPUTS + CONV + CELLS
