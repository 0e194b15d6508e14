"""`dractl classes generate` against a live API emulator: the slices of a sim fleet and an
Ascend node with vNPUs (tests/unit/dractl/test_classes_generate.py's), the classes written
back to the emulator (its schemas and DeviceClass rules), the Kubernetes version read from the
server, `--node`, `-o json`, and the exit codes: 0 with classes, 1 without slices, 2 on bad
flags."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from pathlib import Path

import pytest
import yaml

from devcluster.apiserver import APIServerEmulator
from services.dractl import cli
from services.dractl.commands import classes
from shared.config import KubeSettings
from shared.kube import resources
from shared.kube.client import KubeClient
from tests.unit.dractl.test_classes_generate import fleet_slices

pytestmark = pytest.mark.integration

REPO = str(Path(__file__).resolve().parents[3])
SIM = "sim.dra-suite.io"
H100 = "nvidia-h100-80gb-hbm3"


async def _publish(kube_settings: KubeSettings, minor: int) -> None:
    client = await KubeClient.connect(kube_settings)
    try:
        for item in await fleet_slices(minor):
            await client.create(resources.RESOURCE_SLICES, item)
    finally:
        await client.close()


async def _generate(kube_settings: KubeSettings, *argv: str) -> tuple[int, str, str]:
    args = cli._parser().parse_args(
        ["classes", "generate", *argv, "--kubeconfig", kube_settings.kubeconfig]
    )
    out, err = io.StringIO(), io.StringIO()
    code = await classes.run(args, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


async def test_the_fleets_classes_are_accepted_by_the_api_server_and_kept_whole(
    kube: APIServerEmulator, kube_settings: KubeSettings
):
    await _publish(kube_settings, 36)
    code, out, err = await _generate(kube_settings)
    assert code == 0, err
    generated = list(yaml.safe_load_all(out))
    assert f"{len(generated)} DeviceClasses for" in err
    assert "Kubernetes 1.36" in err  # the emulator's version, read from /version
    client = await KubeClient.connect(kube_settings)
    try:
        for device_class in generated:
            await client.create(resources.DEVICE_CLASSES, device_class)
        stored = {
            c["metadata"]["name"]: c for c in (await client.list(resources.DEVICE_CLASSES))["items"]
        }
    finally:
        await client.close()
    assert sorted(stored) == [c["metadata"]["name"] for c in generated]
    for device_class in generated:
        kept = stored[device_class["metadata"]["name"]]
        assert kept["spec"] == device_class["spec"]  # extendedResourceName not dropped on 1.36
        for field in ("labels", "annotations"):
            assert kept["metadata"].get(field) == device_class["metadata"].get(field)
    # A second run over the same fleet writes the same bytes.
    assert (await _generate(kube_settings))[1] == out


async def test_one_node_as_json(kube: APIServerEmulator, kube_settings: KubeSettings):
    await _publish(kube_settings, 36)
    code, out, _ = await _generate(kube_settings, "--node", "node-b", "-o", "json")
    assert code == 0
    listing = json.loads(out)
    assert (listing["apiVersion"], listing["kind"]) == ("v1", "List")
    names = [c["metadata"]["name"] for c in listing["items"]]
    assert names == [
        *(f"mig-{p}.{SIM}" for p in ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb")),
        f"{H100}.gpu.{SIM}",
    ]


@pytest.mark.parametrize("kube", ["1.34"], indirect=True)
async def test_an_older_server_gets_no_extended_resource_names(
    kube: APIServerEmulator, kube_settings: KubeSettings
):
    await _publish(kube_settings, 34)
    code, out, err = await _generate(kube_settings)
    assert code == 0, err
    assert "Kubernetes 1.34" in err
    assert all("extendedResourceName" not in c["spec"] for c in yaml.safe_load_all(out))
    code, out, _ = await _generate(kube_settings, "--kubernetes-version", "1.36")
    assert code == 0
    assert all("extendedResourceName" in c["spec"] for c in yaml.safe_load_all(out))


async def test_no_slices_or_an_unknown_node_exits_1(
    kube: APIServerEmulator, kube_settings: KubeSettings
):
    code, out, err = await _generate(kube_settings)
    assert (code, out) == (1, "")
    assert "no ResourceSlices: no driver publishes devices in this cluster" in err
    await _publish(kube_settings, 36)
    code, out, err = await _generate(kube_settings, "--node", "node-z")
    assert (code, out) == (1, "")
    assert "no ResourceSlice names node node-z (nodes with devices: node-a, node-b" in err


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--kubernetes-version", "1.33"], "want 1.34 to 1.37"),
        (["--node", "a", "--all-nodes"], "not allowed with argument"),
        (["-o", "wide"], "the classes are written as yaml or json"),
        (["--backend", "gpu.example.com"], "want DRIVER=sim|nvml|ascend"),
        (["--backend", "gpu.example.com=cuda"], "want DRIVER=sim|nvml|ascend"),
    ],
    ids=["version", "node-and-all-nodes", "output", "backend", "backend-name"],
)
async def test_bad_flags_exit_2_before_reading_the_cluster(argv: list[str], error: str):
    # A process of its own: dractl's main configures the process's logging for good.
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.dractl", "classes", "generate", *argv,
        "--kubeconfig", "/nonexistent/kubeconfig",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert (process.returncode, out) == (2, b"")
    assert error in err.decode()


async def test_the_command_line_writes_the_classes_and_exits_0(
    kube: APIServerEmulator, kube_settings: KubeSettings
):
    await _publish(kube_settings, 36)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.dractl",
        "classes",
        "generate",
        "--kubeconfig",
        kube_settings.kubeconfig,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    names = [c["metadata"]["name"] for c in yaml.safe_load_all(out.decode())]
    assert f"shared.{H100}.gpu.{SIM}" in names
    assert "vir04.npu.huawei.com" in names
    # Misspelt: argparse's usage error, exit 2, from the real command line too.
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.dractl",
        "classes",
        "make",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert (process.returncode, out) == (2, b"")
    assert "invalid choice: 'make'" in err.decode()
