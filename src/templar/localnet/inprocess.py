"""The localnet's neurons in this one process, on virtual time (`templar localnet --in-process`).

Same chain file, wallets, buckets, flags and role code as the multi-process localnet (each node is
built by `start_node` from the flags an operator would type, and runs `Miner.run` or
`Validator.run`), but every node is an asyncio task on one `VirtualTimeLoop`. Virtual time stands
still while any node computes and jumps to the next deadline when all of them wait, so:

- a run costs the computation in it, not its windows' wall time (a 10-window, 14-node run takes
  a few minutes on 2 cores instead of its ~4 minutes of windows plus start-up); and
- no node is ever late because the machine was busy: a run's outcome depends on its seed and
  its neurons' behaviour, not on the load, which is what a test of the incentive needs.

What it cannot show is what only separate processes show (kill -9 of one neuron, a real S3
server's sockets, start-up races); the multi-process localnet remains the end-to-end demo.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

import torch
from loguru import logger

from templar.core.clock import loop_time, run_virtual
from templar.core.log import setup_logging
from templar.localnet.adversaries import make_adversary
from templar.localnet.runner import Localnet, is_adversary
from templar.miner.loop import Miner
from templar.runtime.flags import add_node_args, add_validator_args
from templar.runtime.node import Node, start_node
from templar.runtime.roster import NodeInfo, lead_validator
from templar.validator.loop import Validator
from templar.wire.shared_reads import sharing_reads


def _parse(flags: list[str], role: str) -> argparse.Namespace:
    """The flags as the role's entry point parses them (`neurons/miner.py`, `neurons/validator.py`)."""
    parser = argparse.ArgumentParser()
    add_node_args(parser)
    if role == "validator":
        add_validator_args(parser)
    return parser.parse_args(flags)


async def _start(net: Localnet, info: NodeInfo) -> tuple[NodeInfo, Node]:
    args = _parse(net.node_flags(info, net._bucket_args(info)[0]), info.role)
    return info, await start_node(args, info.role, time=loop_time(), configure_logging=False)


def _role(net: Localnet, info: NodeInfo, node: Node) -> Miner | Validator:
    """The role's code for a started node, with an adversary's hooks where the roster names one."""
    if info.role == "validator":
        return Validator(node)
    hooks = (make_adversary(info.strategy, target=net.copy_target(info), pool=net.pool_uids(info))
             if is_adversary(info) else None)
    return Miner(node, extra_pages=net.extra_pages(info), hooks=hooks)


async def _newcomers(net: Localnet, nodes: dict[NodeInfo, Node], tasks: dict[str, asyncio.Task],
                     stopping: asyncio.Event) -> None:
    """Register and start each newcomer once the lead has scored its windows (`LocalnetConfig.newcomers`),
    looking four times a window until `stopping`; its node and task join the others', so the run stops and
    closes it alike."""
    poll = net.hp.windows.window_seconds / 4
    while net.pending_newcomers() and not stopping.is_set():
        for name in net.due_newcomers():
            info, node = await _start(net, net.join(name, now=loop_time().now))
            nodes[info] = node
            tasks[name] = asyncio.create_task(_role(net, info, node).run(), name=name)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), poll)


async def _run_all(net: Localnet) -> str:
    started = await asyncio.gather(*(_start(net, info) for info in net.nodes))
    nodes = dict(started)
    lead_info = lead_validator(net.nodes)
    roles = {info.name: _role(net, info, node) for info, node in nodes.items()}
    # Validators first: the lead publishes the run's start window before any miner looks for it.
    validators = [info for info in nodes if info.role == "validator"]
    tasks = {info.name: asyncio.create_task(roles[info.name].run(net.cfg.windows), name=info.name)
             for info in validators}
    await asyncio.sleep(0)
    tasks |= {info.name: asyncio.create_task(roles[info.name].run(), name=info.name)
              for info in nodes if info.role == "miner"}
    stopping = asyncio.Event()
    joining = asyncio.create_task(_newcomers(net, nodes, tasks, stopping), name="newcomers")
    outcome = "finished"
    try:
        if lead_info is not None:
            await tasks[lead_info.name]
    except Exception as exc:
        logger.exception(f"lead validator failed: {exc}")
        outcome = f"lead validator failed: {type(exc).__name__}: {exc}"
    finally:
        stopping.set()  # the newcomers' task ends first, so that every node it started is stopped below
        await asyncio.gather(joining, return_exceptions=True)
        tasks["newcomers"] = joining  # a newcomer that failed to join fails the run like a node
        for node in nodes.values():
            node.stop.set()  # everyone else finishes its window, saves and returns
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
        for name, result in zip(tasks, results, strict=True):
            if isinstance(result, BaseException):
                logger.opt(exception=result).error(f"{name} failed: {result!r}")
                if outcome == "finished":
                    outcome = f"{name} failed: {type(result).__name__}: {result}"
        for node in nodes.values():
            await node.aclose()
            node.chain.close()
    return outcome


def run_in_process(net: Localnet) -> str:
    """Run a prepared localnet's neurons in this process on virtual time; returns the outcome."""
    if net.cfg.storage != "local":
        raise ValueError("--in-process runs on virtual time, which cannot see a real S3 server's sockets: "
                         "use --storage local")
    setup_logging(logfile=net.out / "localnet.log")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # nodes compute in parallel worker threads; one torch thread each
    started = time.perf_counter()
    try:
        with sharing_reads() as reads:  # every node reads every payload: one decode each
            outcome = run_virtual(_run_all(net))
    finally:
        torch.set_num_threads(threads)
    logger.info(f"in-process localnet {outcome} in {time.perf_counter() - started:.0f}s of wall time "
                f"({reads.misses} payloads decoded for {reads.misses + reads.hits} reads)")
    return outcome
