"""The ``llmrl`` command: the entry point a pod or a local process runs.

Subcommands so far:

- ``llmrl convert-model [SPEC]``: resolve a model spec and, for GGUF models, convert it once into
  the safetensors cache; prints the directory that ``load_model`` will read. Images run it at
  build time so pods start with the default model ready.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import version

from llmrl.models import DEFAULT_MODEL, MissingExtraError, ModelSpecError


def _convert_model(args: argparse.Namespace) -> int:
    from llmrl.models import ensure_converted, resolve_spec

    source = resolve_spec(args.spec)
    if source.kind == "gguf":
        print(ensure_converted(source.location))
    elif source.kind == "directory":
        print(source.location)
    else:
        print(f"{source.location} is a hub id; nothing to convert", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``llmrl`` command."""
    parser = argparse.ArgumentParser(prog="llmrl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"llmrl {version('llmrl')}")
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    convert = commands.add_parser(
        "convert-model", help="convert a GGUF model into llmrl's safetensors cache"
    )
    convert.add_argument(
        "spec", nargs="?", default=DEFAULT_MODEL, help=f"model spec (default: {DEFAULT_MODEL})"
    )
    convert.set_defaults(handler=_convert_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.handler(args)
    except (ModelSpecError, MissingExtraError) as error:
        print(f"llmrl {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
