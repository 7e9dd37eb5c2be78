"""composable_dra.fabric.relogin: after a 401, log in again and repeat the request once."""

from __future__ import annotations

import pytest

from composable_dra.fabric.errors import AuthError
from composable_dra.fabric.relogin import once_more_after_401


class Service:
    """A service that refuses the credentials in ``refused``; the login hands out 1, 2..."""

    def __init__(self, *refused: int) -> None:
        self.refused = set(refused)
        self.credential = 1
        self.sent: list[int] = []
        self.renewed: list[int] = []

    def send(self) -> tuple[int, str, int]:
        self.sent.append(self.credential)
        status = 401 if self.credential in self.refused else 200
        return status, f"answer {status}", self.credential

    def renew(self, stale: int) -> None:
        self.renewed.append(stale)
        self.credential += 1


def test_an_accepted_request_is_sent_once() -> None:
    service = Service()
    assert once_more_after_401(service.send, service.renew, "GET /x") == "answer 200"
    assert (service.sent, service.renewed) == ([1], [])


def test_a_401_renews_the_credential_it_went_with_and_repeats_once() -> None:
    service = Service(1)
    assert once_more_after_401(service.send, service.renew, "GET /x") == "answer 200"
    assert (service.sent, service.renewed) == ([1, 2], [1])


def test_a_second_401_is_an_auth_error_without_a_third_request() -> None:
    service = Service(1, 2)
    with pytest.raises(AuthError, match="GET /x: still unauthorized after logging in again"):
        once_more_after_401(service.send, service.renew, "GET /x")
    assert (service.sent, service.renewed) == ([1, 2], [1])
