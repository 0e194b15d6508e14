"""`python -m services.devcluster.apiserver` as a process: ready line, kubeconfig, SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp
import yaml


async def test_module_entry_point_serves_until_sigterm(tmp_path: Path):
    kubeconfig = tmp_path / "kc"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.devcluster.apiserver", "--port", "0",
        "--kubeconfig", str(kubeconfig), "--kubernetes-version", "1.35",
        "--feature-gates", "DRADeviceTaintRules=true",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert line.startswith("apiserver_ready url=http://127.0.0.1:")
        url = line.strip().split("url=", 1)[1]
        server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        assert server == url
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/apis/resource.k8s.io/v1alpha3") as response:
                assert response.status == 200
            async with session.get(url + "/version") as response:
                assert (await response.json())["gitVersion"] == "v1.35.0"
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 10) == 0
