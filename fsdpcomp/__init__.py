"""fsdpcomp"""
from fsdpcomp import _C
