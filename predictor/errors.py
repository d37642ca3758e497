"""The error every layer raises for bad input from a user.

`UserError` is a `ValueError` naming what was wrong with a request (a size the model
cannot run, an unknown option, a budget that is not a number). `loc` is the path of the
field at fault in the request (`("configs", 0, "sizes")`), where the layer knows it. Front
ends map it to a clean refusal: the CLI exits with status 2 and one line on stderr, the
service answers HTTP 422 naming `body` + `loc`. Anything else escaping a command is an
internal error and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["LimitExceeded", "UserError"]


class UserError(ValueError):
    """Bad input from a user; the message names the argument and what was wrong."""

    def __init__(self, message: str = "", *, loc: Iterable[str | int] = ()):
        super().__init__(message)
        self.loc = tuple(loc)


class LimitExceeded(UserError):
    """A request over a limit the answering side sets (captures per request, configs per
    request, a body's size): the service answers 413."""
