"""vLLM's ``ExampleHiddenStatesConnector`` for the CPU platform (loaded by vLLM, never by us).

The stock connector copies the captured hidden states device-to-host on a CUDA
stream into pinned memory and polls a CUDA event; on vLLM's CPU platform the
states already live in host memory, and ``pin_memory=True`` fails ("requires a
CUDA or other accelerator backend"). This subclass changes exactly that step:
the states are copied out of the cache synchronously and written by the same
writer thread pool, under the same per-file lock, so readers
(``load_hidden_states``) and the scheduler see the stock behaviour. Selected with
``kv_connector_module_path`` on CPU only; on GPU/ROCm the stock connector runs.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class CopyDone:
    """Stands in for the CUDA event the stock connector polls: the copy finished synchronously."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """The stock hidden-states connector with a host-memory copy instead of a CUDA stream."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets.view(1, -1) + blocks.view(-1, 1) * self._block_size).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:  # as the stock connector: never unlocked
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = CopyDone()
        future = self._executor.submit(
            self._write_tensors,
            tensors,
            done,  # type: ignore[arg-type]
            pending.filename,
            lock_fd,
        )
        self._req_copy_events[pending.req_id] = done  # type: ignore[assignment]
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
