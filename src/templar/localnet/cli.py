"""`templar localnet`: the whole subnet on this machine in one command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from templar.localnet.runner import DEFAULT_ADVERSARIES, LocalnetConfig, parse_adversary


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "localnet", help="run an embedded chain, validators and miners (honest and adversarial) on this machine",
        description="Runs every neuron as its own process through neurons/*.py, shows a live table, and "
                    "writes report.json, report.md and plots to --out.",
    )
    p.add_argument("--miners", type=int, default=4, help="honest miners (default 4)")
    p.add_argument("--validators", type=int, default=1, help="validators; the first has the most stake (lead)")
    p.add_argument("--windows", type=int, default=12, help="windows the lead validator evaluates before stopping")
    p.add_argument("--hparams", default="tiny", help="preset name or path (default tiny)")
    p.add_argument("--adversary", action="append", default=None, metavar="NAME[:COUNT]",
                   help=f"adversarial miner, repeatable (default: {', '.join(DEFAULT_ADVERSARIES)}; 'none' for none)")
    p.add_argument("--newcomer", type=int, action="append", default=[], metavar="WINDOWS",
                   help="one more honest miner that registers and starts once the lead has scored WINDOWS windows "
                        "(repeatable): a newcomer joining a running subnet")
    p.add_argument("--storage", choices=["local", "s3"], default="local",
                   help="local directories, or a local S3 server started and stopped by this command")
    p.add_argument("--miner-ranks", type=int, default=1, metavar="N",
                   help="run honest miner0 as one node over N torchrun ranks (FSDP2; gloo on CPU); default 1")
    p.add_argument("--validator-ranks", type=int, default=1, metavar="N",
                   help="run the lead validator0 as one node over N torchrun ranks; default 1")
    p.add_argument("--out", type=Path, default=Path("localnet"), help="everything the run creates (default ./localnet)")
    p.add_argument("--seed", type=int, default=0, help="run seed: initial weights and data assignment (0: the preset's)")
    p.add_argument("--resume", action="store_true", help="keep --out and resume instead of starting clean")
    p.add_argument("--no-live", action="store_true", help="no live table (for logs and CI)")
    p.add_argument("--in-process", action="store_true",
                   help="run every neuron in this process on virtual time: costs only the computation, and "
                        "no node is late because the machine is busy (tests, experiments; local storage only)")
    p.add_argument("--report-only", action="store_true", help="rebuild the report of an existing --out and exit")
    p.add_argument("--dashboard", type=int, default=8787, metavar="PORT",
                   help="serve `templar dashboard` for this net on 127.0.0.1:PORT (default 8787; busy: a free port)")
    p.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    p.add_argument("--no-fork-server", action="store_true",
                   help="start every neuron by exec, each loading torch, transformers and the SDK itself (4-5 s of "
                        "CPU each), instead of forking one-process neurons from an interpreter that loaded them once")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from templar.core.startup import libraries_loading

    with libraries_loading():  # templar/core/startup.py
        from templar.core.log import setup_logging
        from templar.localnet.forkserver import ForkServerError
        from templar.localnet.report import build_report
        from templar.localnet.runner import run_localnet
        from templar.runtime.roster import RosterError

        if args.in_process:  # the nodes' code, torch and transformers: loaded here, run by run_localnet
            import templar.localnet.inprocess  # noqa: F401

    setup_logging()
    if args.report_only:
        try:
            build_report(args.out)
        except RosterError as exc:
            print(f"error: {args.out}: {exc}")
            return 2
        print(f"report rebuilt in {args.out}")
        return 0
    if min(args.miner_ranks, args.validator_ranks) < 1 or (args.miner_ranks > 1 and args.miners < 1) or (
            max(args.miner_ranks, args.validator_ranks) > 1 and args.in_process):
        print("error: --miner-ranks/--validator-ranks N need N >= 1, a node to run (--miners >= 1), and real "
              "processes (not --in-process)")
        return 2
    if any(after < 0 for after in args.newcomer):
        print("error: --newcomer WINDOWS needs WINDOWS >= 0")
        return 2
    if args.adversary is None:
        adversaries = [(name, 1) for name in DEFAULT_ADVERSARIES]
    elif args.adversary == ["none"]:
        adversaries = []
    else:
        try:
            adversaries = [parse_adversary(spec) for spec in args.adversary]
        except ValueError as exc:
            print(f"error: {exc}")
            return 2
    cfg = LocalnetConfig(out=args.out, miners=args.miners, validators=args.validators, windows=args.windows,
                         hparams=args.hparams, adversaries=adversaries, storage=args.storage, seed=args.seed,
                         resume=args.resume, live=not args.no_live, in_process=args.in_process,
                         dashboard=None if args.no_dashboard else args.dashboard, miner_ranks=args.miner_ranks,
                         validator_ranks=args.validator_ranks, fork_server=not args.no_fork_server,
                         newcomers=args.newcomer)
    starter = None
    if cfg.dashboard is not None:  # the command line joins the two tools; neither imports the other
        from templar.dashboard.server import start_localnet_dashboard

        starter = start_localnet_dashboard
    try:
        report = run_localnet(cfg, start_dashboard=starter)
    except ForkServerError as exc:
        print(f"error: {exc} (--no-fork-server starts every neuron by exec)")
        return 1
    summary = [{k: p.get(k) for k in ("name", "strategy", "final_weight", "final_incentive", "final_mu")}
               for p in report["peers"] if p["role"] == "miner"]
    print(json.dumps({"outcome": report["outcome"], "miners": summary}, indent=2))
    return 0 if report["outcome"] == "finished" else 1
