"""The log configuration: tracebacks reach the logs (structured), secrets never do."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

from composable_dra.process import logs


@pytest.fixture
def configured() -> Iterator[None]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def lines(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def _fail_with_a_secret_local() -> None:
    password = "hunter2-local"  # a local the traceback must not show
    raise ValueError(
        f"cannot reach https://admin:s3cret@fabric.example:8443/redfish ({len(password)})"
    )


def _log_a_failure(
    capsys: pytest.CaptureFixture[str], fmt: logs.Format, log: Callable[[], object]
) -> str:
    """Configure the logs in ``fmt``, call ``log`` while handling the failure above and
    return what reached stderr."""
    logs.configure("test", fmt=fmt)
    try:
        _fail_with_a_secret_local()
    except ValueError:
        log()
    return capsys.readouterr().err


def test_log_exception_carries_a_structured_traceback(
    configured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    log = logs.get("test.exceptions")
    err = _log_a_failure(capsys, "json", lambda: log.exception("attach failed", resource="cr-1"))
    (line,) = lines(err)
    assert line["event"] == "attach failed" and line["level"] == "error"
    assert "exc_info" not in line
    (exc,) = line["exception"]
    assert exc["exc_type"] == "ValueError"
    assert "https://[redacted]@fabric.example:8443/redfish" in exc["exc_value"]
    assert exc["frames"][-1]["name"] == "_fail_with_a_secret_local"
    text = json.dumps(line)
    assert "s3cret" not in text and "hunter2-local" not in text


def test_stdlib_and_kopf_records_carry_tracebacks_too(
    configured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _log_a_failure(
        capsys,
        "json",
        lambda: logging.getLogger("kopf.test").exception(
            "handler failed", extra={"k8s_ref": {"name": "cr-2"}, "settings": object()}
        ),
    )
    (line,) = lines(err)
    assert line["resource"] == "cr-2" and line["component"] == "test"
    (exc,) = line["exception"]
    assert exc["exc_type"] == "ValueError" and "s3cret" not in json.dumps(line)


def test_nested_keys_and_url_credentials_are_redacted(
    configured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("test", fmt="json")
    request: dict[str, Any] = {
        "headers": {"Authorization": "Basic YWRtaW46YWRtaW4=", "Accept": "application/json"},
        "items": [{"password": "p1"}, ("x", {"admin_token": "t1"})],
        "endpoint": "https://user:p2@fabric:8443/redfish/v1?token=t2&page=3",
    }
    logs.get("test.redact").info(
        "fetching http://u:p3@h/x?a=1&password=p4#frag",
        request=request,
        client_secret="p5",
        error=OSError("connect to https://me:p6@host failed"),
    )
    (line,) = lines(capsys.readouterr().err)
    text = json.dumps(line)
    for secret in ("YWRtaW46YWRtaW4=", "p1", "t1", "p2", "t2", "p3", "p4", "p5", "p6"):
        assert secret not in text, secret
    assert line["event"] == "fetching http://[redacted]@h/x?a=1&password=[redacted]#frag"
    assert line["request"]["headers"] == {
        "Authorization": "[redacted]",
        "Accept": "application/json",
    }
    assert line["request"]["endpoint"] == (
        "https://[redacted]@fabric:8443/redfish/v1?token=[redacted]&page=3"
    )
    assert line["client_secret"] == "[redacted]"
    # The caller's objects are left as they were.
    assert request["headers"]["Authorization"] == "Basic YWRtaW46YWRtaW4="


def test_console_format_prints_the_traceback_redacted(
    configured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _log_a_failure(
        capsys, "console", lambda: logs.get("test.console").exception("attach failed")
    )
    assert "Traceback (most recent call last)" in err and "_fail_with_a_secret_local" in err
    assert "s3cret" not in err and "https://[redacted]@fabric.example" in err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no url here", "no url here"),
        ("https://host/path?page=2", "https://host/path?page=2"),
        ("ftp://a@b/c", "ftp://[redacted]@b/c"),
        ("a=1 exit code=3", "a=1 exit code=3"),
        ("x?api_key=k&sig=s;auth=z", "x?api_key=[redacted]&sig=[redacted];auth=[redacted]"),
        ("mail admin@example.com", "mail admin@example.com"),
    ],
)
def test_redact_text(text: str, expected: str) -> None:
    assert logs.redact_text(text) == expected


def test_redaction_of_deep_values_never_leaks() -> None:
    deep: Any = {"password": "p"}
    for _ in range(40):
        deep = {"next": [deep]}
    assert "'p'" not in repr(logs.redact(deep))
