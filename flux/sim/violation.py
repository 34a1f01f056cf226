"""The simulator's verdict: a run broke a property a user relies on."""


class Violation(Exception):
    """The run broke a property a user relies on."""
