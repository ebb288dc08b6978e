"""The NCCL transport's Python surface as far as it runs without a GPU: release_nccl() with
nothing to release (alone and on a gloo group), nccl_comm_init's argument checks, and the
timeout_s config key."""
import pytest
import torch.distributed as dist

import fsdpcomp
from helpers.dist_utils import free_port
from fsdpcomp import _C


def test_release_nccl_without_communicators_releases_none():
    assert fsdpcomp.release_nccl() == 0


def test_release_nccl_on_a_gloo_group_releases_none():
    import os
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        assert fsdpcomp.release_nccl(dist.group.WORLD) == 0
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("args,match", [
    ((b"x" * 127, 1, 0, 0, 1.0), "unique_id must be 128 bytes, got 127"),
    ((b"x" * 128, 2, 2, 0, 1.0), "rank 2 of world 2"),
    ((b"x" * 128, 1, 0, -1, 1.0), "on device -1"),
    ((b"x" * 128, 1, 0, 0, -1.0), "timeout_s must be in"),
    ((b"x" * 128, 1, 0, 0, float("nan")), "timeout_s must be in"),
])
def test_nccl_comm_init_names_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        _C.nccl_comm_init(*args)


def test_nccl_comm_release_takes_only_a_communicator():
    with pytest.raises(ValueError):  # PyCapsule_GetPointer's message for a foreign object
        _C.nccl_comm_release(object())


@pytest.mark.parametrize("value", [-1, "5", float("inf")])
def test_timeout_s_is_checked(value):
    with pytest.raises((ValueError, TypeError), match="timeout_s"):
        fsdpcomp.CommState("int8", {"timeout_s": value})


def test_timeout_s_default_means_the_groups():
    assert fsdpcomp.CommState("int8").config["timeout_s"] == 0
    assert fsdpcomp.CommState("int8", {"timeout_s": 30}).config["timeout_s"] == 30
