"""Entry point of the `kvroute` command: dispatches subcommands to the module that owns each.

Each subcommand module exposes ``cli(argv: list[str]) -> int`` and parses its own flags, so this
file never grows with options and imports only the subcommand asked for.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import PackageNotFoundError, version

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("devtools.demo", "router + simulated engines: a short tour, then serves until Ctrl-C"),
    "router": ("router.main", "cache-aware router in front of vLLM engines"),
    "render": ("render.service.server", "GPU-less render service (OpenAI request -> token ids)"),
    "sim-engine": ("sim.main", "simulated vLLM engine speaking the real protocol"),
}


def kvroute_version() -> str:
    """The installed distribution's version (pyproject.toml is its one source)."""
    try:
        return version("kvroute")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-V", "--version"):
        print(f"kvroute {kvroute_version()}")
        return 0
    if not args or args[0] in ("-h", "--help") or args[0] not in SUBCOMMANDS:
        width = max(map(len, SUBCOMMANDS))
        lines = [f"  {name:<{width}}  {desc}" for name, (_, desc) in SUBCOMMANDS.items()]
        print("usage: kvroute [--version] SUBCOMMAND [options]\n\nsubcommands:\n"
              + "\n".join(lines) + "\n\n`kvroute SUBCOMMAND --help` lists its options; start "
              "with `kvroute demo`.")
        if args and args[0] not in ("-h", "--help"):
            print(f"\nkvroute: unknown subcommand {args[0]!r}", file=sys.stderr)
        return 0 if args and args[0] in ("-h", "--help") else 2
    module = importlib.import_module(SUBCOMMANDS[args[0]][0])
    code: int = module.cli(args[1:])
    return code


if __name__ == "__main__":
    sys.exit(main())
