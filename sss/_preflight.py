"""Pre-flight checks of the servers a run talks to: a few seconds' TCP connect before the client library starts.

MLflow's client retries a tracking server that does not answer for minutes without a word, then fails with
``MlflowException``; ``ray.init`` waits for minutes on a cluster address where nothing listens. A connect
with a short timeout tells within seconds that nothing answers there, and the run stops with one line:
the address (its password redacted), what happened and what to do. A server that answers the connect is
left to its client, whose own errors then apply.

This module imports no third-party library at import time.
"""

from __future__ import annotations

import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from sss._redact import redact_urls
from sss.errors import SSSError

__all__ = ["CONNECT_SECONDS", "TrackerUnreachableError", "check_trackers", "connect_error", "http_endpoint"]

CONNECT_SECONDS = 5.0
"""How long a pre-flight connect waits for an answer."""


class TrackerUnreachableError(SSSError):
    """A tracker of ``trainer.log.trackers`` is a server that did not answer the pre-flight connect.

    Example:
        >>> TrackerUnreachableError("x").exit_code
        1
    """


def connect_error(host: str, port: int, seconds: float = CONNECT_SECONDS) -> str | None:
    """Why a TCP connection to `host`:`port` failed within `seconds`, or None when it was accepted.

    Example:
        >>> import socket
        >>> with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        ...     s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        >>> connect_error("127.0.0.1", port)
        'connection refused'
    """
    outcome: list[str | None] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=seconds).close()
            outcome.append(None)
        except ConnectionRefusedError:
            outcome.append("connection refused")
        except TimeoutError:
            outcome.append(f"no answer within {seconds:g} s")
        except socket.gaierror as exc:
            outcome.append(f"unknown host {host!r} ({exc.strerror})")
        except OSError as exc:
            outcome.append(exc.strerror or str(exc))

    # The name look-up (getaddrinfo) has no timeout of its own: a thread bounds the whole attempt.
    thread = threading.Thread(target=attempt, name="sss-preflight", daemon=True)
    thread.start()
    thread.join(seconds + 1)
    return outcome[0] if outcome else f"no answer within {seconds:g} s"


def http_endpoint(url: str, proxies: dict[str, str] | None = None) -> tuple[str, int, bool] | None:
    """Where a request to an http(s) `url` connects first: ``(host, port, through_proxy)``; None for other URLs.

    A proxy that applies to the URL (`proxies`, by default those of ``http_proxy`` / ``https_proxy``, unless
    ``no_proxy`` bypasses it) is what the client connects to, as the ``requests`` library of MLflow's client does.

    Example:
        >>> http_endpoint("https://user:pw@mlflow.example.com/mlflow", proxies={})
        ('mlflow.example.com', 443, False)
        >>> http_endpoint("http://10.0.0.5:5000", proxies={"http": "http://proxy.example.com:3128"})
        ('proxy.example.com', 3128, True)
        >>> http_endpoint("sqlite:///mlflow.db") is None, http_endpoint("file:./mlruns") is None
        (True, True)
    """
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is no number: the client says so itself
        return None
    if parts.scheme not in ("http", "https") or not host:
        return None
    default = 443 if parts.scheme == "https" else 80
    proxy = (urllib.request.getproxies() if proxies is None else proxies).get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        try:
            via = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            if via.hostname:
                return via.hostname, via.port or (443 if via.scheme == "https" else 80), True
        except ValueError:
            return None
    return host, port or default, False


def check_trackers(trackers: Sequence[Any], is_main_process: bool = True) -> None:
    """Raise `TrackerUnreachableError` when a tracker of `trackers` is a server that does not answer.

    `trackers` are the names (or Accelerate's ``LoggerType`` / tracker objects) a fit is about to start;
    only the main process starts them. MLflow with an ``http(s)://`` tracking URI is checked (the
    resolved one: ``MLFLOW_TRACKING_URI`` or ``mlflow.set_tracking_uri``); local stores need no check.

    Example:
        >>> check_trackers(["csv", "tensorboard"])  # nothing to reach
    """
    names = {str(getattr(t, "value", getattr(t, "name", t))) for t in trackers or ()}
    if not is_main_process or "mlflow" not in names:
        return
    import mlflow

    uri = mlflow.get_tracking_uri()
    endpoint = http_endpoint(uri)
    if endpoint is None:
        return
    host, port, proxied = endpoint
    why = connect_error(host, port)
    if why is None:
        return
    via = f" through the proxy {host}:{port} (https_proxy / http_proxy)" if proxied else ""
    raise TrackerUnreachableError(
        redact_urls(
            f"trainer.log.trackers has mlflow, and nothing answered at its tracking server {uri}{via}: {why}. "
            "Start the server, or set MLFLOW_TRACKING_URI to one that runs, or remove mlflow from "
            "trainer.log.trackers"
        )
    )
