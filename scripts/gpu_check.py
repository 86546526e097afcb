"""The steps of ``scripts/gpu-check.sh``, run by the machine's own Python (standard library only
in this process; every step is a subprocess of the project's code, under its own time limit).

    python3 scripts/gpu_check.py OUT                      # on a GPU machine (after the CUDA check)
    python3 scripts/gpu_check.py OUT --device cpu ...     # the CPU rehearsal (gpu-check.sh sets it)

Steps, one printed line each: the environment, the carried wheels (unpacked, never installed),
importing every backend and models module, the ``gpu`` tests, and ``bench --synthetic`` with
perfect and with random drafts. OUT gets seven files, within what the device tool brings back
(8 files, no folders needed): summary.md, gpu-check.json (every check, test and bench number),
bench-perfect.json / bench-random.json (the benches' results.json), their speed plots as
bench-perfect.png / bench-random.png, and logs.txt (the end of every step's output). Exit 0
when no step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 480  # everything within 8 minutes on one H100: a device command may run 10
TESTS_S = 270
BENCH_S = 95
LOG_LINES = 150  # of each step's output, in logs.txt
# bench settings: small enough for the budget, enough rounds to read round costs from
BENCH_FLAGS = ["--limit", "3", "--max-new-tokens", "48", "--repeats", "1", "--no-prompt-lookup"]
COMPARE_TREES = ["--compare-trees", "16/5/4", "60/6/10"]  # a CPU-sized and a GPU-sized tree
# on a CPU, skip the load-time timing of what a GPU load never times (the output projections'
# CPU forms, the thread count); the decoder's fused projections are timed on a GPU too
CPU_ONLY_FLAGS = ["--readout", "stock", "--round-threads", str(os.cpu_count() or 1)]
# the rehearsal proves that the steps run, not how fast: fewer prompts and tokens on 2 cores
REHEARSAL_BENCH_FLAGS = ["--limit", "2", "--max-new-tokens", "24"]
CPU_SLOWNESS = 5  # the rehearsal's time limits, in multiples of the GPU's
ENVIRONMENT_PROBE = """
import json, platform, torch, transformers, accelerate, huggingface_hub, safetensors, tokenizers
cuda = torch.cuda.is_available()
print(json.dumps({
    "python": platform.python_version(), "torch": torch.__version__,
    "torch_cuda": torch.version.cuda, "transformers": transformers.__version__,
    "accelerate": accelerate.__version__, "huggingface_hub": huggingface_hub.__version__,
    "safetensors": safetensors.__version__, "tokenizers": tokenizers.__version__,
    "gpu": torch.cuda.get_device_name(0) if cuda else None,
    "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    if cuda else None,
}))
"""
IMPORT_PROBE = """
import importlib, pkgutil, sys
import backend, models, launch
names = [m.name for p in (backend, models) for m in pkgutil.walk_packages(p.__path__, p.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print(len(names) + 1)
"""


@dataclass
class Check:
    name: str
    status: str = "pass"  # pass | fail | skip
    seconds: float = 0.0
    line: str = ""
    details: dict = field(default_factory=dict)


@dataclass
class Run:
    out: Path
    scratch: Path  # logs, the pytest report and the benches' folders, before OUT gets its files
    device: str  # "cuda" or "cpu" (the rehearsal)
    shape: str
    dtype: str
    env: dict[str, str]
    started: float = field(default_factory=time.monotonic)
    checks: list[Check] = field(default_factory=list)

    def limit_s(self, seconds: float) -> float:
        """A time limit of the GPU run, stretched for the CPU rehearsal."""
        return seconds * (1 if self.device == "cuda" else CPU_SLOWNESS)

    def left_s(self) -> float:
        return self.limit_s(BUDGET_S) - (time.monotonic() - self.started)

    def step(self, name: str, function) -> Check:
        check, start = Check(name), time.monotonic()
        try:
            function(check)
        except Exception as err:  # a step's own failure is its result, not the end of the run
            check.status, check.line = "fail", f"{type(err).__name__}: {err}"
        check.seconds = round(time.monotonic() - start, 1)
        print(f"[{check.status.upper()}] {name}: {check.line} ({check.seconds:.0f} s)", flush=True)
        self.checks.append(check)
        return check

    def command(self, argv: list[str], limit_s: float, log: str) -> subprocess.CompletedProcess:
        """``argv`` under the project's Python with the run's environment; output to a log."""
        limit_s = max(10.0, min(self.limit_s(limit_s), self.left_s()))
        try:
            done = subprocess.run(
                [sys.executable, *argv],
                cwd=ROOT,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=limit_s,
            )
        except subprocess.TimeoutExpired as err:
            (self.scratch / log).write_text(_text(err.stdout) + _text(err.stderr))
            raise TimeoutError(f"stopped after {limit_s:.0f} s (logs.txt: {log})") from err
        (self.scratch / log).write_text(done.stdout + done.stderr)
        return done


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def environment(run: Run, check: Check) -> None:
    done = run.command(["-c", ENVIRONMENT_PROBE], 60, "environment.log")
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1])
    check.details = json.loads(done.stdout.strip().splitlines()[-1])
    info = check.details
    where = info["gpu"] or "CPU (rehearsal)"
    if run.device == "cuda" and not info["gpu"]:
        check.status = "fail"
    check.line = (
        f"{where}, Python {info['python']}, torch {info['torch']}, "
        f"transformers {info['transformers']}, accelerate {info['accelerate']}, "
        f"huggingface_hub {info['huggingface_hub']}"
    )


def wheels(run: Run, check: Check) -> None:
    """Unpack .whl/*.whl into a scratch folder that goes first on PYTHONPATH."""
    found = sorted((ROOT / ".whl").glob("*.whl"))
    if not found:
        check.status, check.line = "skip", "no wheels carried (.whl/ is empty or absent)"
        return
    target = run.scratch / "wheels"
    for wheel in found:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
    paths = [str(target), run.env.get("PYTHONPATH", "")]
    run.env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    check.details = {"wheels": [wheel.name for wheel in found]}
    check.line = ", ".join(wheel.name.split("-py")[0] for wheel in found) + " unpacked"


def imports(run: Run, check: Check) -> None:
    done = run.command(["-c", IMPORT_PROBE], 120, "imports.log")
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1])
    check.line = f"{done.stdout.strip()} modules of backend/, models/ and launch.py import"


def gpu_tests(run: Run, check: Check) -> None:
    report = run.scratch / "gpu-tests.xml"
    argv = ["-m", "pytest", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider", "-v", "-rfEs"]
    done = run.command([*argv, f"--junitxml={report}"], TESTS_S, "gpu-tests.log")
    cases = test_cases(report) if report.is_file() else []
    counts = {o: sum(c["outcome"] == o for c in cases) for o in ("passed", "failed", "skipped")}
    check.details = {"counts": counts, "tests": cases, "exit_code": done.returncode}
    check.line = ", ".join(f"{n} {o}" for o, n in counts.items())
    if done.returncode != 0 or counts["failed"] or not cases:
        check.status = "fail"
        if not cases:
            check.line = f"pytest exited {done.returncode} with no results (logs.txt)"


def test_cases(report: Path) -> list[dict]:
    """Per test: its id, outcome, seconds and the skip reason or failure message."""
    cases = []
    for case in ElementTree.parse(report).iter("testcase"):
        outcome, message = "passed", ""
        for tag, tag_outcome in (
            ("failure", "failed"),
            ("error", "failed"),
            ("skipped", "skipped"),
        ):
            found = case.find(tag)
            if found is not None:
                outcome = tag_outcome
                message = " ".join((found.get("message") or "").split())[:300]
                break
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        seconds = float(case.get("time") or 0)
        cases.append({"test": name, "outcome": outcome, "seconds": seconds, "message": message})
    return cases


def bench(run: Run, check: Check, perfect: bool) -> None:
    folder = "bench-perfect" if perfect else "bench-random"
    argv = ["launch.py", "bench", "--synthetic", run.shape, "--dtype", run.dtype, *BENCH_FLAGS]
    argv += COMPARE_TREES + (["--perfect-drafts"] if perfect else [])
    argv += CPU_ONLY_FLAGS + REHEARSAL_BENCH_FLAGS if run.device == "cpu" else []
    done = run.command([*argv, "--out", str(run.scratch / folder)], BENCH_S, f"{folder}.log")
    results = run.scratch / folder / "results.json"
    if done.returncode != 0 or not results.is_file():
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"exit {done.returncode}: {lines[-1] if lines else ''}")
    shutil.copy(results, run.out / f"{folder}.json")
    if (run.scratch / folder / "speed.png").is_file():
        shutil.copy(run.scratch / folder / "speed.png", run.out / f"{folder}.png")
    data = json.loads(results.read_text())
    check.details = {"command": data["command"], "summary": data["summary"], "costs": data["costs"]}
    check.line, identical = bench_verdict(data)
    if perfect and not identical:
        check.status = "fail"


def bench_verdict(data: dict) -> tuple[str, bool]:
    """A bench's line (speeds, tau, identity per EAGLE tree) and whether every EAGLE reply was
    identical to vanilla decoding. Identity is a float32 guarantee: in bfloat16 a tree's forward
    rounds otherwise than single steps, and a random model's near-ties can part ways; perfect
    drafts rank strictly even in bfloat16, so there any difference is a bug."""
    summary, prompts = data["summary"], data["settings"]["num_prompts"]
    eagle, vanilla = summary["eagle"], summary["vanilla"]
    identical = {
        method.replace("eagle@", "").replace("eagle", "auto"): result["identical"]
        for method, result in summary.items()
        if method.startswith("eagle")
    }
    line = (
        f"vanilla {vanilla['tokens_per_s']:.1f} tok/s, EAGLE {eagle['tokens_per_s']:.1f} tok/s "
        f"(x{eagle['speedup']:.2f}, tau {eagle['tau']:.2f}); identical to vanilla of "
        f"{prompts}: " + ", ".join(f"{tree} {count}" for tree, count in identical.items())
    )
    return line, all(count == prompts for count in identical.values())


def write_outputs(run: Run) -> None:
    environment_check = run.checks[0].details if run.checks else {}
    data = {
        "mode": "gpu" if run.device == "cuda" else "cpu-rehearsal",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "seconds": round(time.monotonic() - run.started, 1),
        "environment": environment_check,
        "checks": [asdict(check) for check in run.checks],
    }
    (run.out / "gpu-check.json").write_text(json.dumps(data, indent=1) + "\n")
    (run.out / "summary.md").write_text(summary_markdown(run, data))
    logs = []
    for log in sorted(run.scratch.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-LOG_LINES:]
        logs += [f"===== {log.name} (last {len(tail)} lines)", *tail, ""]
    (run.out / "logs.txt").write_text("\n".join(logs))


def summary_markdown(run: Run, data: dict) -> str:
    env = data["environment"]
    where = env.get("gpu") or "CPU (rehearsal, `--device cpu`)"
    lines = [
        f"# GPU check: {where}",
        "",
        f"{data['date']}, {data['mode']}, {data['seconds']:.0f} s in all. Python "
        f"{env.get('python')}, torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), "
        f"transformers {env.get('transformers')}, accelerate {env.get('accelerate')}, "
        f"huggingface_hub {env.get('huggingface_hub')}.",
        "",
        "## Checks",
        "",
        "| check | result | seconds | details |",
        "|---|---|---|---|",
    ]
    lines += [f"| {c.name} | {c.status} | {c.seconds:.0f} | {c.line} |" for c in run.checks]
    tests = next((c for c in run.checks if c.name == "gpu tests"), None)
    if tests is not None and tests.details.get("tests"):
        lines += [
            "",
            "## GPU tests",
            "",
            "| test | outcome | seconds | note |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {t['test']} | {t['outcome']} | {t['seconds']:.1f} | {t['message']} |"
            for t in tests.details["tests"]
        ]
    for folder, title in (("bench-perfect", "perfect drafts"), ("bench-random", "random drafts")):
        report = run.scratch / folder / "summary.md"
        if report.is_file():
            body = report.read_text().replace("\n# ", "\n### ").removeprefix("# ")
            lines += ["", f"## Bench, {title} ({folder}.json)", "", body.strip()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--bench-shape", default="1b", help="bench --synthetic shape")
    parser.add_argument("--bench-dtype", default="bfloat16")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="eaglechat-gpu-check-"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg")
    env["EAGLECHAT_CACHE_DIR"] = str(scratch / "cache")  # nothing timed earlier is reused
    if args.device == "cpu":
        env["EAGLECHAT_GPU_TESTS_ON_CPU"] = "1"
    run = Run(args.out.resolve(), scratch, args.device, args.bench_shape, args.bench_dtype, env)
    try:
        run.step("environment", lambda check: environment(run, check))
        run.step("wheels", lambda check: wheels(run, check))
        run.step("imports", lambda check: imports(run, check))
        run.step("gpu tests", lambda check: gpu_tests(run, check))
        run.step("bench perfect drafts", lambda check: bench(run, check, perfect=True))
        run.step("bench random drafts", lambda check: bench(run, check, perfect=False))
        write_outputs(run)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    failed = [c.name for c in run.checks if c.status == "fail"]
    total = time.monotonic() - run.started
    print(
        f"{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'} ({total:.0f} s); "
        f"{run.out}/summary.md"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
