"""The two ways a command fails, mapped to exit codes by gpumeter.app.cli.main."""


class UsageError(Exception):
    """Bad arguments or bad input: exit 2."""


class Failure(Exception):
    """The command ran and failed: exit 1."""
