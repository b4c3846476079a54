"""Offload of saved activations to pinned host memory for the CUDA path (`policy="offload"`).

The sm_90a layer keeps H (the expert FFNs' up-projection outputs) as saved tensors; a layer
built with `policy="offload"` moves them to pinned host memory after its forward and brings
them back for its backward, on a copy stream of its own, so the copies overlap the compute of
the other layers:

- forward: a layer's H waits on the device until the next offloading layer's forward starts;
  then an event on the compute stream, the copy stream waits for it and copies H to a pinned
  host buffer, and the device buffer goes back to torch's allocator once that copy is done
  (`record_stream`). So the copy runs under the next layer's forward, and the last layer of a
  stack, whose backward comes first, is never copied at all.
- backward: the layer waits for its H's host-to-device copy. When a layer's backward starts, the
  prefetch of the layer offloaded before it (in forward order: the next backward in a stack)
  starts too, so its copy runs under this layer's backward.

The copy stream is first in, first out, so a prefetch always follows its own offload. One
`Offloader` per device, shared by every offloading layer of the process. Eager mode only: a
layer under `torch.compile` raises (the copies are side effects a graph does not hold).
"""

from __future__ import annotations

import threading
import weakref
from typing import Dict, List, Optional

import torch

__all__ = ["Offloaded", "Offloader", "offloader", "is_offloaded_name", "previous_layer"]


def is_offloaded_name(name: str) -> bool:
    """The saved tensors offloaded: H of the routed experts and of the shared expert."""
    return name.endswith(".h")


class Offloaded:
    """A saved tensor in pinned host memory: its host copy, the events of its copies and, once
    prefetched, its device copy."""

    __slots__ = (
        "host",
        "shape",
        "dtype",
        "device",
        "d2h_done",
        "on_device",
        "h2d_done",
        "bytes",
        "waiting",
        "ready",
        "__weakref__",
    )

    def __init__(self, tensor: torch.Tensor, ready=None):
        self.shape, self.dtype, self.device = tensor.shape, tensor.dtype, tensor.device
        self.bytes = tensor.numel() * tensor.element_size()
        # Before its copy starts: the device tensor and the event after the work producing it
        self.waiting: Optional[torch.Tensor] = tensor
        self.ready = ready
        self.host: Optional[torch.Tensor] = None
        self.d2h_done = None
        self.on_device: Optional[torch.Tensor] = None
        self.h2d_done = None


class Offloader:
    """The copy stream of one device and the offloaded tensors in forward order."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.order: List[weakref.ref] = []  # Offloaded, forward order
        self.lock = threading.Lock()
        # the bytes copied out in this process, for reports (bench/offload_stack.py)
        self.offloaded_bytes = 0

    def offload_layer(self, tensors: List[torch.Tensor]) -> List[Offloaded]:
        """Entries for one layer's tensors, after the work queued so far on the current stream.
        Their copies start at the next call (the next layer's forward); the copies of the
        previous call's tensors start now."""
        compute = torch.cuda.current_stream(self.device)
        ready = torch.cuda.Event()
        ready.record(compute)
        entries = [Offloaded(t, ready) for t in tensors]
        with self.lock:
            self.order = [r for r in self.order if r() is not None]
            earlier = [
                e for e in (r() for r in self.order) if e is not None and e.waiting is not None
            ]
            self.order.extend(weakref.ref(e) for e in entries)
        for entry in earlier:
            self._copy_out(entry)
        return entries

    def _copy_out(self, entry: Offloaded) -> None:
        """Starts entry's device-to-host copy; its device memory goes back to the allocator
        when the copy is done."""
        t = entry.waiting
        host = torch.empty(entry.shape, dtype=entry.dtype, pin_memory=True)
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(entry.ready)
            host.copy_(t, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        t.record_stream(self.stream)
        entry.host, entry.d2h_done, entry.waiting, entry.ready = host, done, None, None
        with self.lock:
            self.offloaded_bytes += entry.bytes

    def prefetch(self, entry: Offloaded) -> None:
        """Starts entry's host-to-device copy (once); it follows the entry's own offload on the
        copy stream."""
        if entry.on_device is not None or entry.waiting is not None:
            return  # on its way back, or never copied out
        with torch.cuda.stream(self.stream):
            dev = torch.empty(entry.shape, dtype=entry.dtype, device=entry.device)
            dev.copy_(entry.host, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        entry.on_device, entry.h2d_done = dev, done

    def fetch(self, entries: List[Offloaded]) -> List[torch.Tensor]:
        """The device copies of a layer's offloaded tensors for its backward, on the current
        stream; starts the prefetch of the tensors offloaded just before these (the next
        backward's, in a stack of layers)."""
        compute = torch.cuda.current_stream(self.device)
        for entry in entries:
            self.prefetch(entry)
        self._prefetch_previous(entries)
        out = []
        for entry in entries:
            if entry.waiting is not None:  # never copied out: the last layer of a stack
                dev, entry.waiting, entry.ready = entry.waiting, None, None
                out.append(dev)
                continue
            compute.wait_event(entry.h2d_done)
            dev = entry.on_device
            dev.record_stream(compute)
            # The layer holds the only reference from here; the host copy goes back to the
            # pinned pool when the entry dies.
            entry.on_device = None
            out.append(dev)
        return out

    def _prefetch_previous(self, entries: List[Offloaded]) -> None:
        with self.lock:
            live = [r() for r in self.order]
        for entry in previous_layer([e for e in live if e is not None], entries):
            self.prefetch(entry)


def previous_layer(live: List[Offloaded], entries: List[Offloaded]) -> List[Offloaded]:
    """Of the live offloaded tensors in forward order, those of the layer offloaded just
    before `entries` (a layer's tensors are consecutive: as many as it has), not prefetched
    yet: what the next backward of a stack needs."""
    ids = {id(e) for e in entries}
    positions = [i for i, e in enumerate(live) if id(e) in ids]
    if not positions:
        return []
    waiting = [e for e in live[: min(positions)] if e.h2d_done is None and e.on_device is None]
    return waiting[-len(entries) :]


_OFFLOADERS: Dict[int, Offloader] = {}
_LOCK = threading.Lock()


def offloader(device: torch.device) -> Offloader:
    """The process's Offloader of a CUDA device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _LOCK:
        if index not in _OFFLOADERS:
            _OFFLOADERS[index] = Offloader(torch.device("cuda", index))
        return _OFFLOADERS[index]
