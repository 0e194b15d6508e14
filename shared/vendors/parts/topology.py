"""Interconnect groups: connected components of fast links (NVLink, HCCS), named stably (pure).

Members are device ids (ints); other endpoints (an NVSwitch, say) may join components but
are never named. Only components with at least two devices form a group: a device without
fast links to another device belongs to none.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

__all__ = ["groups"]


def _find(parent: dict[Hashable, Hashable], node: Hashable) -> Hashable:
    root = node
    while parent[root] != root:
        root = parent[root]
    while parent[node] != root:  # path compression
        parent[node], node = root, parent[node]
    return root


def groups(
    devices: Iterable[int], links: Iterable[tuple[Hashable, Hashable]], *, prefix: str
) -> dict[int, str]:
    """Device id -> `<prefix><k>`, k counting components by their lowest device id."""
    members = sorted(set(devices))
    parent: dict[Hashable, Hashable] = {device: device for device in members}
    for a, b in links:
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        ra, rb = _find(parent, a), _find(parent, b)
        if ra != rb:
            parent[rb] = ra
    components: dict[Hashable, list[int]] = {}
    for device in members:
        components.setdefault(_find(parent, device), []).append(device)
    named: dict[int, str] = {}
    ordered = sorted((c for c in components.values() if len(c) > 1), key=min)
    for k, component in enumerate(ordered):
        for device in component:
            named[device] = f"{prefix}{k}"
    return named
