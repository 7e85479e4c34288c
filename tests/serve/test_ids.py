"""Ids from the pool: 32 hex digits, never repeated, and a forked child draws its own."""

from __future__ import annotations

import os
import re

from plait.serve.ids import random_id


def test_ids_are_32_hex_digits_and_never_repeat_across_refills():
    ids = [random_id() for _ in range(2000)]  # several refills of the pool

    assert all(re.fullmatch(r"[0-9a-f]{32}", one) for one in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_does_not_hand_out_the_parents_next_ids():
    random_id()  # the pool is full now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.write(write, random_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    os.close(read)

    assert child != random_id()
