"""``palaestra hub ...`` and ``palaestra install``: share environments through a package index."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from palaestra.cli.common import UsageError
from palaestra.hub.client import TOKEN_VAR, URL_VAR

DATA_DIR = Path("hub-data")


def _hub_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hub", default=None, metavar="URL", help=f"the hub (default ${URL_VAR})")


def _token_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token-var", default=TOKEN_VAR, help=f"env var holding the API token ({TOKEN_VAR})")


def add_hub_parser(sub: Any) -> None:
    hub = sub.add_parser(
        "hub", help="publish, find and compare environments on a hub (a Python package index)"
    )
    cmds = hub.add_subparsers(required=True, metavar="COMMAND")

    serve = cmds.add_parser("serve", help="run a hub over a data folder")
    serve.add_argument("--data", type=Path, default=DATA_DIR, help=f"its data folder (default ./{DATA_DIR})")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    serve.add_argument("--max-upload-mb", type=float, default=100.0, help="largest upload accepted (100)")
    serve.set_defaults(func=cmd_serve)

    token = cmds.add_parser(
        "token", help="make an API token for a user of a hub's data folder (run on the hub)"
    )
    token.add_argument("user")
    token.add_argument("--data", type=Path, default=DATA_DIR)
    token.add_argument("--label", default="", help="what the token is for")
    token.add_argument("--revoke", action="store_true", help="revoke all the user's tokens instead")
    token.set_defaults(func=cmd_token)

    publish = cmds.add_parser("publish", help="build an environment's wheel and sdist and upload them")
    publish.add_argument("env_dir", type=Path, metavar="ENV_DIR")
    _hub_flag(publish)
    _token_flag(publish)
    publish.add_argument(
        "--no-isolation", action="store_true", help="build with this Python's packages (offline)"
    )
    publish.set_defaults(func=cmd_publish)

    search = cmds.add_parser("search", help="find environments on the hub")
    search.add_argument("text", nargs="?", default="")
    _hub_flag(search)
    search.set_defaults(func=cmd_search)

    results = cmds.add_parser("results", help="attach a saved eval run to its environment's page")
    results.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    _hub_flag(results)
    _token_flag(results)
    results.add_argument(
        "--no-report", action="store_true", help="send the summary only, not the HTML report"
    )
    results.add_argument(
        "--model-name",
        default=None,
        help="the name the board shows (default: -m, or local:RUN/step-N for a checkpoint)",
    )
    results.set_defaults(func=cmd_results)

    yank = cmds.add_parser("yank", help="yank a release (pip then skips it unless pinned); --undo to restore")
    yank.add_argument("name")
    yank.add_argument("version")
    yank.add_argument("--reason", default="")
    yank.add_argument("--undo", action="store_true")
    _hub_flag(yank)
    _token_flag(yank)
    yank.set_defaults(func=cmd_yank)

    export = cmds.add_parser("export", help="write the hub as static files for any web server")
    export.add_argument("out", type=Path, metavar="DIR")
    export.add_argument("--data", type=Path, default=DATA_DIR)
    export.add_argument("--url", default="", help="the URL it will be served at (for the install lines)")
    export.set_defaults(func=cmd_export)

    install = sub.add_parser("install", help="install an environment from the hub")
    install.add_argument("requirement", metavar="NAME[==VERSION]")
    _hub_flag(install)
    install.add_argument(
        "--python", default=sys.executable, help="the interpreter to install into (this one)"
    )
    install.add_argument("--no-deps", action="store_true", help="only the hub's packages")
    install.add_argument("--dry-run", action="store_true", help="print the pip commands only")
    install.set_defaults(func=cmd_install)


def _data(path: Path, *, create: bool) -> Any:
    from palaestra.hub.data import HubData

    if not create and not (path / "hub.sqlite3").is_file():
        raise UsageError(
            f"{path} is not a hub data folder (no hub.sqlite3): start one with palaestra hub serve"
        )
    return HubData(path)


def cmd_serve(args: argparse.Namespace) -> int:
    from palaestra.hub.server import serve

    if args.max_upload_mb <= 0:
        raise UsageError("--max-upload-mb must be positive")
    serve(args.data, host=args.host, port=args.port, max_upload_bytes=int(args.max_upload_mb * 1024 * 1024))
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    catalog = _data(args.data, create=True).catalog
    if args.revoke:
        print(f"revoked {catalog.revoke_tokens(args.user)} token(s) of {args.user}")
        return 0
    if catalog.user(args.user) is None:
        catalog.add_user(args.user)
    token = catalog.new_token(args.user, args.label)
    print(f"a new token for {args.user} (shown once; only its hash is kept):", file=sys.stderr)
    print(token)
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from palaestra.hub.client import hub_token, hub_url, publish

    url, token = hub_url(args.hub), hub_token(args.token_var)
    for done in publish(url, token, args.env_dir, isolation=not args.no_isolation):
        print(f"published {done['filename']}")
    print(f"page: {url}env/{done['name']}/")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from palaestra.hub.client import hub_url, matches, projects
    from palaestra.runner import run_async

    found = [p for p in run_async(projects(hub_url(args.hub))) if matches(p, args.text)]
    for p in found:
        print(f"{p['name']}\t{p['version']}\t{', '.join(p['environments'])}\t{p['summary']}")
    if not found:
        print("nothing found" if args.text else "the hub is empty", file=sys.stderr)
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    from palaestra.hub.client import attach_results, hub_token, hub_url
    from palaestra.runner import run_async

    url, token = hub_url(args.hub), hub_token(args.token_var)
    done = run_async(
        attach_results(url, token, args.run_dir, with_report=not args.no_report, model_name=args.model_name)
    )
    print(f"attached to {done['project']}: {done['url']}")
    return 0


def cmd_yank(args: argparse.Namespace) -> int:
    from palaestra.hub.client import hub_token, hub_url, set_yanked
    from palaestra.runner import run_async

    url, token = hub_url(args.hub), hub_token(args.token_var)
    run_async(set_yanked(url, token, args.name, args.version, reason=args.reason, undo=args.undo))
    print(f"{'restored' if args.undo else 'yanked'} {args.name} {args.version}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from palaestra.hub.export import export

    count = export(_data(args.data, create=False), args.out, hub_url=args.url)
    print(f"wrote {count} files to {args.out}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    from palaestra.hub.client import hub_url
    from palaestra.hub.install import install

    url = hub_url(args.hub)
    commands = install(url, args.requirement, python=args.python, no_deps=args.no_deps, dry_run=args.dry_run)
    for command in commands:
        print(("would run: " if args.dry_run else "ran: ") + str(command))
    return 0


def list_hub(url: str | None) -> int:
    """``palaestra envs --hub``: the environments on the hub."""
    from palaestra.hub.client import hub_url, projects
    from palaestra.runner import run_async

    found = run_async(projects(hub_url(url or None)))
    for p in found:
        for env in p["environments"]:
            print(f"{env}\t{p['name']} {p['version']}")
    if not found:
        print("the hub is empty", file=sys.stderr)
    return 0
