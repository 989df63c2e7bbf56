"""Every vllm-router 0.1.17 flag and route is accepted with its meaning, or refused with a
message naming it and the feature sessionroute does not have (issue 40)."""

from __future__ import annotations

import argparse
import contextlib
import io

import aiohttp
import pytest

from sessionroute.serve.config import settings_from_args
from sessionroute.serve.flags import add_arguments

from .backend import FakeBackend
from .conftest import MakeRouter
from .vllm_router_017 import FLAGS, ROUTES, help_flags


def _parse(argv: list[str]) -> tuple[argparse.Namespace | None, str]:
    parser = argparse.ArgumentParser(prog="sessionroute serve", allow_abbrev=False)
    add_arguments(parser)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return parser.parse_args(argv), ""
        except SystemExit:
            return None, err.getvalue()


def test_the_checked_in_list_covers_vllm_router_help() -> None:
    listed = help_flags()
    if listed is None:
        pytest.skip("vllm-router is not installed (pip install vllm-router==0.1.17)")
    assert sorted(set(listed) - set(FLAGS)) == []


@pytest.mark.parametrize("flag", sorted(set(FLAGS) | set(help_flags() or [])))
def test_each_flag_is_accepted_or_refused_by_name(flag: str) -> None:
    args, err = _parse([flag, *FLAGS.get(flag, [])])
    if args is None:
        assert flag in err and "sessionroute serve does not support (" in err, err
        return
    settings_from_args(args)  # an accepted flag also validates


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--worker-startup-timeout-secs", "12"], "worker_startup_timeout_secs", 12.0),
        (["--worker-startup-check-interval", "3"], "worker_startup_check_interval", 3.0),
        (["--max-tree-size", "1000"], "max_tree_size", 1000),
    ],
)
def test_accepted_flags_keep_their_meaning(argv: list[str], field: str, value: object) -> None:
    args, err = _parse(argv)
    assert args is not None, err
    assert getattr(settings_from_args(args), field) == value


def test_max_tree_size_reaches_cache_aware() -> None:
    args, _ = _parse(["--policy", "cache_aware", "--max-tree-size", "1000"])
    assert args is not None
    assert settings_from_args(args).policy_options()["max_tree_size"] == 1000


async def test_every_route_is_served_or_refused_by_name(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends])
    for method, path, body in ROUTES:
        async with client.request(method, router.url + path, json=body) as r:
            text = await r.text()
            # (a worker's own 404 passes through: the fake workers lack some routes)
            router_miss = '"not_found"' in text or '"method_not_allowed"' in text
            assert not router_miss, (method, path, r.status, text)
            if r.status == 501:
                assert path.split("?")[0] in text and "does not implement" in text


async def test_vllm_router_route_shapes(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends])
    async with client.get(router.url + "/workers") as r:
        got = await r.json()
    assert got["total"] == 3 and got["stats"]["regular_count"] == 3
    assert [w["url"] for w in got["workers"]] == [b.url for b in backends]
    assert set(got["workers"][0]) == {
        "url", "model_id", "worker_type", "is_healthy", "load", "connection_mode", "priority",
        "cost",
    }  # fmt: skip
    assert all(w["is_healthy"] for w in got["workers"])
    async with client.get(router.url + "/get_server_info?x=1") as r:
        assert r.status == 200
        info = await r.json()  # the worker's own answer
    assert info["port"] in {b.port for b in backends} and info["query"] == "x=1"
    async with client.post(
        router.url + "/generate", json={"text": "hi"}, headers={"x-session-id": "g"}
    ) as r:
        assert r.status == 200
    assert [s.path for b in backends for s in b.seen] == ["/generate"]
    async with client.get(router.url + "/get_loads") as r:
        loads = await r.json()
    assert [w["load"] for w in loads["workers"]] == [0, 0, 0]
