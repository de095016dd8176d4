"""User-facing errors.

A `UserError` is something the user can fix (a bad path, a bad value, a corrupt file). The CLI prints its
message as one line and exits with status 2 instead of showing a traceback. Bugs stay ordinary exceptions.
"""


class UserError(Exception):
    """An error caused by input the user controls; the message says what is wrong and what to do."""


class ConfigError(UserError, ValueError):
    """An invalid configuration value, key or combination."""


class Diverged(UserError):
    """A run stopped on train.max_nonfinite_steps non-finite steps in a row: the recipe's fault, not the input's
    (a GLUE suite records it and goes on with its other runs)."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (libraries' messages run to several lines), or its type. A
    YAML parser's error says its problem and where: its first line is only the context ("while scanning ...")."""
    problem, mark = getattr(e, "problem", None), getattr(e, "problem_mark", None)
    if problem and mark is not None:  # yaml.MarkedYAMLError, without importing yaml here
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
