"""The load sent with the start: as soon as the hello is verified, before the client exists."""

from __future__ import annotations

import select
from typing import Any

import psutil
import pytest

from edge_contracts.errors import InvalidValue
from edge_contracts.protocol import OP_LOAD
from edge_core.host import WorkerClient, bootstrap
from edge_core.host.errors import BootstrapRefused
from edge_core.testing.leaks import descendants

from .conftest import request, test_route


def test_the_load_is_on_its_way_before_the_client_is_built(start, monkeypatch):
    """The worker has answered the load while the controller still builds the client.

    The client is built only once the worker's reply to the load is readable on the
    channel: were the load sent by the client (after it is built), nothing would come.
    """
    answered: list[bool] = []

    def built_after_the_reply(**kwargs: Any) -> WorkerClient:
        poller = select.poll()
        poller.register(kwargs["sock"].fileno(), select.POLLIN)
        answered.append(bool(poller.poll(30_000)))
        return WorkerClient(**kwargs)

    monkeypatch.setattr(bootstrap, "WorkerClient", built_after_the_reply)
    client = start(first_control=(OP_LOAD, {"model": "m"}))
    assert answered == [True]
    report = client.sent_control_reply(timeout_s=10)
    assert report["loaded"] == {"model": "m"}
    assert client.control("ping", {}, timeout_s=10)["pid"] == client.identity.pid  # ctl-2
    call = client.submit(request("r1"), {})
    assert call.next(timeout=10).terminal


def test_the_sent_control_reply_is_taken_once_and_only_where_one_was_sent(start):
    """Asked again, or on a channel started without one: refused, naming the field."""
    client = start(first_control=(OP_LOAD, {}))
    client.sent_control_reply(timeout_s=10)
    with pytest.raises(InvalidValue) as again:
        client.sent_control_reply(timeout_s=10)
    assert again.value.field == "sent_control"
    plain = start()
    with pytest.raises(InvalidValue) as none:
        plain.sent_control_reply(timeout_s=10)
    assert none.value.field == "sent_control"
    with pytest.raises(InvalidValue) as bad:
        start(first_control=(OP_LOAD, {})).sent_control_reply(timeout_s=float("nan"))
    assert bad.value.field == "timeout_s"


def test_a_refused_hello_sends_no_load(monkeypatch):
    """The load goes only to a worker whose hello was verified: a wrong token gets none."""
    sent: list[Any] = []
    real = bootstrap.write_frame

    def recording(send: Any, parts: Any) -> None:
        sent.append(parts)
        real(send, parts)

    monkeypatch.setattr(bootstrap, "write_frame", recording)
    with pytest.raises(BootstrapRefused):
        bootstrap.start_worker(test_route("wrong_token"), generation=1,
                               first_control=(OP_LOAD, {}))
    assert len(sent) == 1  # the boot frame, and nothing after the refused hello


@pytest.mark.parametrize("first", [True, False], ids=["load-sent", "no-load"])
@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_a_start_failing_while_its_client_is_built_leaves_no_process(monkeypatch, first, error):
    """A failure after the hello (no thread for the client, a Ctrl-C) retires the worker.

    Checked while the error is still held, as an unwinding caller holds it: before the
    fix the worker (loading, where the load was sent) and the tree it started ran on,
    known to nobody, until the error was freed. The stubborn worker's tree ignores
    SIGTERM, so only the start's own retirement ends it.
    """
    def failing(**kwargs: Any) -> WorkerClient:
        raise error("can't start new thread")

    monkeypatch.setattr(bootstrap, "WorkerClient", failing)
    with pytest.raises(error) as held:
        bootstrap.start_worker(test_route("stubborn"), generation=1,
                               first_control=(OP_LOAD, {}) if first else None)
    left = [p for p in descendants() if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]
    try:
        assert not left, [(p.pid, " ".join(p.cmdline())[-60:]) for p in left]
    finally:
        for proc in left:
            proc.kill()
        psutil.wait_procs(left, timeout=5)
        del held
