"""docs/router.md "Deploying": the Kubernetes pod spec and the systemd unit parse, their
command lines are valid ``sessionroute serve`` command lines, and their probes name the right
endpoints (liveness on ``/liveness``, readiness and startup on ``/readiness``)."""

from __future__ import annotations

import argparse
import configparser
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from sessionroute.serve.config import settings_from_args
from sessionroute.serve.flags import DEFAULTS, add_arguments

DOC = Path(__file__).resolve().parents[2] / "docs" / "router.md"


def _section() -> str:
    text = DOC.read_text()
    start = text.index("## Deploying")
    return text[start : text.index("\n## ", start + 1)]


def _block(lang: str) -> str:
    blocks = re.findall(rf"```{lang}\n(.*?)```", _section(), re.S)
    assert len(blocks) == 1, f"one {lang} block expected in docs/router.md Deploying"
    return str(blocks[0])


def _serve_args(argv: list[str]) -> argparse.Namespace:
    assert argv[0] == "serve"
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    add_arguments(parser)
    args = parser.parse_args(argv[1:])
    settings_from_args(args)  # valid values
    return args


def test_kubernetes_pod_spec() -> None:
    yaml = pytest.importorskip("yaml")
    spec: dict[str, Any] = yaml.safe_load(_block("yaml"))
    (container,) = spec["containers"]
    args = _serve_args(container["args"])
    assert container["ports"] == [{"containerPort": args.port}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": args.port}
    for probe in ("readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/readiness", "port": args.port}
    startup = container["startupProbe"]
    # the startup probe waits at least as long as the router waits for its workers
    assert (
        startup["periodSeconds"] * startup["failureThreshold"]
        >= (DEFAULTS["worker_startup_timeout_secs"])
    )
    assert spec["terminationGracePeriodSeconds"] > DEFAULTS["shutdown_timeout_secs"]
    assert args.host == "0.0.0.0"  # reachable from the kubelet


def test_systemd_unit() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    unit.read_string(_block("ini"))
    assert set(unit.sections()) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == "sessionroute" and Path(argv[0]).is_absolute()
    _serve_args(argv[1:])
    assert service["Restart"] == "on-failure"  # exit status 1: no worker came up in time
    assert service["KillSignal"] == "SIGTERM"
    assert float(service["TimeoutStopSec"]) > DEFAULTS["shutdown_timeout_secs"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"
