"""docs/deployment.md works as written: its topology is accepted by `cluster init`, and the
`ExecStart` lines of its systemd units are accepted by `automqctl node run` (checked with
`--dry-run`, nothing started); a broker's unit without `--allow-insecure` is refused at once
with the error the docs show, naming the flag."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "deployment.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC, re.S)


def exec_starts() -> dict[str, list[str]]:
    """unit file name -> its ExecStart argv."""
    out = {}
    for block in blocks("ini"):
        unit = re.search(r"^# (/etc/systemd/system/\S+)", block, re.M)
        start = re.search(r"^ExecStart=(.*)$", block, re.M)
        if unit and start:
            out[Path(unit.group(1)).name] = shlex.split(start.group(1))
    return out


def init_docs_topology(tmp_path: Path) -> Path:
    """`cluster init` of the docs' topology, data dirs moved under tmp_path."""
    [topo_text] = [b for b in blocks("yaml") if b.startswith("# topo.yaml")]
    topo = yaml.safe_load(topo_text)
    for kind in ("controllers", "brokers"):
        for node in topo[kind]:
            node["data_dir"] = str(tmp_path / "data" / f"{kind}-{node['id']}")
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(topo))
    out = tmp_path / "etc"
    res = automqctl("cluster", "init", "--topology", str(tmp_path / "topo.yaml"), "--out", str(out))
    assert res.returncode == 0, res.stderr
    return out


def automqctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=60
    )


def unit_args(argv: list[str], etc: Path, instance: str) -> list[str]:
    """The unit's automqctl arguments for instance `instance`, /etc/automq -> `etc`/<host>."""
    assert Path(argv[0]).name == "automqctl", argv
    config = argv[argv.index("--config") + 1].replace("%i", instance)
    [node_file] = list(etc.glob(f"*/{Path(config).name}"))
    args = [a.replace("%i", instance) for a in argv[1:]]
    args[args.index("--config") + 1] = str(node_file)
    return args


def test_the_systemd_units_start_their_nodes_as_written(tmp_path):
    etc = init_docs_topology(tmp_path)
    units = exec_starts()
    assert set(units) == {"automq-broker@.service", "automq-controller@.service"}
    for unit, instance, module in (
        ("automq-broker@.service", "1", "dataplane.broker"),
        ("automq-controller@.service", "0", "controlplane.server"),
    ):
        res = automqctl(*unit_args(units[unit], etc, instance), "--dry-run")
        assert res.returncode == 0, (unit, res.stderr)
        assert module in res.stdout, res.stdout


def test_a_broker_unit_without_allow_insecure_is_refused_before_anything_starts(tmp_path):
    etc = init_docs_topology(tmp_path)
    args = [a for a in unit_args(exec_starts()["automq-broker@.service"], etc, "1")]
    args.remove("--allow-insecure")
    res = automqctl(*args, "--dry-run")
    assert res.returncode == 1
    assert "--allow-insecure" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    # the docs show that very error
    shown = re.search(r"error: \S+ (refusing to serve .*)$", DOC, re.M)
    assert shown and shown.group(1) in res.stderr.replace("\n", ""), res.stderr
    assert not (tmp_path / "data" / "brokers-1").exists()
