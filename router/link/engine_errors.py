"""Engine-link errors, a small hierarchy::

    EngineLinkError
     ├── EngineDeadError          the engine died: ENGINE_CORE_DEAD, or silent past the deadline
     ├── EngineUnavailableError   unknown engine, not (yet) connected, or the client is closed
     └── UtilityCallError         the engine answered a utility call with a failure message
"""

from __future__ import annotations


class EngineLinkError(Exception):
    """Base of the engine-link errors."""


class EngineDeadError(EngineLinkError):
    """The engine serving a request died; its in-flight requests are lost."""


class EngineUnavailableError(EngineLinkError):
    """The engine is unknown, not connected, or the client is closed."""


class UtilityCallError(EngineLinkError):
    """The engine ran the utility method and reported a failure."""
