"""The SuperNode's in-process executor (federated/flower/executor.py, issue 33): it runs only the code the
run ships, answers every task (a reply, or a Flower Error) and always hands the Context back. A real
SuperNode serves it in the slow loopback deployments (tests/federated/test_flower_deploy.py)."""

from __future__ import annotations

import io
import zipfile

import pytest

pytest.importorskip("flwr", reason="Flower is not installed (pip install -e '.[flower]')")

from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.common.constant import ErrorCode, SubStatus  # noqa: E402
from flwr.supercore.fab import Fab  # noqa: E402

from federated.flower import executor  # noqa: E402

from .flower_grid import flower_identity  # noqa: E402

FILES = ["federated/flower/executor.py", "federated/flower/client_app.py", "fpsfl/__init__.py"]


def _fab(root, files, changed: str | None = None, extra: str | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pyproject.toml", "[tool.flwr.app]\n")  # not code: never compared
        for name in files:
            data = (root / name).read_bytes()
            z.writestr(name, data + b"\n# edited\n" if name == changed else data)
        if extra:
            z.writestr(extra, "x = 1\n")
    return buf.getvalue()


def test_a_fab_of_the_installed_code_is_accepted_and_any_other_names_its_first_difference():
    root = executor.installed_root()
    assert executor.fab_differs(_fab(root, FILES), root) == ""
    assert executor.fab_differs(_fab(root, FILES, changed=FILES[1]), root) == FILES[1]
    assert executor.fab_differs(_fab(root, FILES, extra="federated/flower/new_module.py"), root) == \
        "federated/flower/new_module.py"


class _Link:
    """What run_task sends back to the SuperNode, in place of Flower's Runtime API client functions."""

    def __init__(self, monkeypatch, fab: bytes):
        flower_identity(monkeypatch)  # a Message needs the task's identity, which pull_task_input sets
        self.pushed, self.output, self.closed = [], [], False
        self.message = Message(RecordDict({"config": ConfigRecord({"server-round": 1})}), dst_node_id=7,
                               message_type="train")
        self.context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
        run = type("Run", (), {"run_id": 1})()
        link = self
        monkeypatch.setattr(executor, "_client", lambda address, token=None: link)
        task = (self.message, self.context, run, Fab("h" + str(len(fab)), fab, {}))
        monkeypatch.setattr(executor, "pull_task_input", lambda client: task)
        monkeypatch.setattr(executor, "push_message", lambda client, reply, ctx: self.pushed.append(reply))
        monkeypatch.setattr(executor, "push_task_output",
                            lambda client, ctx, status, details: self.output.append((ctx, status, details)))
        monkeypatch.setattr(executor, "_beat", lambda client: True)
        executor._CHECKED.clear()

    def close(self):
        self.closed = True


@pytest.mark.parametrize("case", ["same code", "other code", "app raises"])
def test_every_task_gets_a_reply_and_the_context_back(monkeypatch, tmp_path, case):
    root = executor.installed_root()
    link = _Link(monkeypatch, _fab(root, FILES, changed=FILES[0] if case == "other code" else None))
    calls = []

    def app(message, context):
        calls.append(message)
        if case == "app raises":
            raise RuntimeError("boom")
        context.state["seen"] = ConfigRecord({"round": 1})
        return Message(RecordDict({"metrics": ConfigRecord({"ok": 1})}), reply_to=message)

    status = executor.run_task("127.0.0.1:1", "token", app, root)
    assert link.closed and len(link.pushed) == 1 and len(link.output) == 1
    reply, (ctx, pushed_status, details) = link.pushed[0], link.output[0]
    assert ctx is link.context and pushed_status == status
    if case == "same code":
        assert status == SubStatus.COMPLETED and not reply.has_error() and details == ""
        assert "seen" in ctx.state and calls == [link.message]
    elif case == "other code":  # the app never runs: the node would train with code the run did not ship
        assert status == SubStatus.FAILED and calls == []
        assert reply.error.code == ErrorCode.LOAD_CLIENT_APP_EXCEPTION and FILES[0] in reply.error.reason
    else:
        assert status == SubStatus.FAILED and reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
        assert "RuntimeError: boom" in reply.error.reason


def test_a_reply_the_supernode_no_longer_takes_is_dropped_in_one_line(monkeypatch, capsys):
    """A node that trained past the round's timeout: its message has expired and the SuperNode refuses the
    push. The executor says so, still hands the task's end back, and lives on to serve the next task."""
    root = executor.installed_root()
    link = _Link(monkeypatch, _fab(root, FILES))

    def refused(client, reply, ctx):
        raise RuntimeError("The push session may have expired or been replaced.")

    monkeypatch.setattr(executor, "push_message", refused)
    app = lambda message, context: Message(RecordDict(), reply_to=message)  # noqa: E731
    assert executor.run_task("127.0.0.1:1", "token", app, root) == SubStatus.COMPLETED
    assert link.closed and len(link.output) == 1
    assert "could not push the reply to the SuperNode (RuntimeError: The push session may have expired" \
        in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["nowhere"], "HOST:PORT"), (["127.0.0.1:x"], "HOST:PORT"), (["127.0.0.1:9094", "--poll", "0"], "--poll"),
])
def test_bad_flags_are_one_line(capsys, argv, message):
    assert executor.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
