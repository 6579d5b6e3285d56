"""A SuperNode's in-process executor: every ClientApp task in one long-lived process (issue 33).

flwr 1.41's SuperNode hands each message to its SuperExec, which starts a fresh ``flwr-clientapp``
process for it (a non-ephemeral ClientApp is Flower issue #3670). On the 2-vCPU VM those starts cost
Flower's runtime (about 1.4 CPU-seconds a message) and, with ten SuperNodes starting ten processes at once,
most of a deployed round's wall time. A SuperNode started with ``--isolation process`` instead waits for an
executor of the operator's choice to take its tasks from its Runtime API. This module is that executor:
it polls the SuperNode for ClientApp tasks (Flower's ``AcquireTask``, as ``flower-superexec`` does) and runs
each in this process with Flower's own task functions (pull the message and Context, push the reply and
the updated Context), so torch, the run's code, the node's shard and model stay loaded between messages.

It runs the fpsfl ClientApp installed beside it, not the app bundle (FAB) the run ships: each run's FAB is
compared file by file with the installed code once, and a task of a run whose code differs is answered
with a Flower ``Error`` naming the first differing file (install the run's code on the node, or run the
SuperNode without this executor). Client state still travels only in the Context, which the SuperNode
keeps, so a restarted executor loses nothing but warmth.

Usage: ``flower-supernode ... --isolation process --port P`` and ``python -m federated.flower.executor
127.0.0.1:P`` beside it (recipes/flower_deploy.sh does both for each SuperNode).
"""

from __future__ import annotations

import hashlib
import io
import sys
import time
import zipfile
from pathlib import Path

from flwr.app import Error, Message
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
from flwr.proto.node_pb2 import Node
from flwr.proto.runtime_pb2 import (
    AcquireTaskRequest,
    PullAppMessagesRequest,
    PullTaskInputRequest,
    SendTaskHeartbeatRequest,
)
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from fpsfl.base.cli import UsageError

from .phases import Phases

POLL_S = 0.5  # between AcquireTask calls while idle (flower-superexec's default is 1 s)
# Retries of a message part the SuperNode does not hold yet: its task exists as soon as the message's head
# arrives, before its arrays. Flower's defaults (1 s, doubling to 10 s) suit a process that takes seconds to
# start; a warm executor asks at once and would wait 1 + 2 + 4 + 8 s for a part that came 0.1 s later.
PULL_BACKOFF_S, PULL_BACKOFF_CAP_S = 0.02, 0.25
_CHECKED: dict[str, str] = {}  # FAB hash -> "" (the installed code) or the first file that differs


def installed_root() -> Path:
    """The folder holding the installed fpsfl packages (the repository in an editable install)."""
    import fpsfl

    return Path(fpsfl.__file__).resolve().parent.parent


def fab_differs(content: bytes, root: Path) -> str:
    """The first Python file of a FAB (a zip) that is missing from ``root`` or differs from it; "" if none."""
    with zipfile.ZipFile(io.BytesIO(content)) as fab:
        for name in sorted(fab.namelist()):
            if not name.endswith(".py"):
                continue
            local = root / name
            if not local.is_file():
                return name
            if hashlib.sha256(fab.read(name)).digest() != hashlib.sha256(local.read_bytes()).digest():
                return name
    return ""


def _client(address: str, token: str | None = None) -> RuntimeHttpClient:
    interceptors = [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp")]
    if token is not None:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(address, insecure=True, root_certificates=None,
                                                 interceptors=interceptors,
                                                 retry_invoker=make_simple_http_retry_invoker())


def run_task(address: str, token: str, app, root: Path) -> str:
    """One ClientApp task of the SuperNode at ``address``: its sub-status (Flower's ``SubStatus``)."""
    from . import client_app

    phases = Phases("executor")
    phases.cold = "federated.flower.node" not in sys.modules  # this process has not trained yet
    client = _client(address, token)
    heartbeat = HeartbeatSender(lambda: _beat(client))  # the SuperNode frees a task whose heartbeat stops
    heartbeat.start()
    message = context = reply = None
    status, details = SubStatus.FAILED, "the fpsfl executor failed before the ClientApp ran"
    try:
        message, context, run, fab = pull_task_input(client)
        phases.mark("runtime")  # Flower's exchange with the SuperNode: the message, Context and app bundle
        if fab.hash_str not in _CHECKED:
            _CHECKED[fab.hash_str] = fab_differs(fab.content, root)
        differs = _CHECKED[fab.hash_str]
        if differs:
            details = (f"run {run.run_id}'s app differs from this node's fpsfl ({root}) in {differs}: "
                       f"install the run's code on this node, or start its SuperNode without this executor")
            print(f"fpsfl executor: {details}", file=sys.stderr, flush=True)
            reply = Message(Error(code=ErrorCode.LOAD_CLIENT_APP_EXCEPTION, reason=details), reply_to=message)
        else:
            client_app.PHASES = phases  # the ClientApp logs this task's phases under the executor's name
            reply = app(message=message, context=context)
            status, details = SubStatus.COMPLETED, ""
    except Exception as exc:  # the ClientApp's own failures are Error replies; this is a bug or a lost link
        details = f"{type(exc).__name__}: {exc}"
        print(f"fpsfl executor: task failed: {details}", file=sys.stderr, flush=True)
        if message is not None:
            error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details)
            reply = Message(error, reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                _push("the reply", push_message, client, reply, context)
            _push("the task's end", push_task_output, client, context, status, details)
        finally:
            heartbeat.stop()
            client.close()
    return status


def _push(what: str, push, *args) -> None:
    """``push(*args)``, one line when it fails: a reply the SuperNode no longer takes (its message expired
    at the round's timeout while this node trained, and the server has closed that round) is dropped, and
    the executor serves the next task, as a node that missed the round."""
    try:
        push(*args)
    except Exception as exc:  # noqa: BLE001 - never the end of the executor
        print(f"fpsfl executor: could not push {what} to the SuperNode ({type(exc).__name__}: {exc}); "
              f"dropped", file=sys.stderr, flush=True)


def pull_task_input(client: RuntimeHttpClient):
    """The task's message, Context, run and app bundle, as Flower's ``pull_task_input`` pulls them, with
    the short retries above."""
    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id, TaskIdentity.run_id = res.task_id, res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context, run, fab = context_from_proto(res.context), run_from_proto(res.run), fab_from_proto(res.fab)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("the SuperNode has no message for this task")
    node, tree = Node(node_id=context.node_id), pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree, make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message, initial_backoff=PULL_BACKOFF_S, backoff_cap=PULL_BACKOFF_CAP_S)
    message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower's: the head holds no id of its own
    return message, context, run, fab


def _beat(client: RuntimeHttpClient) -> bool:
    """One task heartbeat; False (retried by the sender) when the SuperNode cannot be reached. Unlike
    Flower's, a refused heartbeat does not interrupt this process: it serves the tasks that follow."""
    try:
        client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
    except Exception:  # noqa: BLE001 - a heartbeat never ends the executor
        return False
    return True


def serve(address: str, poll_s: float = POLL_S, max_tasks: int | None = None) -> int:
    """Take and run the SuperNode's ClientApp tasks until stopped (or ``max_tasks`` are done): their count."""
    from .client_app import app

    root, done, waiting = installed_root(), 0, False
    client = _client(address)
    print(f"fpsfl executor: serving the SuperNode at {address}", file=sys.stderr, flush=True)
    try:
        while max_tasks is None or done < max_tasks:
            try:
                res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
            except Exception as exc:  # noqa: BLE001 - the SuperNode is (re)starting: wait for it
                if not waiting:
                    print(f"fpsfl executor: no SuperNode at {address} ({type(exc).__name__}); waiting",
                          file=sys.stderr, flush=True)
                waiting = True
                time.sleep(1.0)
                continue
            waiting = False
            if res.HasField("task") and res.token:
                try:
                    run_task(address, res.token, app, root)
                except Exception as exc:  # noqa: BLE001 - a bug of one task is not the end of the node
                    print(f"fpsfl executor: task failed: {type(exc).__name__}: {exc}", file=sys.stderr,
                          flush=True)
                done += 1
            else:
                time.sleep(poll_s)
    finally:
        client.close()
    return done


def main(argv: list[str] | None = None) -> int:
    from fpsfl.base.cli import Parser, run_main

    parser = Parser(prog="python -m federated.flower.executor",
                    description="Run a SuperNode's ClientApp tasks in this one long-lived process: start the "
                                "SuperNode with --isolation process --port P, and this with 127.0.0.1:P.")
    parser.add_argument("address", help="the SuperNode's Runtime API, HOST:PORT (flower-supernode --port)")
    parser.add_argument("--poll", type=float, default=POLL_S, metavar="S",
                        help=f"seconds between polls for a task while idle (default {POLL_S})")

    def run(args) -> int:
        host, _, port = args.address.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"{args.address!r}: give the SuperNode's Runtime API as HOST:PORT")
        if not 0.01 <= args.poll <= 60:
            raise UsageError(f"--poll {args.poll}: give seconds in [0.01, 60]")
        serve(args.address, args.poll)
        return 0

    parser.set_defaults(run=run)
    return run_main("python -m federated.flower.executor", parser, argv, (UsageError,))


if __name__ == "__main__":
    sys.exit(main())
