"""The plugin's host release before a detach: wait while a process holds the GPU, then run
the release command, then answer HostReleased (its own field manager)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from composable_dra.k8s.kube import JSON
from composable_dra.model import names
from dra_driver.device_source import DeviceInfo, ProcessesUnknown
from dra_driver.host_release import MANAGER, HostReleaser, decide_release, requested

UUID = "GPU-aaaa"
DEVICE = DeviceInfo(name="gpu-aaaa", uuid=UUID, pci_bus_id="0000:3b:00.0")


def resource(*conditions: tuple[str, str], uuid: str | None = UUID) -> JSON:
    return {
        "metadata": {"name": "r1"},
        "status": {
            "deviceUUID": uuid,
            "conditions": [{"type": t, "status": s} for t, s in conditions],
        },
    }


ASKED = (names.RELEASE_REQUESTED, "True")
BUS = "COMPOSABLE_DRA_PCI_BUS_ID"


class Applies:
    def __init__(self) -> None:
        self.calls: list[tuple[str, JSON, str]] = []

    def apply(self, p: str, body: JSON, manager: str) -> JSON:
        self.calls.append((p, body, manager))
        return body

    def said(self) -> list[tuple[str, str]]:
        return [
            (c["status"], c["reason"])
            for _, body, _ in self.calls
            for c in body["status"]["conditions"]
        ]


def releaser(kube: Applies, pids: list[int], command: str | None = None, **kw: Any) -> HostReleaser:
    return HostReleaser(
        kube,  # type: ignore[arg-type]
        "node-1",
        devices=lambda: [DEVICE],
        refresh=lambda: None,
        processes=lambda _uuid: list(pids),
        command=command,
        **kw,
    )


def test_only_an_unanswered_request_counts() -> None:
    assert requested(resource(ASKED)) == UUID
    assert requested(resource()) is None
    assert requested(resource(ASKED, (names.HOST_RELEASED, "True"))) is None
    assert requested(resource(ASKED, uuid=None)) is None


def test_decide_release() -> None:
    assert decide_release("r", UUID, True, []).run
    held = decide_release("r", UUID, True, [9, 4, 9])
    assert (held.run, held.released, held.reason) == (False, False, "InUse")
    assert "pid 4, 9" in held.message
    gone = decide_release("r", UUID, False, None)
    assert (gone.released, gone.reason) == (True, "NotOnHost")
    unknown = decide_release("r", UUID, True, None)
    assert (unknown.released, unknown.reason) == (False, "ProcessesUnknown")


def test_waits_while_a_process_holds_the_gpu_then_runs_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "released"
    script = f"import os,pathlib; pathlib.Path('{marker}').write_text(os.environ['{BUS}'])"
    command = f'{sys.executable} -c "{script}"'
    kube, pids = Applies(), [4242]
    r = releaser(kube, pids, command)
    r.sync([resource(ASKED)])
    r.sync([resource(ASKED)])  # the same answer is written once
    assert kube.said() == [("False", "InUse")]
    assert not marker.exists()
    pids.clear()
    r.sync([resource(ASKED)])
    assert kube.said()[-1] == ("True", "Released")
    assert marker.read_text() == "0000:3b:00.0"
    assert {m for _, _, m in kube.calls} == {MANAGER}
    assert kube.calls[-1][0].endswith("/composableresources/r1/status")


def test_a_failing_command_is_the_answer_and_nothing_is_released() -> None:
    kube = Applies()
    releaser(kube, [], f"{sys.executable} -c 'raise SystemExit(3)'").sync([resource(ASKED)])
    assert kube.said() == [("False", "ReleaseFailed")]
    assert "status 3" in kube.calls[0][1]["status"]["conditions"][0]["message"]


def test_unreadable_processes_hold_the_release() -> None:
    def fails(_uuid: str) -> list[int]:
        raise ProcessesUnknown("driver gone")

    kube = Applies()
    r = releaser(kube, [])
    r._processes = fails
    r.sync([resource(ASKED)])
    assert kube.said() == [("False", "ProcessesUnknown")]


def test_a_source_without_a_process_table_is_released_after_the_command(
    tmp_path: Path,
) -> None:
    """The redfish and static sources have no NVML: nothing is waited for, the command
    runs, and the answer is released (so the operator's default wait always ends)."""
    marker = tmp_path / "ran"
    command = f"{sys.executable} -c \"import pathlib; pathlib.Path('{marker}').touch()\""
    kube = Applies()
    r = releaser(kube, [], command)
    r._processes = None
    r.sync([resource(ASKED)])
    assert kube.said() == [("True", "Released")] and marker.exists()
    plain = Applies()
    bare = releaser(plain, [])
    bare._processes = None
    bare.sync([resource(ASKED)])
    assert plain.said() == [("True", "Released")]


def test_nothing_is_done_unasked() -> None:
    kube = Applies()
    r = releaser(kube, [])
    r.sync([resource()])
    assert kube.calls == [] and not r.pending([resource()])
    assert r.pending([resource(ASKED)])


def test_a_gpu_missing_from_the_last_poll_is_looked_for_afresh_before_not_on_host() -> None:
    # The attach landed after the source's last poll: the cached list does not show it
    # yet, the host does. Answering NotOnHost then would let the fabric pull a held GPU.
    seen: list[DeviceInfo] = []
    kube = Applies()
    r = HostReleaser(
        kube,  # type: ignore[arg-type]
        "node-1",
        devices=lambda: list(seen),
        refresh=lambda: seen.append(DEVICE),
        processes=lambda _uuid: [4242],
    )
    r.sync([resource(ASKED)])
    assert kube.said() == [("False", "InUse")]


def test_a_released_answer_is_not_rewritten_while_the_watch_catches_up() -> None:
    kube, devices = Applies(), [DEVICE]
    r = HostReleaser(
        kube,  # type: ignore[arg-type]
        "node-1",
        devices=lambda: list(devices),
        refresh=devices.clear,  # the release command removed it from the host
        processes=lambda _uuid: [],
        command=f"{sys.executable} -c pass",
    )
    r.sync([resource(ASKED)])
    r.sync([resource(ASKED)])  # the watch has not shown HostReleased=True yet
    assert kube.said() == [("True", "Released")]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(
    status=st.fixed_dictionaries(
        {},
        optional={
            "deviceUUID": _JSON,
            "conditions": st.lists(
                st.fixed_dictionaries(
                    {"type": st.sampled_from([names.RELEASE_REQUESTED, names.HOST_RELEASED, "x"])},
                    optional={"status": _JSON, "reason": _JSON},
                ),
                max_size=4,
            ),
        },
    )
)
def test_requested_reads_any_status_the_schema_lets_through(status: JSON) -> None:
    uuid = requested({"metadata": {"name": "r"}, "status": status})
    assert uuid is None or uuid == status["deviceUUID"] != ""
