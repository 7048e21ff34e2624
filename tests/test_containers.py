"""sky.containers and sky.DockerImage: tags by name, what they refuse, and where they go
(sky.Container, the marketplaces' configurations). The reference's own tests of the module are
tests/test_reference_containers.py."""

from __future__ import annotations

import dataclasses

import pytest

import skyward as sky
from skyward.containers import (
    CUDA_RELEASES,
    DockerImage,
    cuda,
    pytorch,
    runpod_base,
    runpod_pytorch,
)
from skyward.spec import select_spec


def test_every_known_cuda_release_and_variant_makes_its_tag() -> None:
    for minor, release in CUDA_RELEASES.items():
        for variant in ("runtime", "devel", "base", "cudnn-runtime", "cudnn-devel"):
            img = cuda(minor, variant=variant, ubuntu="24.04")  # type: ignore[arg-type]
            assert str(img) == f"nvidia/cuda:{release}-{variant}-ubuntu24.04"
            assert (img.cuda, img.ubuntu) == (minor, "24.04")


def test_a_full_cuda_release_is_used_as_given() -> None:
    img = cuda("12.4.0", variant="devel")
    assert str(img) == "nvidia/cuda:12.4.0-devel-ubuntu22.04"
    assert img.cuda == "12.4"


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: cuda("twelve"), "is not a version"),
        (lambda: cuda("12"), "give major.minor"),
        (lambda: cuda("12.9", variant="cudnn"), "'runtime', 'devel'"),  # type: ignore[arg-type]
        (lambda: cuda("12.9", repository="ghcr"), "'dockerhub'"),  # type: ignore[arg-type]
        (lambda: DockerImage(tag=""), "not an image tag"),
        (lambda: DockerImage.of("two words"), "not an image tag"),
        (lambda: DockerImage.of("ok:1", cuda=12.8), "cuda=12.8"),  # type: ignore[arg-type]
    ],
)
def test_bad_input_says_the_value_and_what_to_give(call: object, says: str) -> None:
    with pytest.raises(sky.ConfigError, match=None) as info:
        call()  # type: ignore[operator]
    assert says in str(info.value)


def test_versions_the_tables_do_not_know_fall_back() -> None:
    assert str(pytorch("9.9", cuda="13.0")) == "nvcr.io/nvidia/pytorch:latest"
    assert pytorch("9.9", cuda="13.0").cuda == "13.0"
    assert (str(runpod_base(cuda="11.0")), runpod_base(cuda="11.0").cuda) == ("runpod/base:latest", "11.0")
    assert (str(runpod_pytorch("1.0")), runpod_pytorch("1.0").cuda) == ("runpod/pytorch:latest", None)
    assert runpod_pytorch("2.8").cuda == "12.8" and runpod_pytorch("2.8", cuda="12.9").cuda == "12.9"


def test_a_docker_image_is_a_value() -> None:
    a, b = cuda("12.9"), DockerImage.of("nvidia/cuda:12.9.1-cudnn-runtime-ubuntu22.04", cuda="12.9", ubuntu="22.04")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.tag = "other"  # type: ignore[misc]


def test_sky_container_takes_a_docker_image_as_its_tag() -> None:
    assert sky.Container(image=sky.containers.cuda("12.9")).image == "nvidia/cuda:12.9.1-cudnn-runtime-ubuntu22.04"
    assert sky.Container(image=sky.DockerImage.of("localhost/base:1")).image == "localhost/base:1"
    # the same configuration as the tag: equal, and a named pool's settings keep the tag
    assert sky.Container(image=sky.containers.ubuntu("24.04")) == sky.Container(image="ubuntu:24.04")
    with pytest.raises(sky.ConfigError, match=r"sky\.containers\.ubuntu"):
        sky.Container(image=" ")


def test_the_marketplaces_keep_their_image_and_say_they_cannot_rent() -> None:
    img = sky.containers.runpod_pytorch("2.8")
    runpod = sky.RunPod(container_image=img)
    assert runpod.container_image is img
    why = runpod.check(sky.Spec(provider=runpod))
    assert why is not None and "cannot rent RunPod" in why and f"sky.Container(image='{img}')" in why
    with pytest.raises(sky.ConfigError, match="docker_image"):
        sky.VastAI(docker_image="")
    # among several specs, the next one is taken; alone, the pool fails before anything starts
    local = sky.Spec(provider=sky.Local())
    assert select_spec((sky.Spec(provider=sky.VastAI()), local), sky.Options()) is local
    with pytest.raises(sky.SkywardError, match=r"VastAI: this version of skyward cannot rent Vast\.ai"):
        select_spec((sky.Spec(provider=sky.VastAI(docker_image=img)),), sky.Options())


def test_default_image_is_the_image_of_a_pool_that_names_none() -> None:
    assert isinstance(sky.DEFAULT_IMAGE, sky.Image)
    assert sky.DEFAULT_IMAGE == sky.Image() == sky.Spec().image
    assert sky.DEFAULT_IMAGE.python == "auto" and sky.DEFAULT_IMAGE.pip == ()
