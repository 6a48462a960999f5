"""Pure builders of the commands run on hosts: argument lists, never shell strings.

Quoting happens once, at the SSH boundary (``remote``). Each builder is a small function that
tests compare against the exact argv.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfsdeploy.layout import LABEL_PREFIX, HostPaths, Ports, container_name, proxy_name
from tfsdeploy.render import CONTAINER_CONFIG_DIR, CONTAINER_MODEL_ROOT

Argv = list[str]
SERVER_BINARY = "/usr/bin/tensorflow_model_server"


def docker_version() -> Argv:
    """The engine's version: proves the engine answers."""
    return ["docker", "version", "--format", "{{.Server.Version}}"]


def docker_pull(image: str) -> Argv:
    """Pull an image."""
    return ["docker", "pull", "--quiet", image]


def image_id(image: str) -> Argv:
    """The local image id, or a non-zero exit when absent."""
    return ["docker", "image", "inspect", "--format", "{{.Id}}", image]


def list_containers(model: str) -> Argv:
    """All containers (running or not) of a model, one JSON object per line."""
    return ["docker", "ps", "--all", "--no-trunc", "--filter",
            f"label={LABEL_PREFIX}.model={model}", "--format", "{{json .}}"]


def inspect_state(name: str) -> Argv:
    """Status, restart count and exit code of a container."""
    return ["docker", "inspect", "--format",
            "{{.State.Status}} {{.RestartCount}} {{.State.ExitCode}}", name]


def container_logs(name: str, lines: int = 30) -> Argv:
    """The tail of a container's log (TFServing logs on stderr)."""
    return ["docker", "logs", "--tail", str(lines), name]


def run_slot(*, model: str, release_id: str, slot: str, version: int, image: str,
             paths: HostPaths, ports: Ports, flags: Sequence[str], gpus: str | None) -> Argv:
    """Start one release in ``slot``: host network, model and release files read-only."""
    argv = ["docker", "run", "--detach", "--name", container_name(model, release_id),
            "--network", "host", "--restart", "unless-stopped",
            "--label", f"{LABEL_PREFIX}.model={model}",
            "--label", f"{LABEL_PREFIX}.release={release_id}",
            "--label", f"{LABEL_PREFIX}.slot={slot}",
            "--label", f"{LABEL_PREFIX}.version={version}",
            "--volume", f"{paths.model_dir}:{CONTAINER_MODEL_ROOT}/{model}:ro",
            "--volume", f"{paths.release_dir(release_id)}:{CONTAINER_CONFIG_DIR}:ro",
            "--entrypoint", SERVER_BINARY]
    if gpus:
        argv += ["--gpus", gpus]
    return [*argv, image, *flags, f"--port={ports.slot_grpc(slot)}",
            f"--rest_api_port={ports.slot_rest(slot)}"]


def run_proxy(*, model: str, image: str, paths: HostPaths) -> Argv:
    """Start the model's traffic switch (HAProxy) with its config directory read-only."""
    return ["docker", "run", "--detach", "--name", proxy_name(model), "--network", "host",
            "--restart", "unless-stopped", "--label", f"{LABEL_PREFIX}.proxy={model}",
            "--volume", f"{paths.proxy_dir}:/usr/local/etc/haproxy:ro", image]


def start(name: str) -> Argv:
    """Start a stopped container."""
    return ["docker", "start", name]


def stop(name: str, grace_s: int = 0) -> Argv:
    """Stop a container. TFServing ignores SIGTERM (a grace period would only be waited out),
    so callers drain the slot first and stop it at once."""
    return ["docker", "stop", "--time", str(grace_s), name]


def remove(name: str) -> Argv:
    """Remove a container, running or not."""
    return ["docker", "rm", "--force", name]


def mkdir(path: str) -> Argv:
    """Create a directory and its parents."""
    return ["mkdir", "-p", path]


def _swap_link_sh(target: int, link: int) -> str:
    """Shell: replace the symlink named by positional argument ``link`` atomically with one to
    positional argument ``target`` (rename over the old link)."""
    return f'ln -sfn "${target}" "${link}.new" && mv -T "${link}.new" "${link}"'


def _append_line_sh(line: int, path: int) -> str:
    """Shell: append positional argument ``line`` to the file named by positional argument
    ``path``, creating its directory if needed."""
    return f'mkdir -p "$(dirname "${path}")" && printf "%s\\n" "${line}" >> "${path}"'


def point_symlink(target: str, link: str) -> Argv:
    """Replace ``link`` atomically with a symlink to ``target`` (rename over the old link)."""
    return ["sh", "-c", _swap_link_sh(1, 2), "sh", target, link]


def record_current(*, target: str, link: str, audit_log: str, audit_line: str,
                   rolled_back_manifest: str = "", serving_manifest: str = "") -> Argv:
    """In one round trip: point ``current`` at the release (atomic rename), append the audit
    line, mark the release rolled back from (if any) as such and, when recording what a killed
    run left serving, mark that release as serving."""
    status = 'sed -i \'s/^  "status": "[a-z_]*",$/  "status": "%s",/\' '
    script = (_swap_link_sh(1, 2) + ' && ' + _append_line_sh(4, 3) + ' && '
              'if [ -n "$5" ] && [ -f "$5" ]; then ' + status % "rolled_back" + '"$5"; fi && '
              'if [ -n "$6" ] && [ -f "$6" ]; then ' + status % "serving" + '"$6"; fi')
    return ["sh", "-c", script, "sh", target, link, audit_log, audit_line,
            rolled_back_manifest, serving_manifest]


def read_file(path: str) -> Argv:
    """A file's content; a non-zero exit when it does not exist."""
    return ["cat", path]


def append_line(path: str, line: str) -> Argv:
    """Append one line to a file (the audit log), creating its directory if needed."""
    return ["sh", "-c", _append_line_sh(1, 2), "sh", line, path]


def remove_tree(path: str) -> Argv:
    """Remove a directory tree."""
    return ["rm", "-rf", "--", path]


def listening_ports() -> Argv:
    """Local TCP listeners, one line each (address:port in the fourth column)."""
    return ["ss", "-ltnH"]


def gpu_memory() -> Argv:
    """Total and used memory of each GPU, in MiB."""
    return ["nvidia-smi", "--query-gpu=index,memory.total,memory.used",
            "--format=csv,noheader,nounits"]


def free_disk_mib(path: str) -> Argv:
    """Free space under ``path`` (its nearest existing parent), in MiB."""
    return ["sh", "-c", 'p="$1"; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
            'df -Pm "$p" | tail -n 1', "sh", path]


def verify_and_publish(staging: str, final: str) -> Argv:
    """Check the staged files against their SHA256SUMS, then rename into place atomically.

    TFServing loads a version directory the moment it appears, so the directory is only ever
    published whole, and an existing (possibly live) version directory is never touched.
    """
    script = ('set -e; cd "$1"; sha256sum --quiet --check SHA256SUMS; rm SHA256SUMS; cd /; '
              'if [ -e "$2" ]; then rm -rf "$1"; echo exists; else mv -T "$1" "$2"; '
              'echo published; fi')
    return ["sh", "-c", script, "sh", staging, final]


def extract_tar(archive: str, into: str) -> Argv:
    """Unpack an uploaded tar archive into a fresh directory, then delete the archive."""
    return ["sh", "-c", 'rm -rf "$2" && mkdir -p "$2" && tar -xf "$1" -C "$2" && rm -f "$1"',
            "sh", archive, into]
