"""ParamError: a bad value of one named parameter, raised by every check a client's input meets.

Its text reads "<field> <message>" (or "<field>: <message>"), as the checks have always worded their errors, and
`field` names the parameter as the API spells it (`n`, `tools.2.function.name`, `chat_template_kwargs`), so that
the server answers a 400 naming it (OpenAI's `param`) without reading the message.
"""

from __future__ import annotations


class ParamError(ValueError):
    """`ParamError("n", "must be >= 1, got 0")`: str() is "n must be >= 1, got 0"; `separator` ": " for
    "structured_outputs: unknown option 'x'"."""

    def __init__(self, field: str, message: str, separator: str = " ") -> None:
        super().__init__(f"{field}{separator}{message}")
        self.field = field
        self.message = message
