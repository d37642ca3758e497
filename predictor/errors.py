"""The error every layer raises for bad input from a user.

`UserError` is a `ValueError` naming what was wrong with a request (a size the model
cannot run, an unknown option, a budget that is not a number). Front ends map it to a
clean refusal: the CLI exits with status 2 and one line on stderr, the service answers
HTTP 422. Anything else escaping a command is an internal error and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(ValueError):
    """Bad input from a user; the message names the argument and what was wrong."""
