"""Engine-link errors: the ``EngineLinkError`` branch of serving/errors.py's tree (503)::

    EngineLinkError
     ├── EngineDeadError          the engine died: ENGINE_CORE_DEAD, or silent past the deadline
     ├── EngineUnavailableError   unknown engine, not (yet) connected, or the client is closed
     └── UtilityCallError         the engine answered a utility call with a failure message
"""

from __future__ import annotations

from serving.errors import (
    EngineDeadError,
    EngineLinkError,
    EngineUnavailableError,
    UtilityCallError,
)

__all__ = ["EngineDeadError", "EngineLinkError", "EngineUnavailableError", "UtilityCallError"]
