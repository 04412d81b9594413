"""Every error rayslice expects, and the exit code each one ends in.

A failure the user can act on is raised as a `RaysliceError` subclass whose message says what to
do; the CLI prints the message on stderr and exits with the class's `exit_code`. Anything else is
a bug and keeps its traceback. The codes are part of the interface scripts rely on:

- 0: success
- 1: the job ran and failed (`JobFailed`)
- 2: bad input, caught before anything was created or touched (`InvalidInput` and subclasses)
- 3: no cluster reachable, no credentials, or a cloud API call failed (`NoCluster`,
  `NoCredentials`, `CloudError`)
- 130: interrupted by Ctrl-C or SIGTERM (`Interrupted`), as a shell reports a command that
  SIGINT ended (128 + 2)

The recovery controller's bundle carries this module to the head VM: it must stay Python 3.10
code with no import outside the standard library.
"""

from __future__ import annotations

import reprlib

EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_INVALID = 2
EXIT_NO_CLUSTER = 3
EXIT_INTERRUPTED = 130


# What a message may echo of one input value, and how many problems one error lists: a message is
# read on a terminal, so a 1 MB name or 40,000 unknown keys must not become a 1 MB line or 21 MB
# of output. Past the cut a value ends in "...", and a list of problems says how many it left out.
SHOWN_CHARS = 80
SHOWN_PROBLEMS = 20
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = SHOWN_CHARS
_SHOWN.maxlevel = 2


def shown(value: object) -> str:
    """`value` as a message echoes it: its repr, cut to about `SHOWN_CHARS` characters whatever
    its size (strings keep their quotes, containers their first items)."""
    return _SHOWN.repr(value)


class RaysliceError(Exception):
    """Base of every expected failure; `exit_code` is what the CLI exits with."""

    exit_code = EXIT_INVALID


class InvalidInput(RaysliceError):
    """Input that cannot work: a bad config value, an unknown name, a hostile string."""

    exit_code = EXIT_INVALID


class SpecError(InvalidInput):
    """One or more invalid config keys; `problems` lists each with what to do.

    One problem reads as one line; several as one line each, the first `SHOWN_PROBLEMS` of them
    and a line that counts the rest."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        if len(self.problems) == 1:
            super().__init__(f"invalid rayslice configuration: {self.problems[0]}")
            return
        listed = [f"  - {p}" for p in self.problems[:SHOWN_PROBLEMS]]
        left = len(self.problems) - SHOWN_PROBLEMS
        if left > 0:
            listed.append(f"  ... and {left:,} more problem(s): fix these first")
        super().__init__("invalid rayslice configuration:\n" + "\n".join(listed))


class CatalogError(InvalidInput):
    """An accelerator type or generation the catalog does not know, or not on that platform."""


class SimulatorError(RaysliceError):
    """The local simulation cannot do what was asked (not root, tampered state, host failed)."""

    exit_code = EXIT_INVALID


class JobFailed(RaysliceError):
    """A submitted job ended in a state other than SUCCEEDED."""

    exit_code = EXIT_JOB_FAILED


class Interrupted(RaysliceError):
    """The user stopped the command (Ctrl-C or SIGTERM); the message says what was left running."""

    exit_code = EXIT_INTERRUPTED


class NoCluster(RaysliceError):
    """No Ray cluster (or simulated slice) answers at the address rayslice would use."""

    exit_code = EXIT_NO_CLUSTER


class NoCredentials(RaysliceError):
    """Cloud credentials (Application Default Credentials) are missing or rejected."""

    exit_code = EXIT_NO_CLUSTER


class CloudError(RaysliceError):
    """A Google Cloud API call failed: the API answered with an HTTP error `status`, or did not
    answer at all (`status` None: connection refused, timeout, ...). Callers handle the statuses
    they expect (404: not there); any other ends the command with a line naming the call."""

    exit_code = EXIT_NO_CLUSTER

    def __init__(self, call: str, status: int | None, message: str):
        self.call = call
        self.status = status
        outcome = f"HTTP {status}" if status is not None else "no answer"
        super().__init__(" ".join(f"{call} failed: {outcome}: {message}".split()))
