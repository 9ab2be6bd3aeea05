"""Finding a record offset's byte position in a local-log data file.

Each reader keeps, per data file, an in-memory sparse index built while it scans and reads:
the byte position of every ``EVERY``-th offset, the end of the entries seen so far, and the
position where the last read stopped (a hint: sequential reads, like a pipeline source's, find
their start without any scan). To locate an offset the index starts at the nearest mark at or
below it and skips at most ``EVERY - 1`` entry headers; an offset beyond the entries seen so far
first extends the index to the end of the file. Nothing is written to disk, so the index costs
one scan of the headers per reader and a few bytes per ``EVERY`` records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import BinaryIO

from infra.eventlog.local_format import Entry, corrupt, skip
from schemas.errors import EventLogCorrupt

EVERY = 256


class OffsetIndex:
    """Sparse offset -> byte index of one data file (offsets are dense from 0)."""

    def __init__(self, every: int = EVERY) -> None:
        self.every = every
        self._marks = [0]  # byte position of offset k * every; offset 0 is at byte 0
        self._end = (0, 0)  # (offset, byte) after the last complete entry seen
        self._hint = (0, 0)  # (offset, byte) where the last read stopped

    @property
    def end(self) -> tuple[int, int]:
        return self._end

    def _learn(self, offset: int, position: int) -> None:
        """Entry ``offset`` starts at ``position`` (called in offset order, from the end on)."""
        if offset % self.every == 0 and offset // self.every == len(self._marks):
            self._marks.append(position)
        if offset > self._end[0]:
            self._end = (offset, position)

    def extend(self, f: BinaryIO) -> tuple[int, int]:
        """Index the entries appended since the last scan; returns the (offset, byte) end."""
        offset, position = self._end
        while True:
            nxt = skip(f, offset, position, self.every - offset % self.every)
            if nxt == (offset, position):
                return self._end
            offset, position = nxt
            self._learn(offset, position)

    def locate(self, f: BinaryIO, offset: int) -> int:
        """The byte position of entry ``offset`` (or of the end, for the end offset)."""
        if offset == self._hint[0]:
            return self._hint[1]
        if offset > self._end[0]:
            self.extend(f)
        end, end_byte = self._end
        if offset < 0 or offset > end:
            raise EventLogCorrupt(
                f"offset {offset} is outside {getattr(f, 'name', '?')}, which holds offsets "
                f"0..{end - 1}: read from an offset up to end_offset() ({end})"
            )
        if offset == end:
            return end_byte
        mark = offset // self.every
        found, position = skip(f, mark * self.every, self._marks[mark], offset - mark * self.every)
        if found != offset:  # the file shrank under us
            raise corrupt(f, found, position, f"entries up to offset {end - 1} were there before")
        return position

    def read(self, entries: Sequence[Entry], next_offset: int, next_byte: int) -> None:
        """Learn from entries just read (consecutive, from a located offset) and where the read
        stopped."""
        for entry in entries:
            self._learn(entry.offset, entry.start)
        self._learn(next_offset, next_byte)
        self._hint = (next_offset, next_byte)
