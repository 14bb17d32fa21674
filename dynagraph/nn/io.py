"""dy.save / dy.load of parameters and builders (being written)."""


def save(basename, objs):
    raise NotImplementedError


def load(basename, pc):
    raise NotImplementedError
