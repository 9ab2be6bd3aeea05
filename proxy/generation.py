"""One call's generation as the upstream streams it: ids, logprobs and text gathered into a
:class:`~proxy.canonical.Generation`, the text parsed into content and tool-call deltas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from proxy.canonical import Generation
from proxy.chunk import Chunk
from proxy.toolparse import TextDelta, ToolCallDelta, ToolCallStream

Delta = TextDelta | ToolCallDelta


class GenerationStream:
    """Reads the upstream's chunks for one call.

    :meth:`first` waits for the first chunk (upstream errors surface there, before a response
    starts); :meth:`rest` yields the remaining deltas, a list per chunk; :meth:`close` aborts
    the upstream request if it is still running. ``gen`` holds everything generated so far,
    also after an error or a disconnect. ``on_first_token`` is called once, when the first
    token ids arrive.
    """

    def __init__(
        self,
        chunks: AsyncGenerator[Chunk, None],
        prompt_tokens: int,
        on_first_token: Callable[[], None],
    ) -> None:
        self._chunks = chunks
        self._on_first_token: Callable[[], None] | None = on_first_token
        self.gen = Generation(prompt_tokens=prompt_tokens)
        self._parser = ToolCallStream()
        self._rest: AsyncGenerator[list[Delta], None] | None = None

    def _absorb(self, chunk: Chunk) -> list[Delta]:
        if chunk.token_ids and self._on_first_token is not None:
            self._on_first_token()
            self._on_first_token = None
        self.gen.token_ids += chunk.token_ids
        self.gen.logprobs += chunk.logprobs
        self.gen.text += chunk.text
        if chunk.finish_reason:
            self.gen.finish_reason = chunk.finish_reason
        if chunk.policy_version is not None:
            self.gen.policy_version = chunk.policy_version
        if chunk.prompt_token_ids is not None:
            self.gen.engine_prompt_ids = chunk.prompt_token_ids
            self.gen.prompt_tokens = len(chunk.prompt_token_ids)
        return list(self._parser.feed(chunk.text))

    def _close_parser(self) -> list[Delta]:
        deltas = list(self._parser.close())
        self.gen.content, self.gen.tool_calls = self._parser.content, list(self._parser.calls)
        return deltas

    async def first(self) -> list[Delta]:
        """The deltas of the upstream's first chunk (all of them if it sent only one)."""
        try:
            chunk = await anext(self._chunks)
        except StopAsyncIteration:
            return self._close_parser()
        return self._absorb(chunk)

    def rest(self) -> AsyncIterator[list[Delta]]:
        """The deltas after :meth:`first`, a list per upstream chunk (so one chunk's deltas go
        out together), ending with what the parser held back."""
        self._rest = self._deltas()
        return self._rest

    async def _deltas(self) -> AsyncGenerator[list[Delta], None]:
        async for chunk in self._chunks:
            deltas = self._absorb(chunk)
            if deltas:
                yield deltas
            # Chunks the upstream already sent arrive without suspending; yield to the loop so
            # a client's disconnect is seen and other streams get their turn.
            await asyncio.sleep(0)
        deltas = self._close_parser()
        if deltas:
            yield deltas

    async def close(self) -> None:
        """Abort the upstream request if it is still running (no-op once it has ended)."""
        try:
            if self._rest is not None:
                await self._rest.aclose()
        finally:
            await self._chunks.aclose()
