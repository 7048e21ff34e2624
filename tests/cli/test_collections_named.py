"""A named pool's collections live in its head node's agent: they outlive each program that
attaches to the pool."""

from __future__ import annotations

from .conftest import CLI

PROGRAM = """
    import json
    import skyward as sky

    @sky.function
    def visit(who):
        sky.dict("visits")[who] = True
        return sky.counter("runs").increment()

    with sky.Compute(name="shared", options=sky.Options(console="silent")) as pool:
        mine = visit("{who}") >> pool
        seen = sorted(k for k in ("first", "second") if k in sky.dict("visits"))
    print(json.dumps({{"count": mine, "seen": seen}}))
"""


def test_collections_survive_from_one_attached_program_to_the_next(cli: CLI) -> None:
    up = cli("up", "shared", "--provider", "local", "--nodes", "2", "--ttl", "120")
    assert up.code == 0, up
    first = cli.python(PROGRAM.format(who="first"))
    assert first.code == 0, first
    assert first.json() == {"count": 1, "seen": ["first"]}
    second = cli.python(PROGRAM.format(who="second"))
    assert second.code == 0, second
    assert second.json() == {"count": 2, "seen": ["first", "second"]}
    assert cli("down", "shared").code == 0
