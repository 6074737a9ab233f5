"""The CLI's name for the project's errors; they live at the ground floor (:mod:`netns_testbed.errors`),
beside the fabric model, so that nothing below the CLI imports the CLI package."""
from netns_testbed.errors import SIGNAL_BASE, EnvironmentProblem, ExitCode, SpecError, StateError, UserError

__all__ = ["SIGNAL_BASE", "EnvironmentProblem", "ExitCode", "SpecError", "StateError", "UserError"]
