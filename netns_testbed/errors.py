"""Errors a user can act on.

Every failure that is the user's to fix (bad input, missing privilege or kernel
feature) is raised as a :class:`UserError` with a one-line message that names the
problem and the fix; the CLI prints it to stderr and exits with ``code``.
"""
from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; ``code`` is the process exit status."""

    code = 2

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class SpecError(UserError):
    """Malformed topology, fault or experiment specification (exit 2)."""


class EnvironmentProblem(UserError):
    """Missing privilege, package or kernel feature (exit 3)."""

    code = 3


class StateError(UserError):
    """The testbed is not in the state the command needs (exit 4)."""

    code = 4
