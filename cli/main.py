"""The `parley` command: serve, stages, models, chat, client.

Reads the command line (the client's own flags are desktop/main.py's); turns config errors into one line and exit
code 2.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from parley.config import AppConfig, ConfigError, load_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="parley", description="Parley: a self-hosted realtime voice assistant.")
    p.add_argument("--config", help="config file (default: the shipped configs/default.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set server.port=8001 (repeatable)")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the assistant server")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    stages = sub.add_parser("stages", help="serve the loaded stages over the OpenAI-compatible HTTP APIs (no voice sessions)")
    stages.add_argument("--host")
    stages.add_argument("--port", type=int)
    stages.add_argument("--only", metavar="STAGES", help="serve only these stages, e.g. llm or asr,tts (default: all)")
    sub.add_parser("models", help="list each stage's model and where it is")
    chat = sub.add_parser("chat", help="text chat with the LLM engine in the terminal")
    chat.add_argument("--persona")
    # add_help=False: `parley client --help` is the client's own help (desktop/main.py parses its flags)
    client = sub.add_parser("client", help="desktop voice client (microphone and speakers)", add_help=False)
    client.add_argument("rest", nargs=argparse.REMAINDER)
    return p


def _load(args: argparse.Namespace) -> AppConfig:
    overrides = list(args.overrides)
    if getattr(args, "host", None):
        overrides.append(f"server.host={args.host}")
    if getattr(args, "port", None) is not None:
        overrides.append(f"server.port={args.port}")
    if getattr(args, "only", None):
        overrides.append(f"server.stages=[{args.only}]")
    return load_config(args.config, overrides)


def _after_command(argv: Sequence[str], command: str) -> list[str]:
    """The arguments after the subcommand `command` (top-level options and their values come before it)."""
    i = 0
    while i < len(argv):
        if argv[i] in ("--config", "--set"):
            i += 2
        elif argv[i] == command:
            return list(argv[i + 1 :])
        else:
            i += 1
    return []


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "client":  # the desktop client parses its own flags, in their order
        args.rest = _after_command(argv, "client")
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        cfg = _load(args)
    except ConfigError as exc:
        print(f"parley: config error: {exc}", file=sys.stderr)
        return 2
    if args.command == "models":
        from parley.models_table import print_models

        return 0 if print_models(cfg) else 1
    if args.command in ("serve", "stages"):
        from cli.serve import serve

        return serve(cfg, stages_only=args.command == "stages")
    if args.command == "chat":
        from parley.chat import chat_command

        return chat_command(cfg, args.persona)
    if args.command == "client":
        from desktop.main import main as client_main

        return client_main(cfg, args.rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
