"""Errors a user can act on.

Every failure that is the user's to fix (bad input, missing privilege or kernel
feature) is raised as a :class:`UserError` with a one-line message that names the
problem and the fix; the CLI prints it to stderr and exits with ``code``.
"""
from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What a ``flowpulse`` command's exit status means (the reference page of exit codes is generated
    from these members and their descriptions)."""

    OK = 0
    FAILURE = 1
    BAD_INPUT = 2
    ENVIRONMENT = 3
    STATE = 4
    INTERRUPTED = 130

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS = {
    ExitCode.OK: "ok: the command did what it was asked (a demo or experiment: the fault was caught and named)",
    ExitCode.FAILURE: "the command ran and found a failure: unreachable hosts, a fault not caught or named "
                      "wrongly, a false alert, an agent thread that stopped, a test that failed",
    ExitCode.BAD_INPUT: "bad input: one line on stderr names the problem and the fix; nothing was built or written",
    ExitCode.ENVIRONMENT: "the environment: a missing privilege, package or kernel feature (BTF, tcx, netem), "
                          "an unsafe path, or a testbed built by another version",
    ExitCode.STATE: "the testbed is not in the state the command needs: not up, already up, locked by "
                    "another command, or a drain that would go below the spine floor",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C) after cleaning up",
}
#: 128 + N: stopped by signal N (143 SIGTERM, 129 SIGHUP) after cleaning up
SIGNAL_BASE = 128


class UserError(Exception):
    """A problem the user can fix; ``code`` is the process exit status."""

    code: int = ExitCode.BAD_INPUT

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class SpecError(UserError):
    """Malformed topology, fault or experiment specification (exit 2)."""


class EnvironmentProblem(UserError):
    """Missing privilege, package or kernel feature (exit 3)."""

    code = ExitCode.ENVIRONMENT


class StateError(UserError):
    """The testbed is not in the state the command needs (exit 4)."""

    code = ExitCode.STATE
