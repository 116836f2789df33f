"""The Kubernetes manifests name only what exists: the image this project builds, its commands and
options, files in the image, and environment variables pareto reads."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path
from typing import Any

import click
import yaml

from pareto._cli.cli import cli, subcommands

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "kubernetes"


def _documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") != "Kustomization"]
    return docs


def _pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    kind = doc["kind"]
    if kind in {"StatefulSet", "Job"}:
        return [doc["spec"]["template"]["spec"]]
    if kind == "CronJob":
        return [doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    return []


def _pareto_containers() -> list[dict[str, Any]]:
    project = {"name": "pareto-slo", "version": version("pareto-slo")}
    image = f"{project['name']}:{project['version']}"
    found = []
    for doc in _documents():
        for pod in _pod_specs(doc):
            for container in pod["containers"]:
                if container["image"].startswith(project["name"]):
                    assert container["image"] == image, f"{container['image']} is not the image built here ({image})"
                    found.append(container)
    return found


def test_kustomization_lists_every_manifest() -> None:
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")


def test_the_workloads_the_issue_names_are_there() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _documents()}
    assert docs[("StatefulSet", "pareto-postgres")]["spec"]["volumeClaimTemplates"]
    assert docs[("Job", "pareto-workers")]["spec"]["parallelism"] > 1
    assert docs[("CronJob", "pareto-nightly")]["spec"]["concurrencyPolicy"] == "Forbid"
    assert ("Job", "pareto-study-creator") in docs
    workers = docs[("Job", "pareto-workers")]["spec"]["template"]["spec"]
    assert workers["nodeSelector"] and workers["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert (ROOT / "Dockerfile").is_file()


def test_every_command_option_file_and_variable_exists() -> None:
    containers = _pareto_containers()
    assert len(containers) == 3
    source = "\n".join(p.read_text() for p in [*(ROOT / "pareto").rglob("*.py"), ROOT / "cli.py"])
    for container in containers:
        command = [str(part) for part in container["command"]]
        assert command[0] == "pareto"
        group: click.Command = cli
        words = command[1:]
        while isinstance(group, click.Group):
            group = subcommands(group)[words.pop(0)]
        options = {opt for param in group.params for opt in getattr(param, "opts", [])}
        for word in words:
            if word.startswith("--"):
                assert word in options, f"{' '.join(command)}: no option {word}"
            if word.startswith("/app/"):
                assert (ROOT / word.removeprefix("/app/")).is_file(), f"{word} is not in the image"
        for variable in container.get("env", []):
            assert re.search(rf"\b{variable['name']}\b", source), f"pareto never reads {variable['name']}"
