"""Run official implementations in their side venvs (scripts/side-venvs.sh) and exchange tensors
with them through safetensors files, since their pins clash with ours.

A missing side venv is a test failure that says how to create it, never a silent skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]
SIDE_VENVS = Path(os.environ.get("EAGLECHAT_SIDE_VENVS", ROOT / ".cache" / "side-venvs"))
OFFICIAL = Path(__file__).resolve().parent / "official"


def side_python(name: str) -> Path:
    """The python of a finished side venv; fails the test with the command that creates it."""
    python = SIDE_VENVS / name / "bin" / "python"
    if not (python.is_file() and (SIDE_VENVS / name / ".pins").is_file()):
        pytest.fail(
            f"side venv {name!r} is missing: create it with `bash scripts/side-venvs.sh {name}` "
            "(scripts/test.sh does this before running the tests)",
            pytrace=False,
        )
    return python


def run_official(
    name: str,
    script: str,
    workdir: Path,
    request: dict,
    inputs: dict[str, torch.Tensor],
    timeout_s: float = 600,
) -> dict[str, torch.Tensor]:
    """Run ``official/<script>`` with the side venv's python; return its answer tensors."""
    python = side_python(name)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "request.json").write_text(json.dumps(request))
    save_file({k: v.contiguous() for k, v in inputs.items()}, str(workdir / "inputs.safetensors"))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TORCHDYNAMO_DISABLE": "1",  # no compiler runs for a few forwards on a CPU
        "VLLM_NO_USAGE_STATS": "1",
        "PYTHONPATH": str(OFFICIAL),
    }
    done = subprocess.run(
        [str(python), str(OFFICIAL / script), str(workdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=str(workdir),
    )
    if done.returncode != 0:
        pytest.fail(f"{script} in side venv {name} failed:\n{done.stderr[-4000:]}", pytrace=False)
    return load_file(str(workdir / "answer.safetensors"))
