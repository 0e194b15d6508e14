"""`bus_sign_verify_*`: what signed records (issue 21) cost per record, in CPU and bytes.

One record is what an agent writes most: a health record (`DeviceHealth`, a few hundred bytes)
and, less often, an inventory (a sim node's 8 GPUs). Each sample signs it the way `Bus.kv_put`
does (`Records.sign`: certificate and ed25519 signature in the headers) and checks it the way
every reader does (`Records.check`: the certificate from the reader's cache, the owner of the
key, the signature), so `bus_sign_verify_p99_us` is the added latency of one record from
writer to reader. `bus_verify_new_cert_p99_us` is a reader's first record of a writer (the
auth service's signature on the certificate checked too). `bus_record_bytes_added` is what the
two headers add on the wire and in the bucket, header framing included, to a record that had
no headers before (a record with trace headers pays 4 bytes less).
Run alone: `python -m bench.sign_verify`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]  # ships no type hints

from bench import results_file
from bench.stats import percentile
from services.natsauth.keys import SigningKey, new_signing_seed
from shared.bus import codec, signing
from shared.bus.records import Records
from shared.bus.subjects import Names
from shared.config import NATSSettings
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2

__all__ = ["measure_sign_verify"]

_DRIVER, _NODE = "sim.dra-suite.io", "node-0001.rack-12.example.com"
_N = Names("")


def _health() -> tuple[str, bytes]:
    record = health_pb2.DeviceHealth(
        driver=_DRIVER, node=_NODE, pool=_NODE, device="gpu-3", cause="xid", code="79",
        state=health_pb2.HEALTH_STATE_UNHEALTHY, message="GPU has fallen off the bus",
        since_unix_ms=1_790_000_000_000, updated_unix_ms=1_790_000_060_000,
        taint="dra-suite.io/unhealthy:NoSchedule",
    )  # fmt: skip
    key = _N.health_key(_DRIVER, _NODE, "gpu-3")
    return _N.kv_subject(_N.health_bucket, key), codec.encode(record)


def _inventory() -> tuple[str, bytes]:
    inventory = inventory_pb2.Inventory(driver=_DRIVER, node=_NODE, generation=42)
    for index in range(8):
        device = inventory.devices.add(name=f"gpu-{index}")
        device.env["NVIDIA_VISIBLE_DEVICES"] = f"GPU-{index:08d}-aaaa-bbbb-cccc-0123456789ab"
        device.device_nodes.add(path=f"/dev/nvidia{index}", host_path="/dev/null")
    key = _N.inventory_key(_DRIVER, _NODE)
    return _N.kv_subject(_N.inventory_bucket, key), codec.encode(inventory)


def _headers_size(headers: dict[str, str]) -> int:
    """NATS header block: `NATS/1.0\\r\\n`, one `name: value\\r\\n` each, then `\\r\\n`."""
    if not headers:
        return 0
    return len("NATS/1.0\r\n\r\n") + sum(len(f"{k}: {v}\r\n") for k, v in headers.items())


def _records(directory: Path, auth: SigningKey, *, role: str) -> Records:
    path = directory / "certify.pub"
    path.write_text(auth.public + "\n")
    settings = NATSSettings(bus_signatures="enforce", bus_auth_key_file=str(path))
    return Records(settings, names=_N, role=role, node=_NODE)


def measure_sign_verify(*, samples: int = 5000) -> dict[str, Any]:
    auth = SigningKey.from_seed(
        new_signing_seed(nkeys.PREFIX_BYTE_OPERATOR), nkeys.PREFIX_BYTE_OPERATOR
    )
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="dra-bench-sign-") as tmp:
        figures: dict[str, Any] = {}
        for what, (subject, payload), role in (
            ("health", _health(), "health"),
            ("inventory", _inventory(), "discovery"),
        ):
            writer = _records(Path(tmp), auth, role=role)
            reader = _records(Path(tmp), auth, role="allocation")
            assert writer.writer is not None
            cert = signing.Certificate(
                node=_NODE, role=role, key=writer.writer.public, not_before=int(now) - 60,
                not_after=int(now) + 21600,
            )  # fmt: skip
            writer.install(signing.issue_certificate(cert, auth=auth))
            round_trip, fresh = [], []
            for index in range(samples):
                if index % 100 == 0:  # a reader meeting this writer's certificate first
                    cold = _records(Path(tmp), auth, role="allocation")
                    headers = writer.sign(subject, payload, {})
                    started = time.perf_counter()
                    assert cold.check(subject, payload, headers, stored_at=now).ok
                    fresh.append((time.perf_counter() - started) * 1e6)
                started = time.perf_counter()
                headers = writer.sign(subject, payload, {})
                assert reader.check(subject, payload, headers, stored_at=now).ok
                round_trip.append((time.perf_counter() - started) * 1e6)
            added = _headers_size(headers)
            figures |= {
                f"bus_sign_verify_{what}_p50_us": round(percentile(round_trip, 50), 1),
                f"bus_sign_verify_{what}_p99_us": round(percentile(round_trip, 99), 1),
                f"bus_verify_new_cert_{what}_p99_us": round(percentile(fresh, 99), 1),
                f"bus_record_{what}_bytes": len(payload),
                f"bus_record_{what}_bytes_added": added,
            }
    figures["bus_sign_verify_p99_us"] = figures["bus_sign_verify_health_p99_us"]
    figures["bus_record_bytes_added"] = figures["bus_record_health_bytes_added"]
    figures["bus_sign_verify_samples"] = samples
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.sign_verify")
    parser.add_argument("--out", type=Path, default=Path("bench/results.json"))
    parser.add_argument("--samples", type=int, default=5000)
    args = parser.parse_args()
    figures = measure_sign_verify(samples=args.samples)
    results_file.merge(args.out, figures)
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
