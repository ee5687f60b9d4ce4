"""A bounded, talkative session with AI Hub through the real ``qai-hub`` client.

Everything here imports ``qai_hub`` lazily: the ``edge`` command line and the ``qnn``
backend never need it. The client's built-in retries are bounded (a few seconds in all
by default, not its half-minute-per-call default), every retry and every job-state change
is printed to the progress stream, and every failure becomes a :class:`HubError` naming
what failed, the value and the job id when there is one.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import attrs

from edge_core.errors import EdgeError

__all__ = ["CLIENT_INI_ENV", "HubError", "HubSession", "HubSettings", "config_path"]

#: The environment variable the qai-hub client reads its ini file from.
CLIENT_INI_ENV = "QAIHUB_CLIENT_INI"
_RETRY_LOGGERS = ("LogRetry", "backoff")


class HubError(EdgeError):
    """An AI Hub operation failed: ``field: reason: value`` and the job id, if any."""

    def __init__(self, field: str, reason: str, value: object = None,
                 job_id: str | None = None) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        self.job_id = job_id
        suffix = f" (job {job_id})" if job_id else ""
        super().__init__(f"{field}: {reason}: {value!r}{suffix}")


def config_path(explicit: str | None = None) -> Path:
    """The client ini: ``explicit``, else ``$QAIHUB_CLIENT_INI``, else ~/.qai_hub/client.ini."""
    chosen = explicit or os.environ.get(CLIENT_INI_ENV) or "~/.qai_hub/client.ini"
    return Path(chosen).expanduser()


@attrs.frozen
class HubSettings:
    """How to reach AI Hub and how long to keep trying.

    Attributes:
        config: A client ini file (see :func:`config_path`); ignored with ``api_token``.
        api_token: An explicit token (then ``api_url``/``web_url`` apply).
        api_url: The API base URL with an explicit token.
        web_url: The web base URL with an explicit token.
        retries: Retries per HTTP call (the client's own default is 6).
        max_retry_wait_s: Longest single wait between retries.
        job_timeout_s: Longest wait for one job to finish.
        poll_s: Seconds between job-status polls.
    """

    config: str | None = None
    api_token: str | None = None
    api_url: str = "https://workbench.aihub.qualcomm.com"
    web_url: str = "https://workbench.aihub.qualcomm.com"
    retries: int = attrs.field(default=2, validator=attrs.validators.ge(0))
    max_retry_wait_s: float = attrs.field(default=2.0, validator=attrs.validators.gt(0))
    job_timeout_s: float = attrs.field(default=1800.0, validator=attrs.validators.gt(0))
    poll_s: float = attrs.field(default=5.0, validator=attrs.validators.gt(0))


class _ProgressHandler(logging.Handler):
    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self._say = say

    def emit(self, record: logging.LogRecord) -> None:
        self._say(f"hub: retrying: {record.getMessage()}")


class HubSession:
    """One configured ``qai_hub.Client`` with bounded retries and printed progress."""

    def __init__(self, settings: HubSettings, progress: TextIO) -> None:
        import qai_hub as hub
        from qai_hub import api_utils
        from qai_hub.util import session as hub_session

        self.settings = settings
        self._progress = progress
        hub_session.MAX_RETRIES = settings.retries
        hub_session.MAX_WAIT = max(1, round(settings.max_retry_wait_s))
        hub_session.BACKOFF_FACTOR = min(hub_session.BACKOFF_FACTOR, settings.max_retry_wait_s)
        if settings.api_token:
            config = hub.ClientConfig(api_token=settings.api_token, api_url=settings.api_url,
                                      web_url=settings.web_url, verbose=False)
        else:
            path = config_path(settings.config)
            if not path.is_file():
                raise HubError("hub.config", "no AI Hub client configuration (set "
                               f"{CLIENT_INI_ENV}, pass --config, or --api-token)", str(path))
            try:
                config = api_utils.load_api_config_from_file(str(path))
            except Exception as exc:
                raise HubError("hub.config", f"unreadable client configuration ({exc})",
                               str(path)) from None
            config.verbose = False
        self.api_url = config.api_url
        self.client = hub.Client(config=config)

    def say(self, message: str) -> None:
        """Print one progress line."""
        print(message, file=self._progress, flush=True)

    @contextmanager
    def calling(self, what: str, job_id: str | None = None) -> Iterator[None]:
        """Show retries while inside; turn any client failure into a :class:`HubError`."""
        handler = _ProgressHandler(self.say)
        loggers = [logging.getLogger(name) for name in _RETRY_LOGGERS]
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
        try:
            yield
        except HubError:
            raise
        except Exception as exc:
            raise HubError(f"hub.{what}", _describe(exc), self.api_url, job_id) from None
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.removeHandler(handler)
                logger.setLevel(level)

    def wait(self, job: Any, what: str) -> None:
        """Poll ``job`` until it finishes, printing each state; raise unless it succeeded."""
        started = time.monotonic()
        last = ""
        while True:
            with self.calling(f"{what}.status", job.job_id):
                status = job.get_status()
            text = f"{status.code}{f' ({status.message})' if status.message else ''}"
            if text != last:
                elapsed = time.monotonic() - started
                self.say(f"hub: {what} job {job.job_id}: {text} after {elapsed:.0f} s")
                last = text
            if status.finished:
                break
            if time.monotonic() - started > self.settings.job_timeout_s:
                raise HubError(f"hub.{what}", "job did not finish within the timeout "
                               "(it may still finish on the service)",
                               f"{self.settings.job_timeout_s:.0f} s", job.job_id)
            time.sleep(self.settings.poll_s)
        if not status.success:
            raise HubError(f"hub.{what}", "job failed", status.message or status.code,
                           job.job_id)


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{name}: {text}" if text else name
