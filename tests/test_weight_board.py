"""train.weight_board: the trainer's weights in shared memory, published whole or not at all."""

from __future__ import annotations

import torch
import torch.multiprocessing as mp
import pytest

from progress_sql.train.weight_board import WeightBoard


def test_a_publish_copies_every_tensor_and_stops_waiting_when_the_reader_holding_the_lock_is_gone():
    board = WeightBoard({"w": torch.zeros(3), "b": torch.zeros(2, dtype=torch.bfloat16)}, mp.get_context("spawn"))
    assert board.version.value == -1 and all(t.is_shared() and t.dtype == torch.float32 for t in board.tensors.values())
    board.publish({"w": torch.ones(3), "b": torch.full((2,), 2.0)}, 1)
    assert board.version.value == 1
    assert torch.equal(board.tensors["w"], torch.ones(3)) and torch.equal(board.tensors["b"], torch.full((2,), 2.0))

    board.lock.acquire()  # a reader killed while it held the lock never lets go

    def reader_gone(deadline: float) -> None:
        raise RuntimeError("the reader is gone")

    with pytest.raises(RuntimeError, match="the reader is gone"):
        board.publish({"w": torch.full((3,), 5.0), "b": torch.zeros(2)}, 2, alive=reader_gone)
    assert board.version.value == 1 and torch.equal(board.tensors["w"], torch.ones(3))  # nothing half-written
