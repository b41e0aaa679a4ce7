"""What an operator installs next to the code (`deploy/`): systemd units whose stop timeout and
restart rules are the code's, and Prometheus alert rules on metrics the neurons export.

No `promtool` here: the rules are checked structurally (every rule complete, every metric it
names exported by `templar.runtime.metrics.NeuronMetrics` for some role, one rule per state the
dashboard shows)."""

from __future__ import annotations

import configparser
import re

import pytest
import yaml
from prometheus_client import CollectorRegistry

from templar.core.config import REPO_ROOT, load_hparams
from templar.runtime import flags
from templar.runtime.consensus.windows import stop_timeout_seconds
from templar.runtime.metrics import NeuronMetrics

DEPLOY = REPO_ROOT / "deploy"


def unit(role: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string((DEPLOY / "systemd" / f"templar-{role}@.service").read_text())
    return parser["Service"]


@pytest.mark.parametrize("role", ["miner", "validator"])
def test_the_units_stop_timeout_and_restart_rules_are_the_codes(role):
    service = unit(role)
    assert int(service["TimeoutStopSec"]) == stop_timeout_seconds(load_hparams().windows, role)
    assert service["KillMode"] == "mixed" and service["KillSignal"] == "SIGTERM"  # SIGTERM to the neuron only
    assert f"neurons/{role}.py" in service["ExecStart"] and service["EnvironmentFile"].endswith(f"/{role}-%i.env")
    operator_must_fix = {flags.EXIT_NOT_REGISTERED, flags.EXIT_CONFIG, flags.EXIT_OWN_BUCKET, flags.EXIT_STATE_LOCKED,
                         flags.EXIT_STATE_DISK, flags.EXIT_HISTORY}
    assert {int(c) for c in service["RestartPreventExitStatus"].split()} == operator_must_fix
    assert service["Restart"] == "on-failure"
    # every variable of the example environment file is one the neuron (or the unit) reads
    example = (DEPLOY / "systemd" / f"{role}.env.example").read_text()
    names = re.findall(r"^([A-Z_][A-Z0-9_]*)=", example, re.M)
    sources = "".join(p.read_text() for p in (REPO_ROOT / "src" / "templar").rglob("*.py"))
    assert names and all(f'"{n}"' in sources or n == "TEMPLAR_ARGS" for n in names), names
    assert "$TEMPLAR_ARGS" in service["ExecStart"]
    # its flags are the neuron's, and the log goes where the dashboard and the docs look for it
    import argparse
    import shlex

    parser = argparse.ArgumentParser()
    flags.add_node_args(parser)
    flags.add_memory_args(parser) if role == "miner" else flags.add_validator_args(parser)
    args = parser.parse_args(shlex.split(re.search(r"^TEMPLAR_ARGS=(.*)$", example, re.M).group(1)))
    assert str(args.logging_file) == "/opt/templar/.templar/W/H/node.log"  # ~templar (the unit's home), W/H


def exported_metrics() -> set[str]:
    """Every sample name a miner's or a validator's /metrics can carry."""
    from templar.runtime.records import MinerWindowRecord, ValidatorWindowRecord, WeightsRecord

    names: set[str] = set()
    for role in ("miner", "validator"):
        m = NeuronMetrics(role, "5Hotkey", 1, CollectorRegistry(), windows=load_hparams().windows)
        # one record of each kind, so that labelled series exist
        m.on_record(None, ValidatorWindowRecord(1, 1, 0.1, 3.0, 2, 3, 2, 1.0, True))
        m.on_record(None, MinerWindowRecord(1, "active", "honest", 1, 3.0, 10.0, 2, False, 0, 0.0, 2, 0.5))
        m.on_record(None, WeightsRecord(1, 1, "refused", "stake", 2, 10, "", ""))
        for family in m.registry.collect():
            names |= {sample.name for sample in family.samples}
    return names


def test_every_alert_is_complete_and_names_only_exported_metrics():
    rules = yaml.safe_load((DEPLOY / "prometheus" / "templar-alerts.yml").read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    exported = exported_metrics()
    for rule in alerts:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"Templar[A-Za-z]+", rule["alert"]) and rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert "for" not in rule or re.fullmatch(r"\d+[smh]", rule["for"]), rule
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")") and expr.count("[") == expr.count("]"), expr
        named = set(re.findall(r"\btemplar_[a-z_]+", expr))
        assert named and named <= exported, (rule["alert"], named - exported)
    # one rule for each state the dashboard shows (docs/operating.md §2)
    names = {rule["alert"] for rule in alerts}
    assert {"TemplarNodeBehind", "TemplarLeadNotPublishing", "TemplarWeightsNotSet", "TemplarStateDiskLow"} <= names
