"""One round's broadcast into the object store (raysim.engine.store): each part once, each recipient's
bytes counted."""

from __future__ import annotations

from typing import Any

from raysim.algorithm import Broadcast
from raysim.errors import RaysimError
from raysim.tensors import serialized_nbytes


class Delivery:
    def __init__(self, payload: dict[str, Any] | Broadcast, participants: list[int], round_index: int, store: Any):
        broadcast = payload if isinstance(payload, Broadcast) else Broadcast(shared=payload)
        self.shared = store.put(broadcast.shared)
        shared_bytes = serialized_nbytes(broadcast.shared)
        self.parts: dict[int, list] = {k: [] for k in participants}  # each client's references
        self.bytes_down: dict[int, int] = dict.fromkeys(participants, shared_bytes)
        keys: dict[int, set[str]] = {k: set(broadcast.shared) for k in participants}
        for group, part in broadcast.addressed:
            strangers = [k for k in group if k not in self.parts]
            if strangers:
                raise RaysimError(
                    f"round {round_index}: the broadcast addresses a part to client(s) {strangers[:5]}, "
                    "which do not take part in the round: address only the round's participants"
                )
            ref, size = store.put(part), serialized_nbytes(part)
            for k in dict.fromkeys(group):
                clash = keys[k] & set(part)
                if clash:
                    raise RaysimError(
                        f"round {round_index}: client {k} would receive key(s) {sorted(clash)} twice "
                        "(shared and addressed parts are merged): give the parts distinct keys"
                    )
                keys[k] |= set(part)
                self.parts[k].append(ref)
                self.bytes_down[k] += size

    def arguments(self, client: int) -> list:
        """What client `client` is sent: the shared part, then the parts addressed to it."""
        return [self.shared, *self.parts[client]]
