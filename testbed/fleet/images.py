"""The testbed images: built on a build dockerd in the root namespace, pushed to the testbed
registry, pulled by every host.  Nothing is pulled from outside: the base is a debootstrapped
Debian, Python wheels are downloaded once with pip into the cache and served to the build from
10.87.0.1:5080.  Every step is skipped when its inputs' hash is unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import hosts as hostlib
from common import (
    FLEET_DIR,
    GATEWAY,
    REGISTRY,
    Places,
    TestbedError,
    Timer,
    isolated_dockerd_argv,
    log,
    pid_alive,
    read_pid,
    run,
    wait_until,
)

REPO = FLEET_DIR.parent.parent
RECIPES = REPO / "testbed" / "images"
EMULATOR_SRC = REPO / "testbed" / "emulator"
WHEEL_PORT = 5080
SUITE = "bookworm"
# fallbacks for the venv pins when the toolkit venv cannot be asked
DEFAULT_PINS = {
    "tensorflow": "2.21.0",
    "tensorflow-serving-api": "2.21.0",
    "grpcio": "1.85.3",
    "numpy": "2.4.6",
    "protobuf": "7.36.2",
    "ml_dtypes": "0.6.0",  # pyproject.toml's testbed extra says why
}
LAUNCHERS = ("tf_serving_entrypoint.sh", "tensorflow_model_server")


@dataclass(frozen=True)
class Image:
    repo: str
    tag: str
    recipe: str

    @property
    def ref(self) -> str:
        return f"{REGISTRY}/{self.repo}:{self.tag}"


IMAGES = [
    Image("tfserving-emulator", "2.21.0", "tfserving-emulator"),
    Image("tfsdeploy-proxy", "2.6", "tfsdeploy-proxy"),
]


# ---------------------------------------------------------------- hashing and stamps


def tree_hash(root: Path, *extra: str) -> str:
    """Content hash of a directory (paths, exec bits, bytes) plus extra strings."""
    h = hashlib.sha256()
    for item in extra:
        h.update(item.encode() + b"\0")
    for path in sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        h.update(rel.encode() + b"\0" + (b"x" if os.access(path, os.X_OK) else b"-"))
        h.update(path.read_bytes() if not path.is_symlink() else os.readlink(path).encode())
    return h.hexdigest()[:16]


def load_stamps(places: Places) -> dict[str, dict[str, str]]:
    try:
        return dict(json.loads((places.images / "stamps.json").read_text()))
    except (OSError, ValueError):
        return {}


def save_stamps(places: Places, stamps: dict[str, dict[str, str]]) -> None:
    path = places.images / "stamps.json"
    path.with_suffix(".tmp").write_text(json.dumps(stamps, indent=2) + "\n")
    path.with_suffix(".tmp").rename(path)


# ---------------------------------------------------------------- build dockerd


def builder_dir(places: Places) -> Path:
    return places.state / "build"


def builder_socket(places: Places) -> Path:
    return builder_dir(places) / "docker.sock"


def builder_cli(places: Places) -> list[str]:
    return ["docker", "-H", f"unix://{builder_socket(places)}"]


def start_builder(places: Places) -> None:
    if hostlib.docker_ping(builder_socket(places)):
        return
    stop_builder(places)
    bdir = builder_dir(places)
    (bdir / "exec").mkdir(parents=True, exist_ok=True)
    (bdir / "daemon.json").write_text(
        json.dumps({"deprecated-key-path": str(bdir / "engine-key.json")}) + "\n"
    )
    data = places.images / "docker"
    data.mkdir(parents=True, exist_ok=True)
    # its own mount namespace: the overlay and netns mounts it makes vanish with it
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        *isolated_dockerd_argv(socket=str(builder_socket(places)), data_root=str(data),
                               exec_root=str(bdir / "exec"), pidfile=str(bdir / "dockerd.pid"),
                               config_file=bdir / "daemon.json"),
        "--max-concurrent-uploads=6",
    ]
    with open(places.logs / "build-dockerd.log", "ab") as out:
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_until(
        lambda: hostlib.docker_ping(builder_socket(places)),
        timeout=60,
        what=f"the build dockerd (log: {places.logs / 'build-dockerd.log'})",
    )


def stop_builder(places: Places) -> None:
    pid = read_pid(builder_dir(places) / "dockerd.pid")
    if pid is None or not pid_alive(pid):
        return
    if Path(f"/proc/{pid}/comm").read_text().strip() != "dockerd":
        return
    os.kill(pid, 15)
    try:
        wait_until(lambda: not pid_alive(pid), timeout=20, what="the build dockerd to stop")
    except TestbedError:
        os.kill(pid, 9)


# ---------------------------------------------------------------- base image


def base_recipe_hash() -> str:
    return tree_hash(RECIPES / "base", SUITE, "minbase")


def base_packages() -> list[str]:
    lines = (RECIPES / "base" / "packages").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def ensure_base(places: Places, digest: str) -> str:
    """The base image tag in the build dockerd; debootstraps only when no cached rootfs exists."""
    tag = f"tfsdeploy-base:{digest}"
    if run([*builder_cli(places), "image", "inspect", tag], check=False).returncode == 0:
        return tag
    tarball = places.images / f"base-{digest}.tar"
    if not tarball.exists():
        root = places.images / f"rootfs-{digest}"
        shutil.rmtree(root, ignore_errors=True)
        log(f"debootstrap {SUITE} (minbase + {', '.join(base_packages())}); about a minute")
        t = time.monotonic()
        out = run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(base_packages())}",
                SUITE,
                str(root),
            ],
            check=False,
            timeout=1800,
        )
        (places.logs / "debootstrap.log").write_text(out.stdout + out.stderr)
        if out.returncode != 0:
            raise TestbedError(
                f"debootstrap failed; see {places.logs / 'debootstrap.log'} "
                "(needs the Debian package mirror)"
            )
        run([str(RECIPES / "base" / "slim.sh"), str(root)])
        run(["tar", "-C", str(root), "--numeric-owner", "-cf", f"{tarball}.tmp", "."])
        os.rename(f"{tarball}.tmp", tarball)
        shutil.rmtree(root)
        log(f"base rootfs ready in {time.monotonic() - t:.0f}s")
    with open(tarball, "rb") as src:
        proc = subprocess.run(
            [*builder_cli(places), "import", "--change", 'CMD ["/bin/bash"]', "-", tag],
            stdin=src,
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        raise TestbedError(f"docker import of the base failed: {proc.stderr.strip()}")
    return tag


# ---------------------------------------------------------------- wheels


def venv_pins(places: Places) -> dict[str, str]:
    """Versions of the toolkit venv, so the image runs exactly what the tests run."""
    python = places.cache / "venv" / "bin" / "python"
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for n in sys.argv[1:]:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    pins = dict(DEFAULT_PINS)
    if python.exists():
        out = run([str(python), "-c", code, *DEFAULT_PINS], check=False)
        if out.returncode == 0:
            pins.update(json.loads(out.stdout))
    return pins


def requirements(pins: dict[str, str]) -> tuple[str, str]:
    main = [f"tensorflow-cpu=={pins['tensorflow']}"] + [
        f"{name}=={pins[name]}" for name in ("grpcio", "numpy", "protobuf", "ml_dtypes")
    ]
    nodeps = [f"tensorflow-serving-api=={pins['tensorflow-serving-api']}"]
    return "\n".join(main) + "\n", "\n".join(nodeps) + "\n"


def ensure_wheels(places: Places, req: str, nodeps: str) -> Path:
    """Download the wheels once into the cache (pip's own cache under $TFSDEPLOY_CACHE/pip too)."""
    wheels = places.images / "wheels"
    stamp = wheels / ".stamp"
    digest = hashlib.sha256((req + nodeps).encode()).hexdigest()
    if stamp.exists() and stamp.read_text().strip() == digest:
        return wheels
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [
        str(places.cache / "venv" / "bin" / "pip") if (places.cache / "venv").exists() else "pip3",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--dest",
        str(wheels),
        "--cache-dir",
        str(places.cache / "pip"),
        "--disable-pip-version-check",
    ]
    req_file, nodeps_file = wheels / ".requirements.txt", wheels / ".requirements-nodeps.txt"
    req_file.write_text(req)
    nodeps_file.write_text(nodeps)
    log("downloading Python wheels for the emulator image (once)")
    for extra in (["-r", str(req_file)], ["--no-deps", "-r", str(nodeps_file)]):
        out = run([*pip, *extra], check=False, timeout=1800)
        if out.returncode != 0:
            raise TestbedError(
                f"pip download failed: {out.stderr.strip()[-1500:]} "
                "(needs the Python package index; see scripts/setup)"
            )
    stamp.write_text(digest + "\n")
    return wheels


class WheelServer:
    """Serves the wheel directory on 10.87.0.1:5080 to docker build (host network)."""

    def __init__(self, directory: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(directory))
        self.server = http.server.ThreadingHTTPServer((GATEWAY, WHEEL_PORT), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> WheelServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


# ---------------------------------------------------------------- contexts


def stage_context(places: Places, image: Image, req: tuple[str, str]) -> Path:
    """Copy the recipe (and for the emulator its code and pins) into a build context dir."""
    ctx = places.images / "context" / image.recipe
    shutil.rmtree(ctx, ignore_errors=True)
    shutil.copytree(RECIPES / image.recipe, ctx, ignore=shutil.ignore_patterns("__pycache__"))
    if image.recipe == "tfserving-emulator":
        (ctx / "requirements.txt").write_text(req[0])
        (ctx / "requirements-nodeps.txt").write_text(req[1])
        stage_emulator(ctx / "rootfs")
    return ctx


def stage_emulator(rootfs: Path) -> None:
    """Lay testbed/emulator out as docs/emulator.md ("What the image needs") says."""
    package = EMULATOR_SRC / "tfserving_emulator"
    missing = [p for p in (package, *(EMULATOR_SRC / n for n in LAUNCHERS)) if not p.exists()]
    if missing:
        raise TestbedError(
            f"the emulator image needs {', '.join(map(str, missing))}; is the checkout complete?"
        )
    shutil.copytree(
        package,
        rootfs / "opt" / "tfserving_emulator" / "tfserving_emulator",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    bindir = rootfs / "usr" / "bin"
    bindir.mkdir(parents=True)
    for name in LAUNCHERS:
        shutil.copyfile(EMULATOR_SRC / name, bindir / name)
        (bindir / name).chmod(0o755)


# ---------------------------------------------------------------- registry and hosts


def registry_image_id(image: Image) -> str | None:
    """The image id (config digest) the registry holds under image.ref, or None."""
    request = urllib.request.Request(
        f"http://{REGISTRY}/v2/{image.repo}/manifests/{image.tag}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return str(json.loads(resp.read())["config"]["digest"])
    except (urllib.error.URLError, OSError, KeyError, ValueError):
        return None


def host_image_id(host: hostlib.Host, ref: str) -> str | None:
    out = run(
        [
            "docker",
            "-H",
            f"unix://{host.docker_socket}",
            "image",
            "inspect",
            "--format",
            "{{.Id}}",
            ref,
        ],
        check=False,
        timeout=30,
    )
    return out.stdout.strip() if out.returncode == 0 else None


def build_and_push(places: Places, image: Image, ctx: Path, base: str) -> str:
    t = time.monotonic()
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    with open(places.logs / f"build-{image.repo}.log", "w") as out:
        proc = subprocess.run(
            [
                *builder_cli(places),
                "build",
                "--network",
                "host",
                "--build-arg",
                f"BASE={base}",
                "-t",
                image.ref,
                str(ctx),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    if proc.returncode != 0:
        raise TestbedError(
            f"docker build of {image.ref} failed; see {places.logs / f'build-{image.repo}.log'}"
        )
    built = time.monotonic() - t
    image_id = run(
        [*builder_cli(places), "image", "inspect", "--format", "{{.Id}}", image.ref]
    ).stdout.strip()
    if registry_image_id(image) != image_id:
        run([*builder_cli(places), "push", image.ref], timeout=3600)
    log(f"{image.ref}: built {built:.0f}s, pushed {time.monotonic() - t - built:.0f}s")
    return image_id


def pull_everywhere(hosts: list[hostlib.Host], wanted: dict[str, str]) -> int:
    """Pull each image on each host that lacks its id; hosts in parallel.  Returns pull count."""

    def one(host: hostlib.Host) -> int:
        pulls = 0
        for ref, image_id in wanted.items():
            if host_image_id(host, ref) == image_id:
                continue
            run(
                ["docker", "-H", f"unix://{host.docker_socket}", "pull", "--quiet", ref],
                timeout=3600,
            )
            if host_image_id(host, ref) != image_id:
                raise TestbedError(f"{host.name}: pulled {ref} but its id is not {image_id}")
            pulls += 1
        if pulls:  # drop the previous versions' tags-less images (layers in use stay)
            run(
                ["docker", "-H", f"unix://{host.docker_socket}", "image", "prune", "--force"],
                check=False,
            )
        return pulls

    with ThreadPoolExecutor(max_workers=len(hosts) or 1) as pool:
        return sum(pool.map(one, hosts))


def ensure(places: Places, hosts: list[hostlib.Host], timer: Timer) -> dict[str, str]:
    """Make every image current in the registry and on every host; returns ref -> image id."""
    t = time.monotonic()
    places.images.mkdir(parents=True, exist_ok=True)
    stamps = load_stamps(places)
    base_digest = base_recipe_hash()
    req = requirements(venv_pins(places))
    contexts = {img.repo: stage_context(places, img, req) for img in IMAGES}
    digests = {img.repo: tree_hash(contexts[img.repo], base_digest) for img in IMAGES}
    stale = [
        img
        for img in IMAGES
        if stamps.get(img.repo, {}).get("hash") != digests[img.repo]
        or registry_image_id(img) != stamps.get(img.repo, {}).get("id")
    ]
    if stale:
        start_builder(places)
        base = ensure_base(places, base_digest)
        wheels = ensure_wheels(places, *req)
        with WheelServer(wheels):
            for img in stale:
                stamps[img.repo] = {
                    "hash": digests[img.repo],
                    "id": build_and_push(places, img, contexts[img.repo], base),
                }
                save_stamps(places, stamps)
        run([*builder_cli(places), "image", "prune", "--force"], check=False)
    timer.phase(f"images ({len(stale)} built)" if stale else "images (cached)", t)
    t = time.monotonic()
    wanted = {img.ref: stamps[img.repo]["id"] for img in IMAGES}
    pulls = pull_everywhere(hosts, wanted)
    timer.phase(f"pulls ({pulls})", t)
    return wanted


# ---------------------------------------------------------------- the hosts' shared image store
# A new host would pull every image (the TensorFlow-based server image is 1.7 GB unpacked) and
# keep its own copy: 13 hosts, 22 GB of disk, minutes of layer extraction on two cores, and a
# private copy of every shared library in the page cache per host. Instead a store is filled
# once by a dockerd of its own (pulling from the testbed registry), and a host whose engine
# has no data yet starts with the store's image layers hard-linked into its data root: one
# copy on disk and in the page cache for every host. Layer directories are never written
# once extracted (overlay2 mounts them as read-only lower layers; a container writes to its
# own upper directory, and removing an image unlinks only that host's links), so sharing
# them is safe; the small metadata (image/) is copied, never linked.


def store_dir(places: Places) -> Path:
    """The shared store (in the state dir: hard links need the hosts' file system)."""
    return places.state / "host-image-store"


def store_stamp(places: Places) -> Path:
    return store_dir(places) / "images.json"


def _store_current(places: Places, wanted: dict[str, str]) -> bool:
    try:
        return bool(json.loads(store_stamp(places).read_text()) == wanted)
    except (OSError, ValueError):
        return False


def ensure_store(places: Places) -> dict[str, str] | None:
    """The store holding the registry's current images (ref -> id), filled by a dockerd of
    its own when it does not; None when the registry lacks an image (a fresh machine: new
    hosts then pull as usual)."""
    wanted = {img.ref: registry_image_id(img) for img in IMAGES}
    if any(v is None for v in wanted.values()):
        return None
    current = {k: str(v) for k, v in wanted.items()}
    if _store_current(places, current):
        return current
    root = store_dir(places)
    work = places.state / "store-dockerd"
    (work / "exec").mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(parents=True, exist_ok=True)
    (work / "daemon.json").write_text(
        json.dumps({"deprecated-key-path": str(work / "engine-key.json")}) + "\n")
    sock = work / "docker.sock"
    argv = ["unshare", "--mount", "--propagation", "private", "--",
            *isolated_dockerd_argv(socket=str(sock), data_root=str(root / "data"),
                                   exec_root=str(work / "exec"),
                                   pidfile=str(work / "dockerd.pid"),
                                   config_file=work / "daemon.json")]
    t = time.monotonic()
    with open(places.logs / "store-dockerd.log", "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: hostlib.docker_ping(sock), timeout=60,
                   what=f"the image store's dockerd (log: {places.logs / 'store-dockerd.log'})")
        cli = ["docker", "-H", f"unix://{sock}"]
        for ref in current:
            run([*cli, "pull", "--quiet", ref], timeout=3600)
        run([*cli, "image", "prune", "--force"], check=False)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    tmp = store_stamp(places).with_suffix(".tmp")
    tmp.write_text(json.dumps(current, indent=2) + "\n")
    tmp.rename(store_stamp(places))
    log(f"image store filled in {time.monotonic() - t:.0f}s ({store_dir(places)})")
    return current


def seed_host(places: Places, host: hostlib.Host) -> bool:
    """Give a host whose engine has no data yet the store's images (layers hard-linked,
    metadata copied); False when it has data already or there is no store."""
    data = host.dir / "docker"
    source = store_dir(places) / "data"
    if (data / "image").exists() or not (source / "image").exists():
        return False
    data.mkdir(parents=True, exist_ok=True)
    for name in ("overlay2", "image"):
        shutil.rmtree(data / name, ignore_errors=True)
    run(["cp", "-a", "--link", str(source / "overlay2"), str(data / "overlay2")], timeout=600)
    run(["cp", "-a", str(source / "image"), str(data / "image")], timeout=600)
    return True
