"""Typed errors raised by the engine and mapped to exit codes by the CLI.

No imports on purpose: every layer may raise these without pulling anything in.
"""


class SpeedtronicError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with; ``hint`` an optional next step."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class ConfigError(SpeedtronicError, ValueError):
    """Invalid configuration or usage: a bad key, value, file or combination (exit 2).

    Also a ``ValueError``, so callers that validate with ``except ValueError`` catch it.
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, problems: list[str] | None = None):
        super().__init__(message, hint)
        self.problems = problems or [message]


class DataError(ConfigError):
    """A data source that cannot be read or does not fit the model (exit 2)."""


class CheckpointError(SpeedtronicError):
    """A checkpoint that cannot be written, read or trusted (exit 1)."""


class OutputError(SpeedtronicError):
    """A file the run writes (a log, the JSONL metrics, TensorBoard events) cannot be written
    (exit 1). The message names the config key and the file: a full disk says which one."""


class TrainingError(SpeedtronicError):
    """Training cannot continue, e.g. too many non-finite losses in a row (exit 1)."""


class TransportError(SpeedtronicError):
    """A DiLoCo transport (Hub or shared directory) failed (exit 1).

    ``permanent``: retrying cannot help (no access, no repo), so a node stops at once rather
    than training on with work that can never reach the fleet.
    """

    permanent = False


class DamagedRepoFile(TransportError):
    """A file in the shared repo holds what it must not (bad JSON, a wrong field, a link, a
    folder, an oversize file): the repo answered, its content is wrong. Unlike a network
    failure, trying again reads the same thing."""


class BaseMismatch(ConfigError):
    """A fleet node whose frozen base differs from the one its run's repo records (exit 2): its
    adapters would train against other weights. ``permanent``, as a transport failure that
    retrying cannot help: the node stops rather than trains on."""

    permanent = True
