"""How a node says no: a message it cannot serve is answered with a Flower ``Error`` whose code names the
kind (:data:`federated.flower.ERROR_CODES`), so the server counts that client as missing and says why.

Shared by the supervised node (:mod:`.node`) and the self-pre-training node (:mod:`.selfsup_node`).
"""

from __future__ import annotations

from flwr.app import Error, Message

from . import ERROR_CODES


class Refused(Exception):
    """A message this node cannot serve; answered with a Flower Error of ``ERROR_CODES[kind]``."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


def error_reply(msg: Message, kind: str, reason: str) -> Message:
    """A Flower Error reply: the server counts the client as missing, with ``reason`` (one line)."""
    return Message(Error(code=ERROR_CODES[kind], reason=reason), reply_to=msg)
