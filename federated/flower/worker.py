"""A node's warm worker: the ClientApp's work in one long-lived process per SuperNode (issue 33).

flwr 1.41 runs every message a SuperNode receives in a fresh ``flwr-clientapp`` process (a non-ephemeral
ClientApp is Flower issue #3670). Ours would import torch and the run's code, read its shard, build its
model and pay torch's first-step set-up in each of them: about 10 CPU-seconds a client-round on the 2-vCPU
VM, 23x a simulated round. With ``worker='SOCKET'`` in a SuperNode's node config, the ClientApp (which then
imports neither torch nor the run's code) hands each message and the node's Context to the worker serving
SOCKET, and returns its reply and the Context state it updated. The worker keeps the imports, the shard and
the model warm between messages; it keeps no client state (that travels in the Context, which the
SuperNode holds), so a restarted worker costs one cold message, and a worker that is gone only speed: the
ClientApp then does the work itself (one line in the SuperNode's log).

The socket is a Unix stream socket in a folder only its user can enter, and the worker answers only
processes of its own user. One message at a time, as a SuperNode sends them.

Usage: ``python -m federated.flower.worker SOCKET`` (recipes/flower_deploy.sh starts one per SuperNode).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import traceback
from pathlib import Path

from flwr.app import Context, Error, Message
from flwr.common.serde import (
    context_from_proto,
    context_to_proto,
    message_from_proto,
    message_to_proto,
    recorddict_from_proto,
    recorddict_to_proto,
)
from flwr.proto.message_pb2 import Context as ProtoContext
from flwr.proto.message_pb2 import Message as ProtoMessage
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from fpsfl.base.cli import UsageError

from .phases import Phases

CLIENT_APP_RAISED = 2  # flwr.common.constant.ErrorCode.CLIENT_APP_RAISED_EXCEPTION (a bug, not a refusal)
_LENGTH = struct.Struct("!Q")


def forward(path: str, kind: str, msg: Message, context: Context) -> Message | None:
    """``msg`` handled by the worker at ``path``: its reply, with ``context.state`` updated; None when no
    worker answers there (the caller then does the work itself)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            _send(sock, [kind.encode(), message_to_proto(msg).SerializeToString(),
                         context_to_proto(context).SerializeToString()])
            head, content, state = _receive(sock, 3)
    except OSError as exc:
        print(f"fpsfl ClientApp: no worker at {path} ({exc.strerror or exc}); this process trains itself",
              file=sys.stderr)
        return None
    status = json.loads(head)
    context.state = recorddict_from_proto(ProtoRecordDict.FromString(state))
    if "error" in status:
        code, reason = status["error"]
        return Message(Error(code=int(code), reason=str(reason)), reply_to=msg)
    return Message(recorddict_from_proto(ProtoRecordDict.FromString(content)), reply_to=msg)


def serve(path: Path) -> None:
    """Answer the ClientApps of one SuperNode at ``path`` until stopped."""
    phases = Phases("worker")
    from . import node  # torch and the run's code: once, here

    phases.mark("imports")
    handlers = {"train": node.train, "evaluate": node.evaluate, "self_pretrain": node.self_pretrain}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stopped: remove the socket on the way out
    with _listen(path) as sock:
        print(f"fpsfl worker {os.getpid()}: serving {path}", file=sys.stderr, flush=True)
        cold = True
        while True:
            conn, _ = sock.accept()
            phases.restart()  # the wait for a message is no phase of its work
            with conn:
                if not _same_user(conn):
                    continue
                try:
                    kind, msg_bytes, ctx_bytes = _receive(conn, 3)
                except OSError:
                    continue
                msg = message_from_proto(ProtoMessage.FromString(msg_bytes))
                context = context_from_proto(ProtoContext.FromString(ctx_bytes))
                reply = _handle(handlers, kind.decode(), msg, context, phases)
                status = ({"error": [reply.error.code, reply.error.reason]} if reply.has_error() else {})
                content = b"" if reply.has_error() else recorddict_to_proto(reply.content).SerializeToString()
                try:
                    _send(conn, [json.dumps(status).encode(), content,
                                 recorddict_to_proto(context.state).SerializeToString()])
                except OSError:  # the ClientApp is gone (its SuperNode stopped it): nothing to answer
                    pass
            config = msg.content["config"] if "config" in msg.content else {}
            phases.write(kind=kind.decode(), cold=cold, client=config.get("client"),
                         round=config.get("server-round"))
            cold, phases = False, Phases("worker")


def _handle(handlers: dict, kind: str, msg: Message, context: Context, phases: Phases) -> Message:
    try:
        return handlers[kind](msg, context, phases)
    except Exception as exc:  # a bug: reported as Flower reports a ClientApp's exception, and serve on
        traceback.print_exc()
        return Message(Error(code=CLIENT_APP_RAISED, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)


class _listen:
    """A listening Unix socket at ``path`` (readable by its user only), removed on exit."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> socket.socket:
        if self.path.exists():
            try:  # a live worker answers; a stale socket file (a killed worker) does not
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.connect(str(self.path))
                raise UsageError(f"another worker serves {self.path}")
            except ConnectionRefusedError:
                self.path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.sock.bind(str(self.path))
        finally:
            os.umask(old)
        self.sock.listen(4)
        return self.sock

    def __exit__(self, *exc) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)


def _same_user(conn: socket.socket) -> bool:
    """Whether the peer runs as this process's user (Linux SO_PEERCRED; elsewhere the folder's mode)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return True
    _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return uid == os.getuid()


def _send(sock: socket.socket, parts: list[bytes]) -> None:
    sock.sendall(b"".join(_LENGTH.pack(len(p)) + p for p in parts))


def _receive(sock: socket.socket, count: int) -> list[bytes]:
    return [_exactly(sock, _LENGTH.unpack(_exactly(sock, _LENGTH.size))[0]) for _ in range(count)]


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection mid-message")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def main(argv: list[str] | None = None) -> int:
    from fpsfl.base.cli import Parser, run_main

    parser = Parser(prog="python -m federated.flower.worker",
                    description="A SuperNode's warm worker for the fpsfl ClientApp: give the SuperNode "
                                "--node-config \"worker='SOCKET'\" and start this beside it.")
    parser.add_argument("socket", type=Path, help="the Unix socket to serve (its folder must exist and "
                                                  "should be readable by its user only)")

    def run(args) -> int:
        if not args.socket.parent.is_dir():
            raise UsageError(f"{args.socket.parent}: no such folder for the worker's socket")
        serve(args.socket)
        return 0

    parser.set_defaults(run=run)
    return run_main("python -m federated.flower.worker", parser, argv, (UsageError,))


if __name__ == "__main__":
    sys.exit(main())
