"""The devices and links of a multiplied fabric (fabric.multiply) as sequences built from its structure.

A fabric of N nodes is N copies of one node template plus its InfiniBand part, in a fixed layout:

    links   = [node 0's copies of the template's links, ..., node N-1's]      (N x L)
              + [NIC(n, r) -> leaf, leaf -> NIC(n, r) for n < N for r < rails]  (N x rails x 2)
              + [leaf(r, k) -> spine, spine -> leaf(r, k) for r for k]         (rails x leaves x 2)
    devices = [node 0's copies of the template's devices, ...] + [leaf(r, k) for r for k] + [spine]

so item i is a closed form of i. `FabricLinks` and `FabricDevices` compute an item when it is first read
and keep it (a 16,384-GPU fabric has ~130,000 links and ~35,000 devices, of which a step reads a few
thousand); iteration builds one node block at a time (a scan that stops early builds only what it passed),
and `column` gives one field of every link from the template's columns without building any Link. They are
equal to, and hash as, the tuple of their items: the tuple fabric.multiply built link by link before them
(tests/test_fabric_build.py keeps that construction as the reference).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from meshsim.topologies.model import Device, Link, Topology

IB_WIRE_US = 0.025  # ~5 m of cable at ~5 ns/m (signal speed ~0.7 c); fabric.py's constant


def _tail(name: str) -> str:
    """The node-independent tail of a template name: its copy on node n is f"n{n}" + tail."""
    return name[2:] if name.startswith("n0.") else "." + name


class _Lazy(Sequence):
    """Items built on first read and kept; equal to (and hashing as) the tuple of its items."""

    _size: int
    _items: list

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index):
        item = self._items[index]  # IndexError / TypeError as a tuple raises them
        if item is None:
            item = self._items[index] = self._make(index if index >= 0 else index + self._size)
        elif item.__class__ is list:  # a slice (an item is never a list)
            return tuple(self[i] for i in range(*index.indices(self._size)))
        return item

    def _make(self, index: int) -> Any:
        raise NotImplementedError

    def _blocks(self) -> Iterator[tuple[int, int, Any]]:
        """(start, stop, builder of the items [start, stop) as a list) covering the sequence in order."""
        raise NotImplementedError

    def __iter__(self) -> Iterator:
        items = self._items
        for start, stop, build in self._blocks():
            if None in items[start:stop]:
                made = build()
                for i in range(start, stop):  # keep the items already read (an item is built once)
                    if items[i] is None:
                        items[i] = made[i - start]
            yield from items[start:stop]

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is type(self) and other._key() == self._key():
            return True
        if not isinstance(other, Sequence) or isinstance(other, str) or len(other) != self._size:
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))

    def __reduce__(self):
        return type(self), self._key()

    def _key(self) -> tuple:
        raise NotImplementedError


class FabricLinks(_Lazy):
    """The links of `nodes` copies of `node` joined by the rail-optimized fat tree (module doc)."""

    def __init__(self, node: Topology, nodes: int, nics: tuple[str, ...], nic_gbps: float, to_switch_us: float,
                 oversubscription: float, nodes_per_leaf: int, leaves_per_rail: int):
        self._args = (node, nodes, nics, nic_gbps, to_switch_us, oversubscription, nodes_per_leaf, leaves_per_rail)
        self.node, self.nodes, self.rails = node, nodes, len(nics)
        self.nic_gbps, self.to_switch_us, self.oversubscription = nic_gbps, to_switch_us, oversubscription
        self.nodes_per_leaf, self.leaves_per_rail = nodes_per_leaf, leaves_per_rail
        self.parts = [(_tail(lk.src), _tail(lk.dst), lk.bw_gbps, lk.latency_us, lk.kind) for lk in node.links]
        self.nic_tails = [_tail(n) for n in nics]
        self.node_links = len(node.links)
        self.ib_base = nodes * self.node_links
        self.uplink_base = self.ib_base + 2 * nodes * self.rails
        self._size = self.uplink_base + 2 * self.rails * leaves_per_rail
        self._items = [None] * self._size

    def _key(self) -> tuple:
        return self._args

    def uplink_gbps(self, k: int) -> float:
        """Capacity of leaf k's uplink (and downlink from the spine): the nodes it serves x NIC rate / oversubscription."""
        served = min(self.nodes_per_leaf, self.nodes - k * self.nodes_per_leaf)
        return served * self.nic_gbps / self.oversubscription

    def _make(self, i: int) -> Link:
        if i < self.ib_base:
            n, k = divmod(i, self.node_links)
            src, dst, bw, lat, kind = self.parts[k]
            return Link(f"n{n}" + src, f"n{n}" + dst, bw, lat, kind)
        if i < self.uplink_base:
            n, rem = divmod(i - self.ib_base, 2 * self.rails)
            r, back = divmod(rem, 2)
            nic, leaf = f"n{n}" + self.nic_tails[r], f"leaf.r{r}.{n // self.nodes_per_leaf}"
            if back:
                return Link(leaf, nic, self.nic_gbps, IB_WIRE_US, "ib")
            return Link(nic, leaf, self.nic_gbps, self.to_switch_us, "ib")
        q, back = divmod(i - self.uplink_base, 2)
        r, k = divmod(q, self.leaves_per_rail)
        leaf, bw = f"leaf.r{r}.{k}", self.uplink_gbps(k)
        return Link("spine", leaf, bw, self.to_switch_us, "ib") if back else Link(leaf, "spine", bw, self.to_switch_us, "ib")

    def _node_block(self, n: int) -> list[Link]:
        prefix = f"n{n}"
        return [Link(prefix + src, prefix + dst, bw, lat, kind) for src, dst, bw, lat, kind in self.parts]

    def _nic_block(self, n: int) -> list[Link]:
        prefix, leaf_no, out = f"n{n}", f".{n // self.nodes_per_leaf}", []
        for r, tail in enumerate(self.nic_tails):
            leaf, nic = f"leaf.r{r}{leaf_no}", prefix + tail
            out += [Link(nic, leaf, self.nic_gbps, self.to_switch_us, "ib"), Link(leaf, nic, self.nic_gbps, IB_WIRE_US, "ib")]
        return out

    def _blocks(self):
        step, nic_step = self.node_links, 2 * self.rails
        for n in range(self.nodes):
            yield n * step, (n + 1) * step, lambda n=n: self._node_block(n)
        for n in range(self.nodes):
            start = self.ib_base + n * nic_step
            yield start, start + nic_step, lambda n=n: self._nic_block(n)
        yield self.uplink_base, self._size, lambda: [self._make(i) for i in range(self.uplink_base, self._size)]

    def column(self, field: str) -> list:
        """[getattr(link, field) for link in self]: names link by link, the other fields from the template's
        columns without building a Link (values)."""
        if field in ("src", "dst"):
            return [getattr(lk, field) for lk in self]
        return self.values(_same, (field,))

    def values(self, fn: Callable[..., Any], fields: tuple[str, ...]) -> list:
        """[fn(*(getattr(link, f) for f in fields)) for link in self] for fields other than the names, `fn`
        pure: evaluated once per template link, once per NIC link direction and once per leaf, and repeated
        where the links repeat those fields (every node's copy of a template link, every NIC's link pair,
        both directions of a leaf's uplink)."""
        if {"src", "dst"} & set(fields):
            raise ValueError(f"values() reads the fields the links repeat, not names: {fields}")
        at = {"bw_gbps": 2, "latency_us": 3, "kind": 4}
        node = [fn(*(p[at[f]] for f in fields)) for p in self.parts]
        nic_up = dict(bw_gbps=self.nic_gbps, latency_us=self.to_switch_us, kind="ib")
        nic_down = dict(nic_up, latency_us=IB_WIRE_US)
        nic = [fn(*(nic_up[f] for f in fields)), fn(*(nic_down[f] for f in fields))]
        out = node * self.nodes + nic * (self.rails * self.nodes)
        for _ in range(self.rails):
            for k in range(self.leaves_per_rail):
                leaf = dict(bw_gbps=self.uplink_gbps(k), latency_us=self.to_switch_us, kind="ib")
                value = fn(*(leaf[f] for f in fields))
                out += (value, value)
        return out


def _same(value: Any) -> Any:
    return value


class FabricDevices(_Lazy):
    """The devices of `nodes` copies of `node`, then each rail's leaf switches, then the spine (module doc)."""

    def __init__(self, node: Topology, nodes: int, rails: int, leaves_per_rail: int):
        self._args = (node, nodes, rails, leaves_per_rail)
        self.nodes, self.rails, self.leaves_per_rail = nodes, rails, leaves_per_rail
        self.parts = [(_tail(d.name), d.kind, d.in_network_reduction) for d in node.devices]
        self.node_devices = len(self.parts)
        self.switch_base = nodes * self.node_devices
        self._size = self.switch_base + rails * leaves_per_rail + 1
        self._items = [None] * self._size

    def _key(self) -> tuple:
        return self._args

    def _make(self, i: int) -> Device:
        if i < self.switch_base:
            n, k = divmod(i, self.node_devices)
            tail, kind, nvls = self.parts[k]
            return Device(f"n{n}" + tail, kind, n, nvls)
        if i == self._size - 1:
            return Device("spine", "ib_switch")
        r, k = divmod(i - self.switch_base, self.leaves_per_rail)
        return Device(f"leaf.r{r}.{k}", "ib_switch")

    def _blocks(self):
        step = self.node_devices
        for n in range(self.nodes):
            prefix = f"n{n}"
            yield n * step, (n + 1) * step, lambda n=n, prefix=prefix: [
                Device(prefix + tail, kind, n, nvls) for tail, kind, nvls in self.parts]
        yield self.switch_base, self._size, lambda: [self._make(i) for i in range(self.switch_base, self._size)]

    def gpu_names(self) -> tuple[str, ...]:
        """The names of the GPUs in device order (Topology.gpu_names) from the template (no Device built)."""
        tails = [tail for tail, kind, _ in self.parts if kind == "gpu"]
        return tuple(f"n{n}" + tail for n in range(self.nodes) for tail in tails)


def link_column(topo: Topology, field: str) -> list:
    """[getattr(link, field) for link in topo.links]: from a fabric's structure (FabricLinks.column) or link by link."""
    links = topo.links
    if isinstance(links, FabricLinks):
        return links.column(field)
    return [getattr(lk, field) for lk in links]


def link_values(topo: Topology, fn: Callable[..., Any], fields: tuple[str, ...]) -> list:
    """[fn(*(getattr(link, f) for f in fields)) for link in topo.links], `fn` pure: on a fabric once per
    distinct template position (FabricLinks.values), else link by link."""
    links = topo.links
    if isinstance(links, FabricLinks):
        return links.values(fn, fields)
    return [fn(*(getattr(lk, f) for f in fields)) for lk in links]
