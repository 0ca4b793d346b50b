"""The error a declaration onceflow cannot run raises (re-exported as `onceflow.DeclarationError`)."""


class DeclarationError(ValueError):
    """A pipeline declaration onceflow cannot run; the message names the pipeline and the field."""
