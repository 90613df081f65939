"""Entry point of the `kvroute` command: dispatches subcommands to the module that owns each.

Each subcommand module exposes ``cli(argv: list[str]) -> int`` and parses its own flags, so this
file never grows with options and imports only the subcommand asked for.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "render": ("render.service.server", "GPU-less render service (OpenAI request -> token ids)"),
    "router": ("router.main", "cache-aware router in front of vLLM engines"),
    "sim-engine": ("sim.main", "simulated vLLM engine speaking the real protocol"),
    "demo": ("devtools.demo", "router + simulated engines on the embedded model, one request"),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or args[0] not in SUBCOMMANDS:
        width = max(map(len, SUBCOMMANDS))
        lines = [f"  {name:<{width}}  {desc}" for name, (_, desc) in SUBCOMMANDS.items()]
        print("usage: kvroute SUBCOMMAND [options]\n\nsubcommands:\n" + "\n".join(lines))
        return 0 if args and args[0] in ("-h", "--help") else 2
    module = importlib.import_module(SUBCOMMANDS[args[0]][0])
    code: int = module.cli(args[1:])
    return code


if __name__ == "__main__":
    sys.exit(main())
