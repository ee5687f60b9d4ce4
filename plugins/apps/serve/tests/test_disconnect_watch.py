"""The client watch of a request (no server needed): started late, and never for nothing.

A Starlette request over a scripted ASGI channel: its body, then ``http.disconnect`` when
the test says the client has gone. :class:`DisconnectWatch` reads the channel only from
``after_s`` on; a request answered sooner never reads it, and a disconnect that came
before the watch began is seen as soon as it begins.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request

from edge_serve.submitted import WATCH_AFTER_S, DisconnectWatch


class Channel:
    """An ASGI receive: the body once, then ``http.disconnect`` once the client has gone."""

    def __init__(self) -> None:
        self.reads = 0
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if self.reads == 1:
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}


def _request(channel: Channel) -> Request:
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [],
             "query_string": b""}
    return Request(scope, channel.receive)


def test_a_request_answered_before_the_watch_begins_never_reads_its_channel() -> None:
    async def run() -> tuple[int, list[str]]:
        channel = Channel()
        request = _request(channel)
        await request.body()
        seen: list[str] = []
        watch = DisconnectWatch(request, lambda: seen.append("gone"), after_s=0.05)
        await asyncio.sleep(0.01)
        watch.stop()
        channel.gone.set()
        await asyncio.sleep(0.1)  # past after_s: a timer left running would read now
        return channel.reads, seen

    assert asyncio.run(run()) == (1, [])


def test_a_disconnect_is_seen_once_the_watch_runs_even_one_that_came_before() -> None:
    async def run(gone_before: bool) -> tuple[list[float], float]:
        channel = Channel()
        request = _request(channel)
        await request.body()
        loop = asyncio.get_running_loop()
        started = loop.time()
        seen: list[float] = []
        watch = DisconnectWatch(request, lambda: seen.append(loop.time() - started),
                                after_s=0.05)
        if gone_before:
            channel.gone.set()
        await asyncio.sleep(0.1)
        if not gone_before:
            channel.gone.set()
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        watch.stop()
        return seen, loop.time() - started

    seen, _ = asyncio.run(run(gone_before=True))
    assert len(seen) == 1 and seen[0] >= 0.05  # seen when the watch began, not before
    seen, _ = asyncio.run(run(gone_before=False))
    assert len(seen) == 1 and seen[0] >= 0.1  # seen when it happened
    assert 0 < WATCH_AFTER_S <= 0.05  # a disconnect is never seen much later than it was


def test_requests_answered_before_their_watch_began_share_one_timer() -> None:
    # One after another, each answered within a millisecond: the loop's one timer, armed
    # for the earliest watch, serves them all (not a timer each, cancelled, that stays
    # in the loop's schedule until its time).
    async def run() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        armed = 0
        call_at = loop.call_at

        def counting_call_at(when: float, callback: Any, *args: Any,
                             **kwargs: Any) -> asyncio.TimerHandle:
            nonlocal armed
            armed += hasattr(callback, "__self__")  # a watch's timer, not a sleep's
            return call_at(when, callback, *args, **kwargs)

        loop.call_at = counting_call_at  # type: ignore[method-assign]
        channel = Channel()
        request = _request(channel)
        await request.body()
        for _ in range(50):
            watch = DisconnectWatch(request, lambda: None, after_s=0.05)
            await asyncio.sleep(0.001)
            watch.stop()
        await asyncio.sleep(0.1)  # whatever was armed has fired, reading nothing
        return armed, channel.reads

    armed, reads = asyncio.run(run())
    assert reads == 1  # no watch ever began
    assert armed <= 5, armed  # about one for each 50 ms, not one for each request
