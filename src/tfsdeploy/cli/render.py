"""`fab render`: write exactly the files each host would receive (``target.render_release``
rendered and validated them)."""

from __future__ import annotations

from pathlib import Path

from tfsdeploy.core.inventory.gpu import InstancePlan
from tfsdeploy.core.inventory.layout import SLOTS, model_ports
from tfsdeploy.core.localfiles import write_durable_many
from tfsdeploy.core.render.files import HostRender
from tfsdeploy.core.render.host_proxy import render_proxy_config

PROXY_CONFIG = "proxy/haproxy.cfg"


def write_renders(renders: list[HostRender], out: Path) -> list[Path]:
    """Write ``out/<host>/<model>/<file>`` for every render, and the host's proxy config as
    ``proxy/haproxy.cfg`` (as a first deploy writes it: slot blue active; each switch rewrites
    which slot is enabled); returns the paths written."""
    files: dict[Path, str] = {}
    for render in renders:
        folder = out / render.host.name / render.model.name
        texts = {f.name: f.text for f in render.files}
        texts[PROXY_CONFIG] = render_proxy_config(
            render.host, render.model, model_ports(render.host, render.model),
            {i.index: SLOTS[0] for i in render.instances})
        files.update({folder / name: text for name, text in texts.items()})
    out.mkdir(parents=True, exist_ok=True)
    write_durable_many(files, out, mode=0o644)
    return list(files)


def _instance_gpu(instance: InstancePlan, *, several: bool) -> str:
    plan = instance.plan
    assert plan is not None
    label = f"GPU {','.join(map(str, instance.gpus))}: " if several else ""
    return f"{label}{plan.fraction:.3f} (window {plan.window_total:.3f}/{plan.limit:.3f})"


HOST_ROWS_UP_TO = 50  # more hosts than this: one row per distinct setting


def summary_rows(renders: list[HostRender]) -> list[tuple[str, ...]]:
    """One row per host: name, address, version, GPU fraction and window, files."""
    rows: list[tuple[str, ...]] = []
    for r in renders:
        gpu = "; ".join(_instance_gpu(i, several=len(r.instances) > 1)
                        for i in r.instances if i.plan) or "no GPU"
        rows.append((r.host.name, r.host.address, str(r.version), gpu,
                     str(len(r.files) + 1)))  # + the proxy config
    return rows


def summary_table(renders: list[HostRender]
                  ) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The headers and rows ``fab render`` shows: a row per host up to ``HOST_ROWS_UP_TO``
    hosts; beyond, a row per distinct (version, GPU fraction, files) with its hosts counted
    and the first and last named (a thousand rows say less than a few; each host's files
    are in its folder). Rendering a 1,000-row table took rich 0.6 s."""
    rows = summary_rows(renders)
    if len(rows) <= HOST_ROWS_UP_TO:
        return ("host", "address", "version", "GPU fraction", "files"), rows
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, _address, *setting in rows:
        groups.setdefault(tuple(setting), []).append(name)
    grouped = [(str(len(names)), names[0] if len(names) == 1 else f"{names[0]} … {names[-1]}",
                *setting) for setting, names in groups.items()]
    return ("hosts", "first … last", "version", "GPU fraction", "files"), grouped


def arithmetic_lines(renders: list[HostRender]) -> list[str]:
    """The GPU memory arithmetic of every instance, once per distinct plan with the hosts it
    holds for: what nvidia-smi reports, what CUDA can allocate, the fraction and the window."""
    hosts: dict[str, list[str]] = {}
    for r in renders:
        for i in r.instances:
            if i.plan is not None:
                gpus = f" GPU {','.join(map(str, i.gpus))}" if len(r.instances) > 1 else ""
                hosts.setdefault(i.plan.arithmetic(), []).append(r.host.name + gpus)
    return [f"{', '.join(names)}: {text}" for text, names in hosts.items()]

