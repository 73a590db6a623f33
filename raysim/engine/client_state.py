"""Per-client state (SCAFFOLD's control variate, FedDyn's gradient, condensed sets, ...).

Kept in the memory of the actor that hosts the client, and mirrored to disk
under the run directory, one file per (client, round), so that a restarted
actor or a resumed run finds the state as of the round before the one it is
about to (re)run. Only the two newest files per client are kept: the newest
may belong to a round that is being replayed after a crash. Files load with
torch.load(weights_only=True) (raysim.outputs.state_files): a run directory from someone else
cannot run code in the actors.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from raysim.outputs.state_files import load_state, save_state

STATE_FILE = re.compile(r"r(\d+)\.pt")  # raysim's own files; anything else in the folder is not read


class ClientStateStore:
    def __init__(self, directory: str | Path | None):
        self.directory = Path(directory) if directory else None
        self.memory: dict[int, tuple[int, dict[str, Any]]] = {}

    def _client_dir(self, client: int) -> Path:
        return self.directory / f"client_{client:05d}"

    def load(self, client: int, round_index: int) -> dict[str, Any]:
        """The state written by the latest round before `round_index` (empty if none)."""
        if client in self.memory and self.memory[client][0] < round_index:
            return self.memory[client][1]
        if self.directory is None:
            return {}
        rounds = [r for r in self._saved_rounds(client) if r < round_index]
        if not rounds:
            return {}
        path = self._client_dir(client) / f"r{rounds[-1]:06d}.pt"
        state = load_state(path, f"client {client}'s state cannot be recovered: start a fresh run")
        self.memory[client] = (rounds[-1], state)
        return state

    def save(self, client: int, round_index: int, state: dict[str, Any]) -> None:
        self.memory[client] = (round_index, state)
        if self.directory is None or not state:
            return
        folder = self._client_dir(client)
        folder.mkdir(parents=True, exist_ok=True)
        save_state(folder / f"r{round_index:06d}.pt", state)
        for old in self._saved_rounds(client)[:-2]:
            (folder / f"r{old:06d}.pt").unlink(missing_ok=True)

    def _saved_rounds(self, client: int) -> list[int]:
        folder = self._client_dir(client)
        if not folder.is_dir():
            return []
        # other files (a user's r000001.backup.pt, notes) are ignored: neither read nor deleted
        return sorted(int(m.group(1)) for p in folder.iterdir() if (m := STATE_FILE.fullmatch(p.name)))
