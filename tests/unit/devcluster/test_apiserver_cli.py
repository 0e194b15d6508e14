"""`python -m devcluster.apiserver` as a process: ready line, kubeconfig, SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import ssl
import sys
from pathlib import Path

import aiohttp
import pytest
import trustme
import yaml

from shared.config import KubeSettings
from shared.errors import KubeNotFoundError
from shared.kube import resources
from shared.kube.client import KubeClient


async def test_module_entry_point_serves_until_sigterm(tmp_path: Path):
    kubeconfig = tmp_path / "kc"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devcluster.apiserver", "--port", "0",
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


async def test_with_a_certificate_it_serves_https_and_the_kubeconfig_names_the_ca(tmp_path: Path):
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    ca_file, cert_file, key_file = (tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(str(ca_file))
    issued.cert_chain_pems[0].write_to_path(str(cert_file))
    issued.private_key_pem.write_to_path(str(key_file))
    kubeconfig = tmp_path / "kc"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devcluster.apiserver", "--port", "0",
        "--kubeconfig", str(kubeconfig), "--tls-cert-file", str(cert_file),
        "--tls-key-file", str(key_file), "--tls-ca-file", str(ca_file),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        url = line.strip().split("url=", 1)[1]
        assert url.startswith("https://127.0.0.1:")
        cluster = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
        assert cluster == {"server": url, "certificate-authority": str(ca_file)}
        # The agents' own client, from that kubeconfig: it verifies the server by the CA.
        kube = await KubeClient.connect(KubeSettings(kubeconfig=str(kubeconfig)))
        try:
            with pytest.raises(KubeNotFoundError):
                await kube.get(resources.NODES, "absent")
        finally:
            await kube.close()
        untrusted = ssl.create_default_context()
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.get(url + "/version", ssl=untrusted)
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 10) == 0


async def test_an_unreadable_certificate_is_a_clear_error_at_start(tmp_path: Path):
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "devcluster.apiserver",
        "--tls-cert-file", str(tmp_path / "missing.pem"),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2
    assert b"apiserver: TLS certificate:" in stderr
