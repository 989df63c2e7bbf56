"""docs/policies.md "Options and your own policy": the example policy file and both command
lines run as written, from a directory holding only that file, without PYTHONPATH (issue 40)."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from sessionroute.clock import ManualClock
from sessionroute.router.policies import create_policy, policy_class

from .backend import start_backends
from .conftest import JSON, chat

DOC = Path(__file__).resolve().parents[2] / "docs" / "policies.md"
SRC = Path(__file__).resolve().parents[2] / "src"


def _example() -> tuple[str, list[list[str]]]:
    text = DOC.read_text()
    start = text.index("Save this as `mypolicies.py`")
    code = re.search(r"```python\n(.*?)```", text[start:], re.S)
    shell = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    assert code and shell
    commands = [shlex.split(line) for line in shell.group(1).replace("\\\n", " ").splitlines()]
    return code.group(1), [c for c in commands if c]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_file_and_module_forms_load_the_same_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _ = _example()
    (tmp_path / "mypolicies.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    by_file = policy_class("mypolicies.py:LastHealthy")
    assert by_file is policy_class(str(tmp_path / "mypolicies.py") + ":LastHealthy")
    assert policy_class("mypolicies:LastHealthy").__name__ == "LastHealthy"  # cwd, no sys.path
    policy = create_policy("mypolicies.py:LastHealthy", {"offset": 1}, clock=ManualClock())
    assert policy.config.offset == 1


async def test_the_documented_commands_serve(tmp_path: Path) -> None:
    code, commands = _example()
    (tmp_path / "mypolicies.py").write_text(code)
    assert len(commands) == 2
    backends = await start_backends(2)
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONUNBUFFERED": "1"}
    try:
        async with aiohttp.ClientSession() as client:
            for argv in commands:
                assert argv[:2] == ["sessionroute", "serve"]
                args = argv[2:]
                i = args.index("--worker-urls")
                n = sum(1 for a in args[i + 1 :] if a.startswith("http://"))
                args[i + 1 : i + 1 + n] = [b.url for b in backends[:n]]
                port = _free_port()
                # -P: the working directory is not put on sys.path (as for a console script)
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-P", "-m", "sessionroute.cli", "serve", *args,
                    "--port", str(port), "--log-level", "warning",
                    cwd=tmp_path, env=env, stderr=asyncio.subprocess.PIPE,
                )  # fmt: skip
                try:
                    url = f"http://127.0.0.1:{port}"
                    for _ in range(400):
                        try:
                            async with client.get(url + "/readiness") as r:
                                if r.status == 200:
                                    break
                        except aiohttp.ClientConnectionError:
                            pass
                        if proc.returncode is not None:
                            break
                        await asyncio.sleep(0.05)
                    for b in backends:
                        b.seen.clear()
                    for _ in range(3):
                        async with client.post(
                            url + "/v1/chat/completions", json=chat(), headers=JSON
                        ) as r:
                            assert r.status == 200, await r.text()
                    # offset=1 of two workers, or the only one: the first worker each time
                    assert [len(b.seen) for b in backends] == [3, 0]
                finally:
                    if proc.returncode is None:
                        proc.terminate()
                    _, err = await asyncio.wait_for(proc.communicate(), 20)
                assert proc.returncode == 0, err.decode()
    finally:
        for b in backends:
            await b.kill()
